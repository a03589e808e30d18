"""The step-time table (scoring.world.Throughput) an elastic job is planned with when it reports
its step times and nothing more: a prior (fixed and per-sample compute, sync growing with GPUs)
scaled and fitted to what the job measured (scoring.elastic.fit_step_time), and read as measured
at the sizes and batches where the fit would contradict the measurement.

    prior_throughput(job, settings.elastic, hi, nominal, node_gpus) -> Throughput

scoring.control asks here for every job whose JobState.throughput is unset: every job in the
service, and in the simulator unless its labelled oracle mode hands it the profiles' table.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from scoring.elastic import StepTimeModel, fit_step_time
from scoring.settings import ElasticLoopSettings
from scoring.world import FloatArray, IntArray, JobState, Throughput


def batch_grid(lo: int, hi: int, points: int) -> IntArray:
    """Candidate global batch sizes: geometric from the job's smallest to its largest."""
    return np.array(_batch_grid(lo, hi, points), dtype=np.int64)


@functools.lru_cache(maxsize=1024)
def _batch_grid(lo: int, hi: int, points: int) -> tuple[int, ...]:
    """batch_grid's values, kept: every elastic job asks for its range every round."""
    if hi <= lo:
        return (lo,)
    return tuple(int(b) for b in np.unique(np.round(np.geomspace(lo, hi, max(2, points))).astype(np.int64)))


def prior_reference_batch(job: JobState, s: ElasticLoopSettings, nominal: int) -> int:
    """The batch whose 1-GPU step the prior's shares are of: the geometric middle of the batches the
    job accepts, as the shares were fitted (benchmarks/fit_step_prior.py), and the same whatever batch
    it runs now; its own batch when it reports no range (or elastic.prior_at is "batch")."""
    if s.prior_at == "range_middle" and job.batch_range is not None and s.adapt_batch:
        lo, hi = job.batch_range
        return max(1, round(math.sqrt(max(lo, 1) * max(hi, lo, 1))))
    return nominal


def prior_throughput(job: JobState, s: ElasticLoopSettings, hi: int, nominal: int, node_gpus: int = 0) -> Throughput:
    """Step time at each GPU count (and candidate batch, when the job reports its batch range)
    when the job reports nothing but its step rate: the prior (fixed and per-sample compute, sync
    growing with GPUs, within a node and across nodes; elastic.*_fraction) scaled to the measured
    step times, fitted when more than one size was measured. node_gpus: the GPUs of one node
    (World.node_gpus; 0: one sync for every size)."""
    gs_known = tuple(sorted(job.step_samples))
    model = _fitted_prior(gs_known, tuple(job.step_batches.get(x, nominal) for x in gs_known),
                          tuple(job.step_samples[x] for x in gs_known), _prior_shape(s, node_gpus),
                          prior_reference_batch(job, s, nominal), s.fit_misfit, job.batch_local_max)
    batches: tuple[int, ...] = (nominal,)
    if job.batch_range is not None and s.adapt_batch and job.noise is not None:
        batches = tuple(sorted({*_batch_grid(job.batch_range[0], job.batch_range[1], s.batch_points), nominal}))
    # Per-GPU batches far above any measured are not trusted: a fit over small local batches
    # (where a step's fixed cost dominates) extrapolated to large ones promised one GPU at a
    # large batch the speed of eight, and jobs were shrunk to it and back. A job that reports the
    # largest batch a GPU holds (batch_local_max) has the model count the accumulated micro-batches
    # above it instead, which is what that promise had missed.
    local_limit = 0.0
    if s.explore_local_factor > 0 and gs_known and job.batch_local_max <= 0:
        local_limit = max(math.ceil(job.step_batches.get(x, nominal) / x) for x in gs_known) * s.explore_local_factor
    table = measured_where_fit_misses(_prior_table(model, batches, hi, local_limit), job, model, hi, nominal,
                                      s.fit_misfit)
    # A batch it ran at before, at a size it has measured, is read as measured there, not as the
    # fit to the latest step says: fitted to the latest alone, a job whose batch changes live saw
    # the batch it had just left as the better one, every round (measured_at_other_batches).
    return measured_at_other_batches(table, job, hi, s.bend_batches, s.other_batch_tolerance)


def measured_where_fit_misses(table: Throughput, job: JobState, model: StepTimeModel, hi: int, nominal: int,
                              misfit: float) -> Throughput:
    """`table` with the row of each size the job measured scaled to its measurement (at its
    latest batch there) where the fitted `model` misses it by more than a factor 1 + `misfit`
    either way; the table itself when none does (or misfit is inf).

    The fit bounds the prior's terms by `misfit`, not its own error: step times measured on GPUs
    of other types (608 s a step at 1 GPU, 45 at 2, 152 at 4) were fitted to a constant 56 s
    a step, every size promised one goodput, and a type-blind job held 1 K80 of an empty
    64-GPU cluster for 59 simulated days. Read as measured, such a size is left."""
    if not math.isfinite(misfit) or not job.step_samples:
        return table
    step: FloatArray | None = None
    for g, t in job.step_samples.items():
        if not 0 < g <= hi or not t > 0:
            continue
        fitted = float(model.step_time(float(g), float(job.step_batches.get(g, nominal))))
        if not fitted > 0 or abs(math.log(t / fitted)) <= math.log1p(misfit):
            continue
        if step is None:
            step = table.step_s.copy()
        step[g] = step[g] * (t / fitted)
    if step is None:
        return table
    step.setflags(write=False)
    return Throughput(table.batches, step, table.realised)


def measured_at_other_batches(table: Throughput, job: JobState, hi: int, bend: bool = False,
                              tolerance: float = 0.0) -> Throughput:
    """`table` with the step time at each (GPUs, batch) the job measured at a batch other than
    its latest at that size (JobState.batch_samples) as measured; the table itself when none.
    `tolerance` (elastic.other_batch_tolerance): a measurement within that share of the table's
    value is the measurement's error, and the table's value stays.

    `bend` (elastic.bend_batches): at such a size the other batches' step times are bent to agree
    with what was measured too, each x (batch / latest)^k, k the log-log slope (least squares
    through the latest batch, within +-1) of the measured step times over the table's. Read as
    measured alone, the batches measured are left but the others keep the prior's promise: a
    CIFAR-10 job at 1 GPU measured 203, 256, 323, 406, 512 and 645 one after the other, each slower
    than promised, returning to 128 between them (a live batch change every round for 23 minutes)."""
    col = {int(b): k for k, b in enumerate(table.batches.tolist())}
    seen: dict[int, list[tuple[int, float]]] = {}
    for (g, b), t in job.batch_samples.items():
        if g in job.step_samples and b != job.step_batches.get(g) and b in col and 0 < g <= hi:
            seen.setdefault(g, []).append((b, t))
    if not seen:
        return table
    step = table.step_s.copy()
    for g, pts in seen.items():
        latest = job.step_batches.get(g, 0)
        if bend and latest in col and math.isfinite(table.step_s[g, col[latest]]) and table.step_s[g, col[latest]] > 0:
            ref, t_ref = table.step_s[g, col[latest]], job.step_samples[g]
            x = np.array([math.log(b / latest) for b, _ in pts])
            e = np.array([math.log(t / t_ref) - math.log(table.step_s[g, col[b]] / ref) for b, t in pts])
            ok = np.isfinite(e)
            if ok.any():
                k = float(np.clip((e[ok] * x[ok]).sum() / (x[ok] ** 2).sum(), -1.0, 1.0))
                with np.errstate(invalid="ignore"):
                    step[g] = table.step_s[g] * (np.asarray(table.batches, dtype=np.float64) / latest) ** k
        for b, t in pts:
            was = float(table.step_s[g, col[b]])
            if (tolerance > 0 and math.isfinite(was) and was > 0 and math.isfinite(t) and t > 0
                    and abs(math.log(t / was)) <= math.log1p(tolerance)):
                continue  # within the measurement's error of the table: the table's (bent) value
            step[g, col[b]] = t
    step.setflags(write=False)
    return Throughput(table.batches, step, table.realised)


@functools.lru_cache(maxsize=8192)
def _prior_table(model: StepTimeModel, batches: tuple[int, ...], hi: int, local_limit: float) -> Throughput:
    """prior_throughput's table (local_limit > 0: per-GPU batches above it unknown), kept like
    _fitted_prior: a job whose measurements did not change asks for the same one every round.
    Read-only, as every holder of it shares it."""
    b = np.array(batches, dtype=np.int64)
    gs = np.arange(hi + 1, dtype=np.float64)[:, None]
    step = np.array(model.step_time(np.maximum(gs, 1.0), b[None, :].astype(np.float64)), dtype=np.float64)
    if local_limit > 0:
        local = np.ceil(b[None, :] / np.maximum(gs, 1.0) - 1e-9)
        step = np.where(local > local_limit, np.nan, step)
    realised = np.broadcast_to(b[None, :].astype(np.float64), step.shape).copy()
    for x in (b, step, realised):
        x.setflags(write=False)
    return Throughput(b, step, realised)


def _prior_shape(s: ElasticLoopSettings, node_gpus: int = 0) -> tuple[float, float, float, float, float, int]:
    """The prior's terms as shares of a 1-GPU step at the nominal batch: fixed compute, sync and
    sync per added GPU within a node, the same across nodes (the rest of the step is per-sample
    compute), and the GPUs of one node beyond which the across-node terms apply. With node_sync
    off, or no node size known, one sync line for every size: the across-node terms and the node
    size are 0, so every cluster shares one key of the fit's cache. The one place that decides."""
    within = (min(s.compute_fraction, 1.0), s.sync_fraction, s.sync_per_gpu_fraction)
    if not s.node_sync or node_gpus <= 0:
        return (*within, 0.0, 0.0, 0)
    return (*within, s.node_sync_fraction, s.node_sync_per_gpu_fraction, node_gpus)


@functools.lru_cache(maxsize=8192)
def _fitted_prior(gpus: tuple[int, ...], batches: tuple[int, ...], step_s: tuple[float, ...],
                  shape: tuple[float, float, float, float, float, int], nominal: int, misfit: float = math.inf,
                  local_max: int = 0) -> StepTimeModel:
    """prior_throughput's model: pure in its arguments, so kept for the next round (and the next
    loop's World) that asks with the same measurements. shape: _prior_shape's."""
    compute, sync, sync_per_gpu, node_sync, node_sync_per_gpu, node_gpus = shape
    mlb = local_max if local_max > 0 else 1 << 30
    prior = StepTimeModel(compute, (1.0 - compute) / nominal, sync, sync_per_gpu, mlb, node_gpus=node_gpus,
                          node_sync_s=node_sync, node_sync_per_gpu_s=node_sync_per_gpu)
    if not gpus:
        return prior
    g = np.array(gpus, dtype=np.float64)
    t = np.array(step_s, dtype=np.float64)
    b = np.array(batches, dtype=np.float64)
    scaled = prior.scaled(float(t[0] / prior.step_time(g[0], b[0])))
    return fit_step_time(g, b, t, prior=scaled, misfit=misfit) or scaled
