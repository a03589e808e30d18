"""The elastic optimizer as a simulator control loop: scoring.elastic.plan_elastic over the
elastic jobs, acting only through engine.resize (replicas and batch size; a restart, as in the
Pollux model). kube-scheduler (the engine's policy) still places every pod.

What it may do (DESIGN §7): change an opted-in (elastic) job's replica count within its
min..max and its batch size. It never picks nodes, never reorders the queue, never stops a
running job (a running job keeps at least its minimum); a pending job it does not plan for is
left exactly as it is.

Per round (every `replan_s`, and whenever a job arrives or completes):
- the jobs: every active elastic job; capacity = free GPUs + GPUs the elastic jobs hold;
- throughput S_j(g, b) from the job's profile (the Pollux artifact's placements, at the packed
  placement kube-scheduler's pod split gives, with the artifact's batch_config: micro-batch and
  gradient accumulation); statistical efficiency from the gradient noise the job measures now
  (grad_sqr / grad_var at its current batch and epoch, scoring.elastic.GradientNoise), as
  Pollux's agent reports it;
- weight: scoring.elastic.convergence_weight of the FlowCon phase of the job's emitted
  validation series (optional: `convergence=False` gives every job weight 1);
- resize: shrinking jobs first, then growing / starting ones; then kube-scheduler runs (a real
  kube-scheduler schedules new pods within seconds, not at the next round); a resized pending
  job kube-scheduler could not place (GPUs free but fragmented over nodes) is shrunk to the
  largest size whose pods fit the nodes' free GPUs, if that is within its range.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.jobmodel import AppModel, ProfileSet
from benchmarks.sim.policies import pod_sizes
from scoring.convergence import ConvergenceEstimate, ConvergenceSettings, estimate
from scoring.elastic import (
    ElasticJob,
    ElasticSettings,
    GradientNoise,
    WeightSettings,
    convergence_weight,
    plan_elastic,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class ElasticStats:
    plans: int = 0
    resizes: int = 0
    grows: int = 0
    shrinks: int = 0
    batch_changes: int = 0
    refits: int = 0  # pending jobs shrunk to fit fragmented free GPUs
    plan_ms: list[float] = field(default_factory=list)


def batch_grid(app: AppModel, points: int = 8) -> IntArray:
    """Candidate global batch sizes: geometric from the model's initial to its largest
    validated batch (the artifact's range)."""
    lo = int(app.init_batch_size)
    hi = int(getattr(app, "max_batch_size", lo))
    if hi <= lo:
        return np.array([lo], dtype=np.int64)
    grid = np.unique(np.round(np.geomspace(lo, hi, points)).astype(np.int64))
    return grid


@dataclass
class _AppTable:
    """Per model: realised batch and seconds per step at (g, candidate batch)."""

    batches: IntArray  # (B,) candidates
    realised: FloatArray  # (G+1, B) the batch batch_config actually runs
    step_s: FloatArray  # (G+1, B); NaN where infeasible


def app_table(app: AppModel, max_gpus: int, gpus_per_node: int, batches: IntArray) -> _AppTable:
    g_n = max_gpus + 1
    realised = np.full((g_n, batches.size), np.nan)
    step_s = np.full((g_n, batches.size), np.nan)
    min_local = int(getattr(app, "min_local_bsz", 1))
    for g in range(1, g_n):
        placement = pod_sizes(g, gpus_per_node)
        for i, b in enumerate(batches):
            if b < g * min_local:
                continue  # fewer samples per GPU than the model's smallest profiled batch
            atomic, accum = app.batch_config(g, int(b))
            step, sync = app.throughput(placement, atomic)
            realised[g, i] = g * atomic * (accum + 1)
            step_s[g, i] = step + (step - sync) * accum
    return _AppTable(batches, realised, step_s)


@dataclass
class SimElastic:
    profiles: ProfileSet
    settings: ElasticSettings = field(default_factory=lambda: ElasticSettings(restart_s=30.0, horizon_s=150.0))
    weights: WeightSettings = field(default_factory=WeightSettings)
    convergence: bool = True  # weight jobs by their convergence phase
    adapt_batch: bool = True  # False: batch size stays the job's own (GPU counts only)
    replan_s: float = 60.0
    window_points: int = 3
    alpha: float = 0.05
    min_points: int = 6
    dry_run: bool = False
    # Least attained service through the weights (0 = off): a job's weight is multiplied by
    # (1 + attained GPU-hours)^-las_power, attained = GPU x seconds its pods have run so far
    # (the controller's own per-job record from its pods' start times; no remaining work).
    las_power: float = 0.0
    # Composition with other loops (benchmarks/sim/variants.py): jobs `skip` says True for are
    # left exactly as they are (not planned; a running one's GPUs are not capacity), and
    # `on_resize` hears of every resize this loop makes.
    skip: Callable[[SimJob, float], bool] | None = None
    on_resize: Callable[[SimJob, float], None] | None = None
    stats: ElasticStats = field(default_factory=ElasticStats)
    _tables: dict[tuple[str, int], _AppTable] = field(default_factory=dict)
    _last_plan: float = -np.inf
    _seen: tuple[int, int] = (-1, -1)
    _phase: dict[int, tuple[int, ConvergenceEstimate]] = field(default_factory=dict)

    def _table(self, app_name: str, max_gpus: int, gpn: int) -> _AppTable:
        key = (app_name, max_gpus)
        hit = self._tables.get(key)
        if hit is None:
            app = self.profiles.apps[app_name]
            hit = app_table(app, max_gpus, gpn, batch_grid(app))
            self._tables[key] = hit
        return hit

    def _estimate(self, job: SimJob) -> ConvergenceEstimate | None:
        n = len(job.series)
        if n < self.min_points:
            return None
        hit = self._phase.get(job.idx)
        if hit is not None and hit[0] == n:
            return hit[1]
        app = self.profiles.apps[job.spec.app]
        pts = np.array(job.series, dtype=np.float64)
        s = ConvergenceSettings(window_s=0.0, window_points=self.window_points, alpha=self.alpha, fit_families=(),
                                higher_is_better=app.metric_increases)
        est = estimate(pts[:, 1], pts[:, 2], pts[:, 0], s)
        self._phase[job.idx] = (n, est)
        return est

    def _epoch(self, job: SimJob) -> int:
        app = self.profiles.apps[job.spec.app]
        e = int(np.searchsorted(app.progress_at, job.progress * (1 + 1e-12), side="right")) - 1
        return min(max(e, 0), app.max_epochs - 1)

    def elastic_job(self, engine: Engine, job: SimJob) -> ElasticJob:
        s = job.spec
        gpn = engine.cluster.settings.gpus_per_node
        mx = min(s.elastic_max, engine.cluster.total_gpus)
        tab = self._table(s.app, mx, gpn)
        app = self.profiles.apps[s.app]
        sqr, var = app.grad_stats(job.batch_size, self._epoch(job))  # what the job measures now
        noise = GradientNoise(sqr, var, app.init_batch_size)
        eff = noise.efficiency(np.nan_to_num(tab.realised, nan=1.0))
        rate = tab.realised / tab.step_s * eff
        rate[0] = 0.0
        cur = job.gpus if job.placement else 0
        lo = hi = 0
        if not self.adapt_batch:
            lo = hi = job.batch_size
        batches = tab.batches
        cur_batch = job.batch_size if cur else 0
        if cur and cur_batch not in batches:
            # The job runs at a batch off the grid (its own): offer it as a candidate too.
            batches = np.append(batches, cur_batch)
            extra = self._current_rate(job, noise, mx, gpn)
            rate = np.concatenate([rate, extra[:, None]], axis=1)
        elif not self.adapt_batch and job.batch_size not in batches:
            batches = np.append(batches, job.batch_size)
            rate = np.concatenate([rate, self._current_rate(job, noise, mx, gpn)[:, None]], axis=1)
        weight = convergence_weight(self._estimate(job), self.weights) if self.convergence else 1.0
        if self.las_power > 0:
            attained = job.gpu_seconds + (max(0.0, engine.now - job.seg_start) * job.gpus if job.placement else 0.0)
            weight *= (1.0 + attained / 3600.0) ** -self.las_power
        return ElasticJob(s.name, max(1, s.elastic_min), mx, batches, rate, cur, cur_batch, lo, hi, weight)

    def _current_rate(self, job: SimJob, noise: GradientNoise, mx: int, gpn: int) -> FloatArray:
        app = self.profiles.apps[job.spec.app]
        out = np.full(mx + 1, np.nan)
        out[0] = 0.0
        for g in range(1, mx + 1):
            atomic, accum = app.batch_config(g, job.batch_size)
            step, sync = app.throughput(pod_sizes(g, gpn), atomic)
            real = g * atomic * (accum + 1)
            out[g] = real / (step + (step - sync) * accum) * float(noise.efficiency(real))
        return out

    def __call__(self, engine: Engine, now: float) -> None:
        seen = (len(engine.active), engine.done)
        if seen == self._seen and now - self._last_plan < self.replan_s:
            return
        self._seen = seen
        self._last_plan = now
        elastic = [j for j in engine.active.values() if j.spec.elastic_max > 0 and j.completion is None
                   and not (self.skip is not None and self.skip(j, now))]
        if not elastic:
            return
        for j in elastic:
            engine._sync(j, now)  # bring progress and the emitted series up to now
        capacity = engine.cluster.total_free + sum(j.gpus for j in elastic if j.placement)
        t0 = time.perf_counter()
        plan = plan_elastic([self.elastic_job(engine, j) for j in elastic], capacity, self.settings)
        self.stats.plan_ms.append((time.perf_counter() - t0) * 1e3)
        self.stats.plans += 1
        if not plan.feasible:
            return
        changes = [(j, d) for j, d in zip(elastic, plan.decisions, strict=True) if d.changed]
        if self.dry_run or not changes:
            return
        # Shrink first so the GPUs they give back are there for the growing and starting jobs.
        changes.sort(key=lambda jd: jd[1].gpus - jd[1].current_gpus)
        resized: list[SimJob] = []
        for job, d in changes:
            before, batch_before = job.gpus, job.batch_size
            if engine.resize(job, d.gpus, d.batch_size):
                if self.on_resize is not None:
                    self.on_resize(job, now)
                resized.append(job)
                self.stats.resizes += 1
                self.stats.grows += int(d.gpus > before)
                self.stats.shrinks += int(0 < d.gpus < before)
                self.stats.batch_changes += int(d.batch_size != batch_before)
        engine.policy.schedule(engine, now)  # kube-scheduler binds the new pods now
        self._refit(engine, now, [j for j in resized if not j.placement])

    def _refit(self, engine: Engine, now: float, unplaced: list[SimJob]) -> None:
        """Pods kube-scheduler could not place although the GPU count allowed them: shrink to
        the largest size whose pods fit the nodes' free GPUs (best fit, largest pod first)."""
        changed = False
        for job in sorted(unplaced, key=lambda j: j.spec.arrival):
            if job.placement:
                continue
            free = sorted(int(x) for x in engine.cluster.free)
            lo = max(1, job.spec.elastic_min)
            for g in range(job.replicas - 1, lo - 1, -1):
                if _fits(pod_sizes(g, engine.cluster.settings.gpus_per_node), free):
                    if engine.resize(job, g, job.batch_size):
                        if self.on_resize is not None:
                            self.on_resize(job, now)
                        self.stats.refits += 1
                        changed = True
                    break
        if changed:
            engine.policy.schedule(engine, now)


def _fits(pods: list[int], free: list[int]) -> bool:
    left = sorted(free, reverse=True)
    for p in sorted(pods, reverse=True):
        best = -1
        for i, f in enumerate(left):
            if f >= p and (best < 0 or f < left[best]):
                best = i
        if best < 0:
            return False
        left[best] -= p
    return True

