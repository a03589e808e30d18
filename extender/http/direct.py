"""The verbs' direct path: an app that answers some POSTs from the HTTP protocol itself
(DirectApp), and the transport proxy that sends what one event-loop turn wrote in one send."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


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

    def write_now(self, data: bytes) -> None:
        """data sent at once, after anything this turn wrote before it (one send when nothing did)."""
        if self._buf:
            self._buf.append(data)
            self.flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

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


Reply = tuple[int, bytes, Sequence[tuple[bytes, bytes]]]  # status, body, headers (not content-length)


@runtime_checkable
class DirectApp(Protocol):
    """An app that answers some POST paths itself, synchronously, from the protocol (see
    guarded_protocol): no ASGI request/response cycle, no task, no receive/send coroutines.

    direct_begin is called when the headers are in: a reply ends the request there (the body,
    if any, is read and dropped, as uvicorn does after an early response); None admits it, and
    exactly one of direct_answer (the whole body in), direct_too_large (the body passed
    direct_max_body) or direct_abort (the connection went) follows."""

    direct_paths: frozenset[str]
    direct_max_body: int

    def direct_begin(self, path: str, headers: Sequence[tuple[bytes, bytes]]) -> Reply | None: ...

    def direct_answer(self, path: str, body: bytes) -> Reply: ...

    def direct_too_large(self, path: str) -> Reply: ...

    def direct_abort(self, path: str) -> None: ...
