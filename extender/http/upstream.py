"""The API front's client of the verbs' process: HTTP/1.1 over a Unix socket, kept-alive
connections reused (extender.http.api_front).

The front has already bounded the request (head, body, rate); this only carries it across,
naming the peer in FRONT_PEER_HEADER, which the verbs' process trusts on that socket alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence

import httptools

FRONT_PEER_HEADER = b"x-flowsched-peer"
# The form the front turned a body into (extender.http.progress_wire); trusted, like the peer,
# only on requests marked FRONT_SCOPE_KEY by the verbs' process's Unix-socket listener.
FRONT_FORM_HEADER = b"x-flowsched-form"
FRONT_SCOPE_KEY = "flowsched.front"
# Not carried across: hop-by-hop, framing (recomputed), and the peer (the front's word only).
_REQUEST_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade",
                           b"te", b"trailer", b"expect", b"proxy-connection", FRONT_PEER_HEADER,
                           FRONT_FORM_HEADER})
_REPLY_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date",
                         b"server"})

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class UpstreamError(Exception):
    """The verbs' process did not answer (gone, or restarting)."""


class _Reply:
    def __init__(self, head_only: bool) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.head_only = head_only
        self.done = False
        self.parser: httptools.HttpResponseParser | None = None
        # Read while the head is parsed: httptools answers False once the message is complete,
        # so asked afterwards no connection was ever kept for reuse.
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name not in _REPLY_DROP:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()
        if self.head_only:
            self.done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used_at = time.monotonic()

    def close(self) -> None:
        self.writer.close()


def encode_request(method: str, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes,
                   peer: str, form: bytes | None = None) -> bytes:
    out = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        if name.lower() not in _REQUEST_DROP:
            out += [name, b": ", value, b"\r\n"]
    if form is not None:
        out += [FRONT_FORM_HEADER, b": ", form, b"\r\n"]
    out += [FRONT_PEER_HEADER, b": ", peer.encode("ascii", "replace"), b"\r\n",
            b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body]
    return b"".join(out)


# Retried once on a fresh connection when a reused one fails before any byte of an answer.
# Not POST: the verbs' process may have read and applied it before the connection broke (a
# progress batch would be stored twice), and nothing here can tell; the client gets a 503.
RETRIED_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Upstream:
    """Requests to the verbs' process. A kept-alive connection idle longer than idle_s, or one
    the other side already closed, is not reused (the other side closes its own after its
    keep-alive); a reused one that fails before any byte of an answer is retried once on a fresh
    connection (it was closed under us) when the method is one of RETRIED_METHODS."""

    def __init__(self, uds: str, timeout_s: float = 60.0, idle_s: float = 20.0) -> None:
        self.uds, self.timeout_s, self.idle_s = uds, timeout_s, idle_s
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.open_unix_connection(self.uds, limit=1 << 20)
        return _Conn(reader, writer)

    def _reuse(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.used_at < self.idle_s and not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    async def request(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes,
                      peer: str, form: bytes | None = None) -> Answer:
        data = encode_request(method, target, headers, body, peer, form)
        conn = self._reuse()
        if conn is not None:
            try:
                return await self._exchange(conn, data, method == "HEAD")
            except _Untouched as e:
                if method not in RETRIED_METHODS:
                    raise UpstreamError("the verbs' process closed the connection; not retried") from e
                # closed while idle: once more on a fresh connection
        try:
            conn = await self._connect()
        except OSError as e:
            raise UpstreamError(f"cannot reach the verbs' process: {e}") from e
        try:
            return await self._exchange(conn, data, method == "HEAD")
        except _Untouched as e:
            raise UpstreamError("the verbs' process closed the connection") from e

    async def _exchange(self, conn: _Conn, data: bytes, head_only: bool) -> Answer:
        reply = _Reply(head_only)
        parser = reply.parser = httptools.HttpResponseParser(reply)
        got = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                conn.writer.write(data)
                await conn.writer.drain()
                while not reply.done:
                    chunk = await conn.reader.read(1 << 16)
                    if not chunk:
                        raise ConnectionResetError("closed mid-answer")
                    got += len(chunk)
                    parser.feed_data(chunk)
        except TimeoutError as e:
            conn.close()
            raise UpstreamError(f"no answer within {self.timeout_s:.0f}s") from e
        except (OSError, httptools.HttpParserError) as e:
            conn.close()
            if not got:
                raise _Untouched from e
            raise UpstreamError(f"the verbs' process broke off its answer: {e}") from e
        if head_only or not reply.keep_alive:
            conn.close()
        else:
            conn.used_at = time.monotonic()
            self._idle.append(conn)
        status = parser.get_status_code()
        body = reply.body[0] if len(reply.body) == 1 else b"".join(reply.body)
        return status, reply.headers, body

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class _Untouched(Exception):
    """The connection failed before any byte of an answer."""
