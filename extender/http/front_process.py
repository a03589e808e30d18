"""The verbs' process's side of the API front (extender.http.api_front): the listening socket,
the front's process and its supervision, and the Unix-socket listener it forwards to.

The verbs' process binds `api_port` itself and hands the socket to the front, so a port that
cannot be bound fails `flowsched serve` at start, and a front that dies is restarted on the same
socket (connections wait in its backlog meanwhile). More than `restarts` deaths within
`window_s`: the verbs' process exits non-zero, and Kubernetes restarts the pod whole.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from extender.http.api_front import FrontConfig
from extender.http.front_counts import RefusalReader
from extender.http.upstream import FRONT_PEER_HEADER, FRONT_SCOPE_KEY

log = logging.getLogger("flowsched.http")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def bind_listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on host:port, inheritable (the front accepts on it)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def private_socket_path() -> str:
    """A path for the forwarded requests' Unix socket, in a directory only this user can enter."""
    return str(Path(tempfile.mkdtemp(prefix="flowsched-")) / "api.sock")


class FrontPeer:
    """ASGI wrapper for the Unix-socket listener: the client is the peer the front names (the
    API's per-peer TokenReview budget and the debug pages' loopback check read it). Only the front
    can reach that socket, and it always sets the header (a tenant's own is dropped there); the
    scope is marked as the front's, so a body form it names (FRONT_FORM_HEADER) is trusted."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            peer = ""
            for name, value in scope["headers"]:
                if name == FRONT_PEER_HEADER:
                    peer = value.decode("ascii", "replace")
            scope["client"] = (peer, 0) if peer else None
            scope[FRONT_SCOPE_KEY] = True  # its FRONT_FORM_HEADER is the front's word too
        await self.app(scope, receive, send)


def refusals_counter(registry: CollectorRegistry) -> Counter:
    return Counter("flowsched_api_front_refusals", "Requests the API port's front answered itself, not forwarded "
                   "(429 a peer past its rate, 503 busy or the verbs' process unreachable, 413, 404 a verb path)",
                   ["code", "reason"], registry=registry)


class ApiFront:
    """The front's process, started on `sock`, supervised from the verbs' event loop (check()),
    which also adds the front's own refusals to `refusals` (extender.http.front_counts)."""

    def __init__(self, config: FrontConfig, sock: socket.socket, restarts: int = 5, window_s: float = 300.0,
                 refusals: Counter | None = None) -> None:
        self.config, self.sock = config, sock
        self.restarts, self.window_s = restarts, window_s
        self.refusals = refusals
        self.counts: RefusalReader | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.deaths: collections.deque[float] = collections.deque()
        self.stopping = False

    def _spawn(self) -> int:
        """Start the front; the read end of its ready pipe."""
        ready_r, ready_w = os.pipe()
        counts_r, counts_w = os.pipe()
        self.read_counts()  # what the previous front wrote before it died
        if self.counts is not None:
            self.counts.close()
        self.counts = RefusalReader(counts_r)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the package's checkout or site-packages
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        fd = self.sock.fileno()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "extender.http.api_front", "--listen-fd", str(fd), "--ready-fd", str(ready_w),
                 "--counts-fd", str(counts_w), "--config", self.config.to_json()],
                pass_fds=(fd, ready_w, counts_w), env=env,
                start_new_session=True)  # a terminal's Ctrl-C reaches this process only; it stops the front
        finally:
            os.close(ready_w)
            os.close(counts_w)
        return ready_r

    def start(self, timeout_s: float = 30.0) -> bool:
        """Started and accepting; False if it exited or did not say so within timeout_s."""
        ready_r = self._spawn()
        try:
            readable, _, _ = select.select([ready_r], [], [], timeout_s)
            return bool(readable) and os.read(ready_r, 1) == b"1"
        finally:
            os.close(ready_r)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def read_counts(self) -> None:
        """The refusals the front has reported so far, added to the counter."""
        if self.counts is None:
            return
        for (code, reason), n in self.counts.drain().items():
            if self.refusals is not None:
                self.refusals.labels(code, reason).inc(n)

    def check(self) -> bool:
        """Called every tick of the verbs' loop: a dead front is restarted (not waited for: the
        socket keeps its backlog); False once it has died more than `restarts` times in window_s."""
        self.read_counts()
        if self.stopping or self.alive():
            return True
        code = self.proc.returncode if self.proc is not None else None
        now = time.monotonic()
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.window_s:
            self.deaths.popleft()
        if len(self.deaths) > self.restarts:
            log.error("the API front exited (status %s) %d times in %.0fs; giving up", code, len(self.deaths),
                      self.window_s)
            return False
        log.error("the API front exited (status %s); restarting it", code)
        os.close(self._spawn())
        return True

    def terminate(self, force: bool = False) -> None:
        """SIGTERM: it stops accepting and drains (a second one, force, exits at once)."""
        if not self.alive():
            self.stopping = True
            return
        assert self.proc is not None
        if force:
            self.proc.kill()
        elif not self.stopping:  # once: a second SIGTERM would make it drop open requests
            self.proc.send_signal(signal.SIGTERM)
        self.stopping = True

    def wait(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the API front did not stop within %.0fs; killed", timeout_s)
            self.proc.kill()
            self.proc.wait(5.0)

    def close(self) -> None:
        self.read_counts()
        if self.counts is not None:
            self.counts.close()
        self.sock.close()
        shutil.rmtree(Path(self.config.uds).parent, ignore_errors=True)
