"""The extender filter's GPU-type step (DESIGN §10, docs/gpu-types.md): on a cluster of several
GPU types, a GPU pod passes only on nodes of one type, the first of the types its job may bind to
(scoring.typed_placement.TypePlan.allowed: its home type, its plan's, the one it was given, or,
after fallback_s, each type fastest for it first) that has a node passing the filter. Nodes of no
known type pass (the extender never blocks scheduling because its view lags). With one type, or
no plan yet, nothing changes: one attribute read per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from extender.http.verbs import FilterAnswer
from extender.snapshot.objects import MODEL_CLASS, job_key, parse_time
from extender.snapshot.state import ClusterState
from scoring.gpu_types import ANY, GpuTypeSettings
from scoring.typed_placement import TypePlan

WRONG_TYPE = "not the GPU type flowsched keeps this job on"


@dataclass(frozen=True)
class TypeGate:
    plan: Callable[[], TypePlan]  # the latest TypePlan (extender/control/type_plan.py)
    settings: GpuTypeSettings
    job_view: Callable[[str], dict[str, Any] | None] = lambda _key: None  # for /debug/explain

    def allowed(self, state: ClusterState, pod: Mapping[str, Any], gpus: float, now: float
                ) -> tuple[TypePlan, tuple[str, ...]]:
        """The plan and the types the pod's job may bind to, in order; () no constraint."""
        plan = self.plan()
        if gpus <= 0 or not plan.typed:
            return plan, ()
        meta = pod.get("metadata") or {}
        key = job_key(meta)
        pinned = (state.read().plan_of(key) or {}).get("gpu_type")
        ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        cls = ann.get(MODEL_CLASS) or labels.get(MODEL_CLASS)
        created = parse_time(meta.get("creationTimestamp"))
        return plan, plan.allowed(key, now, self.settings, pinned=pinned if isinstance(pinned, str) else "",
                                  model_class=cls if isinstance(cls, str) else "", gpus=gpus,
                                  created_at=created if created is not None else math.nan)

    def filter(self, decide: Callable[[list[str]], FilterAnswer], state: ClusterState, pod: Mapping[str, Any],
               gpus: float, names: list[str], now: float) -> FilterAnswer:
        plan, allowed = self.allowed(state, pod, gpus, now)
        return filter_by_type(decide, names, plan.node_types, allowed)


def filter_by_type(decide: Callable[[list[str]], FilterAnswer], names: list[str], node_types: Mapping[str, str],
                   allowed: tuple[str, ...]) -> FilterAnswer:
    """`decide` (the filter, ranked or not) on the candidates of one type at a time, in the allowed
    order, nodes of no known type with each: the first type where one of its nodes passes wins
    (ranking only among its nodes and the untyped); when none does, the first type's answer. The other nodes fail with
    WRONG_TYPE."""
    if not allowed or ANY in allowed:
        return decide(names)
    first: tuple[FilterAnswer, list[str]] | None = None
    for t in allowed:
        sub = [n for n in names if node_types.get(n, "") in ("", t)]
        ans = decide(sub)
        if first is None:
            first = (ans, sub)
        if any(node_types.get(n, "") == t for n in ans.passed):
            first = (ans, sub)
            break
    assert first is not None  # allowed is not empty
    ans, sub = first
    kept = set(sub)
    moved = [n for n in names if n not in kept]
    if not moved:
        return ans
    return replace(ans, failed={**ans.failed, **dict.fromkeys(moved, WRONG_TYPE)},
                   rejected={**ans.rejected, WRONG_TYPE: ans.rejected.get(WRONG_TYPE, 0) + len(moved)})
