"""An emulated cAdvisor (the kubelet's /metrics/cadvisor) for tests: no containers, the same page.

It serves, per emulated pod, the series flowsched's bottleneck diagnosis reads, with the labels
the kubelet's embedded cAdvisor puts on them (container, id, image, name, namespace, pod):

    container_cpu_usage_seconds_total   counter, per container (cpu="total" in older versions)
    container_spec_cpu_quota            gauge, microseconds per period; absent without a CPU limit
    container_spec_cpu_period           gauge, microseconds (100000)
    container_network_receive_bytes_total / container_network_transmit_bytes_total
                                        counters, per pod sandbox (container="POD"), interface="eth0"

The counters advance at the rates set with `run_pod` / `set_pod`, integrated over the emulator's
clock (wall time by default), so Prometheus' rate() over them gives those rates back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PERIOD_US = 100_000


@dataclass
class EmulatedPod:
    namespace: str
    name: str
    container: str
    cpu_cores: float  # current use, cores
    cpu_limit_cores: float | None  # None: no CPU limit (no quota series)
    rx_bytes_s: float
    tx_bytes_s: float
    cpu_seconds: float = 0.0
    rx_bytes: float = 0.0
    tx_bytes: float = 0.0


def _labels(**kv: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items()) + "}"


class CadvisorEmulator:
    def __init__(self, node: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self.clock = node, clock
        self.pods: dict[tuple[str, str], EmulatedPod] = {}
        self.scrapes = 0
        self._lock = threading.Lock()
        self._last = clock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- what runs on the node ----
    def _advance(self) -> None:
        now = self.clock()
        dt, self._last = max(0.0, now - self._last), now
        for p in self.pods.values():
            p.cpu_seconds += p.cpu_cores * dt
            p.rx_bytes += p.rx_bytes_s * dt
            p.tx_bytes += p.tx_bytes_s * dt

    def run_pod(self, namespace: str, name: str, *, cpu_cores: float, cpu_limit_cores: float | None,
                rx_bytes_s: float = 0.0, tx_bytes_s: float = 0.0, container: str = "trainer") -> None:
        with self._lock:
            self._advance()
            self.pods[(namespace, name)] = EmulatedPod(namespace, name, container, cpu_cores, cpu_limit_cores,
                                                       rx_bytes_s, tx_bytes_s)

    def set_pod(self, namespace: str, name: str, *, cpu_cores: float | None = None,
                cpu_limit_cores: float | None = None, rx_bytes_s: float | None = None,
                tx_bytes_s: float | None = None) -> None:
        """Change a running pod's rates (counters keep what they counted so far)."""
        with self._lock:
            self._advance()
            p = self.pods[(namespace, name)]
            if cpu_cores is not None:
                p.cpu_cores = cpu_cores
            if cpu_limit_cores is not None:
                p.cpu_limit_cores = cpu_limit_cores
            if rx_bytes_s is not None:
                p.rx_bytes_s = rx_bytes_s
            if tx_bytes_s is not None:
                p.tx_bytes_s = tx_bytes_s

    def stop_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._advance()
            self.pods.pop((namespace, name), None)

    # ---- the page ----
    def render(self) -> str:
        with self._lock:
            self._advance()
            pods = list(self.pods.values())
        lines = ["# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.",
                 "# TYPE container_cpu_usage_seconds_total counter"]
        for p in pods:
            uid = f"/kubepods/pod-{p.namespace}-{p.name}/{p.container}"
            lines.append("container_cpu_usage_seconds_total" + _labels(
                container=p.container, cpu="total", id=uid, image="trainer:latest", name=p.container,
                namespace=p.namespace, pod=p.name) + f" {p.cpu_seconds:.6f}")
        for metric, help_, value in (
                ("container_spec_cpu_quota", "CPU quota of the container.", "quota"),
                ("container_spec_cpu_period", "CPU period of the container.", "period")):
            lines += [f"# HELP {metric} {help_}", f"# TYPE {metric} gauge"]
            for p in pods:
                if p.cpu_limit_cores is None:
                    continue  # cAdvisor has no quota series for a container without a CPU limit
                v = round(p.cpu_limit_cores * PERIOD_US) if value == "quota" else PERIOD_US
                lines.append(metric + _labels(container=p.container, id=f"/kubepods/pod-{p.namespace}-{p.name}/"
                                              f"{p.container}", image="trainer:latest", name=p.container,
                                              namespace=p.namespace, pod=p.name) + f" {v}")
        for metric, attr, help_ in (
                ("container_network_receive_bytes_total", "rx_bytes", "Cumulative count of bytes received"),
                ("container_network_transmit_bytes_total", "tx_bytes", "Cumulative count of bytes transmitted")):
            lines += [f"# HELP {metric} {help_}", f"# TYPE {metric} counter"]
            for p in pods:
                lines.append(metric + _labels(container="POD", id=f"/kubepods/pod-{p.namespace}-{p.name}",
                                              image="pause:3.9", interface="eth0", name="POD",
                                              namespace=p.namespace, pod=p.name)
                             + f" {getattr(p, attr):.1f}")
        return "\n".join(lines) + "\n"

    # ---- HTTP ----
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> CadvisorEmulator:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/metrics/cadvisor"):
                    self.send_error(404)
                    return
                body = emulator.render().encode()
                emulator.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"cadvisor-{self.node}",
                                        daemon=True)
        self._thread.start()
        return self

    @property
    def address(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
