"""Start a real `flowsched serve --no-kube` for a benchmark or a test: static progress token, a
temporary SQLite store, the verbs and the API on free local ports; stopped on exit."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> bool:
    """Whether a local server's /readyz answered 200 within timeout_s (False as soon as proc,
    if given, has exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            return False
        time.sleep(0.2)


@dataclass(frozen=True)
class Served:
    api_url: str
    api_port: int
    verbs_port: int
    token: str
    namespace: str
    db: Path  # the progress store's SQLite file
    pid: int


@contextmanager
def local_flowsched(token: str = "bench-token", namespace: str = "team-a", ready_s: float = 60.0,
                    keep_in: Path | None = None) -> Iterator[Served]:
    """keep_in: a folder that keeps the store and serve.log after exit (else a temporary one)."""
    with contextlib.ExitStack() as stack:
        work = keep_in if keep_in is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="flowsched-serve-")))
        (work / "tokens").write_text(f"{token} {namespace}\n")
        port, api_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWSCHED_")}
        env.update({"FLOWSCHED_PROGRESS_DB": str(work / "p.sqlite"), "FLOWSCHED_PROGRESS_AUTH": "static",
                    "FLOWSCHED_STATIC_TOKENS_FILE": str(work / "tokens"), "FLOWSCHED_LOG_LEVEL": "warning"})
        with (work / "serve.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from extender.cli import main; sys.exit(main())", "serve",
                 "--no-kube", "--host", "127.0.0.1", "--port", str(port), "--api-port", str(api_port)],
                stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                if not wait_ready(api_port, ready_s, proc):
                    tail = (work / "serve.log").read_text()[-2000:]
                    raise RuntimeError(f"flowsched serve did not come up: {tail}")
                yield Served(f"http://127.0.0.1:{api_port}", api_port, port, token, namespace, work / "p.sqlite",
                             proc.pid)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
