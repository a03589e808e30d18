"""The HTTP service kube-scheduler calls: a thin shell around extender.decide.

Handlers read the raw body (bounded), decode with orjson, and reply with exact Go field
names. Client mistakes get 400/413 naming the problem; flowsched's own failures fail open
(every node passes, neutral scores, candidates kept) so they never block scheduling.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender import wire
from extender.decide import (
    NEUTRAL_SCORE,
    Policy,
    ScoreMemo,
    decide_filter,
    decide_preempt,
    decide_prioritize,
    explain,
)
from extender.metrics import Metrics
from extender.settings import Settings
from extender.state import ClusterState

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


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type=JSON)


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


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
    policy = Policy(settings.placement, settings.telemetry_stale_s, settings.gpu_resource)
    limit = settings.max_body_bytes
    prefix = settings.prefix
    memo = ScoreMemo()  # filter's scores, reused by the prioritize call that follows it

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

    def note_unknown(verb: str, count: int, names: list[str]) -> None:
        if count:
            metrics.unknown_nodes.labels(verb).inc(count)
            unknown = [n for n in names if state.slot_of(n) < 0][:5]
            log.warning("%s: %d candidate node(s) not in the snapshot, treated as neutral: %s",
                        verb, count, ", ".join(unknown))

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
        except wire.WireError as e:
            metrics.bad_requests.labels(verb, "shape").inc()
            metrics.requests.labels(verb, "400").inc()
            return 400, orjson.dumps({"error": str(e)})
        except Exception:  # flowsched's own bug: fail open, loudly
            log.exception("%s failed; answering neutrally so scheduling goes on", verb)
            reply, outcome = fallback(decoded), "fallback"
        metrics.requests.labels(verb, outcome).inc()
        body = reply if isinstance(reply, bytes) else orjson.dumps(reply)
        metrics.latency.labels(verb).observe(time.perf_counter() - start)
        return 200, body

    def do_filter(body: Any) -> Any:
        args = wire.parse_extender_args(body)
        ans = decide_filter(state, args, policy, clock(), memo)
        note_unknown("filter", ans.unknown, args.names)
        for reason, count in Counter((*ans.failed.values(), *ans.unresolvable.values())).items():
            metrics.filter_rejections.labels(reason).inc(count)
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
        ready = state.ready
        return _json({"ready": ready, "synced": state.synced, **status()}, 200 if ready else 503)

    @app.get("/metrics")
    async def prom_metrics() -> Response:
        metrics.snapshot_nodes.set(len(state.nodes))
        metrics.snapshot_pods.set(len(state.pods))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/snapshot")
    async def debug_snapshot() -> Response:
        return _json({**state.describe(clock(), settings.telemetry_stale_s), "status": status()})

    @app.get("/debug/explain")
    async def debug_explain(pod: str = "") -> Response:
        ns, _, name = pod.partition("/")
        if not ns or not name:
            return _error(400, "pod: expected namespace/name")
        found = next((p for p in list(state.pods.values()) if p.namespace == ns and p.name == name), None)
        if found is None:
            return _error(404, f"pod {pod} is not in the snapshot")
        return _json({"pod": pod, "gpus": found.requests.gpus,
                      "nodes": explain(state, found, sorted(state.nodes), policy, clock())})

    if settings.debug_telemetry_injection:
        @app.post("/debug/telemetry")
        async def inject_telemetry(request: Request) -> Response:
            body = await decode(request, "debug_telemetry")
            if isinstance(body, Response):
                return body
            if not isinstance(body, dict) or not isinstance(body.get("node"), str) \
                    or not isinstance(body.get("gpu_util"), list):
                return _error(400, "expected {node: str, gpu_util: [pct, ...], fb_free_mib?: [...]}")
            util = [float("nan") if v is None else float(v) for v in body["gpu_util"]]
            fb = [float("nan") if v is None else float(v) for v in body.get("fb_free_mib") or []]
            if not state.set_node_telemetry(body["node"], util, fb, clock()):
                return _error(404, f"node {body['node']} is not in the snapshot")
            return _json({"ok": True})

    for router in routers:
        app.include_router(router)
    verbs = {
        f"{prefix}/filter": ("filter", do_filter, filter_fallback),
        f"{prefix}/prioritize": ("prioritize", do_prioritize, prioritize_fallback),
        f"{prefix}/preempt": ("preempt", do_preempt, preempt_fallback),
    }
    return ExtenderApp(app, verbs, answer, limit, metrics)


_HEADERS = [(b"content-type", JSON.encode())]


class ExtenderApp:
    """ASGI entry: the three verbs are answered here, on the hot path, without FastAPI's
    request/response machinery (~0.4 ms a call); everything else goes to the FastAPI app."""

    def __init__(self, fastapi: FastAPI, verbs: Mapping[str, Verb],
                 answer: Callable[[str, bytes, Callable[[Any], Any], Callable[[Any], Any]], tuple[int, bytes]],
                 limit: int, metrics: Metrics) -> None:
        self.fastapi, self.verbs, self.answer, self.limit, self.metrics = fastapi, verbs, answer, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(scope.get("path", "")) if scope["type"] == "http" else None
        if verb is None:
            await self.fastapi(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self._send(send, 405, orjson.dumps({"error": "use POST"}))
            return
        try:
            raw = await receive_body(scope.get("headers", ()), receive, self.limit)
        except BodyTooLarge:
            self.metrics.bad_requests.labels(verb[0], "too_large").inc()
            self.metrics.requests.labels(verb[0], "413").inc()
            await self._send(send, 413, orjson.dumps({"error": f"request body over {self.limit} bytes"}))
            return
        status, body = self.answer(verb[0], raw, verb[1], verb[2])
        await self._send(send, status, body)

    @staticmethod
    async def _send(send: Send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*_HEADERS, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
