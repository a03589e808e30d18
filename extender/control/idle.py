"""The idle loop: GPUs held by pods that do not use them (docs/sharing.md, "Idle GPUs").

world(): the pods holding GPUs (from the snapshot) with their DCGM samples attributed to the
pod (written by the telemetry refresher), how many GPU pods wait, the namespaces' labels.
The kernel's idle plan (scoring.kernel: scoring.idle.plan_idle, its idle times and warnings in
the kernel's Memory) gives the actions; planned() sets the gauges:
- `report` (an Event, no budget): a pod idle for window_s gets a FlowschedIdleGPU Event, once
  per idle spell; the flowsched_idle_gpu_pods and flowsched_idle_gpus gauges count them;
- `warn` (an Event, no budget): an opted-in notebook (`flowsched.io/reclaim-idle: "2h"`) idle
  that long is warned (FlowschedIdleGPUReclaim, type Warning); the warning counts from when the
  apiserver accepted the Event (a refused one is a TemporaryError, and is planned again);
- `evict` (budgeted): warned at least warning_s ago, while GPU pods wait, through the shared
  eviction path (extender/control/eviction.py), re-checking the opt-in on the pod as it is now.
The rounds runner (extender/control/loop.py) runs it only on the Lease holder, honours dry run
(plans shown at /debug/idle, nothing sent) and the budget, which is the migrator's when both run
(scoring.kernel.SHARED_BUDGET).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from extender.control.events import ObjectRef
from extender.control.eviction import evict_job
from extender.control.loop import Action, PodRef
from extender.control.runtime import ControlContext
from extender.kube.errors import PermanentError, TemporaryError
from extender.snapshot.objects import PodInfo
from scoring.actions import ControlAction, IdleReport, IdleWarn, Reclaim
from scoring.idle import parse_duration_s
from scoring.kernel import Plan
from scoring.workload import workload_class
from scoring.world import IdlePod, World

log = logging.getLogger("flowsched.idle")

IDLE_REASON = "FlowschedIdleGPU"
WARN_REASON = "FlowschedIdleGPUReclaim"
EVICT_REASON = "FlowschedIdleGPUReclaimed"


@dataclass(frozen=True)
class IdleObserved:
    now: float
    pods: tuple[IdlePod, ...]
    info: Mapping[str, PodInfo]  # "namespace/name" -> the pod as the snapshot has it
    waiting: int  # GPU pods waiting to be scheduled
    namespace_labels: Mapping[str, Mapping[str, str]]


def waiting_gpu_pods(pods: Sequence[PodInfo], gate: str) -> int:
    """GPU pods not bound yet: kube-scheduler's queue, and pods behind flowsched's own admission
    gate (they wait for GPUs too); pods behind any other gate wait for something else."""
    return sum(1 for p in pods
               if p.requests.gpus > 0 and not p.node and p.phase == "Pending" and not p.terminating
               and all(g == gate for g in p.scheduling_gates))


class IdleLoop:
    name = "idle"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.core.idle
        self.idle_pods = Gauge("flowsched_idle_gpu_pods", "Pods whose GPUs stayed under the idle threshold "
                               "for the idle window", registry=ctx.registry)
        self.idle_gpus = Gauge("flowsched_idle_gpus", "GPUs held by idle pods", registry=ctx.registry)
        self.reclaimed = Counter("flowsched_idle_reclaimed", "Idle notebooks evicted to give their GPUs back",
                                 ["namespace"], registry=ctx.registry)
        self.last: dict[str, Any] = {}
        self.info: Mapping[str, PodInfo] = {}  # "namespace/name" -> the pod, as the latest World had it

    # ---- Controller ----
    def world(self, now: float) -> World | None:
        observed = self.observe(now)
        if observed is None:
            return None
        self.info = observed.info
        return World(now, (), (), (), observed.namespace_labels, gpu_pods=observed.pods,
                     gpu_pods_waiting=observed.waiting)

    def observe(self, now: float) -> IdleObserved | None:
        state = self.ctx.state.read()
        if not state.ready:
            self.last = {"at": now, "skipped": "snapshot not synced yet"}
            return None
        pods, _nodes, _marks = state.control_view()
        samples = state.pod_gpu_samples(now, self.ctx.settings.telemetry_stale_s)
        holding = [p for p in pods if p.node and p.phase == "Running" and p.requests.gpus > 0 and not p.terminating]
        idle_pods = tuple(IdlePod(key=p.key, namespace=p.namespace, workload=workload_class(p.workload, p.owner_kind),
                                  gpus=p.requests.gpus, reclaim=p.reclaim_idle, samples=samples.get(p.key, ()))
                          for p in holding)
        labels = self.ctx.world.namespace_labels()  # read fresh, as every loop's World
        return IdleObserved(now, idle_pods, {p.key: p for p in holding},
                            waiting_gpu_pods(pods, self.ctx.core.admission.gate), labels)

    def bind(self, action: ControlAction) -> Action:
        p = self.info.get(action.target)
        return Action.of(action, self._ref(p) if p is not None else ())

    def planned(self, plan: Plan) -> None:
        """The gauges and the /debug view, from the kernel's plan."""
        self.idle_pods.set(len(plan.view.get("idle", ())))
        self.idle_gpus.set(float(plan.view.get("idle_gpus", 0.0)))
        self.last = dict(plan.view)

    @staticmethod
    def _ref(p: PodInfo) -> tuple[PodRef, ...]:
        return (PodRef(p.namespace, p.name, p.uid, p.node, gpus=p.requests.gpus),)

    def _refusal(self, p: PodInfo) -> str | None:
        """The last line of defence, on the pod as the snapshot has it now."""
        if workload_class(p.workload, p.owner_kind) != "notebook":
            return f"{p.key} is not a notebook"
        if parse_duration_s(p.reclaim_idle) is None:
            return f"{p.key} has not opted in ({self.cfg.reclaim_key})"
        return None

    def act(self, action: Action, now: float) -> str:
        (p,) = action.pods
        ref = ObjectRef(p.namespace, p.name, p.uid)
        if isinstance(action.plan, IdleReport):
            self.ctx.recorder.record(ref, IDLE_REASON, f"Idle GPU: {action.reason}", action="Detect")
            return "recorded"
        if isinstance(action.plan, IdleWarn):
            if not self.ctx.recorder.record(ref, WARN_REASON, f"Idle GPU reclamation: {action.reason}",
                                            type_="Warning", action="Warn"):
                # Not delivered, so not given: warned again next round, evicted only warning_s
                # after a warning the apiserver accepted.
                raise TemporaryError(f"the {WARN_REASON} Event on {action.target} was not accepted",
                                     self.ctx.settings.control.retry_after_s)
            return "recorded"  # the kernel counts the warning from now (scoring.idle.warning_delivered)
        if not isinstance(action.plan, Reclaim):
            raise PermanentError(f"the idle loop cannot carry out {action.kind}")
        done = evict_job(self.ctx.state, self.ctx.actions, self.ctx.recorder, action.key, action.pods, None,
                         action.reason, EVICT_REASON, "to give its idle GPUs to waiting pods",
                         still_leader=self.ctx.still_leader, refusal=self._refusal)
        if not done.evicted:
            return "gone"
        self.reclaimed.labels(p.namespace).inc()
        log.info("reclaimed idle notebook %s on %s: %s", action.target, p.node, action.reason)
        return done.outcome

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": asdict(self.cfg)}


def build(ctx: ControlContext) -> IdleLoop:
    return IdleLoop(ctx)
