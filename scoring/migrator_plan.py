"""The migrator's plan from a World (scoring.kernel runs it in a round; SpeCon's moves over the
arrays of scoring.migration).

    plan_migrations_for(world, settings, max_moves=..., elastic_on=...) -> MigratorPlan

Both shells (the service's extender/control/, the simulator's benchmarks/sim/) call exactly this,
with the same CoreSettings, and carry out the actions it returns. The safety rules
(scoring.safety) are applied here; composition with the elastic optimizer is scoring.control's
docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from scoring.actions import Evict
from scoring.convergence import Phase
from scoring.migration import WHY_TEXT, BoolArray, Demands, JobArrays, MigrationPlan, Why, plan_migrations
from scoring.safety import NOT_CHECKPOINTABLE, migrator_refusal
from scoring.settings import CoreSettings
from scoring.typed_placement import node_masks, plan_types
from scoring.world import JobState, World


def _fmt(x: float, spec: str = ".3g") -> str:
    return format(x, spec) if math.isfinite(x) else "unknown"


@dataclass(frozen=True)
class MigratorPlan:
    actions: tuple[Evict, ...]
    jobs: tuple[str, ...]  # the rows the planner saw (jobs holding GPUs)
    arrays: JobArrays
    plan: MigrationPlan
    refusals: dict[str, str]  # job -> the safety rule that kept it out
    unmet: tuple[str, ...]

    def describe(self, world: World) -> dict[str, Any]:
        j = self.arrays

        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {
            "at": world.now,
            "unmet_demands": list(self.unmet),
            "free_gpus": dict(zip(world.node_names, world.free_gpus().tolist(), strict=True)),
            "jobs": {key: {
                "decision": self.refusals.get(key) or WHY_TEXT[Why(int(self.plan.why[r]))],
                "checkpointable": bool(j.opted_in[r]), "phase": Phase(int(j.phase[r])).name.lower(),
                "growth_efficiency": num(float(j.growth[r])), "remaining_s": num(float(j.remaining_s[r])),
                "runtime_s": num(float(j.runtime_s[r])), "migrations": int(j.migrations[r]),
                "attained_gpu_s": num(float(j.attained_gpu_s[r])) if j.attained_gpu_s is not None else None,
                "gpus": float(j.gpus_on[r].sum())} for r, key in enumerate(self.jobs)},
        }


def migration_arrays(world: World, settings: CoreSettings, elastic_on: bool
                     ) -> tuple[list[JobState], JobArrays, dict[str, str]]:
    """The planner's arrays: one row per job holding GPUs, one column per schedulable node."""
    col = {n: k for k, n in enumerate(world.node_names)}
    rows = [j for j in world.jobs if j.held_gpus > 0]
    gpus_on = np.zeros((len(rows), len(col)))
    refusals: dict[str, str] = {}
    allowed = np.ones(len(rows), dtype=bool)
    for r, job in enumerate(rows):
        for node, g in job.gpus_on.items():
            if node in col:
                gpus_on[r, col[node]] += g
        why = migrator_refusal(job, world, settings.safety, elastic_on)
        if why is not None and why != NOT_CHECKPOINTABLE:
            allowed[r] = False
            refusals[job.key] = why
    est = [j.estimate for j in rows]
    growth = [e.growth_efficiency if e is not None and math.isfinite(e.growth_efficiency)
              else (e.progress if e is not None else math.nan) for e in est]
    arrays = JobArrays(
        opted_in=np.array([j.checkpointable for j in rows], dtype=bool),
        allowed=allowed,
        running=np.array([j.running for j in rows], dtype=bool),
        runtime_s=np.array([j.runtime_s for j in rows], dtype=np.float64),
        phase=np.array([int(j.phase) for j in rows], dtype=np.int64),
        growth=np.array(growth, dtype=np.float64),
        # Its end under its stopping rule (planned end, target, early stopping; without a rule the
        # plateau, when the prediction weighs at least admission.min_evidence): JobState.seconds_to_end.
        remaining_s=np.array([j.seconds_to_end(settings.admission.min_evidence) for j in rows], dtype=np.float64),
        migrations=np.array([j.migrations for j in rows], dtype=np.int64),
        since_migration_s=np.array([j.since_migration_s for j in rows], dtype=np.float64),
        gpus_on=gpus_on,
        attained_gpu_s=np.array([j.attained_gpu_s for j in rows], dtype=np.float64),
    )
    return rows, arrays, refusals


def pending_nodes(world: World, settings: CoreSettings) -> BoolArray | None:
    """[pending pod, node]: where the extender's filter lets each pending pod bind, any of its job's
    types (scoring.typed_placement.node_masks); None on a cluster of one type. A typed move freed
    K80s for a pod that binds only to a V100: an eviction that serves nothing."""
    types = plan_types(world, settings)
    if not types.typed or not world.pending:
        return None
    masks: dict[str, BoolArray] = {}
    rows = []
    for p in world.pending:
        if p.job not in masks:
            job = world.job(p.job)
            masks[p.job] = (np.logical_or.reduce(node_masks(types, world, job, settings.gpu_types)) if job is not None
                            else np.ones(len(world.nodes), dtype=bool))
        rows.append(masks[p.job])
    return np.array(rows, dtype=bool).reshape(len(world.pending), len(world.nodes))


def plan_migrations_for(world: World, settings: CoreSettings, *, max_moves: int | None = None,
                        elastic_on: bool = False) -> MigratorPlan:
    """SpeCon's moves for this World; at most `max_moves` (default: the per-interval budget)."""
    ms = settings.migrator
    rows, arrays, refusals = migration_arrays(world, settings, elastic_on)
    demands = Demands.pending(np.array([p.gpus for p in world.pending], dtype=np.float64),
                              np.array([p.wait_s for p in world.pending], dtype=np.float64),
                              pending_nodes(world, settings))
    if max_moves is not None and max_moves <= 0:
        plan = MigrationPlan((), np.full(len(rows), int(Why.MOVE_LIMIT), dtype=np.int64), ())
    else:
        plan = plan_migrations(arrays, world.free_gpus(), demands, ms, max_moves)
    names = world.node_names
    pend = [p.key for p in world.pending]
    actions = []
    alpha = settings.convergence.alpha
    for m in plan.moves:
        job = rows[m.job]
        origin = names[int(np.argmax(arrays.gpus_on[m.job]))]
        served = tuple(pend[d] for d in m.served)
        plateau = job.estimate.remaining_seconds if job.estimate is not None else math.nan
        count = job.migrations + 1
        reason = (f"phase {job.phase.name.lower()}, growth efficiency {_fmt(float(arrays.growth[m.job]))} < alpha "
                  f"{alpha:g}, time to plateau {_fmt(plateau, '.0f')}s, running {_fmt(job.runtime_s, '.0f')}s, "
                  f"migration {count}/{ms.max_migrations}: frees {m.freed_gpus:g} GPUs on {origin} for "
                  f"{len(served)} waiting pod(s) needing {m.benefit_gpus:g} GPUs "
                  f"({', '.join(served[:3])}{', ...' if len(served) > 3 else ''}); "
                  f"estimated restart cost {ms.restart_cost_s:.0f}s")
        actions.append(Evict(job.key, origin, count, m.freed_gpus, m.benefit_gpus, served,
                             tuple(names[k] if k >= 0 else None for k in m.relocation), reason,
                             attained_gpu_s=job.attained_gpu_s))
    unmet = tuple(pend[d] for d in plan.unmet_before)
    return MigratorPlan(tuple(actions), tuple(j.key for j in rows), arrays, plan, refusals, unmet)
