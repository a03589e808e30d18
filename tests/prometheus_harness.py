"""A real Prometheus server for tests on a free loopback port.

The binary is $FLOWSCHED_PROMETHEUS_BIN, else `prometheus` on PATH, else Prometheus built from
its Go module by tests/cluster/build_go_tool.sh (cached; tests/cluster/tools.py). The test
tooling writes the config (static targets, 1 s scrape interval), keeps storage in a temporary
directory, and owns the process: it runs in its own process group, dies with the test process
(PR_SET_PDEATHSIG), and `stop` kills it by PID. If there is no binary and it cannot be built,
the test fails with the reason and what to install, unless FLOWSCHED_SKIP_PROMETHEUS=1.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest
import yaml

from tests.cluster.tools import ToolUnavailable, go_tool


def prometheus_binary() -> str:
    """The binary's path (built on first use); fails, or skips on FLOWSCHED_SKIP_PROMETHEUS=1,
    when there is none and it cannot be built."""
    if os.environ.get("FLOWSCHED_SKIP_PROMETHEUS") == "1":
        pytest.skip("FLOWSCHED_SKIP_PROMETHEUS=1: Prometheus tests skipped on request")
    try:
        return go_tool("prometheus")
    except ToolUnavailable as e:
        pytest.fail(f"the Prometheus tests need a real prometheus binary: {e}", pytrace=False)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


Target = tuple[str, Mapping[str, str]]  # ("host:port", extra labels)


class PrometheusServer:
    def __init__(self, binary: str, workdir: Path, targets: Sequence[Target], scrape_interval_s: float = 1.0,
                 other_jobs: Mapping[str, Sequence[Target]] | None = None, extra_args: Sequence[str] = ()) -> None:
        self.binary, self.workdir = binary, workdir
        self.extra_args = list(extra_args)  # e.g. --web.enable-remote-write-receiver
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()  # kept across restarts, so clients keep one URL
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"
        interval = f"{int(scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": "dcgm-exporter",
                "static_configs": [{"targets": [addr], "labels": dict(labels)} for addr, labels in targets],
            }] + [{"job_name": name, "static_configs": [{"targets": [addr], "labels": dict(labels)}
                                                         for addr, labels in job_targets]}
                  for name, job_targets in (other_jobs or {}).items()],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        (workdir / "data").mkdir(exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 30.0) -> PrometheusServer:
        argv = [self.binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle", "--log.level=warn",
                *self.extra_args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus not ready after {ready_timeout_s}s:\n{self.log_tail()}")

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def query(self, promql: str) -> list[dict[str, object]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        result: list[dict[str, object]] = r.json()["data"]["result"]
        return result


@contextlib.contextmanager
def running_prometheus(workdir: Path, targets: Sequence[Target], scrape_interval_s: float = 1.0,
                       extra_args: Sequence[str] = ()) -> Iterator[PrometheusServer]:
    server = PrometheusServer(prometheus_binary(), workdir, targets, scrape_interval_s, extra_args=extra_args)
    try:
        yield server.start()
    finally:
        server.stop()  # by PID (its process group), whatever the test did


def wait_for(pred: object, timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Poll pred() until true; returns the seconds it took, or fails naming `what`."""
    assert callable(pred)
    start = time.monotonic()
    last: Exception | None = None
    while True:
        try:
            if pred():
                return time.monotonic() - start
        except Exception as e:  # not yet
            last = e
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.1f}s waiting for {what}"
                                 + (f" (last error: {last!r})" if last else ""))
        time.sleep(interval_s)


@contextlib.contextmanager
def scraping(workdir: Path, addresses: Iterable[str]) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping these exporters' addresses, stopped on exit."""
    server = PrometheusServer(prometheus_binary(), workdir, [(a, {}) for a in addresses])
    try:
        yield server.start()
    finally:
        server.stop()
