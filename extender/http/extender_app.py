"""ExtenderApp, the ASGI entry of every listener: the verbs answered on the hot path (and from the
protocol itself, extender.http.direct), the in-flight and per-peer guards, the debug gate, and
which paths each port serves (DESIGN.md §12); everything else goes to the FastAPI app."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import orjson
from fastapi import FastAPI

from extender.http.admission import BUSY, CLIENT_BUSY, CLIENT_RATE, ELSEWHERE, PROBES, UNRATED, ClientSlots, PeerRate
from extender.http.body import BodyTooLarge, Receive, Scope, Send, receive_body
from extender.http.debug_gate import is_debug_path
from extender.metrics import Metrics

Verb = tuple[str, Callable[[Any], Any], Callable[[Any], Any]]  # metric name, work, fail-open fallback

_HEADERS = [(b"content-type", b"application/json")]
_BUSY_HEADERS = [*_HEADERS, (b"retry-after", b"1"), (b"connection", b"close")]
Reply = tuple[int, bytes, Sequence[tuple[bytes, bytes]]]  # status, body, headers but content-length


# Which paths a listener answers (DESIGN.md §12): "verbs" is kube-scheduler's port (the verbs and
# the probes), "api" every tenant's (all the rest and the probes), "all" both (in-process clients).
Serves = Literal["all", "verbs", "api"]


def is_loopback(client: Any) -> bool:
    """Whether an ASGI scope's client address is 127.0.0.0/8 or ::1."""
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except (TypeError, ValueError, IndexError):
        return False


class VerbActivity:
    """The verbs being answered, for the watch threads' wait_quiet; one per app, shared by its
    listeners (the verbs are answered on one event loop only)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._quiet = threading.Event()  # set when the last verb in flight is answered, if waited for
        self._quiet_wanted = False

    def begin(self) -> None:
        self.in_flight += 1

    def done(self) -> None:
        self.in_flight -= 1
        if self._quiet_wanted and not self.in_flight:
            self._quiet_wanted = False
            self._quiet.set()

    def wait_quiet(self, timeout_s: float) -> None:
        if not self.in_flight:
            return
        self._quiet.clear()
        self._quiet_wanted = True
        if self.in_flight:  # not answered between the first check and the flag
            self._quiet.wait(timeout_s)
        self._quiet_wanted = False


class ExtenderApp:
    """ASGI entry: the verbs are answered here, on the hot path, without FastAPI's
    request/response machinery (~0.4 ms a call); everything else goes to the FastAPI app.
    Under `flowsched serve` the verbs do not even take the ASGI route: the HTTP protocol calls
    the direct_* methods below (extender.http.direct.DirectApp), which answer with the same
    guards, bytes and metrics; the ASGI route serves in-process clients (tests, benchmarks).

    Two guards sit in front of everything: at most max_in_flight requests at once (more get 503
    at once, so a flood of large bodies cannot take the memory), and the debug class of paths
    (extender.http.debug_gate: /debug/*, /ui, /docs) only from loopback unless debug_access is "open".

    `flowsched serve` runs two listeners, each on a view of its own (listener()): the same
    routes and answers, its own in-flight count, and only the paths its port serves."""

    def __init__(self, fastapi: FastAPI, verbs: Mapping[str, Verb],
                 answer: Callable[[str, bytes, Callable[[Any], Any], Callable[[Any], Any]], tuple[int, bytes]],
                 limit: int, metrics: Metrics, *, max_in_flight: int = 64, debug_access: str = "loopback",
                 serves: Serves = "all", activity: VerbActivity | None = None) -> None:
        self.fastapi, self.verbs, self.answer, self.limit, self.metrics = fastapi, verbs, answer, limit, metrics
        self.max_in_flight, self.debug_open = max_in_flight, debug_access == "open"
        self.serves: Serves = serves
        self.in_flight = 0  # this listener's alone: another port's clients cannot take its slots
        self.per_client: ClientSlots | None = None  # the most slots one peer address may hold
        self.rate: PeerRate | None = None  # requests a second per peer address
        self.activity = activity if activity is not None else VerbActivity()
        self.live_checks: dict[str, Callable[[], bool]] = {}  # name -> up? (/healthz, /readyz)

    def listener(self, serves: Serves, max_in_flight: int | None = None, per_client: int | None = None,
                 rate_per_client_s: float | None = None) -> ExtenderApp:
        """A view for one port: the same app, its own in-flight cap, only the paths `serves` names;
        per_client: the most of its slots one peer address may hold, rate_per_client_s the
        requests a second it may send (None: no such cap)."""
        view = ExtenderApp(self.fastapi, self.verbs, self.answer, self.limit,
                           self.metrics, max_in_flight=max_in_flight or self.max_in_flight,
                           debug_access="open" if self.debug_open else "loopback", serves=serves,
                           activity=self.activity)
        view.per_client = ClientSlots(per_client) if per_client else None
        view.live_checks = self.live_checks
        view.rate = PeerRate(rate_per_client_s) if rate_per_client_s else None
        return view

    @property
    def verbs_in_flight(self) -> int:
        return self.activity.in_flight

    def _elsewhere(self, path: str) -> bool:
        """A path this listener does not serve (another port does)."""
        if self.serves == "all" or path in PROBES:
            return False
        if self.serves == "verbs":
            return path not in self.verbs
        return path in self.verbs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fastapi(scope, receive, send)  # lifespan (the listener that runs it)
            return
        path = scope.get("path", "")
        if self._elsewhere(path):
            await self._send(send, 404, ELSEWHERE[self.serves])
            return
        if not self.debug_open and is_debug_path(path) and not is_loopback(scope.get("client")):
            await self._send(send, 403, orjson.dumps(
                {"error": "/debug/*, /ui and /docs answer only on loopback (kubectl port-forward); "
                          "see debug_access"}))
            return
        if self.in_flight >= self.max_in_flight and path not in PROBES:
            self.metrics.requests.labels("any", "503").inc()
            await self._send(send, 503, BUSY,
                             _BUSY_HEADERS[1:])
            return
        peer = ""
        if self.rate is not None and path not in UNRATED:
            client = scope.get("client")
            if not self.rate.take(str(client[0]) if client else "?", time.monotonic()):
                self.metrics.requests.labels("any", "429").inc()
                await self._send(send, 429, CLIENT_RATE, [(b"retry-after", b"1")])
                return
        if self.per_client is not None and path not in PROBES:
            client = scope.get("client")
            peer = str(client[0]) if client else "?"
            if not self.per_client.take(peer):  # a few clients' slow connections cannot take every slot
                self.metrics.requests.labels("any", "503").inc()
                await self._send(send, 503, CLIENT_BUSY, _BUSY_HEADERS[1:])
                return
        self.in_flight += 1
        try:
            await self._route(path, scope, receive, send)
        finally:
            self.in_flight -= 1
            if peer and self.per_client is not None:
                self.per_client.give_back(peer)

    async def _route(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(path)
        if verb is None:
            await self.fastapi(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self._send(send, 405, orjson.dumps({"error": "use POST"}))
            return
        self.activity.begin()
        try:
            try:
                raw = await receive_body(scope.get("headers", ()), receive, self.limit)
            except BodyTooLarge:
                await self._send(send, *self._too_large(verb)[:2])
                return
            status, body = self.answer(verb[0], raw, verb[1], verb[2])
        finally:
            self._verb_done()
        await self._send(send, status, body)

    def _too_large(self, verb: Verb) -> Reply:
        self.metrics.bad_requests.labels(verb[0], "too_large").inc()
        self.metrics.requests.labels(verb[0], "413").inc()
        return 413, orjson.dumps({"error": f"request body over {self.limit} bytes"}), _HEADERS

    def _verb_done(self) -> None:
        self.activity.done()

    def wait_quiet(self, timeout_s: float) -> None:
        """For the watch threads: return once no verb is being answered, or after timeout_s.
        The event loop wakes the waiter when it answers (no polling); with no verb in flight
        this returns at once."""
        self.activity.wait_quiet(timeout_s)

    # ---- the direct path (extender.http.direct.DirectApp): the verbs answered from the HTTP
    # protocol itself, without an ASGI cycle; the same guards, answers and metrics as above.
    @property
    def direct_paths(self) -> frozenset[str]:
        return frozenset() if self.serves == "api" else frozenset(self.verbs)

    @property
    def direct_max_body(self) -> int:
        return self.limit

    def direct_begin(self, path: str, headers: Sequence[tuple[bytes, bytes]]) -> Reply | None:
        """A POST to a verb, its headers in: 503 past max_in_flight, 413 past the declared
        length, else None (admitted: counted in flight until answered or aborted)."""
        if self.in_flight >= self.max_in_flight:
            self.metrics.requests.labels("any", "503").inc()
            return 503, BUSY, _BUSY_HEADERS
        for name, value in headers:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return self._too_large(self.verbs[path])
        self.in_flight += 1
        self.activity.begin()
        return None

    def direct_answer(self, path: str, body: bytes) -> Reply:
        verb = self.verbs[path]
        try:
            status, out = self.answer(verb[0], body, verb[1], verb[2])
        finally:
            self.in_flight -= 1
            self._verb_done()
        return status, out, _HEADERS

    def direct_too_large(self, path: str) -> Reply:
        self.in_flight -= 1
        self._verb_done()
        return self._too_large(self.verbs[path])

    def direct_abort(self, path: str) -> None:
        self.in_flight -= 1
        self._verb_done()

    @staticmethod
    async def _send(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*_HEADERS, (b"content-length", str(len(body)).encode()), *(extra or [])]})
        await send({"type": "http.response.body", "body": body})
