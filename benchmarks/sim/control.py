"""The simulator shell's other half: run the control core each round and carry out its actions
through the engine's public API only (engine.resize for Scale, engine.evict for Evict).

Per round, in scoring.control.LOOP_ORDER (the optimizer, then the migrator on the result), for
each enabled loop whose interval has come: build the World (benchmarks/sim/world.py), call the
same plan function `flowsched serve` calls with the same CoreSettings, and apply its actions
within the loop's budget (scoring.safety.Budget), as the service's ControlLoop does. After the
optimizer acts, kube-scheduler (the engine's policy) binds what now fits: a real kube-scheduler
binds new pods within seconds, not a round later. Nothing here decides anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.world import SimWorldBuilder, changes_batch_live, job_key
from scoring.admission import plan_admission_for
from scoring.control import LOOP_ORDER, Evict, Scale, plan_elastic_for, plan_migrations_for
from scoring.safety import Budget
from scoring.settings import CoreSettings
from scoring.tracker import ConvergenceTracker
from scoring.world import World


@dataclass
class ControlStats:
    plans: dict[str, int] = field(default_factory=dict)
    resizes: int = 0
    grows: int = 0
    shrinks: int = 0
    batch_changes: int = 0
    migrations: int = 0
    jobs_migrated: set[int] = field(default_factory=set)
    admitted: int = 0
    preempted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # safety rule -> jobs x rounds it kept out


@dataclass
class SimControl:
    settings: CoreSettings
    loops: tuple[str, ...]
    builder: SimWorldBuilder = field(init=False)
    budgets: dict[str, Budget] = field(init=False)
    stats: ControlStats = field(default_factory=ControlStats)
    _last: dict[str, float] = field(default_factory=dict)
    _jobs: dict[str, SimJob] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [x for x in self.loops if x not in LOOP_ORDER]
        if unknown:
            raise ValueError(f"unknown control loops {unknown}; known: {', '.join(LOOP_ORDER)}")
        self.builder = SimWorldBuilder(self.settings, ConvergenceTracker(self.settings.convergence))
        self.budgets = {n: Budget(self.settings.loop(n).max_per_interval, self.settings.loop(n).max_per_hour)
                        for n in self.loops}
        a = self.settings.admission
        self.preempt_budget = Budget(a.max_preemptions_per_interval, a.max_preemptions_per_hour)

    def _job(self, engine: Engine, key: str) -> SimJob:
        if not self._jobs:
            self._jobs = {job_key(j): j for j in engine.jobs}
        return self._jobs[key]

    def _count_refusals(self, refusals: dict[str, str]) -> None:
        for why in refusals.values():
            self.stats.refused[why] = self.stats.refused.get(why, 0) + 1

    def __call__(self, engine: Engine, now: float) -> None:
        for name in LOOP_ORDER:
            if name not in self.loops:
                continue
            if now - self._last.get(name, -math.inf) < self.settings.loop(name).interval_s - 1e-9:
                continue
            self._last[name] = now
            budget = self.budgets[name]
            budget.new_interval()
            self.stats.plans[name] = self.stats.plans.get(name, 0) + 1
            world = self.builder.build(engine, now)
            if name == "elastic":
                self._elastic(engine, world, budget, now)
            elif name == "admission":
                self._admission(engine, world, budget, now)
            else:
                self._migrator(engine, world, budget, now)

    def plan(self, loop: str, world: World, budget_left: int) -> tuple[Scale, ...] | tuple[Evict, ...]:
        """The core's actions for one loop on this World (what the service's controller would plan)."""
        if loop == "elastic":
            ep = plan_elastic_for(world, self.settings, migrator_on="migrator" in self.loops)
            self._count_refusals(ep.refusals)
            return ep.actions
        mp = plan_migrations_for(world, self.settings, max_moves=budget_left, elastic_on="elastic" in self.loops)
        self._count_refusals(mp.refusals)
        return mp.actions

    def _elastic(self, engine: Engine, world: World, budget: Budget, now: float) -> None:
        acted = False
        for a in self.plan("elastic", world, budget.left(now)):
            assert isinstance(a, Scale)
            if self.settings.safety.dry_run or not budget.allows(now):
                break
            job = self._job(engine, a.job)
            before, batch_before = job.gpus if job.placement else job.replicas, job.batch_size
            if a.gpus == before and job.placement and a.batch_size and changes_batch_live(job):
                # It adopts the batch in place: no restart.
                # Its size did not change, so neither does the time of its last rescale (cooldown).
                if engine.rebatch(job, a.batch_size):
                    budget.spend(now)
                    self.stats.resizes += 1
                    self.stats.batch_changes += 1
                continue
            if engine.resize(job, a.gpus, a.batch_size or None):
                budget.spend(now)
                acted = True
                self.builder.marks.scaled_at[job.idx] = now
                self._record_attained(job, a.attained_gpu_s, now)
                self.stats.resizes += 1
                self.stats.grows += int(a.gpus > before)
                self.stats.shrinks += int(a.gpus < before)
                self.stats.batch_changes += int(job.batch_size != batch_before)
        if acted:
            engine.policy.schedule(engine, now)

    def _admission(self, engine: Engine, world: World, budget: Budget, now: float) -> None:
        self.preempt_budget.new_interval()
        plan = plan_admission_for(world, self.settings, max_admits=budget.left(now),
                                  max_preempts=self.preempt_budget.left(now))
        if self.settings.safety.dry_run:
            return
        for p in plan.preempts:
            job = self._job(engine, p.job)
            if engine.evict(job):
                self.preempt_budget.spend(now)
                self._mark_evicted(job, p.attained_gpu_s, now)
                self.stats.preempted += 1
        released = False
        for a in plan.admits:
            if engine.release(self._job(engine, a.job)):
                budget.spend(now)
                self.stats.admitted += 1
                released = True
        if released:
            engine.policy.schedule(engine, now)

    def _mark_evicted(self, job: SimJob, attained: float, now: float) -> None:
        m = self.builder.marks
        m.migrations[job.idx] = m.migrations.get(job.idx, 0) + 1
        m.migrated_at[job.idx] = now
        self._record_attained(job, attained, now)

    def _record_attained(self, job: SimJob, attained: float, now: float) -> None:
        """What the service writes into its eviction mark or plan annotation: the job's service so far."""
        if math.isfinite(attained):
            self.builder.marks.attained[job.idx] = attained
            self.builder.marks.attained_at[job.idx] = now

    def _migrator(self, engine: Engine, world: World, budget: Budget, now: float) -> None:
        for a in self.plan("migrator", world, budget.left(now)):
            if self.settings.safety.dry_run or not budget.allows(now):
                break
            job = self._job(engine, a.job)
            if engine.evict(job):  # the engine refuses anything not opted in
                budget.spend(now)
                self._mark_evicted(job, a.attained_gpu_s, now)
                self.stats.migrations += 1
                self.stats.jobs_migrated.add(job.idx)
