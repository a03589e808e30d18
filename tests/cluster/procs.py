"""Child processes that cannot outlive the test session.

Every process the harness starts (etcd, kube-apiserver, kube-scheduler, the flowsched
service) goes through `ManagedProcess`:
- it runs in its own session, hence its own process group, so a stop kills the whole group
  (a Go binary or a uvicorn worker may have children of its own);
- on Linux it gets PR_SET_PDEATHSIG=SIGKILL, so it dies even if pytest itself is SIGKILLed
  and no Python code gets to run;
- it is registered in a module-level set that an atexit hook and a SIGTERM/SIGHUP handler
  drain, for the cases where fixture finalizers never run (a crash in collection, a
  `kill <pytest pid>` from CI).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. prctl is Linux-only; elsewhere the atexit and
    # signal hooks still cover every exit that lets Python run.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ManagedProcess:
    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed after Popen
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd, start_new_session=True, preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it; always reaps the leader."""
        p = self.proc
        if p is None:
            return
        try:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=grace_s)
            # The leader may be gone while grandchildren in its group live on: kill the group
            # unconditionally (ESRCH when it is already empty).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            self.proc = None


def stop_all(grace_s: float = 3.0) -> None:
    """Stop every live process at once: SIGTERM all groups, one shared grace, then SIGKILL."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        p.stop(grace_s=0.0)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_installed = False


def install_exit_hooks() -> None:
    """Idempotent; must run in the main thread (signal handlers can only be set there)."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(stop_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            prev = signal.getsignal(sig)
            if prev in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)


def wait_until(pred: Callable[[], bool], timeout_s: float, interval_s: float = 0.05,
               what: str = "condition") -> None:
    """Poll `pred` until true or raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            if pred():
                return
        except Exception as e:  # a transient error is just "not yet"; reported on timeout
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}{detail}")
        time.sleep(interval_s)
