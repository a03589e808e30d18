"""Builds the leader elector, the enabled loops and their one rounds runner for the service, and
the /debug routes.

Controllers are found by name in FACTORIES ("module:function"); a factory takes a
ControlContext and returns a Controller (extender/control/loop.py: how to build its part of the
World and how to carry out its action kinds). The plans are the kernel's (scoring.kernel): adding
a loop = its plan in the kernel, one line here, a settings class in scoring/settings.py (a
LoopSettings) with a field of CoreSettings named like the controller, and the name in
Settings.controllers' Literal.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import APIRouter, Response
from prometheus_client import CollectorRegistry, Counter

from extender.control.budget_store import BudgetStore, LeaseBudgetStore
from extender.control.events import EventRecorder, LogRecorder, Recorder
from extender.control.kube_actions import KubeActions
from extender.control.leader import AlwaysLeader, KubeLeaseClient, LeaderElector
from extender.control.loop import Controller, ControlLoop, ControlMetrics, ControlRounds, Leadership
from extender.control.mark_store import LeaseMarkStore, MarkStore
from extender.control.world_builder import WorldBuilder
from extender.progress.convergence import ConvergenceTracker
from extender.progress.reports import JobReportBook
from extender.settings import Settings
from extender.snapshot.state import ClusterState
from scoring import kernel
from scoring.bottleneck import Diagnosis
from scoring.settings import CoreSettings

log = logging.getLogger("flowsched.control")

FACTORIES: dict[str, str] = {
    "migrator": "extender.control.migrator:build",
    "resizer": "extender.control.resizer:build",
    "elastic": "extender.control.elastic:build",
    "admission": "extender.control.admission:build",
    "idle": "extender.control.idle:build",
    "remedies": "extender.control.remedies:build",
}


@dataclass
class ControlContext:
    """What a controller factory gets. `actions` is None without a cluster (loops are then dry-run)."""

    settings: Settings
    core: CoreSettings
    world: WorldBuilder
    state: ClusterState
    tracker: ConvergenceTracker
    actions: KubeActions | None
    recorder: Recorder
    registry: CollectorRegistry
    leader: Leadership
    identity: str
    clock: Callable[[], float] = time.time
    budgets: BudgetStore | None = None  # where budgets outlive the leader (None: no cluster)
    marks: MarkStore | None = None  # where eviction marks outlive the evicted pods (None: no cluster)

    def still_leader(self) -> bool:
        """Checked before every write of an action (one action is many API calls)."""
        return bool(self.leader.is_leader)


def default_identity(settings: Settings) -> str:
    if settings.control.identity:
        return settings.control.identity
    pod = os.environ.get("POD_NAME")
    return pod or f"{socket.gethostname()}-{os.getpid()}"


def _factory(name: str) -> Callable[[ControlContext], Controller]:
    spec = FACTORIES.get(name)
    if spec is None:
        raise ValueError(f"unknown controller {name!r}; known: {', '.join(sorted(FACTORIES))}")
    module, _, func = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ValueError(f"controller {name!r} is not available in this build ({e})") from e
    f: Callable[[ControlContext], Controller] = getattr(mod, func)
    return f


@dataclass
class Controllers:
    rounds: ControlRounds  # the one runner of the loops' rounds (its thread: control-rounds)
    elector: LeaderElector | None
    leader: Leadership
    controllers: dict[str, Controller] = field(default_factory=dict)
    world: WorldBuilder | None = None  # the loops' World builder (its per-type step times: type_plan.py)

    @property
    def loops(self) -> list[ControlLoop]:
        return self.rounds.loops

    def start(self) -> None:
        if self.elector is not None:
            self.elector.start()
        self.rounds.start()

    def stop(self) -> None:
        self.rounds.stop()
        if self.elector is not None:
            self.elector.stop(release=True)

    def loop(self, name: str) -> ControlLoop | None:
        return next((lp for lp in self.loops if lp.name == name), None)

    def status(self) -> dict[str, Any]:
        leader = self.elector.status() if self.elector is not None else {"is_leader": True, "lease": None}
        return {"leader": leader, "loops": {lp.name: {"interval_s": lp.interval_s, "dry_run": lp.dry_run,
                                                      "budget_left": lp.budget.remaining(lp.clock())}
                                            for lp in self.loops},
                # whether this replica has read the saved eviction marks (mark_store.py): the first
                # round it leads; a replica with no cluster has none to read
                "marks_restored": self.rounds.marks_restored}


def build_controllers(settings: Settings, state: ClusterState, tracker: ConvergenceTracker, api_client: Any,
                      registry: CollectorRegistry, clock: Callable[[], float] = time.time,
                      reports: JobReportBook | None = None,
                      diagnoses: Callable[[], Mapping[str, Diagnosis]] | None = None) -> Controllers | None:
    """None when no controller is enabled. Raises ValueError for an unknown or missing one."""
    if not settings.controllers:
        return None
    cc = settings.control
    identity = default_identity(settings)
    event_failures = Counter("flowsched_event_failures", "Events the apiserver did not accept", registry=registry)
    elector: LeaderElector | None = None
    leader: Leadership
    recorder: Recorder
    actions: KubeActions | None
    budgets: BudgetStore | None = None
    marks: MarkStore | None = None
    dry_run = cc.dry_run
    if api_client is not None:
        elector = LeaderElector(KubeLeaseClient(api_client), cc.lease_namespace, cc.lease_name, identity,
                                lease_duration_s=cc.lease_duration_s, renew_deadline_s=cc.renew_deadline_s,
                                retry_period_s=cc.retry_period_s)
        leader = elector
        recorder = EventRecorder(api_client, identity, failures=event_failures)
        budgets = LeaseBudgetStore(api_client, cc.lease_namespace, f"{cc.lease_name}-budgets")
        marks = LeaseMarkStore(api_client, cc.lease_namespace, f"{cc.lease_name}-marks")
        # A write lands before anyone may take the Lease over (kube_actions.KubeActions).
        actions = KubeActions(api_client, retry_s=cc.retry_after_s,
                              write_timeout_s=max(1.0, cc.lease_duration_s - cc.renew_deadline_s))
    else:
        log.warning("control loops without a cluster: always leader, always dry-run")
        leader, recorder, actions, dry_run = AlwaysLeader(), LogRecorder(), None, True
    world = WorldBuilder(tracker, actions.namespace_labels if actions is not None else dict,
                         reports.job_reports if reports is not None else None, gate=settings.admission.gate,
                         diagnoses=diagnoses, gpu_types=settings.gpu_types)
    ctx = ControlContext(settings=settings, core=settings.core(), world=world, state=state, tracker=tracker,
                         actions=actions, recorder=recorder,
                         registry=registry, leader=leader, identity=identity, clock=clock, budgets=budgets,
                         marks=marks)
    metrics = ControlMetrics.build(registry)
    loops: list[ControlLoop] = []
    made: dict[str, Controller] = {}
    for name in dict.fromkeys(settings.controllers):
        controller = _factory(name)(ctx)
        made[name] = controller
        if name in kernel.UNBUDGETED:
            # The remedies: no budget of their own (scoring.kernel); they plan as often as the
            # diagnoses they read are refreshed.
            loop = ControlLoop(controller, leader, metrics, interval_s=settings.diagnosis.interval_s,
                               dry_run=dry_run, budgeted=False, permanent_backoff_s=cc.permanent_backoff_s,
                               clock=clock)
        else:
            cfg = ctx.core.loop(name)
            loop = ControlLoop(controller, leader, metrics, interval_s=cfg.interval_s, dry_run=dry_run,
                               per_interval=cfg.max_per_interval, per_hour=cfg.max_per_hour,
                               permanent_backoff_s=cc.permanent_backoff_s, clock=clock)
        loops.append(loop)
        log.info("control loop %s enabled (every %.0fs, %s, identity %s)", name, loop.interval_s,
                 "dry run" if dry_run else "acting", identity)
    # One round of every due loop (scoring.kernel.run_round); the idle loop's evictions spend the
    # migrator's budget when both run (scoring.kernel.SHARED_BUDGET).
    rounds = ControlRounds(loops, ctx.core, leader, metrics, dry_run=dry_run, clock=clock, budget_store=budgets,
                           mark_store=marks, seed_marks=state.seed_migrations)
    return Controllers(rounds=rounds, elector=elector, leader=leader, controllers=made, world=world)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                                 default=str), status_code=status, media_type="application/json")


def build_control_router(get: Callable[[], Controllers | None]) -> APIRouter:
    """GET /debug/control: leader and every loop; GET /debug/{loop}s (e.g. /debug/migrations):
    that loop's recent planned ticks (dry-run plans included), back-offs, performed actions and
    the controller's own `describe()` if it has one."""
    router = APIRouter()

    @router.get("/debug/control")
    async def debug_control() -> Response:
        c = get()
        if c is None:
            return _json({"enabled": []})
        return _json({"enabled": [lp.name for lp in c.loops], **c.status()})

    def loop_view(name: str) -> Response:
        c = get()
        lp = c.loop(name) if c is not None else None
        if c is None or lp is None:
            return _json({"error": f"controller {name} is not enabled (settings.controllers)"}, 404)
        body: dict[str, Any] = {"leader": c.status()["leader"], **lp.status()}
        describe = getattr(c.controllers.get(name), "describe", None)
        if callable(describe):
            body["controller"] = describe()
        return _json(body)

    @router.get("/debug/migrations")
    async def debug_migrations() -> Response:
        return loop_view("migrator")

    @router.get("/debug/resizes")
    async def debug_resizes() -> Response:
        return loop_view("resizer")

    @router.get("/debug/admission")
    async def debug_admission() -> Response:
        return loop_view("admission")

    @router.get("/debug/elastic")
    async def debug_elastic() -> Response:
        return loop_view("elastic")

    @router.get("/debug/idle")
    async def debug_idle() -> Response:
        return loop_view("idle")

    @router.get("/debug/remedies")
    async def debug_remedies() -> Response:
        return loop_view("remedies")

    return router
