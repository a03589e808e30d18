"""The resizer's round, pure: FlowCon's shares (scoring.resize) per node over the opted-in pods the
World carries (World.resize_nodes), the bottleneck diagnoses applied (scoring.remedy), one Resize
per changed pod, decreases first so the node has room for the raises, and one ResizeHeld notice
per pod whose resize the kubelet holds back (once per reason: the memory says which were told).

Moved here from the service's shell (extender/control/resizer.py), which now only reads the pods
into the World, carries the actions out and sets its metrics from `nodes` below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from scoring.actions import Resize, ResizeHeld
from scoring.convergence import Phase
from scoring.remedy import resize_targets
from scoring.resize import NodeRows, Why, growth_efficiency, plan_node
from scoring.settings import CoreSettings
from scoring.world import ResizeNode, World


def _fmt_m(m: float) -> str:
    return f"{round(m)}m"


@dataclass(frozen=True)
class ResizerPlan:
    actions: tuple[ResizeHeld | Resize, ...]  # notices, then decreases, then raises
    reported: Mapping[str, str]  # pod uid -> the pending reason already told (the memory)
    nodes: Mapping[str, Mapping[str, Any]]  # node -> pool, skipped pods, each pod's numbers and verdict

    def describe(self, now: float) -> dict[str, Any]:
        return {"at": now, "nodes": {k: dict(v) for k, v in self.nodes.items()}}


def pending_notices(nodes: tuple[ResizeNode, ...], reported: Mapping[str, str]
                    ) -> tuple[list[ResizeHeld], dict[str, str]]:
    """One notice per pod and pending reason; a pod whose condition cleared may be told again."""
    out: list[ResizeHeld] = []
    told = dict(reported)
    for r in (r for nd in nodes for r in nd.rows):
        if r.pending is None:
            told.pop(r.uid, None)
            continue
        reason, message = r.pending
        if told.get(r.uid) == reason:
            continue
        told[r.uid] = reason
        out.append(ResizeHeld(r.pod, r.uid, r.container, reason, (
            f"the kubelet holds the CPU resize of container {r.container} back ({reason}): "
            f"{message or 'no message'}; flowsched leaves this pod alone until the condition clears")))
    return out, told


def plan_resizes(world: World, settings: CoreSettings, reported: Mapping[str, str]) -> ResizerPlan:
    s = settings.resizer
    headroom = s.headroom_m
    notices, told = pending_notices(world.resize_nodes, reported)
    downs: list[Resize] = []
    ups: list[Resize] = []
    nodes: dict[str, Mapping[str, Any]] = {}
    for nd in world.resize_nodes:
        rows = nd.rows
        diagnoses = {r.job: r.diagnosis for r in rows if r.diagnosis is not None}
        # Pool: allocatable minus every other pod's request on the node, minus headroom.
        pool = nd.allocatable_m - nd.others_m - headroom
        cur = np.array([r.request_m for r in rows])
        # A pod with a resize in flight or pending is evidence-less for this round: frozen.
        phase = np.array([int(Phase.UNKNOWN) if r.in_flight else int(r.phase) for r in rows], dtype=np.int64)
        progress = np.array([r.progress for r in rows])
        g = growth_efficiency(progress, cur, pool)
        plan = plan_node(NodeRows.build(
            pool, cur, g, phase, original_m=[r.original_m for r in rows], min_m=[r.min_m for r in rows],
            max_m=[r.max_m for r in rows], may_shrink=[r.may_shrink for r in rows],
            since_resize_s=[r.since_resize_s for r in rows],
        ), s)
        # The bottleneck diagnosis (scoring.remedy): no CPU for a job CPU is not what holds back,
        # CPU for an input-bound one.
        frozen = [r.in_flight or r.since_resize_s < s.cooldown_s for r in rows]
        new_m, diag_why = resize_targets([r.job for r in rows], cur, plan.new_m, [r.max_m for r in rows], pool,
                                         diagnoses, settings.bottleneck, frozen=frozen)
        pods: dict[str, Any] = {}
        for i, r in enumerate(rows):
            why = diag_why.get(i) or Why(int(plan.why[i])).name
            pods[r.pod] = {
                "job": r.job, "phase": Phase(int(phase[i])).name, "progress": float(progress[i]),
                "growth": float(g[i]), "current_m": float(cur[i]), "target_m": float(plan.target_m[i]),
                "new_m": float(new_m[i]), "lo_m": float(plan.lo_m[i]), "hi_m": float(plan.hi_m[i]),
                "why": why, "pending": r.pending,
            }
            if abs(float(new_m[i]) - float(cur[i])) < 0.5:
                continue
            new = float(new_m[i])
            hi_txt = "inf" if math.isinf(plan.hi_m[i]) else _fmt_m(plan.hi_m[i])
            reason = (f"cpu {_fmt_m(cur[i])} -> {_fmt_m(new)} ({why.lower()}): phase "
                      f"{Phase(int(phase[i])).name.lower()}, G={g[i]:.3g}, share of node pool "
                      f"{cur[i] / pool:.2f} -> {new / pool:.2f}, pool {_fmt_m(pool)} on {nd.node}, "
                      f"bounds [{_fmt_m(plan.lo_m[i])}, {hi_txt}]")
            action = Resize(r.pod, r.uid, r.job, nd.node, r.container, float(cur[i]), new, r.limit_ratio,
                            r.original_m, r.had_original, reason)
            (ups if new > cur[i] else downs).append(action)
        nodes[nd.node] = {"pool_m": pool, "skipped": dict(nd.skipped), "pods": pods,
                          "requested_m": float(new_m.sum())}
    return ResizerPlan((*notices, *downs, *ups), told, nodes)
