"""uvicorn, configured so that a slow, idle or hostile client cannot pin the process.

uvicorn closes a keep-alive connection idle after a response, but not one that never finishes
its request line and headers, nor one that drips its body; with a 1,024 open-file limit,
1,100 such connections made most normal requests fail (issue 18). The protocol here adds:

- a header deadline: the request line and headers must arrive within header_timeout_s of the
  connection opening (or of the previous response on a kept-alive connection);
- a body deadline: the body must arrive within body_timeout_s of the headers;
- a connection cap (max_connections, lowered to fit RLIMIT_NOFILE): at the cap the connection
  idle longest without a request is closed to make room, so a new client is still served;
- every closing is counted and logged (at most one line per kind every 10 s).

Shutdown is bounded (timeout_graceful_shutdown) and a second SIGTERM exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("flowsched.http")

FD_RESERVE = 128  # files kept free for SQLite, the apiserver watches, Prometheus, logs


@dataclass(frozen=True)
class ServerLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 30  # > kube-scheduler's idle reuse of a connection is not needed; Go re-dials
    max_connections: int = 2048
    graceful_shutdown_s: int = 10


class _RateLimitedLog:
    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.last: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def note(self, kind: str, message: str, *args: Any) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) >= self.every_s:
            self.last[kind] = now
            log.warning(message + " (%d so far)", *args, self.counts[kind])


def effective_max_connections(wanted: int) -> int:
    """wanted, lowered so that connections cannot exhaust the process's open-file limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - FD_RESERVE))


class OneSendPerTurn:
    """A transport proxy: the writes of one event-loop turn leave in one send.

    uvicorn writes a response's status line and headers, then its body, in two sends; on
    loopback each is a TCP segment that wakes kube-scheduler's reader (and, with uvloop, a
    syscall made holding the GIL). A verb's reply is written within one turn, so here it leaves
    as one segment. A turn that writes more than FLUSH_BYTES sends at once, so a large streamed
    body still meets the transport's flow control."""

    FLUSH_BYTES = 64 * 1024

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buf: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._buf:
            self._loop.call_soon(self.flush)
        self._buf.append(bytes(data))
        self._size += len(data)
        if self._size >= self.FLUSH_BYTES:
            self.flush()

    def writelines(self, chunks: Any) -> None:
        for c in chunks:
            self.write(c)

    def flush(self) -> None:
        if not self._buf:
            return
        data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: ServerLimits, max_connections: int) -> type[HttpToolsProtocol]:
    """An httptools protocol class with the deadlines and the cap of `limits`."""
    events = _RateLimitedLog()
    header_s, body_s = limits.header_timeout_s, limits.body_timeout_s

    class GuardedProtocol(HttpToolsProtocol):
        counts = events.counts  # for tests and /debug/status

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(OneSendPerTurn(transport, self.loop))  # type: ignore[arg-type]
            self._deadline: asyncio.TimerHandle | None = None
            self._since = time.monotonic()  # connection made, or its last response sent
            if len(self.connections) > max_connections and not self._make_room():
                events.note("cap_refused", "connection cap %d reached, every connection busy: refused one",
                            max_connections)
                transport.close()
                return
            self._arm(header_s, "header_timeout")

        def _waiting_on_client(self) -> bool:
            """Idle, or still sending its request: nothing of ours is working for it."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete or cycle.more_body

        def _make_room(self) -> bool:
            """Close the connection that has waited on its client longest; False if none does."""
            waiting: list[tuple[float, Any]] = []
            for c in self.connections:
                if (c is not self and isinstance(c, GuardedProtocol) and not c.transport.is_closing()
                        and c._waiting_on_client()):
                    waiting.append((c._since, c))
            if not waiting:
                return False
            since, victim = min(waiting, key=lambda x: x[0])
            events.note("cap_evicted", "connection cap %d reached: closed the connection idle longest (%.1fs)",
                        max_connections, time.monotonic() - since)
            victim.transport.close()
            return True

        def _arm(self, after_s: float, kind: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(after_s, self._expire, kind)

        def _disarm(self) -> None:
            if getattr(self, "_deadline", None) is not None:
                self._deadline.cancel()  # type: ignore[union-attr]
                self._deadline = None

        def _expire(self, kind: str) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                events.note(kind, "closed a connection past its %s (client %s)", kind, self.client)
                self.transport.close()

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm(body_s, "body_timeout")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._since = time.monotonic()
            # uvicorn has started the next pipelined request, if any: its deadlines are its own.
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm(header_s + limits.keep_alive_s, "header_timeout")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedProtocol


class FlowschedServer(uvicorn.Server):
    """uvicorn's server where a second SIGTERM (or SIGINT) forces the exit."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in (signal.SIGTERM, signal.SIGINT):
            log.warning("second %s: exiting without waiting for open requests", signal.Signals(sig).name)
            self.force_exit = True
        super().handle_exit(sig, frame)


def server_config(app: Any, *, host: str, port: int, limits: ServerLimits, log_level: str,
                  ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                  loop: str = "auto") -> uvicorn.Config:
    cap = effective_max_connections(limits.max_connections)
    if cap < limits.max_connections:
        log.info("max_connections %d lowered to %d to fit the open-file limit", limits.max_connections, cap)
    return uvicorn.Config(
        app, host=host, port=port, loop=loop, http=guarded_protocol(limits, cap),
        access_log=False, log_level=log_level, lifespan="on",
        timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=limits.graceful_shutdown_s,
        proxy_headers=False,  # the peer address gates /debug/*; no header may claim another
        ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
    )
