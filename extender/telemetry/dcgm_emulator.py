"""An emulated dcgm-exporter for tests and the simulator: no GPU, no DCGM, the same /metrics.

The page follows dcgm-exporter's format (3.x with the default counters): per metric a HELP
and a TYPE line with the HELP texts of etc/default-counters.csv, then one line per GPU with
the labels gpu, UUID, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, and container,
namespace, pod on GPUs the kubelet pod-resources API maps to a pod. Utilisation and memory
follow the emulated pods placed with `run_pod`.

A fault can be switched on (`fault`) to serve HTTP 500, malformed text, or to hang, which
is what a wedged exporter does to a scraper.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Fault = Literal["none", "http500", "garbage", "hang"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (metric, type, help) in dcgm-exporter's default-counters.csv order (NVIDIA/dcgm-exporter).
_FAMILIES = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
)


@dataclass
class EmulatedGpu:
    index: int
    uuid: str
    util_pct: float = 0.0
    fb_used_mib: float = 0.0
    pod: tuple[str, str, str] | None = None  # (namespace, name, container)


class DcgmExporterEmulator:
    def __init__(self, hostname: str, gpus: int = 8, model: str = "NVIDIA A100-SXM4-80GB",
                 fb_total_mib: float = 81920.0, driver: str = "535.104.05", pod_mapping: bool = True) -> None:
        self.hostname, self.model, self.fb_total_mib, self.driver = hostname, model, fb_total_mib, driver
        self.pod_mapping = pod_mapping
        # Stable UUIDs per host and index, shaped like NVML's GPU-xxxxxxxx-xxxx-...
        self.gpus = [EmulatedGpu(i, "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{hostname}/gpu{i}")))
                     for i in range(gpus)]
        self.fault: Fault = "none"
        self.scrapes = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- what runs on the node ----
    def run_pod(self, namespace: str, name: str, gpus: int = 1, util_pct: float = 95.0,
                fb_used_mib: float = 40000.0, container: str = "main") -> list[int]:
        """Place a pod on the lowest free GPUs (as the device plugin would); returns their indices."""
        with self._lock:
            free = [g for g in self.gpus if g.pod is None]
            if len(free) < gpus:
                raise ValueError(f"{self.hostname}: {gpus} GPU(s) wanted, {len(free)} free")
            for g in free[:gpus]:
                g.pod, g.util_pct, g.fb_used_mib = (namespace, name, container), util_pct, fb_used_mib
            return [g.index for g in free[:gpus]]

    def stop_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            for g in self.gpus:
                if g.pod is not None and g.pod[:2] == (namespace, name):
                    g.pod, g.util_pct, g.fb_used_mib = None, 0.0, 0.0

    def set_gpu(self, index: int, util_pct: float, fb_used_mib: float | None = None) -> None:
        """Load from outside Kubernetes (another scheduler, a process on the host)."""
        with self._lock:
            g = self.gpus[index]
            g.util_pct = util_pct
            if fb_used_mib is not None:
                g.fb_used_mib = fb_used_mib

    # ---- the page ----
    def _labels(self, g: EmulatedGpu) -> str:
        parts = [("gpu", str(g.index)), ("UUID", g.uuid), ("device", f"nvidia{g.index}"),
                 ("modelName", self.model), ("Hostname", self.hostname), ("DCGM_FI_DRIVER_VERSION", self.driver)]
        if self.pod_mapping and g.pod is not None:
            ns, name, container = g.pod
            parts += [("container", container), ("namespace", ns), ("pod", name)]
        return ",".join(f'{k}="{v}"' for k, v in parts)

    def _values(self, g: EmulatedGpu) -> Iterator[str]:
        busy = g.util_pct / 100.0
        yield f"{round(30 + 45 * busy)}"  # temperature, C
        yield f"{60.0 + 340.0 * busy:f}"  # power, W: dcgm-exporter prints floats with %f
        yield f"{round(g.util_pct)}"
        yield f"{round(self.fb_total_mib - g.fb_used_mib)}"
        yield f"{round(g.fb_used_mib)}"

    def render(self) -> str:
        with self._lock:
            rows = [(self._labels(g), list(self._values(g))) for g in self.gpus]
        out: list[str] = []
        for k, (metric, kind, help_text) in enumerate(_FAMILIES):
            out.append(f"# HELP {metric} {help_text}")
            out.append(f"# TYPE {metric} {kind}")
            out.extend(f"{metric}{{{labels}}} {values[k]}" for labels, values in rows)
        return "\n".join(out) + "\n"

    # ---- HTTP ----
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> DcgmExporterEmulator:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                emulator.scrapes += 1
                fault = emulator.fault
                if fault == "hang":
                    time.sleep(30)
                    return
                if fault == "http500":
                    self.send_error(500, "DCGM unavailable")
                    return
                body = (emulator.render() if fault == "none" else
                        "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 95\n<html>not metrics</html>\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # quiet: tests scrape every second
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"dcgm-emu-{self.hostname}",
                                        daemon=True)
        self._thread.start()
        return self

    @property
    def address(self) -> str:
        """host:port, as a Prometheus static target."""
        if self._server is None:
            raise RuntimeError("emulator is not serving")
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
