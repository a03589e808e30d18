"""The elastic optimizer on a cluster of several GPU types: a type and a size per job (DESIGN §10).

Sia (SOSP'23) chooses a (type, GPUs) configuration per job in one solve over goodput normalised
per job. Here, per round: each job's type is fixed first, then the existing optimizer
(scoring.control.plan_elastic_for: goodput per job, restart cost, hysteresis) sizes the jobs of
each type on that type's nodes, with each job's value weighted by its speed there over its speed
on its slowest type (scoring.gpu_types.type_weight), so a type's GPUs go to the jobs that gain most
on it. A job never spans types:
- a job holding GPUs keeps its type (moving it would cost a restart and its measured speed there);
- a waiting job is given a type by scoring.gpu_types.assign_types over the room each type has for
  the waiting jobs' smallest sizes, longest-waiting first in the window.
Not Sia's joint integer program: the type choice is a greedy assignment before the sizing DP.
With one type, or types off (GpuTypeSettings.enabled), this is plan_elastic_for unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

from scoring.control import ElasticLoopPlan, plan_elastic_for
from scoring.elastic import ElasticPlan
from scoring.gpu_types import Claim, assign_types, cluster_types, speeds_for, type_weight, typed
from scoring.settings import CoreSettings
from scoring.world import JobState, World


def home_type(job: JobState, node_type: dict[str, str]) -> str | None:
    """The type a job holds GPUs on (the one it holds most on); None when it holds none."""
    by: dict[str, float] = {}
    for node, g in job.gpus_on.items():
        t = node_type.get(node, "")
        by[t] = by.get(t, 0.0) + g
    return max(sorted(by), key=lambda t: by[t]) if by else None


def job_types(world: World, settings: CoreSettings) -> dict[str, str]:
    """Each job's type this round: where it runs, else the one assign_types gives it."""
    s = settings.gpu_types
    node_type = {n.name: n.gpu_type for n in world.nodes}
    types = cluster_types(list(node_type.values()))
    home: dict[str, str] = {}
    for j in world.jobs:
        t = home_type(j, node_type)
        if t is not None:
            home[j.key] = t
    room: dict[str, float] = {t: 0.0 for t in types}
    for n in world.nodes:
        if n.gpu_type in room:
            room[n.gpu_type] += n.gpus
    for j in world.jobs:  # what the running jobs keep at least: an elastic job its minimum
        t = home.get(j.key)
        if t in room:
            room[t] -= float(j.elastic[0]) if j.elastic is not None else j.held_gpus
    waiting = sorted((j for j in world.jobs if j.key not in home),
                     key=lambda j: (-(j.wait_s if math.isfinite(j.wait_s) else 0.0), j.key))[: s.queue_window]
    claims = [Claim(j.key, speeds_for(types, j.model_class, j.gpu_measured),
                    float(j.elastic[0]) if j.elastic is not None else float(j.live_gpus)) for j in waiting]
    home.update(assign_types(claims, room, s.min_share))
    return home


def plan_typed_elastic_for(world: World, settings: CoreSettings, *, migrator_on: bool = False) -> ElasticLoopPlan:
    types = cluster_types([n.gpu_type for n in world.nodes])
    if not typed(types, settings.gpu_types):
        return plan_elastic_for(world, settings, migrator_on=migrator_on)
    home = job_types(world, settings)
    groups = sorted({n.gpu_type for n in world.nodes})  # "" too: untyped nodes are planned apart
    parts: list[tuple[str, ElasticLoopPlan]] = []
    for t in groups:
        jobs = tuple(replace(j, type_weight=type_weight(speeds_for(types, j.model_class, j.gpu_measured), t))
                     for j in world.jobs if home.get(j.key, "") == t)
        sub = replace(world, nodes=tuple(n for n in world.nodes if n.gpu_type == t), jobs=jobs,
                      pending=tuple(p for p in world.pending if home.get(p.job, "") == t))
        parts.append((t, plan_elastic_for(sub, settings, migrator_on=migrator_on)))
    return merge(parts)


def merge(parts: list[tuple[str, ElasticLoopPlan]]) -> ElasticLoopPlan:
    """One plan from the per-type plans: Scale actions carry their type, shrinks first."""
    actions = sorted((replace(a, gpu_type=t) for t, p in parts for a in p.actions), key=lambda a: a.gpus - a.from_gpus)
    planned = [(t, p) for t, p in parts if p.plan is not None]
    jobs = tuple(j for _, p in planned for j in p.jobs)
    options = tuple(o for _, p in planned for o in p.options)
    plan = None
    if planned:
        ps = [p.plan for _, p in planned if p.plan is not None]
        plan = ElasticPlan(tuple(d for x in ps for d in x.decisions), sum(x.total_value for x in ps),
                           sum(x.gpus_used for x in ps), sum(x.capacity for x in ps), all(x.feasible for x in ps))
    accounting: dict[str, float] = {}
    for t, p in parts:
        for k, v in p.accounting.items():
            accounting[k] = accounting.get(k, 0.0) + v
            accounting[f"{t or 'untyped'}.{k}"] = v
    refusals = {k: v for _, p in parts for k, v in p.refusals.items()}
    return ElasticLoopPlan(tuple(actions), jobs, options, plan, accounting, refusals)
