"""Wiring: settings -> state, metrics, watches, app. The one place that starts threads."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI

from extender.control.bottleneck import BottleneckDiagnoser, build_diagnoser
from extender.control.kube_actions import KubeActions
from extender.control.runtime import Controllers, build_control_router, build_controllers
from extender.control.type_plan import TypePlanSource
from extender.http.app import build_app
from extender.http.auth import (
    Authenticator,
    AuthError,
    Identity,
    ReviewLimits,
    StaticTokenAuthenticator,
    TokenReviewAuthenticator,
    kubernetes_token_reviewer,
)
from extender.http.docs import build_docs_router
from extender.http.extender_app import ExtenderApp
from extender.http.gpu_type_gate import TypeGate
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.http.status_view import PHASES, job_phase_counts
from extender.http.ui import build_ui_router
from extender.http.webhook import build_webhook_router
from extender.kube.client import load_api_client
from extender.metrics import Metrics, build_metrics, watch_status
from extender.periodic import PeriodicRunner
from extender.progress.convergence import ConvergenceTracker
from extender.progress.reports import JobReportBook, TrainingReport
from extender.progress.sources import ProgressSources, build_progress_store, start_progress_sources
from extender.progress.store import ProgressStore
from extender.settings import Settings, load_static_tokens
from extender.snapshot.annotations import ProgressSpec
from extender.snapshot.state import ClusterState
from extender.snapshot.watcher import Watcher, start_watchers
from extender.telemetry.refresher import TelemetryRefresher, start_telemetry
from scoring.stopping import EarlyStopping

log = logging.getLogger("flowsched.service")
_T = TypeVar("_T")

STORE_PROBE_S = 5.0  # the progress store's write probe: /readyz is at most this late


@dataclass
class Service:
    settings: Settings
    state: ClusterState
    metrics: Metrics
    app: ExtenderApp
    store: ProgressStore
    tracker: ConvergenceTracker
    watchers: list[Watcher] = field(default_factory=list)
    api_client: Any = None
    telemetry: TelemetryRefresher | None = None
    control: Controllers | None = None  # the enabled control loops and their leader elector
    sources: ProgressSources | None = None  # progress from logs / Prometheus gauges (issue 17)
    diagnoser: BottleneckDiagnoser | None = None  # per-job bottleneck diagnosis (settings.diagnosis)
    store_probe: PeriodicRunner | None = None  # writes to the store every few seconds, for /readyz
    types: TypePlanSource | None = None  # the GPU types the filter keeps jobs on (mixed GPU generations)

    def status(self) -> dict[str, Any]:
        tel = self.telemetry.describe() if self.telemetry else {"source": "none"}
        out = {"watch": {w.kind: vars(w.status) for w in self.watchers}, "kube": self.settings.kube,
               "telemetry": tel, "progress_store": self.store.health()}
        if self.control is not None:
            out["control"] = self.control.status()
        if self.sources is not None:
            out["progress_sources"] = self.sources.status()
        if self.diagnoser is not None:
            out["diagnosis"] = self.diagnoser.describe()
        return out

    def start(self) -> None:
        # /readyz says not ready whenever a write would fail (a full disk, a file made read-only),
        # which only a write shows; probed off the event loops.
        self.store_probe = PeriodicRunner("progress-store-probe", self.store.probe_write, STORE_PROBE_S)
        self.store_probe.start()
        self.tracker.start()
        if self.diagnoser is not None:
            self.diagnoser.start()
        if self.control is not None:
            self.control.start()  # each loop acts only while this replica holds the Lease
        if self.types is not None:
            self.types.start()
        # Telemetry needs no cluster: nodes it has no series for simply stay unknown.
        self.telemetry = start_telemetry(self.settings.telemetry, self.state, self.metrics,
                                         stale_s=self.settings.telemetry_stale_s, api_client=self.api_client)
        if self.telemetry is None:
            # No source: every GPU node is unknown, and the gauge must say so rather than read 0.
            stale_s, state = self.settings.telemetry_stale_s, self.state
            self.metrics.telemetry_unknown_nodes.set_function(
                lambda: float(state.read().count_telemetry_unknown(time.time(), stale_s)))
        # Only the Lease holder reads logs and gauges when loops run; a lone replica always does.
        control = self.control
        self.sources = start_progress_sources(
            self.settings, self.state, self.store, self.api_client,
            (lambda: control.leader.is_leader) if control is not None else (lambda: True))
        if not self.settings.kube:
            self.state.mark_synced()
            log.warning("running without a cluster (--no-kube): every node is unknown and scored neutral")
            return
        self.watchers = start_watchers(
            self.api_client, self.state, self.metrics, gpu_resource=self.settings.gpu_resource,
            resync_s=self.settings.resync_s, watch_timeout_s=self.settings.watch_timeout_s,
            backoff_max_s=self.settings.backoff_max_s, quiet=self.app.wait_quiet,
        )

    def stop(self) -> None:
        if self.control is not None:
            self.control.stop()  # releases the Lease so another replica takes over at once
        for w in self.watchers:
            w.stop()
        if self.telemetry is not None:
            self.telemetry.stop()
        if self.sources is not None:
            self.sources.stop()
        if self.diagnoser is not None:
            self.diagnoser.stop()
        if self.types is not None:
            self.types.stop()
        self.tracker.stop()
        if self.store_probe is not None:
            self.store_probe.stop(join_s=5.0)
        self.store.close()


class _NoTokenReview:
    """Without a cluster there is nobody to verify a service-account token."""

    async def authenticate(self, token: str, peer: str = "") -> Identity:
        raise AuthError(503, "TokenReview needs a cluster; configure progress_auth=static to report without one")


def _authenticator(settings: Settings, api_client: Any) -> Authenticator:
    if settings.progress_auth == "static":
        if not settings.static_tokens_file:
            raise FileNotFoundError("progress_auth=static needs static_tokens_file")
        return StaticTokenAuthenticator(load_static_tokens(settings.static_tokens_file))
    if api_client is None:
        return _NoTokenReview()
    return TokenReviewAuthenticator(
        kubernetes_token_reviewer(api_client, timeout_s=settings.token_review_timeout_s),
        ReviewLimits(timeout_s=settings.token_review_timeout_s, threads=settings.token_review_threads,
                     negative_ttl_s=settings.token_review_negative_ttl_s,
                     rate_per_s=settings.token_review_rate_per_s,
                     per_client_rate_per_s=settings.token_review_rate_per_client_s))


def build_service(settings: Settings) -> Service:
    """Raises FileNotFoundError with a clear message when no kubeconfig can be found."""
    state = ClusterState(completing_horizon_s=settings.completing_horizon_s, placement=settings.placement,
                         gpu_resource=settings.gpu_resource,
                         migration_ttl_s=settings.migrator.origin_ttl_s)  # origin scored down (every replica)
    metrics = build_metrics()
    api_client = None
    if settings.kube:
        try:
            api_client = load_api_client(settings.kubeconfig)
        except Exception as e:  # the kubernetes client raises ConfigException or OSError
            raise FileNotFoundError(
                f"no usable Kubernetes configuration ({e}); pass --kubeconfig, set $KUBECONFIG, "
                "run in a pod, or use --no-kube"
            ) from e
    holder: dict[str, Service] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        svc = holder["svc"]
        svc.start()
        started = time.monotonic()
        log.info("flowsched extender up: verbs on %s:%d%s, API on port %d", settings.host, settings.port,
                 settings.prefix, settings.api_port)
        try:
            yield
        finally:
            svc.stop()
            log.info("stopped after %.0fs", time.monotonic() - started)

    store = build_progress_store(settings)
    reports = JobReportBook()

    def stopping_rule(key: str, posted: Callable[[TrainingReport], _T | None],
                      annotated: Callable[[ProgressSpec], _T | None]) -> _T | None:
        """One part of the job's stopping rule: what it posted (training.*) wins, else what its pods
        declare by annotation (jobs reporting through logs or Prometheus)."""
        report = reports.get(key)
        value = posted(report) if report is not None else None
        if value is not None:
            return value
        pods = state.read().job_pods([key]).get(key, ())
        spec = next((p.progress for p in pods if p.progress is not None), None)
        return annotated(spec) if spec is not None else None

    def planned_end(key: str) -> float | None:
        return stopping_rule(key, lambda r: float(r.max_steps) if r.max_steps else None, lambda s: s.max_steps)

    def stop_target(key: str) -> float | None:
        return stopping_rule(key, lambda r: r.target_metric, lambda s: s.target)

    def early_stopping(key: str) -> EarlyStopping | None:
        return stopping_rule(key, lambda r: r.early_stopping, lambda s: s.early_stopping)

    tracker = ConvergenceTracker(store, state, settings.convergence, planned_end=planned_end, stop_target=stop_target,
                                 early_stopping=early_stopping)
    diagnoser = build_diagnoser(settings, state, store, api_client, metrics.registry)
    # Mixed GPU types: every replica's filter keeps each job on one type (docs/gpu-types.md).
    types = TypePlanSource(state, tracker, settings.core(), job_reports=reports.job_reports,
                           gate=settings.admission.gate,
                           annotate=KubeActions(api_client).annotate_pod if api_client is not None else None)
    progress = build_progress_router(
        store, _authenticator(settings, api_client),
        ProgressApiSettings(convergence=settings.convergence,
                            max_body_bytes=settings.progress_max_body_bytes,
                            prune_slack_s=tracker.prune_every_s),
        ProgressApiMetrics.build(metrics.registry), reports=reports, plan_of=state.read().plan_of,
        diagnosis=diagnoser.get if diagnoser is not None else None, gpu_types=types.job_view,
    )
    control = build_controllers(settings, state, tracker, api_client, metrics.registry, reports=reports,
                                diagnoses=diagnoser.snapshot if diagnoser is not None else None)
    if control is not None and control.world is not None:  # one memory of each job's step times
        control.world.measured = types.builder.measured
    control_router = build_control_router(lambda: holder["svc"].control)
    webhook = build_webhook_router(settings.admission.gate, settings.webhook_schedulers)
    app = build_app(settings, state, metrics, status=lambda: holder["svc"].status(),
                    routers=[progress, control_router, webhook],
                    type_gate=TypeGate(types.get, settings.gpu_types, types.job_view))
    app.fastapi.router.lifespan_context = lifespan
    _add_pages(app, settings, state, store, metrics, lambda: holder["svc"].control, control)
    svc = Service(settings=settings, state=state, metrics=metrics, app=app, store=store, tracker=tracker,
                  api_client=api_client, control=control, diagnoser=diagnoser, types=types)
    holder["svc"] = svc
    return svc


def _add_pages(app: ExtenderApp, settings: Settings, state: ClusterState, store: ProgressStore, metrics: Metrics,
               get_control: Callable[[], Controllers | None], control: Controllers | None) -> None:
    """The status page (/ui), the API docs (/docs, /openapi.json) and the gauges they and the
    Grafana dashboard read (jobs by phase, control-loop budgets)."""
    app.fastapi.include_router(build_ui_router(state, store, settings.convergence, get_control,
                                               settings.telemetry_stale_s))
    app.fastapi.include_router(build_docs_router(app.fastapi, settings.prefix))
    budgets = {lp.name: (lambda lp=lp: lp.budget.remaining(lp.clock())) for lp in control.loops} \
        if control is not None else {}
    watch_status(metrics, lambda: job_phase_counts(state), PHASES, budgets)
