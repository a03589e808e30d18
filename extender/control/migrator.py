"""The migrator (SpeCon): evicts slow-growing checkpointable jobs so waiting work can start.

world(): the snapshot -> scoring.world.World (extender/control/world_builder.py); the kernel's
migrator plan (scoring.kernel, run by extender/control/loop.py ControlRounds; safety rules and
composition included) gives one Evict per chosen job. act(): re-checks the opt-in on every pod, asks the apiserver
whether every pod may go (dry-run evictions), marks the pods (annotation
flowsched.io/migration, which every replica's pod watch turns into the job's origin record
that the extender scores down), evicts them through policy/v1 Eviction, withdraws the mark if
the eviction is refused, and records a FlowschedMigrated Event per pod with the numbers behind
the decision. A refusal after some pods went ends "partial" (counted and charged like a whole
eviction, a FlowschedPartialEviction Warning Event on each pod left running;
extender/control/eviction.py).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

from prometheus_client import Counter

from extender.control.eviction import evict_job
from extender.control.job_loop import JobLoop
from extender.control.loop import Action, PodRef
from extender.control.runtime import ControlContext
from extender.control.world_builder import PodsOf
from extender.kube.errors import PermanentError
from scoring.actions import ControlAction, Evict
from scoring.kernel import Plan

log = logging.getLogger("flowsched.migrator")

REASON = "FlowschedMigrated"


class Migrator(JobLoop):
    name = "migrator"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.core.migrator
        self.migrations = Counter("flowsched_migrations", "Jobs evicted for migration", ["namespace"],
                                  registry=ctx.registry)
        self.freed = Counter("flowsched_migration_freed_gpus", "GPUs released by migrations",
                             registry=ctx.registry)
        self.last: dict[str, Any] = {}
        self.pods_of: PodsOf = {}  # each job's pods, as the latest World had them

    # ---- Controller ----
    def bind(self, action: ControlAction) -> Action:
        pods = self.pods_of.get(action.key, []) if isinstance(action, Evict) else []
        return Action.of(action, tuple(PodRef(p.namespace, p.name, p.uid, p.node, gpus=p.requests.gpus)
                                       for p in pods if p.node))

    def planned(self, plan: Plan) -> None:
        self.last = dict(plan.view)

    def act(self, action: Action, now: float) -> str:
        e = action.plan
        if not isinstance(e, Evict):
            raise PermanentError(f"the migrator cannot carry out {action.kind}")
        attained = round(e.attained_gpu_s, 3) if math.isfinite(e.attained_gpu_s) else None
        mark = {"from": e.origin, "at": round(now, 3), "count": e.count, "attained": attained}
        done = evict_job(self.ctx.state, self.ctx.actions, self.ctx.recorder, action.key, action.pods, mark,
                         action.reason, REASON, "to migrate", still_leader=self.ctx.still_leader, marks=self.ctx.marks)
        if not done.evicted:
            return "gone"
        # Every job with a pod evicted counts, a partial eviction too (outcome "partial").
        self.migrations.labels(done.evicted[0].namespace).inc()
        # The GPUs the plan counted (DRA GPUs included: the control view's requests), not the
        # snapshot's PodInfo the eviction re-read (its requests count device-plugin GPUs only).
        gone = {p.uid for p in done.evicted}
        self.freed.inc(sum(r.gpus for r in action.pods if r.uid in gone))
        log.info("migrated %s off %s (%s): %s", action.key, e.origin, done.outcome, action.reason)
        return done.outcome

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": asdict(self.cfg)}


def build(ctx: ControlContext) -> Migrator:
    return Migrator(ctx)
