"""Training progress in, convergence out: POST /v1/progress and GET /v1/jobs/{namespace}/{job}.

POST /v1/progress, header "Authorization: Bearer <token>", body (at most max_body_bytes):
    {"namespace": "team-a", "job": "resnet-1", "pod": "resnet-1-worker-0",   # pod optional
     "higher_is_better": false,        # optional, remembered per job (true for accuracy)
     "points": [{"step": 120, "loss": 0.83, "timestamp": 1732250000.5,    # timestamp optional
                 "metrics": {"accuracy": 0.71}}],                          # metrics optional
     "training": {"batch_size": 512, "batch_min": 128, "batch_max": 4096,  # all optional
                  "grad_sqr": 0.02, "grad_var": 0.5, "max_steps": 90000, "batch_live": true,
                  "target_metric": 0.05,                 # the loss value the job stops at
                  "early_stopping": {"patience": 8, "min_delta": 0.001,   # Lightning's EarlyStopping:
                                     "metric": null, "higher_is_better": null}}}  # null: the loss / its direction
  200 {"accepted": n, "rejected": m, "reasons": {"loss_nan": 1, ...}, "plan": {...} | null}:
      points with a NaN, inf or null loss or a non-finite timestamp are rejected one by one, and
      so are points stamped more than max_future_skew_s (1 h) ahead of the server's clock, before
      1970, or older than the store's idle window (7 days: prune would drop them); the rest are
      stored. Metric names are 1-128 characters of valid Unicode, at
      most 64 per point. "plan" is the elastic optimizer's latest plan for the job ({"gpus",
      "replicas", "batch_size", "at", "reason", ...}; batch_size null = keep yours; "measured" is
      flowsched's own record of its step times), so the job learns
      its next size from the reply (docs/elastic.md: what a training script must do).
      NaN/Infinity literals (Python's json.dumps writes them) are read, then rejected per point.
  400 {"error": "points.3.step: ..."} names the field; 401 bad token; 403 the token's namespace
  is not the body's; 413 body too large; 503 token or store unavailable (retry later).
GET /v1/jobs/{namespace}/{job} (same token rule): the job's history summary, phase and
  predictions, its latest `training` report and its `plan`; NaN (unknown) is null. The
  remaining_* fields and evidence_weight are the job's end under its stopping rule, end_reason
  says which (planned_end, target, early_stopping, plateau); plateau_remaining_* are the
  convergence estimate's time to the plateau (scoring.convergence.estimate).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
import orjson
from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CollectorRegistry, Counter

from extender.http.auth import Authenticator, AuthError, Identity, bearer_token
from extender.http.body import BodyTooLarge, read_body
from extender.http.progress_wire import (
    CHECKED_BODY_FACTOR,
    CHECKED_FORM,
    JOB_PATTERN,
    MAX_POINTS_PER_REQUEST,
    NAMESPACE_PATTERN,
    BadReport,
    CheckedReport,
    check_report,
    decode_checked,
)
from extender.http.upstream import FRONT_FORM_HEADER, FRONT_SCOPE_KEY
from extender.progress.reports import JobReportBook, TrainingReport
from extender.progress.store import EncodedPoints, JobHistory, ProgressStore, QuotaExceeded, Row, point_bytes
from scoring.bottleneck import Diagnosis
from scoring.convergence import ConvergenceEstimate, estimate
from scoring.job_end import Series, predict_end
from scoring.settings import TrackerSettings
from scoring.stopping import EarlyStopping, StoppingRule

log = logging.getLogger("flowsched.progress")
FORM_HEADER = FRONT_FORM_HEADER.decode()

_NAMESPACE_RE = re.compile(NAMESPACE_PATTERN.replace("$", r"\Z"))
_JOB_RE = re.compile(JOB_PATTERN.replace("$", r"\Z"))


@dataclass(frozen=True)
class ProgressApiSettings:
    convergence: TrackerSettings = field(default_factory=TrackerSettings)
    max_body_bytes: int = 1 << 20
    max_points_per_request: int = MAX_POINTS_PER_REQUEST
    # A point stamped further ahead than this is rejected: a job whose last timestamp lies far in
    # the future would never be pruned as idle (a clock this far off is a bug, not skew).
    max_future_skew_s: float = 3600.0
    # The prune runs this often (ConvergenceTracker.prune_every_s): a point is accepted only if it
    # is still inside the idle window when the next prune can come, else it would be acknowledged
    # and then deleted (issue 33, finding 11). 0: checked against the window itself.
    prune_slack_s: float = 0.0
    # GET /v1/jobs answers from a reply at most this old (a POST to the job drops it): readers
    # looping on a job cost an auth check and a lookup, not a read and encoding of its history.
    job_reply_ttl_s: float = 1.0


@dataclass(frozen=True)
class ProgressApiMetrics:
    points: Counter
    requests: Counter

    @classmethod
    def build(cls, registry: CollectorRegistry) -> ProgressApiMetrics:
        return cls(
            points=Counter("flowsched_progress_points", "Progress points received", ["result"], registry=registry),
            requests=Counter("flowsched_progress_requests", "Progress API calls", ["route", "code"],
                             registry=registry),
        )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json",
                    headers=headers)


def _interval_or_none(low: float, high: float) -> list[float] | None:
    """[low, high] when both ends are known, else null (never a half-known interval)."""
    return [low, high] if math.isfinite(low) and math.isfinite(high) else None


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def split_points(report: CheckedReport, now: float, max_future_skew_s: float = 3600.0,
                 max_age_s: float = math.inf) -> tuple[EncodedPoints, dict[str, int]]:
    """The checked report's points to store, and the count of refused ones by reason (the
    clock-free reasons check_report found, then those that need the clock).

    max_age_s is the store's idle window: a point stamped further back would be acknowledged and
    then deleted, with its whole job, by the next prune (seconds since the job's start sent as
    timestamps, or a client clock days behind), so it is rejected here instead.
    """
    rows: list[Row] = []
    reasons = dict(report.reasons)
    size = 0
    for p in report.points:
        reason = None
        if p.timestamp is not None and p.timestamp > now + max_future_skew_s:
            reason = "timestamp_future"
        elif p.timestamp is not None and p.timestamp < 0:
            reason = "timestamp_negative"
        elif p.timestamp is not None and p.timestamp < now - max_age_s:
            reason = "timestamp_stale"
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        rows.append((p.step, p.loss, p.timestamp if p.timestamp is not None else now, report.pod, p.metrics))
        size += point_bytes(report.job, report.pod, p.metrics)
    return EncodedPoints(tuple(rows), size, report.metric_names), reasons


def job_summary(history: JobHistory, settings: TrackerSettings, max_steps: int | None = None,
                target: float | None = None, early_stopping: EarlyStopping | None = None,
                monitored: Series | None = None) -> dict[str, Any]:
    s = replace(settings, higher_is_better=history.higher_is_better)
    # The planned end and the target the job reported (training.max_steps, .target_metric) bound
    # the prediction.
    est: ConvergenceEstimate = estimate(history.steps, history.values, history.timestamps, s,
                                        max_steps=float(max_steps) if max_steps else None, target=target)
    rule = StoppingRule(max_steps=float(max_steps) if max_steps else math.nan,
                        target=target if target is not None else math.nan,
                        higher_is_better=history.higher_is_better, early_stopping=early_stopping)
    end = predict_end(history.steps, history.values, history.timestamps, rule, s, est=est, monitored=monitored,
                      forecast=settings.forecast)
    last = history.count - 1
    return {
        "namespace": history.namespace,
        "job": history.job,
        "points": history.count,
        "higher_is_better": history.higher_is_better,
        "first_timestamp": float(history.timestamps[0]) if history.count else None,
        "last_timestamp": float(history.timestamps[last]) if history.count else None,
        "last_step": int(history.steps[last]) if history.count else None,
        "last_value": float(history.values[last]) if history.count else None,
        "phase": est.phase.name.lower(),
        "progress": _finite_or_none(est.progress),
        "growth_efficiency": _finite_or_none(est.growth_efficiency),
        "remaining_steps": _finite_or_none(end.remaining_steps),
        "remaining_seconds": _finite_or_none(end.remaining_seconds),
        "remaining_steps_interval": _interval_or_none(end.steps_low, end.steps_high),
        "remaining_seconds_interval": _interval_or_none(end.seconds_low, end.seconds_high),
        "end_reason": None if end.reason is None else end.reason.value,
        "evidence_weight": end.evidence,
        "plateau_remaining_steps": _finite_or_none(est.remaining_steps),
        "plateau_remaining_seconds": _finite_or_none(est.remaining_seconds),
        "plateau_probability": _finite_or_none(est.plateau_probability),
        "step_rate": _finite_or_none(est.step_rate),
        "restarts": est.restarts,
        "points_used": est.points_used,
    }


def writer_restarts(writers: Mapping[str, tuple[npt.NDArray[np.int64], Any]], points: int, merged: int) -> int:
    """Restarts counted per writer (pod), not across writers: 32 data-parallel pods interleaving
    their steps made the merged series go back 480 times (issue 33, finding 12). A job restart
    sends every writer back at once, so it is the most any one writer went back. `merged` (the
    count over the merged series) stands when some points name no pod."""
    if not writers or sum(int(steps.size) for steps, _ in writers.values()) != points:
        return merged
    return max(int(np.count_nonzero(np.diff(steps) < 0)) for steps, _ in writers.values())


class SummaryCache:
    """Job summaries by the job's state (points, newest timestamp, reported bounds): a reader
    looping on an unchanged job gets the same fit without refitting. Bounded, oldest out."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> dict[str, Any] | None:
        return self._items.get(key)

    def put(self, key: tuple[Any, ...], summary: dict[str, Any]) -> None:
        self._items[key] = summary
        while len(self._items) > self.size:
            self._items.popitem(last=False)


MAX_CACHED_REPLIES = 1024
QUOTA_RETRY_AFTER_S = 3600  # the prune's interval: the earliest a namespace's idle jobs free room

PlanOf = Callable[[str], dict[str, Any] | None]  # "namespace/job" -> its elastic plan


def build_progress_router(
    store: ProgressStore,
    authenticator: Authenticator,
    settings: ProgressApiSettings,
    metrics: ProgressApiMetrics,
    clock: Callable[[], float] = time.time,
    reports: JobReportBook | None = None,
    plan_of: PlanOf | None = None,
    diagnosis: Callable[[str], Diagnosis | None] | None = None,  # job -> its bottleneck (bottleneck_loop)
    gpu_types: Callable[[str], dict[str, Any] | None] | None = None,  # job -> its speed per GPU type (type_plan.py)
) -> APIRouter:
    router = APIRouter()

    def plan(key: str) -> dict[str, Any] | None:
        return plan_of(key) if plan_of is not None else None

    fit_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowsched-job-fit")
    summaries = SummaryCache()
    replies: dict[str, tuple[float, bytes]] = {}  # "namespace/job" -> (until, the GET's body)

    def fitted_summary(history: JobHistory, max_steps: int | None, target: float | None,
                       early_stopping: EarlyStopping | None) -> dict[str, Any]:
        monitored = None
        if early_stopping is not None and early_stopping.metric is not None:
            try:
                monitored = store.metric_series(history.namespace, history.job, early_stopping.metric)
            except sqlite3.Error:
                monitored = None
            if monitored is None:  # the named metric was never reported: early stopping is unknown
                monitored = (np.zeros(0), np.zeros(0))
        summary = job_summary(history, settings.convergence, max_steps, target, early_stopping, monitored)
        try:
            writers = store.pod_steps(history.namespace, history.job, -math.inf)
        except sqlite3.Error:
            writers = {}
        summary["restarts"] = writer_restarts(writers, history.count, summary["restarts"])
        return summary

    async def identify(authorization: str | None, request: Request) -> Identity | Response:
        peer = request.client.host if request.client is not None else ""
        try:
            return await authenticator.authenticate(bearer_token(authorization), peer)
        except AuthError as e:
            headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
            return _error(e.status, e.message, headers)

    def reply(route: str, response: Response) -> Response:
        metrics.requests.labels(route, str(response.status_code)).inc()
        return response

    async def read_report(request: Request) -> CheckedReport:
        """The body's report, checked; from the API front, the form it already checked (a
        tenant cannot send that: the front drops the header, and only the front reaches the
        socket whose requests are marked)."""
        if request.scope.get(FRONT_SCOPE_KEY) and request.headers.get(FORM_HEADER) == CHECKED_FORM:
            try:
                return decode_checked(await read_body(request, CHECKED_BODY_FACTOR * settings.max_body_bytes))
            except BodyTooLarge:
                raise BadReport(413, f"body over {settings.max_body_bytes} bytes") from None
            except ValueError as e:
                log.error("the API front forwarded a report this process cannot read: %s", e)
                raise BadReport(400, "report could not be read") from e
        try:
            raw = await read_body(request, settings.max_body_bytes)
        except BodyTooLarge:
            raise BadReport(413, f"body over {settings.max_body_bytes} bytes") from None
        return check_report(raw, settings.max_points_per_request)

    @router.post("/v1/progress")
    async def post_progress(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        who = await identify(authorization, request)
        if isinstance(who, Response):
            return reply("progress", who)
        try:
            report = await read_report(request)
        except BadReport as e:
            return reply("progress", _error(e.status, e.message))
        if not who.may_write(report.namespace):
            return reply("progress", _error(403, f"{who.username} may not report for namespace {report.namespace}"))
        now = clock()
        kept, reasons = split_points(report, now, settings.max_future_skew_s,
                                     max(0.0, store.max_idle_s - settings.prune_slack_s))
        def admit_and_add() -> int:
            store.admit(report.namespace, report.job, kept)  # the namespace's quotas (finding 7)
            return store.add_points(report.namespace, report.job, kept, report.higher_is_better)

        try:
            stored = await asyncio.to_thread(admit_and_add)
        except QuotaExceeded as e:
            # Room comes back only as jobs go idle and are pruned (hourly) or thin out.
            return reply("progress", _error(429, str(e), {"Retry-After": str(QUOTA_RETRY_AFTER_S)}))
        except sqlite3.Error as e:
            log.error("progress store write failed for %s/%s: %s", report.namespace, report.job, e)
            return reply("progress", _error(503, "progress store unavailable; retry later"))
        rejected = report.received - stored
        if stored < len(kept.rows):
            reasons["not_stored"] = len(kept.rows) - stored
        metrics.points.labels("accepted").inc(stored)
        for reason, n in reasons.items():
            if reason != "metric_not_finite":
                metrics.points.labels(reason).inc(n)
        key = f"{report.namespace}/{report.job}"
        if report.training is not None and reports is not None:
            t = report.training
            reports.put(key, TrainingReport(t.batch_size, t.batch_min, t.batch_max,
                                            None if t.grad_sqr is None else float(t.grad_sqr),
                                            None if t.grad_var is None else float(t.grad_var), t.max_steps, now,
                                            t.batch_live,
                                            None if t.target_metric is None else float(t.target_metric),
                                            None if t.early_stopping is None else t.early_stopping.rule(),
                                            t.batch_local_max))
        replies.pop(key, None)
        body = {"accepted": stored, "rejected": rejected, "reasons": reasons, "plan": plan(key)}
        return reply("progress", Response(orjson.dumps(body), media_type="application/json"))

    @router.get("/v1/jobs/{namespace}/{job}")
    async def get_job(
        namespace: str, job: str, request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        who = await identify(authorization, request)
        if isinstance(who, Response):
            return reply("job", who)
        if not (_NAMESPACE_RE.match(namespace) and len(namespace) <= 63
                and _JOB_RE.match(job) and len(job) <= 253):
            return reply("job", _error(400, "namespace or job: not a valid name"))
        if not who.may_write(namespace):
            return reply("job", _error(403, f"{who.username} may not read namespace {namespace}"))
        key = f"{namespace}/{job}"
        recent = replies.get(key)
        if recent is not None and recent[0] > time.monotonic():
            return reply("job", Response(recent[1], media_type="application/json"))
        try:
            history = await asyncio.to_thread(store.history, namespace, job)
        except sqlite3.Error as e:
            log.error("progress store read failed for %s/%s: %s", namespace, job, e)
            return reply("job", _error(503, "progress store unavailable; retry later"))
        if history is None:
            return reply("job", _error(404, f"no progress for job {namespace}/{job}"))
        training = reports.get(key) if reports is not None else None
        max_steps = training.max_steps if training is not None else None
        target = training.target_metric if training is not None else None
        early_stopping = training.early_stopping if training is not None else None
        # One fit per job's state (its points and the bounds it reported), on one thread: 16
        # readers looping on a 4,000-point job took the verbs from 1,698 to 601 req/s (finding 13).
        last_ts = float(history.timestamps[-1]) if history.count else 0.0
        fit_key = (namespace, job, history.count, last_ts, max_steps, target, early_stopping)
        summary = summaries.get(fit_key)
        if summary is None:
            summary = await asyncio.get_running_loop().run_in_executor(
                fit_pool, fitted_summary, history, max_steps, target, early_stopping)
            summaries.put(fit_key, summary)
        summary = dict(summary)
        summary["training"] = training.as_dict() if training is not None else None
        summary["plan"] = plan(key)
        if diagnosis is not None:
            d = diagnosis(key)
            summary["bottleneck"] = d.as_dict() if d is not None else None
        if gpu_types is not None:
            summary["gpu_types"] = gpu_types(key)
        out = orjson.dumps(summary)
        if settings.job_reply_ttl_s > 0:
            if len(replies) >= MAX_CACHED_REPLIES:
                replies.clear()  # bounded; refilled by the next reads
            replies[key] = (time.monotonic() + settings.job_reply_ttl_s, out)
        return reply("job", Response(out, media_type="application/json"))

    return router
