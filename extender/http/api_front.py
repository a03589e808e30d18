"""The API port's front: a process of its own in front of everything tenants call (DESIGN.md §12).

Every connection to `api_port` is accepted, parsed and bounded here (the head, body and
keep-alive deadlines, the connection cap, no upgrades, backpressure: extender.http.server), and
the per-peer budgets applied (extender.http.admission); only requests that pass reach the
verbs' process, over a Unix socket (extender.http.upstream), where the progress store, the
cluster state and the report book live. A header flood, 1,100 upgrade attempts or a closed loop
of job reads now spends this process's CPU and GIL, not the one kube-scheduler waits on
(issue 33: two event loops in one process still moved the verbs' p99 6-40x).

Started by `flowsched serve` (extender.http.front_process) with the API port's listening
socket already bound; runs at a lower CPU priority (`api_nice`) so that, on a busy node, the
verbs' process wins the CPU. Exits when its parent is gone.

    python -m extender.http.api_front --listen-fd N --ready-fd M --config JSON
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson

from extender.http.admission import BUSY, CLIENT_BUSY, CLIENT_RATE, ELSEWHERE, PROBES, UNRATED, ClientSlots, PeerRate
from extender.http.body import BodyTooLarge, ClientGone, Receive, Scope, Send, receive_whole_body
from extender.http.front_counts import RefusalTally
from extender.http.progress_wire import CHECKED_FORM, MAX_POINTS_PER_REQUEST, BadReport, check_report, encode_checked
from extender.http.ratelog import RateLimitedLog
from extender.http.reply_cache import Key, ReplyCache, cache_key, storable
from extender.http.server import FlowschedServer, server_config
from extender.http.server_limits import ServerLimits
from extender.http.upstream import Answer, Upstream, UpstreamError

log = logging.getLogger("flowsched.front")


_JSON = [(b"content-type", b"application/json")]
PROGRESS_PATH = "/v1/progress"
_RETRY = [(b"retry-after", b"1")]


@dataclass(frozen=True)
class FrontConfig:
    """What the front needs of the settings; passed to its process as JSON."""

    uds: str  # the verbs' process's socket for forwarded requests
    limits: ServerLimits
    max_in_flight: int
    per_client: int
    rate_per_client_s: float
    max_body_bytes: int  # the largest body any API route reads; larger ones get 413 here
    verb_paths: tuple[str, ...]  # answered 404 here: they live on `port`
    log_level: str = "info"
    loop: str = "auto"
    nice: int = 10
    # A peer past its rate gets its 429 after this (its Retry-After): a client looping on 429s
    # otherwise spends as much CPU as the front can answer (16 readers: ~5,000 a second).
    refusal_delay_s: float = 1.0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    reserved_fds: int = 0
    # A job read's 200 is kept here this long (the verbs' process's own replies may be as old:
    # job_reply_ttl_s) and repeats answered without forwarding (finding 13); 0: none kept.
    job_reply_ttl_s: float = 1.0
    reply_cache_bytes: int = 32 << 20
    # POST /v1/progress is parsed and checked here and forwarded in its checked form
    # (extender.http.progress_wire): the verbs' process then only slices and stores (finding 7).
    progress_max_body_bytes: int = 1 << 20
    progress_max_points: int = MAX_POINTS_PER_REQUEST

    def to_json(self) -> str:
        return orjson.dumps(dataclasses.asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> FrontConfig:
        raw = orjson.loads(text)
        raw["limits"] = ServerLimits(**raw["limits"])
        raw["verb_paths"] = tuple(raw["verb_paths"])
        return cls(**raw)


class FrontApp:
    """ASGI: the API port's admission, then the request carried to the verbs' process."""

    def __init__(self, config: FrontConfig, upstream: Upstream, tally: RefusalTally | None = None) -> None:
        self.config, self.upstream = config, upstream
        self.tally = tally or RefusalTally(None)  # its own answers, for the verbs' process's /metrics
        self.verb_paths = frozenset(config.verb_paths)
        self.in_flight = 0
        self.rate = PeerRate(config.rate_per_client_s)
        self.slots = ClientSlots(config.per_client)
        self.events = RateLimitedLog(log)
        self.replies = ReplyCache(config.job_reply_ttl_s, config.reply_cache_bytes)
        # A kept reply's key -> the forward under way for it: readers arriving as it expires wait
        # for that one answer rather than each sending the verbs' process the same read.
        self.fetching: dict[Key, asyncio.Future[Answer]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path in self.verb_paths:
            self.tally.note(404, "verb_path")
            await _send(send, 404, ELSEWHERE["api"])
            return
        probe = path in PROBES
        if self.in_flight >= self.config.max_in_flight and not probe:
            self.events.note("busy", "%d requests in flight: answered 503", self.in_flight)
            self.tally.note(503, "busy")
            await _send(send, 503, BUSY, _RETRY)
            return
        client = scope.get("client")
        peer = str(client[0]) if client else "?"
        if path not in UNRATED and not self.rate.take(peer, time.monotonic()):
            self.events.note("rate", "a peer past api_rate_per_client_s: answered 429 (client %s)", peer)
            self.tally.note(429, "client_rate")
            await asyncio.sleep(self.config.refusal_delay_s)
            await _send(send, 429, CLIENT_RATE, _RETRY)
            return
        if not probe and not self.slots.take(peer):
            self.events.note("client_busy", "a peer past max_in_flight_per_client: answered 503 (client %s)", peer)
            self.tally.note(503, "client_busy")
            await _send(send, 503, CLIENT_BUSY, _RETRY)
            return
        self.in_flight += 1
        try:
            await self._forward(scope, receive, send, peer)
        finally:
            self.in_flight -= 1
            if not probe:
                self.slots.give_back(peer)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, peer: str) -> None:
        try:
            body = await receive_whole_body(scope.get("headers", ()), receive, self.config.max_body_bytes)
        except ClientGone:
            return  # the client went mid-body: nothing to carry across
        except BodyTooLarge:
            self.tally.note(413, "body_too_large")
            await _send(send, 413, orjson.dumps({"error": f"request body over {self.config.max_body_bytes} bytes"}))
            return
        query = scope.get("query_string") or b""
        target = (scope.get("raw_path") or scope["path"].encode()) + (b"?" + query if query else b"")
        form = None
        if scope["method"] == "POST" and scope["path"] == PROGRESS_PATH:
            body, form = self._checked_report(body), CHECKED_FORM.encode()
        key = cache_key(scope["method"], target, scope["headers"]) if not body else None
        if key is not None:
            kept = self.replies.get(key, time.monotonic())
            if kept is None and key in self.fetching:
                with contextlib.suppress(UpstreamError):
                    status, headers, out = await asyncio.shield(self.fetching[key])
                    kept = (headers, out) if storable(status, headers) else None
            if kept is not None:
                await _reply(send, 200, *kept)
                return
        try:
            status, headers, out = await self._fetch(key, scope["method"], target, scope["headers"], body, peer, form)
        except UpstreamError as e:
            self.events.note("upstream", "could not forward a request: %s", e)
            self.tally.note(503, "upstream")
            await _send(send, 503, b'{"error":"flowsched is restarting; retry"}', _RETRY)
            return
        await _reply(send, status, headers, out)

    def _checked_report(self, body: bytes) -> bytes:
        """The report's checked form, or its refusal's (forwarded all the same: the verbs'
        process checks the token first, and counts the answer)."""
        if len(body) > self.config.progress_max_body_bytes:
            return encode_checked(BadReport(413, f"body over {self.config.progress_max_body_bytes} bytes"))
        try:
            return encode_checked(check_report(body, self.config.progress_max_points))
        except BadReport as e:
            return encode_checked(e)

    async def _fetch(self, key: Key | None, method: str, target: bytes, headers: list[tuple[bytes, bytes]],
                     body: bytes, peer: str, form: bytes | None = None) -> Answer:
        if key is None:
            return await self.upstream.request(method, target, headers, body, peer, form)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.fetching[key] = future
        try:
            answer = await self.upstream.request(method, target, headers, body, peer)
        except BaseException as e:
            future.set_exception(e if isinstance(e, UpstreamError) else UpstreamError("forward cancelled"))
            future.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            self.fetching.pop(key, None)
        if storable(answer[0], answer[1]):
            self.replies.put(key, answer[1], answer[2], time.monotonic())
        future.set_result(answer)
        return answer


async def _reply(send: Send, status: int, headers: list[tuple[bytes, bytes]], out: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


async def _send(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class FrontServer(FlowschedServer):
    """Tells its parent when it listens (one byte on ready_fd), and exits once the parent is gone
    (outside a pod nothing else would stop it, and it would hold the port)."""

    def __init__(self, config: Any, ready_fd: int | None, tally: RefusalTally | None = None) -> None:
        super().__init__(config)
        self.ready_fd, self.tally = ready_fd, tally
        self.parent = os.getppid()

    async def on_tick(self, counter: int) -> bool:
        if self.ready_fd is not None and self.started:
            with contextlib.suppress(OSError):  # a restart's parent does not wait for the byte
                os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)
            self.ready_fd = None
        if self.tally is not None and counter % 10 == 0:  # ticks are 0.1 s apart
            self.tally.flush()
        if os.getppid() != self.parent and not self.should_exit:
            log.error("flowsched's verbs process is gone; the API front exits")
            self.should_exit = True
        return await super().on_tick(counter)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flowsched-api-front")
    ap.add_argument("--listen-fd", type=int, required=True)
    ap.add_argument("--ready-fd", type=int)
    ap.add_argument("--counts-fd", type=int, help="where the front's own refusals are counted (front_counts)")
    ap.add_argument("--config", required=True)
    ns = ap.parse_args(argv)
    config = FrontConfig.from_json(ns.config)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.nice:
        os.nice(config.nice)  # the verbs' process wins the CPU on a busy node
    sock = socket.socket(fileno=ns.listen_fd)
    tally = RefusalTally(ns.counts_fd)
    app = FrontApp(config, Upstream(config.uds, timeout_s=60.0), tally)
    uv = server_config(app, host="", port=0, limits=config.limits, log_level=config.log_level, loop=config.loop,
                       lifespan="off", reserved_fds=config.reserved_fds,
                       ssl_certfile=config.tls_cert_file, ssl_keyfile=config.tls_key_file)
    server = FrontServer(uv, ns.ready_fd, tally)
    server.run(sockets=[sock])
    tally.close()  # the last counts, before the parent reads the pipe's end
    app.upstream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
