"""The HTTP service's routes: the verbs (a thin shell around extender.http.verbs), the probes,
/metrics and the debug pages, built into an ExtenderApp (extender.http.extender_app).

Handlers read the raw body (bounded), decode with orjson, and reply with exact Go field
names. Client mistakes get 400/413 naming the problem; flowsched's own failures fail open
(every node passes, neutral scores, candidates kept) so they never block scheduling.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.http import wire
from extender.http.body import BodyTooLarge, read_body
from extender.http.debug import DebugQueryError, DutyCycle, SnapshotQuery, explain_page, snapshot_page
from extender.http.extender_app import ExtenderApp
from extender.http.gpu_type_gate import TypeGate
from extender.http.ratelog import RateLimitedLog
from extender.http.verbs import (
    NEUTRAL_SCORE,
    FilterAnswer,
    Policy,
    ScoreMemo,
    ask_of,
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
    type_gate: TypeGate | None = None,  # mixed GPU types: the filter keeps a job on one (gpu_type_gate.py)
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

        def decide(a: wire.ExtenderArgs) -> FilterAnswer:
            return decide_filter_ranked(state, a, policy, clock()) if ranked else decide_filter(
                state, a, policy, clock(), memo)

        if type_gate is not None and type_gate.plan().typed:  # a job's pods on one GPU type
            ans = type_gate.filter(lambda names: decide(wire.ExtenderArgs(args.pod, names, None)), state, args.pod,
                                   ask_of(args.pod, policy.gpu_resource, state.read()).demand.gpus, args.names,
                                   clock())
        else:
            ans = decide(args)
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

    # Parts outside this event loop that must be up (the API port's front process): /healthz and
    # /readyz say 503 while one is down, on both ports.
    live_checks: dict[str, Callable[[], bool]] = {}

    def down() -> list[str]:
        return [name for name, up in live_checks.items() if not up()]

    @app.get("/healthz")
    async def healthz() -> Response:
        gone = down()
        return _json({"ok": True} if not gone else {"ok": False, "down": gone}, 503 if gone else 200)

    @app.get("/readyz")
    async def readyz() -> Response:
        # Public (probes, anyone who reaches the port): no error texts, which name apiserver URLs.
        full = status()
        store = full.get("progress_store") or {"ok": True}
        gone = down()
        ready = state.read().ready and bool(store.get("ok", True)) and not gone
        watch = {kind: {k: w.get(k) for k in ("connected", "errors", "relists")}
                 for kind, w in (full.get("watch") or {}).items()}
        return _json({"ready": ready, "synced": dict(state.read().synced()), "watch": watch,
                      "progress_store": store, "kube": full.get("kube"), "down": gone}, 200 if ready else 503)

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
            if found is None:
                return None
            if type_gate is not None and type_gate.plan().typed:  # its job's speed per GPU type
                node_types = type_gate.plan().node_types
                for row in found["nodes"]:
                    row["gpu_type"] = node_types.get(row["node"]) or None
                found["gpu_types"] = type_gate.job_view(found["job"])
            return {**found, "bottleneck": diagnosed.get(found["job"])}

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
    ext = ExtenderApp(app, verbs, answer, limit, metrics, max_in_flight=settings.max_concurrent_requests,
                      debug_access=settings.debug_access)
    ext.live_checks = live_checks
    return ext
