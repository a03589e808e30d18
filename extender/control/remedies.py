"""The remedies of bottleneck diagnosis in the service (docs/bottlenecks.md, "Remedies").

world(): the World (extender/control/world_builder.py) with each job's latest diagnosis on it
(the BottleneckDiagnoser, extender/control/bottleneck.py, feeds them in); the kernel's remedies
plan (scoring.remedy.plan_remedies, through scoring.kernel.run_round, dry run and budget as
every loop) gives one typed remedy per confidently diagnosed job.

None of them is carried out by this loop: each is told, as an Event on the job's first pod and a
count in flowsched_remedies_total{remedy}, so that the one who can act does:
- GiveCpu: the resizer raises a CPU-bound job's opted-in pods in its own round (the diagnosis is
  in its World: scoring.resize_loop, scoring.remedy.resize_targets); a Normal Event when the
  resizer runs, a Warning asking for flowsched.io/resizable (or more CPU) when it does not;
- Consolidate, AddPs, MoveReplica need a restart placed by a person or the job's own operator
  (more parameter servers, a replica moved): a Warning Event with the recommendation and why.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from prometheus_client import Counter

from extender.control.events import ObjectRef
from extender.control.job_loop import JobLoop
from extender.control.loop import Action, PodRef
from extender.control.runtime import ControlContext
from extender.control.world_builder import PodsOf
from extender.kube.errors import PermanentError
from scoring.actions import AddPs, Consolidate, ControlAction, GiveCpu, MoveReplica
from scoring.kernel import Plan

log = logging.getLogger("flowsched.remedies")

REASON = "FlowschedRemedy"


def recommendation(a: ControlAction, resizer_on: bool) -> tuple[str, str]:
    """(Event type, message) telling what the remedy asks for and who can do it."""
    if isinstance(a, GiveCpu):
        if resizer_on:
            return "Normal", f"more CPU: the resizer raises its opted-in pods within their cpu-max ({a.reason})"
        return "Warning", (f"more CPU recommended: annotate its pods flowsched.io/resizable=\"true\" (and enable "
                           f"the resizer) or raise their CPU request ({a.reason})")
    if isinstance(a, Consolidate):
        return "Warning", (f"consolidation recommended: restart it on {a.target_node}, which has room for all "
                           f"{a.gpus:g} GPUs, instead of {a.from_nodes} nodes ({a.reason})")
    if isinstance(a, AddPs):
        return "Warning", f"more parameter servers recommended: PS replicas {a.from_ps} -> {a.ps} ({a.reason})"
    if isinstance(a, MoveReplica):
        return "Warning", f"moving replica {a.pod} off {a.node} recommended ({a.reason})"
    raise PermanentError(f"the remedies loop cannot carry out {a.kind}")


class Remedies(JobLoop):
    name = "remedies"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.told = Counter("flowsched_remedies", "Remedies of a diagnosed bottleneck, told as an Event",
                            ["remedy"], registry=ctx.registry)
        self.last: dict[str, Any] = {}
        self.pods_of: PodsOf = {}

    def bind(self, action: ControlAction) -> Action:
        pods = sorted((p for p in self.pods_of.get(action.key, []) if p.node), key=lambda p: p.name)
        return Action.of(action, tuple(PodRef(p.namespace, p.name, p.uid, p.node) for p in pods))

    def planned(self, plan: Plan) -> None:
        self.last = dict(plan.view)

    def act(self, action: Action, now: float) -> str:
        if action.plan is None:
            raise PermanentError(f"the remedies loop cannot carry out {action.kind}")
        type_, message = recommendation(action.plan, "resizer" in self.ctx.settings.controllers)
        if not action.pods:
            return "gone"
        first = action.pods[0]
        self.ctx.recorder.record(ObjectRef(first.namespace, first.name, first.uid), REASON,
                                 f"{action.kind} for {action.key}: {message}", type_=type_, action="Recommend")
        self.told.labels(action.kind).inc()
        log.info("remedy %s for %s: %s", action.kind, action.key, message)
        return "recommended"

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": asdict(self.ctx.core.bottleneck)}


def build(ctx: ControlContext) -> Remedies:
    return Remedies(ctx)
