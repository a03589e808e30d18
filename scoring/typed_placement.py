"""Which GPU types a job's pods may bind to: the service's extender filter on a cluster of several
types (DESIGN §10), from the World, as benchmarks/sim/typed.py TypedPlacement decides it.

A job holding GPUs stays on that type (a job never spans types). Else its type is the one its
latest typed elastic plan named, else the one scoring.gpu_types.assign_types gives it among the
waiting jobs for the room each type has (scoring.typed_elastic.job_types), until it has waited
GpuTypeSettings.fallback_s; then the types within min_share of its fastest that can hold it
(every type when none can), fastest for it first. Pure: the shell asks with its own clock and the
job's pods' plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scoring.gpu_types import (
    ANY,
    Claim,
    GpuTypeSettings,
    allowed_types,
    assign_types,
    cluster_types,
    speeds_for,
    typed,
)
from scoring.settings import CoreSettings
from scoring.typed_elastic import home_type, job_types
from scoring.world import JobState, World


@dataclass(frozen=True)
class JobTypes:
    """One job's types as the latest World gave them."""

    home: str | None  # the type it holds GPUs on; None: it holds none
    assigned: str  # its type this round: home, else the one assign_types gave it ("": none)
    speeds: Mapping[str, float]  # its speed on each type (measured where it ran, else the prior)
    measured: tuple[str, ...]  # the types its speed was measured on
    waiting_since: float  # when its oldest waiting pod was created (World clock); NaN: not waiting
    gpus: float  # GPUs its live pods ask for now (more than every type holds: it spans types)
    elastic_min: float = 0.0  # an elastic job's fewest GPUs: past the bound, near types that hold them only


@dataclass(frozen=True)
class TypePlan:
    """Each node's type and each job's types in one World; empty when the World is untyped."""

    at: float = math.nan
    node_types: Mapping[str, str] = field(default_factory=dict)
    room: Mapping[str, float] = field(default_factory=dict)  # free GPUs per type
    capacity: Mapping[str, float] = field(default_factory=dict)  # GPUs per type
    jobs: Mapping[str, JobTypes] = field(default_factory=dict)

    @property
    def typed(self) -> bool:
        return bool(self.node_types)

    def allowed(self, job: str, now: float, s: GpuTypeSettings, *, pinned: str = "", model_class: str = "",
                gpus: float = 0.0, created_at: float = math.nan) -> tuple[str, ...]:
        """The types the job's pods may bind to, tried in order (ANY: all); () no constraint.
        `pinned`: the type its pods' latest elastic plan named. A job the World did not have yet
        (it arrived since) gets its type by the same rule, alone, on the room the World had."""
        if not self.typed:
            return ()
        jt = self.jobs.get(job)
        if jt is None:
            types = cluster_types(list(self.node_types.values()))
            speeds = speeds_for(types, model_class, {})
            own = pinned or assign_types([Claim(job, speeds, gpus)], self.room, s.min_share).get(job, "")
            return allowed_types(own, speeds, now - created_at if math.isfinite(created_at) else 0.0, s,
                                 gpus, dict(self.capacity))
        if jt.home is not None:
            return (jt.home,)
        waited = now - jt.waiting_since if math.isfinite(jt.waiting_since) else 0.0
        return allowed_types(pinned or jt.assigned, jt.speeds, waited, s, jt.gpus, dict(self.capacity),
                             jt.elastic_min)


def plan_types(world: World, settings: CoreSettings) -> TypePlan:
    """The TypePlan of a World (untyped World, or types off: the empty plan)."""
    s = settings.gpu_types
    node_types = {n.name: n.gpu_type for n in world.nodes}
    types = cluster_types(list(node_types.values()))
    if not typed(types, s):
        return TypePlan(at=world.now)
    room: dict[str, float] = {}
    capacity: dict[str, float] = {}
    for n in world.nodes:
        if n.gpu_type:
            room[n.gpu_type] = room.get(n.gpu_type, 0.0) + n.free_gpus
            capacity[n.gpu_type] = capacity.get(n.gpu_type, 0.0) + n.gpus
    assigned = job_types(world, settings)
    jobs = {}
    for j in world.jobs:
        jobs[j.key] = JobTypes(
            home=home_type(j, node_types) or None, assigned=assigned.get(j.key, ""),
            speeds=speeds_for(types, j.model_class, j.gpu_measured),
            measured=tuple(sorted(t for t in j.gpu_measured if t in types)),
            waiting_since=world.now - j.wait_s if math.isfinite(j.wait_s) else math.nan,
            gpus=float(j.live_gpus), elastic_min=float(j.elastic[0]) if j.elastic is not None else 0.0)
    return TypePlan(world.now, node_types, room, capacity, jobs)


def node_masks(plan: TypePlan, world: World, job: JobState, s: GpuTypeSettings) -> list[npt.NDArray[np.bool_]]:
    """Over world.nodes, a mask per type the job's pods may bind to, in the filter's order (nodes
    of no known type with each, as extender/http/gpu_type_gate.filter_by_type); [every node] when
    nothing constrains it. An elastic job: every node, since its pods carry the type of its latest
    elastic plan, which the World does not (admission and the migrator then count GPUs as on one
    type)."""
    every = np.ones(len(world.nodes), dtype=bool)
    allowed = plan.allowed(job.key, world.now, s) if plan.typed and job.elastic is None else ()
    if not allowed or ANY in allowed:
        return [every]
    node_type = np.array([n.gpu_type for n in world.nodes], dtype=object)
    untyped = node_type == ""
    return [(node_type == t) | untyped for t in allowed]
