"""The migrator as a simulator control loop: the same scoring.migration planner the cluster
controller runs (extender/control/migrator.py), fed from the simulated cluster and the jobs'
emitted validation series, acting only through engine.evict (DESIGN §7).

What it may do: evict a running job that opted in (JobSpec.checkpointable); the job keeps its
progress (checkpoint), goes back to kube-scheduler's queue (the policy's on_requeue) and pays
the engine's restart_penalty when it starts again. It never picks where the job goes and never
reorders the queue. What it knows: GPUs per node, the pending pods (kube-scheduler's queue as
the apiserver shows it), each job's phase and progress P from scoring.convergence over its
(epoch, metric) series (as benchmarks/sim/telemetry.py), its run time since its last start,
and its own migration record. Not the job's remaining work (flowsched does not know it).

With settings.order="attained" it also knows what the cluster loop reads from pod objects:
each running job's attained GPU-time since its pods started (GPUs x time since its latest
start: a replacement pod's startTime is its own, so earlier runs are not counted)
and how long each pending pod has waited (since it was created: a requeued job's
replacement pods are new).

Budgets as the controller's: max_per_interval moves a round (interval = the engine round) and
max_per_hour in any sliding hour.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.jobmodel import ProfileSet
from benchmarks.sim.policies import pod_sizes
from scoring.convergence import ConvergenceSettings, Phase, estimate
from scoring.migration import Demands, JobArrays, MigrationSettings, plan_migrations


@dataclass
class MigrationStats:
    migrations: int = 0
    jobs_migrated: set[int] = field(default_factory=set)
    restart_cost_s: float = 0.0  # sum over migrations: restart penalty (the checkpoint reload)
    requeue_wait_s: float = 0.0  # sum over migrations: eviction -> next start (back in the queue)
    rounds_planned: int = 0


@dataclass
class SimMigrator:
    profiles: ProfileSet
    settings: MigrationSettings = field(default_factory=lambda: MigrationSettings(
        min_runtime_s=600.0, max_migrations=2, cooldown_s=1800.0, min_remaining_s=300.0,
        require_room_elsewhere=True, max_moves=1))
    max_per_hour: int = 6
    window_points: int = 3
    alpha: float = 0.05
    min_points: int = 6
    # Composition with other loops (benchmarks/sim/variants.py): jobs `skip` says True for are
    # never candidates (the planner's `allowed` is False), and `on_evict` hears of each eviction.
    skip: Callable[[SimJob, float], bool] | None = None
    on_evict: Callable[[SimJob, float], None] | None = None
    stats: MigrationStats = field(default_factory=MigrationStats)
    count: dict[int, int] = field(default_factory=dict)
    last_at: dict[int, float] = field(default_factory=dict)
    _evicted_at: dict[int, float] = field(default_factory=dict)
    _spent: deque[float] = field(default_factory=deque)
    _est: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # idx -> (n points, phase, P)

    def _phase(self, job: SimJob) -> tuple[int, float]:
        n = len(job.series)
        if n < self.min_points:
            return int(Phase.UNKNOWN), math.nan
        hit = self._est.get(job.idx)
        if hit is not None and hit[0] == n:
            return hit[1], hit[2]
        pts = np.asarray(job.series, dtype=np.float64)
        cs = ConvergenceSettings(window_s=0.0, window_points=self.window_points, alpha=self.alpha, fit_families=(),
                                 higher_is_better=self.profiles.apps[job.spec.app].metric_increases)
        est = estimate(pts[:, 1], pts[:, 2], pts[:, 0], cs)
        self._est[job.idx] = (n, int(est.phase), est.progress)
        return int(est.phase), est.progress

    def __call__(self, engine: Engine, now: float) -> None:
        # Requeue waits of earlier migrations that have started again.
        for idx, t in list(self._evicted_at.items()):
            j = engine.jobs[idx]
            if j.placement or j.completion is not None:
                self.stats.requeue_wait_s += max(0.0, j.seg_start - t)
                del self._evicted_at[idx]
        while self._spent and self._spent[0] <= now - 3600.0:
            self._spent.popleft()
        allowed = min(self.settings.max_moves, self.max_per_hour - len(self._spent))
        if allowed <= 0:
            return
        c = engine.cluster
        per_node = c.settings.gpus_per_node
        running = [j for j in engine.active.values() if j.placement]
        queued_at: dict[int, float] = getattr(engine.policy, "queued_at", {})
        pending = sorted((j for j in engine.active.values() if not j.placement),
                         key=lambda j: (-j.spec.priority, queued_at.get(j.idx, j.spec.arrival), j.idx))
        if not running or not pending:
            return
        demand = [g for j in pending for g in pod_sizes(j.replicas, per_node)]
        wait = [now - queued_at.get(j.idx, j.spec.arrival) for j in pending for _ in pod_sizes(j.replicas, per_node)]
        n_nodes = c.gpu_alloc.shape[0]
        gpus_on = np.zeros((len(running), n_nodes))
        phase = np.zeros(len(running), dtype=np.int64)
        growth = np.full(len(running), math.nan)
        for r, j in enumerate(running):
            engine._sync(j, now)  # bring its emitted series up to now, as completing_gpus() does
            for node, g in j.placement:
                gpus_on[r, node] += g
            phase[r], growth[r] = self._phase(j)
        jobs = JobArrays(
            opted_in=np.array([j.spec.checkpointable for j in running], dtype=bool),
            allowed=np.array([self.skip is None or not self.skip(j, now) for j in running], dtype=bool),
            running=np.array([now >= j.restart_until for j in running], dtype=bool),
            runtime_s=np.array([now - j.seg_start for j in running], dtype=np.float64),
            phase=phase, growth=growth,
            remaining_s=np.full(len(running), math.nan),
            migrations=np.array([self.count.get(j.idx, 0) for j in running], dtype=np.int64),
            since_migration_s=np.array([now - self.last_at[j.idx] if j.idx in self.last_at else math.inf
                                        for j in running], dtype=np.float64),
            gpus_on=gpus_on,
            attained_gpu_s=np.array([max(0.0, now - j.seg_start) * j.gpus for j in running],
                                    dtype=np.float64),
        )
        free = c.gpu_alloc - c.gpu_used
        s = self.settings if allowed >= self.settings.max_moves else MigrationSettings(
            **{**self.settings.__dict__, "max_moves": allowed})
        plan = plan_migrations(jobs, free, Demands.pending(np.asarray(demand, dtype=np.float64),
                                                          np.asarray(wait, dtype=np.float64)), s)
        self.stats.rounds_planned += 1
        for m in plan.moves:
            job = running[m.job]
            if not engine.evict(job):  # the engine refuses anything not opted in
                continue
            if self.on_evict is not None:
                self.on_evict(job, now)
            self.stats.migrations += 1
            self.stats.jobs_migrated.add(job.idx)
            self.stats.restart_cost_s += engine.settings.restart_penalty
            self.count[job.idx] = self.count.get(job.idx, 0) + 1
            self.last_at[job.idx] = now
            self._evicted_at[job.idx] = now
            self._spent.append(now)
