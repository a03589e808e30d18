"""Elastic optimizer: GPUs and batch size per elastic job, by dynamic programming.

Pure: numpy and dataclasses; the caller brings every measurement (step times, gradient
statistics, convergence estimates) and the GPUs free for elastic jobs.

Model (Saxena et al., MASCOTS'20, with Pollux's goodput as the throughput that counts):
- A job's useful progress rate at g GPUs and global batch b is rate[g, b] = throughput x
  statistical efficiency. Throughput comes from a step-time model (fitted to the job's own
  measured step times when it reports them, else a profile); statistical efficiency from the
  gradient noise (Pollux: gain(b) / (b / b0), gain = (var + sqr) / (var / scale + sqr)).
- Rates of different models are not comparable, so each job's rate is normalised by its
  rate per GPU at its minimum size: value_j(g) = max_b rate[g, b] / (max_b rate[min, b] / min).
  That is "GPU-equivalents of useful work"; it is concave in g for real jobs, so the sum
  favours running many jobs before widening any.
- Every change of (g, b) of a running job costs a restart of `restart_s` seconds out of the
  planning horizon `horizon_s` (its value is scaled by 1 - restart_s / horizon_s), and the
  current configuration is kept unless the gain is above `min_gain` (hysteresis): jobs are
  not resized for marginal gains. Both are part of the objective, so the DP is exact.
- Each job's value is multiplied by its weight; `convergence_weight` weighs a job by its
  convergence phase (FlowCon's growing / watching / completing), so that GPUs may go to the
  jobs whose training still grows (the phase weights are neutral by default).

The settings (restart_s, horizon_s, min_gain, the phase weights) are the elastic loop's own,
scoring.settings.ElasticLoopSettings: the optimizer has none of its own.

DP: P[j][k] = max over g of value_j(g) + P[j-1][k-g], over the options of job j (g = 0 for
a job that may stay idle, i.e. a pending one, and min..max). O(J·K·maxG); each job's step is
one max over shifted copies of P (a sliding-window view), so 200 jobs x 512 GPUs takes
milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from scoring.convergence import ConvergenceEstimate, Phase
from scoring.settings import ElasticLoopSettings

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_NEG = -np.inf


# -- throughput and statistical efficiency ------------------------------------------------
@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per optimizer step of a data-parallel job:
    (accum + 1) x (compute_s + per_sample_s x atomic) + sync(g), sync(1) = 0,
    sync(g) = sync_s + sync_per_gpu_s x (g - 1) for g > 1; atomic = per-GPU micro-batch
    (at most max_local_bsz, the rest by gradient accumulation).

    node_gpus > 0 (the GPUs of one node): a job of more GPUs spans nodes, and its sync is
    node_sync_s + node_sync_per_gpu_s x (g - 1) instead, as Pollux models a reduction within a
    node and across nodes apart. The profiled models step slower on 8 GPUs over two nodes than on 4
    in one (bert 2.50 s against 1.70 s, yolov3 2.13 against 1.27); one sync line through both
    promised them the opposite."""

    compute_s: float
    per_sample_s: float
    sync_s: float = 0.0
    sync_per_gpu_s: float = 0.0
    max_local_bsz: int = 1 << 30
    node_gpus: int = 0  # 0: one sync for every size
    node_sync_s: float = 0.0
    node_sync_per_gpu_s: float = 0.0

    def step_time(self, gpus: npt.ArrayLike, batch: npt.ArrayLike) -> FloatArray:
        g = np.maximum(np.asarray(gpus, dtype=np.float64), 1.0)
        b = np.asarray(batch, dtype=np.float64)
        local = np.ceil(b / g - 1e-9)
        steps = np.maximum(np.ceil(local / self.max_local_bsz - 1e-9), 1.0)
        atomic = np.ceil(local / steps - 1e-9)
        sync = np.where(g > 1, self.sync_s + self.sync_per_gpu_s * (g - 1), 0.0)
        if self.node_gpus > 0:
            sync = np.where(g > self.node_gpus, self.node_sync_s + self.node_sync_per_gpu_s * (g - 1), sync)
        out: FloatArray = steps * (self.compute_s + self.per_sample_s * atomic) + sync
        return out

    def scaled(self, factor: float) -> StepTimeModel:
        """Every time term times `factor` (the shape kept): a prior scaled to a measured step."""
        return replace(self, compute_s=self.compute_s * factor, per_sample_s=self.per_sample_s * factor,
                       sync_s=self.sync_s * factor, sync_per_gpu_s=self.sync_per_gpu_s * factor,
                       node_sync_s=self.node_sync_s * factor, node_sync_per_gpu_s=self.node_sync_per_gpu_s * factor)


def fit_step_time(
    gpus: npt.ArrayLike,
    batch: npt.ArrayLike,
    step_time: npt.ArrayLike,
    prior: StepTimeModel | None = None,
    max_local_bsz: int = 1 << 30,
    misfit: float = math.inf,
    node_gpus: int = 0,
) -> StepTimeModel | None:
    """Least-squares fit of StepTimeModel to measured (gpus, global batch, seconds/step).

    Terms the measurements cannot identify (no multi-GPU point: sync; one batch size: the
    per-sample slope) are taken from `prior`; None when nothing usable was measured and no
    prior is given. The error is relative (a 60 s step at a large batch must not drown the 0.5 s
    ones), and no coefficient is negative (time never shrinks with more work): a term the
    unconstrained fit makes negative is set to zero and the rest refitted, as non-negative least
    squares does; clipping after the fit instead turned three honest samples of one job into a
    model in which GPUs did not matter, and the job was never grown again.

    `misfit`: the prior's terms that the measurements cannot identify are kept only while the fit
    stays within this relative error of every measurement; else they are shrunk (halved, down to
    none) until it does, or as far as that helps. A prior whose sync alone exceeded a job's
    measured 12-GPU step (the ImageNet jobs' near-linear speed-up) made every fit through it peak
    at 8 GPUs, and the job was never offered more."""
    g = np.asarray(gpus, dtype=np.float64).reshape(-1)
    b = np.asarray(batch, dtype=np.float64).reshape(-1)
    t = np.asarray(step_time, dtype=np.float64).reshape(-1)
    ok = np.isfinite(g) & np.isfinite(b) & np.isfinite(t) & (g >= 1) & (b >= 1) & (t > 0)
    g, b, t = g[ok], b[ok], t[ok]
    if t.size == 0:
        return prior
    mlb = prior.max_local_bsz if prior is not None else max_local_bsz
    node = prior.node_gpus if prior is not None else node_gpus
    local = np.ceil(b / g - 1e-9)
    steps = np.maximum(np.ceil(local / mlb - 1e-9), 1.0)
    atomic = np.ceil(local / steps - 1e-9)
    across = (g > node).astype(np.float64) if node > 0 else np.zeros_like(g)
    multi = (g > 1).astype(np.float64) - across
    cols = [steps, steps * atomic, multi, multi * (g - 1)]
    names = ["compute_s", "per_sample_s", "sync_s", "sync_per_gpu_s"]
    if node > 0:
        cols += [across, across * (g - 1)]
        names += ["node_sync_s", "node_sync_per_gpu_s"]
    base = prior or StepTimeModel(0.0, 0.0, 0.0, 0.0, mlb, node)
    # Identifiable columns only: each must add to the rank of those already kept.
    use = [0]
    for i in range(1, len(cols)):
        if np.linalg.matrix_rank(np.stack([cols[c] for c in [*use, i]], axis=1)) == len(use) + 1:
            use.append(i)
    best: tuple[float, StepTimeModel] | None = None
    for shrink in _PRIOR_SHRINK if len(use) < len(cols) and math.isfinite(misfit) else (1.0,):
        model = StepTimeModel(max_local_bsz=mlb, node_gpus=node, **_nonneg_fit(cols, names, use, base, shrink, t))
        err = float(np.max(np.abs(model.step_time(g, b) - t) / t))
        if best is None or err < best[0] - 1e-9 or err <= misfit:
            best = (err, model)
        if err <= misfit:
            break
    assert best is not None
    fitted = best[1]
    return prior if fitted.compute_s + fitted.per_sample_s <= 0 else fitted


_PRIOR_SHRINK = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.0)  # the prior's unidentified terms, tried in turn


def _nonneg_fit(cols: list[FloatArray], names: list[str], use: list[int], base: StepTimeModel, shrink: float,
                t: FloatArray) -> dict[str, float]:
    """Relative-error least squares of the identifiable columns `use`, the others at the prior's
    value x shrink; a negative coefficient is set to zero and the rest refitted."""
    use = list(use)
    fixed = np.zeros_like(t)
    vals = {names[i]: getattr(base, names[i]) * (1.0 if i in use else shrink) for i in range(len(names))}
    for i in range(len(names)):
        if i not in use:
            fixed += cols[i] * vals[names[i]]
    w = 1.0 / t
    while use:
        a = np.stack([cols[i] for i in use], axis=1)
        coef, *_ = np.linalg.lstsq(a * w[:, None], (t - fixed) * w, rcond=None)
        worst = int(np.argmin(coef))
        if coef[worst] >= 0:
            for i, c in zip(use, coef, strict=True):
                vals[names[i]] = float(c)
            break
        vals[names[use[worst]]] = 0.0
        del use[worst]
    return vals


@dataclass(frozen=True)
class GradientNoise:
    """Gradient statistics measured at batch size `base_batch` (Pollux's grad_sqr, grad_var)."""

    grad_sqr: float
    grad_var: float
    base_batch: int

    def efficiency(self, batch: npt.ArrayLike) -> FloatArray:
        """Statistical efficiency in (0, 1]: progress per sample at `batch` relative to base_batch."""
        b = np.asarray(batch, dtype=np.float64)
        scale = np.maximum(b / self.base_batch, 1e-12)
        sqr, var = max(self.grad_sqr, 0.0), max(self.grad_var, 0.0)
        if sqr + var <= 0:
            return np.ones_like(b)
        gain = (var + sqr) / (var / scale + sqr)
        out: FloatArray = np.minimum(gain / scale, 1.0)
        return out


def rate_table(
    model: StepTimeModel, max_gpus: int, batch_sizes: npt.ArrayLike, noise: GradientNoise | None = None
) -> FloatArray:
    """rate[g, i] = samples/s x efficiency at g GPUs and batch_sizes[i] (row 0 is zero);
    NaN where the batch cannot be split over g GPUs (fewer samples than GPUs)."""
    bs = np.asarray(batch_sizes, dtype=np.float64).reshape(-1)
    g = np.arange(max_gpus + 1, dtype=np.float64)[:, None]
    t = model.step_time(np.maximum(g, 1.0), bs[None, :])
    eff = noise.efficiency(bs) if noise is not None else np.ones_like(bs)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = bs[None, :] / t * eff[None, :]
    r = np.where((g >= 1) & (bs[None, :] >= g) & np.isfinite(r), r, np.nan)
    r[0, :] = 0.0
    out: FloatArray = r
    return out


# -- convergence weight -------------------------------------------------------------------
def convergence_weight(est: ConvergenceEstimate | None, s: ElasticLoopSettings | None = None) -> float:
    """A job's weight in the objective from its convergence phase (s's phase weights; no
    estimate or an unknown phase is neutral, 1)."""
    s = s or ElasticLoopSettings()
    if est is None:
        return 1.0
    return {
        Phase.GROWING: s.growing_weight,
        Phase.WATCHING: s.watching_weight,
        Phase.COMPLETING: s.completing_weight,
    }.get(est.phase, 1.0)


# -- the optimizer ------------------------------------------------------------------------
@dataclass(frozen=True)
class ElasticJob:
    """One elastic job as the optimizer sees it.

    rate: (max_gpus + 1, len(batch_sizes)) useful progress per second (see rate_table);
    NaN or <= 0 marks an infeasible configuration. current_gpus 0 = pending (holds no GPUs).
    """

    key: str
    min_gpus: int
    max_gpus: int
    batch_sizes: IntArray
    rate: FloatArray
    current_gpus: int = 0
    current_batch: int = 0
    min_batch: int = 0  # 0 = no lower bound
    max_batch: int = 0  # 0 = no upper bound
    weight: float = 1.0
    may_idle: bool | None = None  # g = 0 allowed; default: only when pending
    batch_live: bool = False  # a running job changes its batch without a restart (at its current size)
    horizon_s: float = math.nan  # how long a new configuration would hold for it; NaN: the settings'
    min_gain: float = math.nan  # the gain a change must bring for it; NaN: the settings'
    measured_rate: float = math.nan  # its rate now as its latest step measured it; NaN: not measured


@dataclass(frozen=True)
class ElasticDecision:
    key: str
    gpus: int  # 0 = stays pending
    batch_size: int  # 0 when gpus is 0
    value: float  # this job's term of the objective
    current_gpus: int
    current_batch: int

    @property
    def changed(self) -> bool:
        if self.gpus == 0:
            return False  # a pending job left pending is not touched
        return self.gpus != self.current_gpus or self.batch_size != self.current_batch


@dataclass(frozen=True)
class ElasticPlan:
    decisions: tuple[ElasticDecision, ...]
    total_value: float
    gpus_used: int
    capacity: int
    feasible: bool  # False: the running jobs' minimums exceed the capacity; nothing changes


@dataclass(frozen=True)
class JobOptions:
    """A job's value per GPU count after batch choice, restart penalty and weight."""

    gpus: IntArray  # the options, ascending (0 first when the job may idle)
    value: FloatArray  # finite
    batch: IntArray  # batch size chosen at each option (0 for g = 0)


def job_options(job: ElasticJob, s: ElasticLoopSettings) -> JobOptions:
    """The feasible (g, value, batch) options of one job (s: restart_s, horizon_s, min_gain)."""
    bs = np.asarray(job.batch_sizes, dtype=np.int64).reshape(-1)
    rate = np.asarray(job.rate, dtype=np.float64)
    mx = min(job.max_gpus, rate.shape[0] - 1)
    mn = max(job.min_gpus, 1)
    ok_b = (bs >= job.min_batch) & ((bs <= job.max_batch) | (job.max_batch <= 0))
    may_idle = job.current_gpus == 0 if job.may_idle is None else job.may_idle
    empty = JobOptions(np.zeros(1, np.int64), np.zeros(1), np.zeros(1, np.int64))
    if mx < mn or not ok_b.any():
        return empty if may_idle else JobOptions(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
    sub = rate[mn : mx + 1]
    filled = np.where(ok_b & (sub > 0) & (sub < np.inf), sub, _NEG)  # NaN, <= 0, excluded batches: -inf
    best_b = filled.argmax(axis=1)
    best = filled.max(axis=1)
    feasible = best > _NEG
    if not feasible.any():
        return empty if may_idle else JobOptions(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
    ref_row = int(feasible.argmax())  # the smallest feasible size
    ref = best[ref_row] / (mn + ref_row)
    horizon = job.horizon_s if math.isfinite(job.horizon_s) else s.horizon_s
    discount = max(0.0, 1.0 - s.restart_s / horizon) if horizon > 0 else 1.0
    value = np.where(feasible, best, 0.0) * (discount * job.weight / ref)  # -inf x a 0 discount is NaN
    batch = bs[best_b]
    g = np.arange(mn, mx + 1, dtype=np.int64)
    # Staying as is costs no restart, and wins unless a change gains more than min_gain. A job that
    # changes its batch live stays at its size with its best batch, still without a restart, if
    # that beats its batch now by more than batch_gain (what it reports is measured at its batch
    # now, and each change made the other batch look better: without it, flips every round). The
    # batch now is held at the better of the table's reading and its own measurement: the table's
    # is a fit through every size, which can read it well below what it measures while the batch
    # it left reads as measured, and then each looked better from the other (a YOLOv3 job flipped
    # between two measured batches every round for 25 minutes).
    cur = job.current_gpus
    gain = job.min_gain if math.isfinite(job.min_gain) else s.min_gain
    if job.current_gpus > 0 and mn <= cur <= mx:
        i = cur - mn
        hit = np.flatnonzero(bs == job.current_batch)
        at_current = filled[i, hit[0]] if hit.size else _NEG
        if job.batch_live and feasible[i]:
            held = max(at_current, job.measured_rate) if math.isfinite(job.measured_rate) else at_current
            keep = at_current > _NEG and held * (1.0 + s.batch_gain) >= best[i]
            value[i] = (at_current if keep else best[i]) / ref * job.weight * (1.0 + gain)
            if keep:
                batch[i] = job.current_batch
        elif at_current > _NEG:
            stay = at_current / ref * job.weight * (1.0 + gain)
            if stay >= value[i]:
                value[i], batch[i] = stay, job.current_batch
    if not feasible.all():
        g, value, batch = g[feasible], value[feasible], batch[feasible]
    if may_idle:
        g, value, batch = np.insert(g, 0, 0), np.insert(value, 0, 0.0), np.insert(batch, 0, 0)
    return JobOptions(g, value, batch)


def solve(options: Sequence[JobOptions], capacity: int) -> tuple[float, IntArray]:
    """max Σ value_j(g_j) s.t. Σ g_j <= capacity, one option per job. Returns (best total,
    chosen index into each job's options); (-inf, empty) when no choice fits.

    P_j[k] is the best value of jobs 0..j using at most k GPUs. For job j, a strided view
    lays the shifted copies P_{j-1}[k - g] of the previous row one above the other (one row
    per size g, -inf below zero capacity), so the step is one elementwise max down the rows.
    The choices are recovered afterwards from the stored rows."""
    n = len(options)
    if any(o.gpus.size == 0 for o in options):
        return _NEG, np.zeros(0, np.int64)
    k_cap = max(0, min(capacity, sum(int(o.gpus[-1]) for o in options)))
    top = max((int(o.gpus[-1]) for o in options), default=0)
    buf = np.full(top + k_cap + 1, _NEG)  # buf[top:] = P_{j-1}; buf[:top] = -inf (negative capacity)
    prev = buf[top:]
    prev[:] = 0.0
    rows = np.empty((n + 1, k_cap + 1))
    rows[0] = 0.0
    view = np.lib.stride_tricks.sliding_window_view(buf, k_cap + 1)  # view[c] = buf[c : c + K + 1], live
    work = np.empty((max(top, 1), k_cap + 1))
    for j, o in enumerate(options):
        idle = o.gpus[0] == 0
        sizes = o.gpus[1:] if idle else o.gpus
        if sizes.size == 0:
            prev += o.value[0]
        else:
            mn, mx = int(sizes[0]), int(sizes[-1])
            w = mx - mn + 1
            dense = np.full(w, _NEG)  # dense[i] = value at g = mn + i
            dense[sizes - mn] = o.value[1:] if idle else o.value
            # view[top - g] = P_{j-1}[k - g] for k = 0..K; g = mn..mx -> rows top-mn down to top-mx.
            shifted = view[top - mx : top - mn + 1][::-1]
            cand = np.add(shifted, dense[:, None], out=work[:w])
            best = cand.max(axis=0)
            if idle:
                np.maximum(best, prev + o.value[0], out=best)
            prev[:] = best
        rows[j + 1] = prev
    total = float(prev[k_cap])
    if not math.isfinite(total):
        return _NEG, np.zeros(0, np.int64)
    picks = np.zeros(n, dtype=np.int64)
    k = k_cap
    for j in range(n - 1, -1, -1):
        o = options[j]
        fits = o.gpus <= k
        before = np.where(fits, rows[j][np.where(fits, k - o.gpus, 0)], _NEG)
        i = int(np.argmax(o.value + before))
        picks[j] = i
        k -= int(o.gpus[i])
    return total, picks


def plan_elastic(jobs: Sequence[ElasticJob], capacity: int, settings: ElasticLoopSettings | None = None,
                 options: Sequence[JobOptions] | None = None) -> ElasticPlan:
    """GPUs and batch size for every elastic job, maximising Σ weight x normalised useful rate
    (with restart penalty and hysteresis) within `capacity` GPUs: the free GPUs plus those the
    elastic jobs hold now. Pending jobs may stay pending (g = 0); running ones stay within
    their min..max. If even the running jobs' minimums do not fit, nothing changes.
    `options`: each job's job_options(job, settings), when the caller has them already."""
    s = settings or ElasticLoopSettings()
    opts = list(options) if options is not None else [job_options(j, s) for j in jobs]
    total, picks = solve(opts, capacity)
    if not math.isfinite(total):
        keep = tuple(
            ElasticDecision(j.key, j.current_gpus, j.current_batch if j.current_gpus else 0, 0.0,
                            j.current_gpus, j.current_batch)
            for j in jobs
        )
        return ElasticPlan(keep, 0.0, sum(j.current_gpus for j in jobs), capacity, False)
    decisions = tuple(
        ElasticDecision(j.key, int(o.gpus[i]), int(o.batch[i]), float(o.value[i]), j.current_gpus, j.current_batch)
        for j, o, i in zip(jobs, opts, picks, strict=True)
    )
    return ElasticPlan(decisions, total, sum(d.gpus for d in decisions), capacity, True)
