"""The HTTP service kube-scheduler calls: a thin shell around extender.http.verbs.

Handlers read the raw body (bounded), decode with orjson, and reply with exact Go field
names. Client mistakes get 400/413 naming the problem; flowsched's own failures fail open
(every node passes, neutral scores, candidates kept) so they never block scheduling.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import orjson
from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.http import wire
from extender.http.debug import DebugQueryError, DutyCycle, SnapshotQuery, explain_page, snapshot_page
from extender.http.debug_gate import is_debug_path
from extender.http.ratelog import RateLimitedLog
from extender.http.verbs import (
    NEUTRAL_SCORE,
    Policy,
    ScoreMemo,
    decide_filter,
    decide_filter_ranked,
    decide_preempt,
    decide_prioritize,
)
from extender.metrics import Metrics
from extender.settings import Settings
from extender.snapshot.state import ClusterState

log = logging.getLogger("flowsched.extender")

JSON = "application/json"


Verb = tuple[str, Callable[[Any], Any], Callable[[Any], Any]]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


async def receive_body(headers: Iterable[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    """The request body off an ASGI receive channel; BodyTooLarge past limit (declared or read).

    A client that disconnects mid-body gets b"" (its answer goes nowhere anyway)."""
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_body(request: Request, limit: int) -> bytes:
    return await receive_body(request.headers.raw, request.receive, limit)


LOG_FIELD_CHARS = 80  # client-supplied text in a log line is cut to this (a name is at most 253)


def _clip(text: str, limit: int = LOG_FIELD_CHARS) -> str:
    """Client text fit for a log line: repr (no control characters), at most limit characters."""
    shown = repr(text[: limit + 1])
    return shown if len(text) <= limit else f"{shown[:limit]}…(+{len(text) - limit} chars)"


def _first_unknown(state: ClusterState, names: list[str], most: int = 5) -> list[str]:
    view = state.read()
    out: list[str] = []
    for n in names:
        if view.slot_of(n) < 0:
            out.append(_clip(n))
            if len(out) == most:
                break
    return out


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type=JSON)


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


def _samples(values: list[Any], field: str, high: float) -> tuple[list[float], str]:
    """Injected telemetry samples: null is NaN (unknown); anything else must be a number in 0..high.

    Returns the floats and "" or, for the first bad entry, the 400's message. Infinity (read as
    "no sample") or a string there used to be stored or to raise (a 500).
    """
    out: list[float] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            return [], f"{field}[{i}]: expected a number or null"
        try:
            x = float(v)
        except OverflowError:
            x = math.inf
        if not 0.0 <= x <= high or not math.isfinite(x):
            return [], f"{field}[{i}]: expected a finite number in 0..{high:g}"
        out.append(x)
    return out, ""


def build_app(
    settings: Settings,
    state: ClusterState,
    metrics: Metrics,
    *,
    clock: Callable[[], float] = time.time,
    status: Callable[[], dict[str, Any]] = dict,
    routers: Iterable[APIRouter] = (),
) -> ExtenderApp:
    app = FastAPI(title="flowsched extender", docs_url=None, redoc_url=None, openapi_url=None)
    policy = Policy(settings.placement, settings.telemetry_stale_s, settings.gpu_resource, settings.rank_margin,
                    settings.rank_keep)
    limit = settings.verb_max_body_bytes
    prefix = settings.prefix
    memo = ScoreMemo()  # filter's scores, reused by the prioritize call that follows it
    debug_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowsched-debug")

    async def decode(request: Request, verb: str) -> Any | Response:
        try:
            body = await read_body(request, limit)
        except BodyTooLarge:
            metrics.bad_requests.labels(verb, "too_large").inc()
            return _error(413, f"request body over {limit} bytes")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            metrics.bad_requests.labels(verb, "json").inc()
            return _error(400, f"malformed JSON: {e}")

    unknown_log = RateLimitedLog(log)  # the client names them: one line per verb every 10 s

    def note_unknown(verb: str, count: int, names: list[str]) -> None:
        if count:
            metrics.unknown_nodes.labels(verb).inc(count)
            unknown_log.note(verb, "%s: %d candidate node(s) not in the snapshot, treated as neutral: %s",
                             verb, count, ", ".join(_first_unknown(state, names)))

    # The metric children the verbs update on every call, looked up once (labels() builds a key
    # and takes a lock each time; with the caches cold, as between kube-scheduler's calls, the
    # lookups cost ~40 us a call).
    children: dict[tuple[str, str], tuple[Any, Any]] = {}
    rejection_counters: dict[str, Any] = {}

    def answer(verb: str, raw: bytes, work: Callable[[Any], Any], fallback: Callable[[Any], Any]
               ) -> tuple[int, bytes]:
        """One verb call: status and JSON body. Client mistakes are 400; our own bugs fail open."""
        start = time.perf_counter()
        try:
            decoded = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            metrics.bad_requests.labels(verb, "json").inc()
            metrics.requests.labels(verb, "400").inc()
            return 400, orjson.dumps({"error": f"malformed JSON: {e}"})
        try:
            reply = work(decoded)
            outcome = "200"
        except wire.WireTooLarge as e:  # more than kube-scheduler sends: refused before the work
            metrics.bad_requests.labels(verb, "too_large").inc()
            metrics.requests.labels(verb, "413").inc()
            return 413, orjson.dumps({"error": str(e)})
        except wire.WireError as e:
            metrics.bad_requests.labels(verb, "shape").inc()
            metrics.requests.labels(verb, "400").inc()
            return 400, orjson.dumps({"error": str(e)})
        except Exception:  # flowsched's own bug: fail open, loudly
            log.exception("%s failed; answering neutrally so scheduling goes on", verb)
            try:
                reply, outcome = fallback(decoded), "fallback"
            except Exception as e:  # the request cannot even be read back: it is the client's
                metrics.bad_requests.labels(verb, "shape").inc()
                metrics.requests.labels(verb, "400").inc()
                return 400, orjson.dumps({"error": f"cannot read request: {_clip(str(e))}"})
        counted = children.get((verb, outcome))
        if counted is None:
            counted = children[(verb, outcome)] = (metrics.requests.labels(verb, outcome), metrics.latency.labels(verb))
        counted[0].inc()
        body = reply if isinstance(reply, bytes) else orjson.dumps(reply)
        counted[1].observe(time.perf_counter() - start)
        return 200, body

    def do_filter(body: Any, ranked: bool = False) -> Any:
        args = wire.parse_extender_args(body)
        if ranked:
            ans = decide_filter_ranked(state, args, policy, clock())
        else:
            ans = decide_filter(state, args, policy, clock(), memo)
        note_unknown("filter", ans.unknown, args.names)
        for reason, count in ans.rejected.items():
            rejections = rejection_counters.get(reason)
            if rejections is None:
                rejections = rejection_counters[reason] = metrics.filter_rejections.labels(reason)
            rejections.inc(count)
        return wire.filter_result(args, ans.passed, ans.failed, ans.unresolvable)

    def filter_fallback(body: Any) -> Any:
        args = wire.parse_extender_args(body)
        return wire.filter_result(args, args.names, {}, {})

    def do_prioritize(body: Any) -> Any:
        args = wire.parse_extender_args(body)
        ans = decide_prioritize(state, args, policy, clock(), memo)
        note_unknown("prioritize", ans.unknown, args.names)
        return wire.encode_host_priority_list(ans.names, ans.scores)

    def prioritize_fallback(body: Any) -> Any:
        names = wire.parse_extender_args(body).names
        return wire.host_priority_list(names, [NEUTRAL_SCORE] * len(names))

    def do_preempt(body: Any) -> Any:
        args = wire.parse_preemption_args(body)
        kept = decide_preempt(state, args)
        metrics.preempt_dropped.inc(len(args.victims) - len(kept))
        return wire.preemption_result(kept)

    def preempt_fallback(body: Any) -> Any:
        return wire.preemption_result(wire.parse_preemption_args(body).victims)

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"ok": True})

    @app.get("/readyz")
    async def readyz() -> Response:
        # Public (probes, anyone who reaches the port): no error texts, which name apiserver URLs.
        full = status()
        store = full.get("progress_store") or {"ok": True}
        ready = state.read().ready and bool(store.get("ok", True))
        watch = {kind: {k: w.get(k) for k in ("connected", "errors", "relists")}
                 for kind, w in (full.get("watch") or {}).items()}
        return _json({"ready": ready, "synced": dict(state.read().synced()), "watch": watch,
                      "progress_store": store, "kube": full.get("kube")}, 200 if ready else 503)

    @app.get("/debug/status")
    async def debug_status() -> Response:
        return _json({"ready": state.read().ready, "synced": dict(state.read().synced()), **status()})

    @app.get("/metrics")
    async def prom_metrics() -> Response:
        counts = state.read().counts()
        metrics.snapshot_nodes.set(counts["nodes"])
        metrics.snapshot_pods.set(counts["pods"])
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def off_loop(fn: Callable[[], Any]) -> bytes:
        # One thread for every debug call: they queue behind each other and never block the loop.
        return await asyncio.get_running_loop().run_in_executor(
            debug_pool, lambda: orjson.dumps(fn(), option=orjson.OPT_SERIALIZE_NUMPY))

    page_max = settings.debug_page_limit

    @app.get("/debug/snapshot")
    async def debug_snapshot(kind: str = "", namespace: str = "", node: str = "", after: str = "",
                             limit: int = page_max) -> Response:
        try:
            q = SnapshotQuery.parse(kind, namespace, node, after, limit, page_max)
        except DebugQueryError as e:
            return _error(400, str(e))
        st = status()  # small; read here, on the loop, like /readyz
        body = await off_loop(lambda: {**snapshot_page(state, q, clock(), settings.telemetry_stale_s, DutyCycle()),
                                       "status": st})
        return Response(body, media_type=JSON)

    @app.get("/debug/explain")
    async def debug_explain(pod: str = "", node: str = "", after: str = "", limit: int = page_max) -> Response:
        ns, _, name = pod.partition("/")
        if not ns or not name:
            return _error(400, "pod: expected namespace/name")
        if not 1 <= limit <= page_max:
            return _error(400, f"limit: expected 1..{page_max}")
        nodes = [node] if node else []
        # Its job's bottleneck, when diagnosis runs (extender/control/bottleneck.py): why it is slow.
        diagnosed = (status().get("diagnosis") or {}).get("jobs") or {}

        def page() -> dict[str, Any] | None:
            found = explain_page(state, pod, nodes, after, limit, policy, clock(), DutyCycle())
            return found if found is None else {**found, "bottleneck": diagnosed.get(found["job"])}

        body = await off_loop(page)
        if body == b"null":
            return _error(404, f"pod {_clip(pod)} is not in the snapshot")
        return Response(body, media_type=JSON)

    if settings.debug_telemetry_injection:
        @app.post("/debug/telemetry")
        async def inject_telemetry(request: Request) -> Response:
            body = await decode(request, "debug_telemetry")
            if isinstance(body, Response):
                return body
            if not isinstance(body, dict) or not isinstance(body.get("node"), str) \
                    or not isinstance(body.get("gpu_util"), list):
                return _error(400, "expected {node: str, gpu_util: [pct, ...], fb_free_mib?: [...]}")
            fb_raw = body.get("fb_free_mib")
            if fb_raw is not None and not isinstance(fb_raw, list):
                return _error(400, "fb_free_mib: expected a list or null")
            util, bad = _samples(body["gpu_util"], "gpu_util", 100.0)
            fb, bad_fb = _samples(fb_raw or [], "fb_free_mib", math.inf)
            if bad or bad_fb:
                return _error(400, bad or bad_fb)
            if not state.set_node_telemetry(body["node"], util, fb, clock()):
                return _error(404, f"node {body['node']} is not in the snapshot")
            return _json({"ok": True})

    for router in routers:
        app.include_router(router)
    verbs = {
        f"{prefix}/filter": ("filter", do_filter, filter_fallback),
        # Filter-only mode (docs/hot-path.md): one call per pod, the filter also ranks.
        f"{prefix}/filter-ranked": ("filter", lambda body: do_filter(body, ranked=True), filter_fallback),
        f"{prefix}/prioritize": ("prioritize", do_prioritize, prioritize_fallback),
        f"{prefix}/preempt": ("preempt", do_preempt, preempt_fallback),
    }
    return ExtenderApp(app, verbs, answer, limit, metrics, max_in_flight=settings.max_concurrent_requests,
                       debug_access=settings.debug_access)


_HEADERS = [(b"content-type", JSON.encode())]
_BUSY_HEADERS = [*_HEADERS, (b"retry-after", b"1"), (b"connection", b"close")]
Reply = tuple[int, bytes, Sequence[tuple[bytes, bytes]]]  # status, body, headers but content-length


_PROBES = frozenset({"/healthz", "/readyz"})  # never refused for load: a refused probe restarts the pod

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


_CLIENT_BUSY = b'{"error":"too many requests in flight from this client; retry"}'
_CLIENT_RATE = b'{"error":"too many requests from this client; retry"}'
_UNRATED = frozenset({"/healthz", "/readyz", "/webhook/gate"})  # probes; the apiserver's pod creations


class PeerRate:
    """A token bucket per peer address: `rate_per_s` requests a second, bursts of twice that.
    A closed loop of cheap tenant requests otherwise takes as much of the process's CPU (and GIL)
    as it can, which the verbs' loop then waits for (issue 33, figures in docs/hardening.md)."""

    def __init__(self, rate_per_s: float, peers: int = 4096) -> None:
        self.rate, self.burst, self.peers = rate_per_s, 2.0 * rate_per_s, peers
        self._buckets: dict[str, tuple[float, float]] = {}  # peer -> (tokens, refilled)

    def take(self, peer: str, now: float) -> bool:
        tokens, refilled = self._buckets.get(peer, (self.burst, now))
        tokens = min(self.burst, tokens + (now - refilled) * self.rate)
        if len(self._buckets) >= self.peers and peer not in self._buckets:
            self._buckets.clear()
        took = tokens >= 1.0
        self._buckets[peer] = (tokens - 1.0 if took else tokens, now)
        return took
_ELSEWHERE = {
    "verbs": b'{"error":"this port serves kube-scheduler\'s verbs only; the API is on api_port"}',
    "api": b'{"error":"the extender verbs are served on port, for kube-scheduler alone"}',
}


class ExtenderApp:
    """ASGI entry: the verbs are answered here, on the hot path, without FastAPI's
    request/response machinery (~0.4 ms a call); everything else goes to the FastAPI app.
    Under `flowsched serve` the verbs do not even take the ASGI route: the HTTP protocol calls
    the direct_* methods below (extender.http.server.DirectApp), which answer with the same
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
        self.per_client: int | None = None  # the most slots one peer address may hold
        self.rate: PeerRate | None = None  # requests a second per peer address
        self._by_client: dict[str, int] = {}  # peer address -> its requests in flight (per_client set)
        self.activity = activity if activity is not None else VerbActivity()

    def listener(self, serves: Serves, max_in_flight: int | None = None, per_client: int | None = None,
                 rate_per_client_s: float | None = None) -> ExtenderApp:
        """A view for one port: the same app, its own in-flight cap, only the paths `serves` names;
        per_client: the most of its slots one peer address may hold, rate_per_client_s the
        requests a second it may send (None: no such cap)."""
        view = ExtenderApp(self.fastapi, self.verbs, self.answer, self.limit,
                           self.metrics, max_in_flight=max_in_flight or self.max_in_flight,
                           debug_access="open" if self.debug_open else "loopback", serves=serves,
                           activity=self.activity)
        view.per_client = per_client
        view.rate = PeerRate(rate_per_client_s) if rate_per_client_s else None
        return view

    @property
    def verbs_in_flight(self) -> int:
        return self.activity.in_flight

    def _elsewhere(self, path: str) -> bool:
        """A path this listener does not serve (another port does)."""
        if self.serves == "all" or path in _PROBES:
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
            await self._send(send, 404, _ELSEWHERE[self.serves])
            return
        if not self.debug_open and is_debug_path(path) and not is_loopback(scope.get("client")):
            await self._send(send, 403, orjson.dumps(
                {"error": "/debug/*, /ui and /docs answer only on loopback (kubectl port-forward); "
                          "see debug_access"}))
            return
        if self.in_flight >= self.max_in_flight and path not in _PROBES:
            self.metrics.requests.labels("any", "503").inc()
            await self._send(send, 503, orjson.dumps({"error": "too many requests in flight; retry"}),
                             _BUSY_HEADERS[1:])
            return
        peer = ""
        if self.rate is not None and path not in _UNRATED:
            client = scope.get("client")
            if not self.rate.take(str(client[0]) if client else "?", time.monotonic()):
                self.metrics.requests.labels("any", "429").inc()
                await self._send(send, 429, _CLIENT_RATE, [(b"retry-after", b"1")])
                return
        if self.per_client is not None and path not in _PROBES:
            client = scope.get("client")
            peer = str(client[0]) if client else "?"
            held = self._by_client.get(peer, 0)
            if held >= self.per_client:  # a few clients' slow connections cannot take every slot
                self.metrics.requests.labels("any", "503").inc()
                await self._send(send, 503, _CLIENT_BUSY, _BUSY_HEADERS[1:])
                return
            self._by_client[peer] = held + 1
        self.in_flight += 1
        try:
            await self._route(path, scope, receive, send)
        finally:
            self.in_flight -= 1
            if peer:
                left = self._by_client[peer] - 1
                if left:
                    self._by_client[peer] = left
                else:
                    del self._by_client[peer]

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

    # ---- the direct path (extender.http.server.DirectApp): the verbs answered from the HTTP
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
            return 503, orjson.dumps({"error": "too many requests in flight; retry"}), _BUSY_HEADERS
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
