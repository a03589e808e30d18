"""The admission loop: releases gated jobs (pods carrying the scheduling gate
`flowsched.io/admission`) in the control core's order, a whole gang at a time, and preempts
checkpointable jobs of later queues for long-waiting work. See docs/admission.md.

world(): the World (extender/control/world_builder.py); the kernel's admission plan
(scoring.kernel: scoring.admission.plan_admission_for), as the simulator runs it. act():
an "admit" removes the gate from every gated pod of the job (a merge-patch of spec.schedulingGates
keeping any other gate) and records a FlowschedAdmitted Event per pod; a "preempt" goes through the
migrator's eviction path (extender/control/eviction.py: opt-in re-checked, PodDisruptionBudgets,
the eviction mark with the job's attained service and its count of flowsched-caused restarts + 1,
which the migrator's max_migrations reads too, a FlowschedPreempted Event), within its own budget
(scoring.kernel.PREEMPT_BUDGET, owned by the rounds runner with the loops' own: spent by a
preemption carried out, or planned in a dry run; never by one refused or parked).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

from prometheus_client import Counter

from extender.control.errors import LeaderGuard
from extender.control.events import ObjectRef
from extender.control.eviction import evict_job
from extender.control.job_loop import JobLoop
from extender.control.loop import Action, PodRef
from extender.control.runtime import ControlContext
from extender.control.world_builder import PodsOf
from extender.kube.errors import LostLeadership, PermanentError
from scoring.actions import ControlAction, Preempt
from scoring.kernel import Plan

log = logging.getLogger("flowsched.admission")

ADMITTED = "FlowschedAdmitted"
PREEMPTED = "FlowschedPreempted"


class Admission(JobLoop):
    name = "admission"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.core.admission
        self.admitted = Counter("flowsched_admitted_pods", "Pods released from flowsched's scheduling gate",
                                ["namespace"], registry=ctx.registry)
        self.preempted = Counter("flowsched_preemptions", "Jobs evicted by admission for long-waiting work",
                                 ["namespace"], registry=ctx.registry)
        self.last: dict[str, Any] = {}
        self.pods_of: PodsOf = {}  # each job's pods, as the latest World had them

    # ---- Controller ----
    def bind(self, action: ControlAction) -> Action:
        pods = self.pods_of.get(action.key, [])
        if isinstance(action, Preempt):
            return Action.of(action, tuple(PodRef(x.namespace, x.name, x.uid, x.node, gpus=x.requests.gpus)
                                           for x in pods if x.node))
        gate = self.cfg.gate
        return Action.of(action, tuple(PodRef(p.namespace, p.name, p.uid, p.node,
                                              tuple(g for g in p.scheduling_gates if g != gate))
                                       for p in pods if gate in p.scheduling_gates and not p.terminating))

    def planned(self, plan: Plan) -> None:
        self.last = dict(plan.view)

    def act(self, action: Action, now: float) -> str:
        if action.kind == "preempt":
            return self._evict_for(action, now)
        actions = self.ctx.actions
        if actions is None:
            raise PermanentError("no cluster: admission can only plan")
        released = 0
        guard = LeaderGuard(self.ctx.still_leader)
        for p in action.pods:
            try:
                guard(f"releasing {p.namespace}/{p.name}")
            except LostLeadership:
                if released:
                    log.warning("%s: gang partly released (%d of %d pods) when this replica lost the Lease; the "
                                "next leader releases the rest as they fit", action.key, released,
                                len(action.pods))
                    self.admitted.labels(action.key.split("/", 1)[0]).inc(released)
                raise
            if actions.set_scheduling_gates(p.namespace, p.name, list(p.gates)):
                released += 1
                if self.ctx.still_leader():
                    self.ctx.recorder.record(ObjectRef(p.namespace, p.name, p.uid), ADMITTED,
                                             f"Scheduling gate {self.cfg.gate} removed: {action.reason}",
                                             action="Admit")
        if not released:
            return "gone"
        self.admitted.labels(action.key.split("/", 1)[0]).inc(released)
        log.info("admitted %s (%d pods): %s", action.key, released, action.reason)
        return "admitted"

    def _evict_for(self, action: Action, now: float) -> str:
        p = action.plan
        if not isinstance(p, Preempt):
            raise PermanentError(f"admission cannot carry out {action.kind}")
        # The job's restarts so far + 1: the planned count, or more if a newer mark reached the
        # watch since (never 1 for a job that was already moved: that would reset its count).
        known = self.ctx.state.read().migration_of(action.key)
        count = max(p.count, known.count + 1 if known is not None else 1)
        origin = max(((x.node or "", x.gpus) for x in action.pods), key=lambda t: t[1], default=("", 0.0))[0]
        attained = round(p.attained_gpu_s, 3) if math.isfinite(p.attained_gpu_s) else None
        mark = {"from": origin, "at": round(now, 3), "count": count, "attained": attained, "preempted_for": p.for_job}
        done = evict_job(self.ctx.state, self.ctx.actions, self.ctx.recorder, action.key, action.pods, mark,
                         action.reason, PREEMPTED, f"for {p.for_job}", still_leader=self.ctx.still_leader,
                         marks=self.ctx.marks)
        if not done.evicted:
            return "gone"
        self.preempted.labels(done.evicted[0].namespace).inc()
        log.info("preempted %s for %s (%s): %s", action.key, p.for_job, done.outcome, action.reason)
        return done.outcome

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": asdict(self.cfg)}


def build(ctx: ControlContext) -> Admission:
    return Admission(ctx)
