"""uvicorn's httptools protocol, guarded so that a slow, idle or hostile client cannot pin the process.

uvicorn closes a keep-alive connection idle after a response, but not one that never finishes
its request line and headers, nor one that drips its body; with a 1,024 open-file limit,
1,100 such connections made most normal requests fail (issue 18). The protocol here adds:

- a header deadline: the request line and headers must arrive within header_timeout_s of the
  connection opening (or of the previous response on a kept-alive connection);
- a body deadline: the body must arrive within body_timeout_s of the headers;
- a connection cap (max_connections, lowered to fit RLIMIT_NOFILE): at the cap the connection
  idle longest without a request is closed to make room, so a new client is still served;
- every closing is counted and logged (at most one line per kind every 10 s).

and (issue 33) no protocol upgrades, bounded request lines and heads, stopped reading while
replies go unread, a bounded pipeline, and peers refused again and again dropped on connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from extender.http.direct import DirectApp, OneSendPerTurn, Reply
from extender.http.ratelog import RateLimitedLog
from extender.http.server_limits import ServerLimits

log = logging.getLogger("flowsched.http")

_INTERNAL_ERROR: Reply = (500, b"Internal Server Error",
                         [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")])
_CLOSE = [(b"content-type", b"application/json"), (b"connection", b"close")]
HOLD_RCVBUF = 4096  # a held connection's receive buffer: what a blocked peer can park in the kernel
MAX_PIPELINED = 16  # requests queued behind the one being answered on a connection; more: aborted


class RefusalBox:
    """Peers refused (400/414/431, an upgrade, a deep pipeline) more than `most` times within
    `window_s`: their next connections are held unread as they open (GuardedProtocol._hold). A
    header flood reconnected 11,000 times in 6 s, each time parsed up to the 64 KiB bound."""

    def __init__(self, most: int = 20, window_s: float = 10.0, peers: int = 4096) -> None:
        self.most, self.window_s, self.peers = most, window_s, peers
        self._seen: dict[str, tuple[int, float]] = {}  # peer -> (refusals, since)

    def refused(self, peer: str, now: float) -> None:
        count, since = self._seen.get(peer, (0, now))
        if now - since > self.window_s:
            count, since = 0, now
        if len(self._seen) >= self.peers and peer not in self._seen:
            self._seen.clear()
        self._seen[peer] = (count + 1, since)

    def blocked(self, peer: str, now: float) -> bool:
        count, since = self._seen.get(peer, (0, now))
        return count > self.most and now - since <= self.window_s


class _StopParsing(Exception):
    """Raised from a parser callback to stop httptools at once (it surfaces as a
    HttpParserCallbackError): after a refusal, the rest of a 256 KiB read would otherwise still
    cost a Python call per header line."""
_URL_TOO_LONG: Reply = (414, b'{"error":"request line too long"}', _CLOSE)
_HEAD_TOO_LARGE: Reply = (431, b'{"error":"request header fields too large or too many"}', _CLOSE)


def guarded_protocol(limits: ServerLimits, max_connections: int,
                     direct: DirectApp | None = None) -> type[HttpToolsProtocol]:
    """An httptools protocol class with the deadlines and the cap of `limits`; POSTs to
    direct.direct_paths are answered by `direct` without the ASGI machinery (about 0.05 ms of
    CPU a call less, an eighth of a filter-ranked call: uvicorn's cycle, its task, the ASGI
    messages, the call_soon flush)."""
    events = RateLimitedLog(log)
    box = RefusalBox()
    header_s, body_s = limits.header_timeout_s, limits.body_timeout_s
    direct_paths = direct.direct_paths if direct is not None else frozenset()

    class GuardedProtocol(HttpToolsProtocol):
        counts = events.counts  # for tests and /debug/status

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._direct: str | None = None  # the direct path whose body is arriving
            self._direct_body: list[bytes] = []
            self._direct_size = 0
            self._direct_drop = False  # answered early: the rest of this request's body is dropped
            self._direct_last = False  # shutting down: close once the request being read is answered
            self._refused = False  # answered 400/414/431 and closing: nothing more is read
            self._in_head = True  # the request line and headers are being read
            self._head_began = False  # a request began in the read being parsed
            self._head_bytes = 0
            self._header_count = 0
            self._write_timer: asyncio.TimerHandle | None = None
            self._due: float | None = None  # the connection's deadline (loop time), None: none
            self._due_kind = "header_timeout"
            self._body_due: float | None = None  # a body deadline, armed if the body is still out
            self._deadline: asyncio.TimerHandle | None = None
            self._deadline_at = 0.0
            super().connection_made(OneSendPerTurn(transport, self.loop))  # type: ignore[arg-type]
            self._since = time.monotonic()  # connection made, or its last response sent
            if self.client is not None and box.blocked(str(self.client[0]), self._since):
                self._refused = True
                events.note("peer_blocked", "held unread a connection of a peer refused %d times in %.0fs (client %s)",
                            box.most, box.window_s, self.client)
                self._hold(transport)
                return
            if len(self.connections) > max_connections and not self._make_room():
                events.note("cap_refused", "connection cap %d reached, every connection busy: refused one",
                            max_connections)
                transport.close()
                return
            self._arm(header_s, "header_timeout")

        def _hold(self, transport: asyncio.Transport) -> None:
            """A blocked peer's connection: held unread, its receive buffer small, until its header
            deadline (or evicted at the cap, as any connection waiting on its client). Dropped at
            once, a flooding client reconnected ~1,000 times a second and pushed ~60 MB/s into
            the kernel's buffers, CPU the verbs then waited for on a small node (issue 33, finding 2)."""
            sock = transport.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, HOLD_RCVBUF)
            transport.pause_reading()
            self._arm(header_s, "held_timeout")

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

        # One timer per connection, moved only when a deadline comes sooner than it fires; a later
        # deadline is checked when it fires. So a request on a kept-alive connection, whose body
        # arrives with its headers, arms and cancels no timer (three of each before: ~30 us of a
        # call with cold caches).
        def _arm(self, after_s: float, kind: str) -> None:
            self._body_due = None
            self._arm_at(self.loop.time() + after_s, kind)

        def _arm_at(self, due: float, kind: str) -> None:
            self._due, self._due_kind = due, kind
            if self._deadline is not None:
                if self._deadline_at <= due:
                    return
                self._deadline.cancel()
            self._deadline, self._deadline_at = self.loop.call_at(due, self._on_deadline), due

        def _disarm(self) -> None:
            self._due = self._body_due = None  # the timer, if any, finds nothing due when it fires

        def _on_deadline(self) -> None:
            self._deadline = None
            due = self._due
            if due is None:
                return
            if self.loop.time() < due:
                self._deadline, self._deadline_at = self.loop.call_at(due, self._on_deadline), due
                return
            self._expire(self._due_kind)

        def _expire(self, kind: str) -> None:
            self._due = None
            if not self.transport.is_closing():
                events.note(kind, "closed a connection past its %s (client %s)", kind, self.client)
                self.transport.close()

        def on_message_begin(self) -> None:
            self._direct_drop = False
            self._in_head, self._header_count, self._head_began = True, 0, True
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            if self._refused:
                return
            if len(self.url) + len(url) > limits.max_url_bytes:
                self._refuse("url_too_long", _URL_TOO_LONG)
                raise _StopParsing
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._refused:
                return
            self._header_count += 1
            if self._header_count > limits.max_header_count:
                self._refuse("headers_too_large", _HEAD_TOO_LARGE)
                raise _StopParsing
            super().on_header(name, value)

        def _count_refusal(self) -> None:
            if self.client is not None:
                box.refused(str(self.client[0]), time.monotonic())

        def _refuse(self, kind: str, reply: Reply) -> None:
            """A request refused before its headers are in: the answer, then the connection closed;
            nothing it sends after is parsed."""
            if self._refused:
                return
            self._refused = True
            self._count_refusal()
            events.note(kind, "refused a request: %s (client %s)", kind, self.client)
            self._direct_drop = True
            self._reply(reply)

        def on_headers_complete(self) -> None:
            self._in_head, self._head_bytes = False, 0
            if self._refused:
                return
            if self.parser.should_upgrade():
                self._refuse_upgrade()
                raise _StopParsing
            if self.cycle is not None and not self.cycle.response_complete and len(self.pipeline) >= MAX_PIPELINED:
                # uvicorn queues every request of a read behind the one being answered; a client
                # pipelining thousands and reading nothing grew RSS past 2 GiB (finding 3).
                self._refused = True
                self._count_refusal()
                events.note("pipeline_too_deep", "aborted a connection pipelining more than %d requests (client %s)",
                            MAX_PIPELINED, self.client)
                self.transport.abort()
                raise _StopParsing
            if direct is not None and self._takes_direct():
                path = self.scope["path"]
                self.scope["method"] = "POST"
                reply = direct.direct_begin(path, self.headers)
                if reply is not None:
                    self._direct_drop = True
                    self._reply(reply)
                else:
                    self._direct, self._direct_body, self._direct_size = path, [], 0
                    self._await_body()
                return
            super().on_headers_complete()
            self._await_body()

        def _await_body(self) -> None:
            """The body deadline from now; armed by data_received only if the body is still out
            once the bytes at hand are parsed."""
            self._due, self._body_due = None, self.loop.time() + body_s

        def _refuse_upgrade(self) -> None:
            """No protocol switch (WebSocket, h2c): a switched connection would be out of reach
            of every deadline here (issue 33: pinned for good). 400, then closed."""
            self._refuse("upgrade_refused", (400, b'{"error":"no protocol upgrade here"}', _CLOSE))

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._unset_keepalive_if_required()
            self._head_began = False
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:  # _StopParsing included (a callback error)
                if not self._refused:
                    self._refused = True
                    self._count_refusal()
                    events.note("bad_request", "invalid HTTP request (client %s)", self.client)
                    self.send_400_response("Invalid HTTP request received.")
                return
            except httptools.HttpParserUpgrade:
                self._refuse_upgrade()
                return
            if self._in_head and not self._refused:
                # Still in the request line or headers after this read: what they have taken so
                # far is bounded here, before httptools copies a never-ending value again. A read
                # in which the request began is not counted (its head is only a part of it), so the
                # bound is max_head_bytes plus one read.
                self._head_bytes = 0 if self._head_began else self._head_bytes + len(data)
                if self._head_bytes > limits.max_head_bytes:
                    self._refuse("headers_too_large", _HEAD_TOO_LARGE)
                    return
            due = self._body_due
            if due is not None:
                self._body_due = None
                self._arm_at(due, "body_timeout")

        def _takes_direct(self) -> bool:
            """A POST to a direct path, with no earlier request still being answered (a
            pipelined one waits its turn in uvicorn's queue) and nothing that needs the ASGI
            cycle (Expect: 100-continue, an upgrade, a %-escaped path)."""
            if self.parser.get_method() != b"POST" or self.expect_100_continue or self.parser.should_upgrade():
                return False
            if self.cycle is not None and not self.cycle.response_complete:
                return False
            raw = httptools.parse_url(self.url).path
            if b"%" in raw:
                return False
            path = self.root_path + raw.decode("ascii")
            if path not in direct_paths:
                return False
            self.scope["path"] = path
            return True

        def on_body(self, body: bytes) -> None:
            if self._direct_drop:
                return
            if self._direct is None:
                super().on_body(body)
                return
            self._direct_size += len(body)
            if self._direct_size > direct.direct_max_body:  # type: ignore[union-attr]
                path, self._direct, self._direct_body = self._direct, None, []
                self._direct_drop = True
                self._reply(direct.direct_too_large(path))  # type: ignore[union-attr]
                return
            self._direct_body.append(body)

        def on_message_complete(self) -> None:
            if self._direct_drop:  # answered already: the deadline is the next request's
                self._arm(header_s + limits.keep_alive_s, "header_timeout")
                return
            if self._direct is None:
                super().on_message_complete()
                self._disarm()
                return
            self._disarm()
            path, chunks = self._direct, self._direct_body
            self._direct, self._direct_body = None, []
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            try:
                reply = direct.direct_answer(path, body)  # type: ignore[union-attr]
            except Exception:  # as uvicorn answers an ASGI app that raised
                log.exception("answering %s failed", path)
                reply = _INTERNAL_ERROR
            self._reply(reply)

        def _reply(self, reply: Reply) -> None:
            """The response, in one send; then what uvicorn does after any response."""
            status, body, headers = reply
            keep_alive = (not self._direct_last and self.parser.get_http_version() != "1.0"
                          and self.parser.should_keep_alive())
            out = [STATUS_LINE[status]]
            for name, value in (*self.server_state.default_headers, *headers):
                if name == b"connection" and b"close" in value.lower():
                    keep_alive = False
                out += [name, b": ", value, b"\r\n"]
            out += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
            if not keep_alive:
                out.append(b"connection: close\r\n")
            out += [b"\r\n", body]
            self.transport.write_now(b"".join(out))  # type: ignore[attr-defined]
            if not keep_alive:
                self.transport.close()
            self.on_response_complete()

        def pause_writing(self) -> None:
            """The send buffer passed its high-water mark: the client is not reading its replies.
            Stop reading its requests (a pipelining client would otherwise grow the buffer
            without bound), and close it if the buffer stays full write_timeout_s."""
            super().pause_writing()
            self.flow.pause_reading()
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(limits.write_timeout_s, self._abort_unread)

        def _abort_unread(self) -> None:
            """Aborted, not closed: a close would wait to flush what the client does not read."""
            self._write_timer = None
            events.note("write_timeout", "aborted a connection whose replies were not read for %.0fs (client %s)",
                        limits.write_timeout_s, self.client)
            self.transport.abort()

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            if self.cycle is None or self.cycle.response_complete:  # else uvicorn resumes when it completes
                self.flow.resume_reading()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # resumes reading, and starts the next queued request ...
            if (self.flow.write_paused or self.pipeline) and not self.transport.is_closing():
                # ... not while the replies are not being read, nor while requests are still
                # queued: uvicorn read (and queued) another read's worth after every response.
                self.flow.pause_reading()
            self._since = time.monotonic()
            # uvicorn has started the next pipelined request, if any: its deadlines are its own.
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm(header_s + limits.keep_alive_s, "header_timeout")

        def shutdown(self) -> None:
            if self._direct is not None:  # as uvicorn does for a request under way: answer, then close
                self._direct_last = True
                return
            super().shutdown()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            if self._deadline is not None:  # not left pinning the protocol until it fires
                self._deadline.cancel()
                self._deadline = None
            if self._direct is not None:
                path, self._direct, self._direct_body = self._direct, None, []
                direct.direct_abort(path)  # type: ignore[union-attr]
            super().connection_lost(exc)

    return GuardedProtocol
