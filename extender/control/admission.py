"""The admission loop: releases gated jobs (pods carrying the scheduling gate
`flowsched.io/admission`) in the control core's order, a whole gang at a time, and preempts
checkpointable jobs of later queues for long-waiting work. See docs/admission.md.

observe(): the World (extender/control/world_builder.py). plan(): the kernel's admission plan
(scoring.kernel.plan_loop: scoring.admission.plan_admission_for), as the simulator runs it. act():
an "admit" removes the gate from every gated pod of the job (a merge-patch of spec.schedulingGates
keeping any other gate) and records a FlowschedAdmitted Event per pod; a "preempt" goes through the
migrator's eviction path (extender/control/eviction.py: opt-in re-checked, PodDisruptionBudgets,
the eviction mark with the job's attained service and its count of flowsched-caused restarts + 1,
which the migrator's max_migrations reads too, a FlowschedPreempted Event), within its own budget.
That budget is spent when a preemption is planned, so a dry run (which never acts) shows what
acting would do, and given back when the preemption is refused or its job is gone.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from prometheus_client import Counter

from extender.control.errors import LeaderGuard
from extender.control.events import ObjectRef
from extender.control.eviction import evict_job
from extender.control.loop import Action, PodRef
from extender.control.runtime import ControlContext
from extender.control.world_builder import Observed, observe
from extender.kube.errors import LostLeadership, PermanentError, TemporaryError
from scoring.actions import Preempt, Release
from scoring.kernel import Memory, plan_loop
from scoring.safety import Budget

log = logging.getLogger("flowsched.admission")
# The key of admission's preemption budget in the budget store (the loops' own are their names).
PREEMPT_BUDGET = "admission-preemptions"

ADMITTED = "FlowschedAdmitted"
PREEMPTED = "FlowschedPreempted"


class Admission:
    name = "admission"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.core.admission
        self.preempt_budget = Budget(self.cfg.max_preemptions_per_interval, self.cfg.max_preemptions_per_hour)
        self.admitted = Counter("flowsched_admitted_pods", "Pods released from flowsched's scheduling gate",
                                ["namespace"], registry=ctx.registry)
        self.preempted = Counter("flowsched_preemptions", "Jobs evicted by admission for long-waiting work",
                                 ["namespace"], registry=ctx.registry)
        self.last: dict[str, Any] = {}
        self._spent: dict[str, float] = {}  # job -> when this round's plan spent preemption budget on it
        self._parked: dict[str, float] = {}  # job -> until when the loop backs its preemption off (as the loop)

    def observe(self, now: float) -> Observed | None:
        return observe(self.ctx.state.read(), self.ctx.world, now, gpu_pods_only=False, last=self.last)

    def plan(self, observed: Observed | None, budget_left: int) -> Sequence[Action]:
        if observed is None:
            return []
        world = observed.world
        now = self.ctx.clock()
        self.preempt_budget.new_interval()
        if self.ctx.budgets is not None:  # what this or an earlier leader preempted this hour
            try:
                self.preempt_budget.restore(self.ctx.budgets.load().get(PREEMPT_BUDGET, ()), now)
            except Exception as e:
                raise TemporaryError(f"saved preemption budget unreadable: {e}", 0.0) from e
        plan = plan_loop("admission", world, self.ctx.core, Memory(), budget_left, self.ctx.settings.controllers,
                         preempt_left=self.preempt_budget.left(now))
        self.last = dict(plan.view)
        # The preemption budget is spent when a preemption is planned, so a dry run (which never
        # calls act) shows what acting would do; act() gives it back if the preemption is not
        # carried out. A victim the loop has parked (it will report `backoff`) spends nothing.
        self._spent = {}
        self._parked = {k: t for k, t in self._parked.items() if t > now}
        out: list[Action] = []
        for a in plan.actions:
            if isinstance(a, Preempt):
                if self._parked.get(a.job, -math.inf) <= now:
                    self.preempt_budget.spend(now)
                    self._spent[a.job] = now
                out.append(self._preempt(a, observed))
            elif isinstance(a, Release):
                out.append(self._admit(a, observed))
        return out  # preemptions first (the kernel's order): they free what the waiting job needs

    def _admit(self, a: Release, observed: Observed) -> Action:
        gate = self.cfg.gate
        pods = [p for p in observed.pods_of.get(a.job, []) if gate in p.scheduling_gates and not p.terminating]
        return Action.of(a, tuple(PodRef(p.namespace, p.name, p.uid, p.node,
                                         tuple(g for g in p.scheduling_gates if g != gate)) for p in pods))

    @staticmethod
    def _preempt(p: Preempt, observed: Observed) -> Action:
        pods = [x for x in observed.pods_of.get(p.job, []) if x.node]
        return Action.of(p, tuple(PodRef(x.namespace, x.name, x.uid, x.node, gpus=x.requests.gpus) for x in pods))

    def act(self, action: Action, now: float) -> str:
        if action.kind == "preempt":
            return self._act_preempt(action, now)
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

    def _act_preempt(self, action: Action, now: float) -> str:
        try:
            outcome = self._evict_for(action, now)
        except TemporaryError as e:
            self._not_carried_out(action.key, now, now + e.delay_s)
            raise
        except Exception:  # PermanentError, or a bug: the loop parks the key for permanent_backoff_s
            self._not_carried_out(action.key, now, now + self.ctx.settings.control.permanent_backoff_s)
            raise
        if outcome == "gone":
            self._not_carried_out(action.key, now, now)
        else:
            self._spent.pop(action.key, None)
            self._save_preempt_budget(now)
        return outcome

    def _save_preempt_budget(self, now: float) -> None:
        if self.ctx.budgets is None:
            return
        # Only what was carried out: the round's other planned preemptions are still in _spent
        # (spent at planning), and a refusal after this save would give back in memory alone.
        carried = (collections.Counter(self.preempt_budget.spent_times(now))
                   - collections.Counter(self._spent.values()))
        try:
            self.ctx.budgets.save(PREEMPT_BUDGET, sorted(carried.elements()))
        except Exception as e:  # the preemption is done; the in-memory budget still holds
            log.warning("could not save the preemption budget (a restart would forget it): %s", e)

    def _not_carried_out(self, job: str, now: float, parked_until: float) -> None:
        """The preemption planned for `job` did not happen: its budget back; while the loop parks
        the key, re-planning it spends nothing (the loop will not act on it)."""
        at = self._spent.pop(job, None)
        if at is not None:
            self.preempt_budget.refund(at)
        if parked_until > now:
            self._parked[job] = parked_until

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
                         action.reason, PREEMPTED, f"for {p.for_job}", still_leader=self.ctx.still_leader)
        if not done.evicted:
            return "gone"
        self.preempted.labels(done.evicted[0].namespace).inc()
        log.info("preempted %s for %s (%s): %s", action.key, p.for_job, done.outcome, action.reason)
        return done.outcome

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": asdict(self.cfg),
                "preemption_budget_left": self.preempt_budget.remaining(self.ctx.clock())}


def build(ctx: ControlContext) -> Admission:
    return Admission(ctx)
