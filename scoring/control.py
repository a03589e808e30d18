"""The elastic optimizer's plan from a World (scoring.kernel runs it in a round; the migrator's is
scoring.migrator_plan).

    plan_elastic_for(world, settings, migrator_on=...) -> ElasticLoopPlan

Both shells (the service's extender/control/, the simulator's benchmarks/sim/) call exactly
these, with the same CoreSettings, and carry out the actions they return; neither filters or
reorders them. The safety rules (scoring.safety) are applied in the two plans, once, to every loop.

Composition (both loops on): the elastic optimizer plans first in a round and the migrator sees
the result; the migrator never evicts an elastic job the optimizer can still shrink, nor one it
rescaled within hold_s; the optimizer leaves a job the migrator moved alone for hold_s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scoring.actions import Scale
from scoring.elastic import (
    ElasticDecision,
    ElasticJob,
    ElasticPlan,
    GradientNoise,
    convergence_weight,
    job_options,
    plan_elastic,
)
from scoring.migration import place
from scoring.remedy import cap_growth
from scoring.safety import NO_PLANNABLE_SIZE, NO_WHOLE_POD_SIZE, elastic_refusal
from scoring.settings import CoreSettings, ElasticLoopSettings
from scoring.step_prior import prior_throughput
from scoring.world import FloatArray, JobState, Throughput, World, pods_for


# -- elastic optimizer --------------------------------------------------------------------
@dataclass(frozen=True)
class ElasticLoopPlan:
    actions: tuple[Scale, ...]
    jobs: tuple[JobState, ...]
    options: tuple[ElasticJob, ...]
    plan: ElasticPlan | None
    accounting: dict[str, float]
    refusals: dict[str, str] = field(default_factory=dict)

    def describe(self, world: World) -> dict[str, Any]:
        out: dict[str, Any] = {"at": world.now, **self.accounting, "refused": dict(self.refusals)}
        if self.plan is None:
            return {**out, "jobs": {}}
        out.update(feasible=self.plan.feasible, objective=self.plan.total_value)
        out["jobs"] = {j.key: {"range": list(j.elastic or ()), "per_pod": j.per_pod, "live_gpus": j.live_gpus,
                               "held_gpus": j.held_gpus, "settling": j.settling, "weight": e.weight,
                               "planned_gpus": d.gpus, "planned_batch": d.batch_size,
                               "measured_step_s": dict(j.step_samples)}
                       for j, e, d in zip(self.jobs, self.options, self.plan.decisions, strict=True)}
        return out


def _place_pods(pods: list[float], free: FloatArray) -> tuple[bool, FloatArray]:
    """Best-fit the pods into `free`: whether all fit, and what is left (those that fit taken)."""
    where, left = place(free, np.asarray(pods, dtype=np.float64), np.full(len(pods), -1, dtype=np.int64))
    return bool((where >= 0).all()), left


def _fits(pods: list[float], free: FloatArray) -> bool:
    f = np.ascontiguousarray(free, dtype=np.float64)
    return _fits_kept(tuple(pods), f.tobytes())


@functools.lru_cache(maxsize=512)
def _fits_kept(pods: tuple[float, ...], free: bytes) -> bool:
    """_fits, kept: every waiting elastic job asks it for each of its sizes against the same free
    GPUs, round after round (pure: the pods and the free GPUs are the whole question). At most
    512 answers: 20 MiB of keys at 5,000 nodes."""
    return _place_pods(list(pods), np.frombuffer(free, dtype=np.float64))[0]


def idle_min_gain(job: JobState, s: ElasticLoopSettings) -> float:
    """The gain a change must bring for a running job while GPUs are free and no job waits: for a
    job known by the prior beyond the one GPU count it measured, min_gain_explore; else min_gain
    until it has held its size for cooldown_s, then min_gain x cooldown_s / that time, down to
    min_gain_idle; NaN: min_gain as always."""
    if job.throughput is None and len(job.step_samples) <= 1 and s.min_gain_explore < s.min_gain:
        return s.min_gain_explore
    at_size = min(job.since_scaled_s, job.runtime_s if math.isfinite(job.runtime_s) else math.inf)
    if not (math.isfinite(at_size) and at_size > s.cooldown_s) or s.min_gain_idle >= s.min_gain:
        return math.nan
    return max(s.min_gain_idle, s.min_gain * s.cooldown_s / at_size)


def elastic_job(job: JobState, world: World, s: ElasticLoopSettings, free: FloatArray | None = None,
                free_now: FloatArray | None = None, spare: bool = False) -> ElasticJob:
    """The optimizer's view of one job. `free`: GPUs per node a waiting job could start on now;
    a waiting job is only offered sizes whose pods fit there (a size kube-scheduler cannot place
    would leave it waiting with GPUs promised to it). `free_now`: the same without the GPUs
    running elastic jobs would give up, which bounds its growth above its ask (grow_waiting) and
    a running job's growth within its cooldown (grow_in_cooldown). `spare`: GPUs are free and no
    job waits (the gain a change must bring then falls with the time at its size: idle_min_gain)."""
    assert job.elastic is not None
    lo, hi = job.elastic
    hi = max(hi, lo)
    nominal = job.batch_size if job.batch_size > 0 else hi * 1024
    tp, kept = rate_table(job, s, hi, nominal, world.node_gpus)
    rate = kept.copy()
    g_max = rate.shape[0] - 1  # the table's sizes up to hi
    g = np.arange(g_max + 1)
    rate[(g % max(1, job.per_pod)) != 0] = np.nan  # whole pods only
    rate[0] = 0.0
    if job.throughput is None and s.explore_factor > 0:  # the prior is trusted only near what was measured
        known = max([*job.step_samples, job.live_gpus, 1])
        rate[math.ceil(known * s.explore_factor) + 1:] = np.nan
    # Its size now when any pod is bound, wherever (a job on a cordoned node is running, not
    # waiting: its cooldown and settling hold apply as anywhere).
    cur = job.live_gpus if job.bound else 0
    if not cur and free is not None:
        plannable = np.asarray(np.isfinite(rate).any(axis=1), dtype=bool)  # each row read before the loop blanks it
        for size in range(1, g_max + 1):
            if plannable[size] and not _fits(pods_for(job, size), free):
                rate[size] = np.nan
    asked = min(job.live_gpus, g_max)
    if not cur and s.grow_waiting == "never":
        rate[asked + 1:] = np.nan
    elif not cur and s.grow_waiting == "free":
        within = max(asked, math.floor(asked * s.grow_waiting_within))
        for size in range(within + 1, g_max + 1):
            if free_now is None or not _fits(pods_for(job, size), free_now):
                rate[size:] = np.nan  # larger sizes need even more of what is not free
                break
    top = g_max
    cooling = bool(cur) and job.since_scaled_s < s.cooldown_s
    if cooling and s.grow_in_cooldown and not job.settling and cur <= g_max and job.planned_gpus == cur:
        lo = cur  # just rescaled, and the plan carried out: it may still grow, into GPUs free now only
        own = None if free_now is None else free_now.copy()
        if own is not None:
            _give_back(own, job, {n: k for k, n in enumerate(world.node_names)}, +1)
        for size in range(cur + 1, g_max + 1):
            if own is None or not _fits(pods_for(job, size), own):
                rate[size:] = np.nan
                break
    elif cur and (job.settling or cooling):
        lo = top = cur  # mid-change or just rescaled: hold it where it is
        if cur > g_max:
            rate = np.vstack([rate, np.full((cur - g_max, rate.shape[1]), np.nan)])
            rate[cur] = 1.0
    cur_batch = (job.batch_size if job.batch_size > 0 else nominal) if cur else 0
    min_b = max_b = 0
    if not s.adapt_batch or job.noise is None or job.batch_range is None:
        min_b = max_b = job.batch_size if job.batch_size > 0 else nominal
    elif job.batch_range is not None:
        min_b, max_b = job.batch_range
    weight = convergence_weight(job.estimate, s) * job.type_weight  # type_weight: 1.0 unless typed
    if s.las_power > 0 and math.isfinite(job.attained_gpu_s):
        weight *= (1.0 + max(0.0, job.attained_gpu_s) / 3600.0) ** -s.las_power
    left = job.remaining_gpu_s()
    if s.srpt_power > 0 and math.isfinite(left):
        weight *= (1.0 + left / 3600.0) ** -s.srpt_power
    live = bool(cur) and job.batch_live and min_b != max_b  # only when the optimizer chooses its batch
    end = job.predicted_end_s(s.min_evidence) if cur and s.horizon_to_end else math.nan
    horizon = min(s.horizon_s, max(end, 1.0)) if math.isfinite(end) else math.nan
    gain = idle_min_gain(job, s) if cur and spare else math.nan
    return ElasticJob(job.key, max(1, lo), top, tp.batches, rate, cur, cur_batch, min_b, max_b, weight,
                      batch_live=live, horizon_s=horizon, min_gain=gain,
                      measured_rate=_measured_rate(job, cur, cur_batch) if live else math.nan)


def rate_table(job: JobState, s: ElasticLoopSettings, hi: int, nominal: int, node_gpus: int
               ) -> tuple[Throughput, FloatArray]:
    """The job's step-time table (its own, or the prior's fitted to what it measured) and the
    optimizer's rate at each (GPUs, batch) up to `hi` (read-only: copy before changing it)."""
    if job.throughput is not None:
        return job.throughput, _table_rate(job.throughput, job.noise, hi)
    return _prior_rate_kept(_PriorAsk(job, s, hi, nominal, node_gpus))


class _PriorAsk:
    """One question to prior_throughput and _goodput, equal to another when every field of the
    job they read is (a job's measurements change seldom; it is asked every round). A field of
    JobState those two come to read must join `key`, or a kept table would answer for a changed job."""

    __slots__ = ("hi", "job", "key", "node_gpus", "nominal", "s")

    def __init__(self, job: JobState, s: ElasticLoopSettings, hi: int, nominal: int, node_gpus: int) -> None:
        self.job, self.s, self.hi, self.nominal, self.node_gpus = job, s, hi, nominal, node_gpus
        self.key = (tuple(job.step_samples.items()), tuple(job.step_batches.items()),
                    tuple(job.batch_samples.items()), job.batch_range, job.noise, job.batch_local_max,
                    hi, nominal, node_gpus, s)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PriorAsk) and self.key == other.key


@functools.lru_cache(maxsize=4096)
def _prior_rate_kept(ask: _PriorAsk) -> tuple[Throughput, FloatArray]:
    """rate_table for a job planned with the prior, kept: pure in what _PriorAsk compares. At most
    4,096 tables (a few MiB)."""
    tp = prior_throughput(ask.job, ask.s, ask.hi, ask.nominal, ask.node_gpus)
    return tp, _table_rate(tp, ask.job.noise, ask.hi)


def _table_rate(tp: Throughput, noise: GradientNoise | None, hi: int) -> FloatArray:
    """_goodput over the table's rows up to `hi` GPUs, read-only."""
    g_max = min(hi, tp.step_s.shape[0] - 1)
    rate = _goodput(noise, tp.realised[: g_max + 1], tp.step_s[: g_max + 1])
    rate.setflags(write=False)
    return rate


def _goodput(noise: GradientNoise | None, realised: FloatArray, step_s: FloatArray) -> FloatArray:
    """The optimizer's rate: samples a second x the statistical efficiency at each realised batch.
    One formula for the table and the job's own measurement, so the batch hold compares like with like."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = realised / step_s
    if noise is not None:
        rate = rate * noise.efficiency(np.nan_to_num(realised, nan=1.0))
    return np.array(rate, dtype=np.float64)


def _measured_rate(job: JobState, gpus: int, batch: int) -> float:
    """The job's goodput at `gpus` and `batch` as its latest step there measured it; NaN when its
    latest step there was at another batch."""
    t = job.step_samples.get(gpus, math.nan)
    if job.step_batches.get(gpus) != batch or not t > 0:
        return math.nan
    return _goodput_at(job.noise, float(batch), float(t))


@functools.lru_cache(maxsize=4096)
def _goodput_at(noise: GradientNoise | None, batch: float, step_s: float) -> float:
    """_goodput of one (batch, step time), kept: every running job asks it every round."""
    return float(_goodput(noise, np.array([batch]), np.array([step_s]))[0])


def fit_waiting(plan: ElasticPlan, mine: list[JobState], options: list[ElasticJob], world: World,
                es: ElasticLoopSettings) -> ElasticPlan:
    """The DP counts GPUs, not where they are: a waiting job planned at a size whose pods fit no
    node's free GPUs would wait with them idle (4-GPU pods and 1-3 GPUs free on each node). Each
    waiting job planned to start gets the largest of its sizes up to the planned one whose pods
    fit what is free once kube-scheduler's queue and the resized jobs' new pods are placed
    (best-fit, as the extender packs), the jobs with the largest objective terms first; a job
    that fits at no size keeps its plan and waits. A running job planned to grow grows to the
    largest size above its own whose pods fit (its own GPUs counted free); if none does, its plan
    stands."""
    names = world.node_names
    col = {n: k for k, n in enumerate(names)}
    mine_keys = {j.key for j in mine}
    avail = np.maximum(world.free_gpus(), 0.0)
    _, avail = _place_pods([p.gpus for p in world.pending if p.job not in mine_keys], avail)
    out = list(plan.decisions)
    resized = [i for i, (j, d) in enumerate(zip(mine, out, strict=True))
               if j.bound and d.gpus > 0 and d.gpus != j.live_gpus]
    growing = [i for i in resized if out[i].gpus > mine[i].live_gpus]
    shrinking = [i for i in resized if out[i].gpus < mine[i].live_gpus]
    for i in shrinking:  # replaced at the new size: the GPUs it holds come back first
        _give_back(avail, mine[i], col, +1)
    for i in shrinking:  # ... and its smaller pods fit where its bigger ones were
        _, avail = _place_pods(pods_for(mine[i], out[i].gpus), avail)
    # A growing job whose new pods fit nowhere would wait with its GPUs given up: it grows only as
    # far as its pods fit. When no larger size fits, the DP's size stands: keeping such jobs at
    # their size cost the demo 3481 -> 3719 s (docs/elastic.md).
    for i in sorted(growing, key=lambda i: -out[i].value):
        job, d = mine[i], out[i]
        _give_back(avail, job, col, +1)
        fit, avail = _largest_fit(job, options[i], es, d, job.live_gpus + 1, avail)
        if fit is None:  # no larger size fits now: the plan stands (staying put did worse, above)
            _give_back(avail, job, col, -1)
        else:
            out[i] = fit
    waiting = [i for i, (j, d) in enumerate(zip(mine, out, strict=True)) if not j.bound and d.gpus > 0]
    for i in sorted(waiting, key=lambda i: -out[i].value):
        fit, avail = _largest_fit(mine[i], options[i], es, out[i], 1, avail)
        out[i] = fit or out[i]
    total = float(sum(d.value for d in out))
    return replace(plan, decisions=tuple(out), total_value=total, gpus_used=sum(d.gpus for d in out))


def _give_back(avail: FloatArray, job: JobState, col: dict[str, int], sign: int) -> None:
    for node, g in job.gpus_on.items():
        if node in col:
            avail[col[node]] += sign * g


def _largest_fit(job: JobState, option: ElasticJob, es: ElasticLoopSettings, d: ElasticDecision, bottom: int,
                 avail: FloatArray) -> tuple[ElasticDecision | None, FloatArray]:
    """The decision at the largest of the job's sizes in bottom..d.gpus whose pods fit `avail` (d
    itself when that size is d's; None when none fits) and what is left after its pods."""
    o = job_options(option, es)
    for k in np.flatnonzero((o.gpus >= bottom) & (o.gpus <= d.gpus))[::-1]:
        size = int(o.gpus[k])
        fits, left = _place_pods(pods_for(job, size), avail)
        if fits:
            if size == d.gpus:
                return d, left
            return ElasticDecision(d.key, size, int(o.batch[k]), float(o.value[k]), d.current_gpus,
                                   d.current_batch), left
    return None, avail


def work_left_gpu_s(job: JobState, min_evidence: float) -> float:
    """The work the heSRPT ranking reads: GPU-seconds to its planned end (remaining_gpu_s); else,
    while it holds GPUs, its predicted end (predicted_end_s at min_evidence: early stopping, a
    target, the plateau) at its size now; NaN unknown (a waiting job's size is the plan's to choose)."""
    left = job.remaining_gpu_s()
    if math.isfinite(left) or not job.bound or min_evidence > 1.0:
        return left
    end = job.predicted_end_s(min_evidence)
    return end * max(1, job.live_gpus) if math.isfinite(end) else math.nan


def srpt_weights(jobs: Sequence[JobState], s: ElasticLoopSettings) -> FloatArray:
    """The heSRPT weights of the elastic jobs: ranked by planned ends, and with predicted ends
    counted (srpt_rank_min_evidence) by srpt_rank_predicted_share, the geometric blend
    w_planned^(1 - share) x w_predicted^share. Wholly by the predicted ranks, jobs whose predicted
    end is short grew and long ones shrank, and restarts rose past what the gain paid for."""
    planned = rank_weights(np.array([j.remaining_gpu_s() for j in jobs]), s.srpt_rank_p, s.srpt_rank_unknown)
    share = s.srpt_rank_predicted_share
    if s.srpt_rank_min_evidence > 1.0 or share <= 0.0:
        return planned
    left = np.array([work_left_gpu_s(j, s.srpt_rank_min_evidence) for j in jobs])
    predicted = rank_weights(left, s.srpt_rank_p, s.srpt_rank_unknown)
    out: FloatArray = planned ** (1.0 - share) * predicted ** share
    return out


def rank_weights(left: FloatArray, p: float, unknown: str = "smallest") -> FloatArray:
    """heSRPT's shares as DP weights. For m jobs numbered by work left, largest first (i = 1..m),
    the mean-flow-time optimal share of job i under speed-up k^p is (i/m)^q - ((i-1)/m)^q with
    q = 1/(1-p); maximising sum w_i k_i^p gives k_i proportional to w_i^q, so w_i = share_i^(1-p).
    Scaled so the largest weight is 1. Unknown (NaN) work ranks as the smallest or the median.
    Jobs with equal work left (unknown ones among them) share their ranks' shares equally: a tie
    broken by list order would weigh equal jobs apart, and with no job's work known every weight
    is 1 (the plan is as with the ranking off)."""
    m = left.size
    if m == 0:
        return np.ones(0)
    known = np.isfinite(left)
    fill = -np.inf if unknown == "smallest" else (float(np.median(left[known])) if known.any() else 0.0)
    key = np.where(known, left, fill)
    order = np.argsort(-key, kind="stable")  # largest work first
    q = 1.0 / (1.0 - p)
    pos = np.arange(1, m + 1, dtype=np.float64)
    by_pos = (pos / m) ** q - ((pos - 1) / m) ** q  # heSRPT's share at each rank
    _, group = np.unique(-key[order], return_inverse=True)  # equal work, one group, in rank order
    mean = np.bincount(group, weights=by_pos) / np.bincount(group)
    share = np.empty(m, dtype=np.float64)
    share[order] = mean[group]
    w = share ** (1.0 - p)
    out: FloatArray = w / w.max()
    return out


def unplannable(job: JobState) -> str:
    """Why a running job has no size the optimizer may plan (job_options is empty)."""
    assert job.elastic is not None
    lo, hi = job.elastic
    per = max(1, job.per_pod)
    return NO_PLANNABLE_SIZE if hi // per * per >= max(1, lo) else NO_WHOLE_POD_SIZE


def plan_elastic_for(world: World, settings: CoreSettings, *, migrator_on: bool = False) -> ElasticLoopPlan:
    return _plan_elastic(world, settings, migrator_on, {})


def _plan_elastic(world: World, settings: CoreSettings, migrator_on: bool, held: dict[str, str]
                  ) -> ElasticLoopPlan:
    """`held`: jobs found unplannable (a running job with no size it may run at, as 4-GPU pods in
    a 1-2 range): each is refused, held at its size with its GPUs counted as others', and the rest
    planned as usual; one such job must not leave the DP without a feasible plan for everyone."""
    s = settings.elastic
    mine: list[JobState] = []
    refusals: dict[str, str] = {}
    other_held = 0.0
    for job in world.jobs:
        why = held.get(job.key) or elastic_refusal(job, world, settings.safety, migrator_on)
        if why is None:
            mine.append(job)
        else:
            if job.elastic is not None:
                refusals[job.key] = why
            other_held += job.held_gpus
    waiting_mine = {j.key for j in mine}
    # Waiting work the optimizer does not plan for: pods kube-scheduler sees, and (reserve_gated)
    # gated jobs the admission loop will release.
    other_waiting = sum(p.gpus for p in world.pending if p.job not in waiting_mine)
    if s.reserve_gated:
        other_waiting += sum(sum(j.gated_pods) for j in world.jobs if j.gated_pods and j.key not in waiting_mine)
    total = world.total_gpus()
    reserve = other_waiting if s.reserve_pending else 0.0
    # GPUs the elastic jobs hold on nodes not in the World (cordoned, NotReady): the plan counts
    # their current sizes, so they count as capacity too (else a job held there at its size would
    # push the others down into the schedulable GPUs alone).
    unlisted = sum(j.unlisted_gpus for j in mine)
    capacity = int(max(0.0, total + unlisted - other_held - reserve))
    accounting = {"allocatable_gpus": total, "held_by_others": other_held, "reserved_for_waiting": reserve,
                  "capacity": float(capacity)}
    if unlisted:
        accounting["held_on_unschedulable_nodes"] = unlisted
    if not mine:
        return ElasticLoopPlan((), (), (), None, accounting, refusals)
    # Where a waiting job could start: free GPUs after the pods kube-scheduler already sees.
    free = np.maximum(world.free_gpus(), 0.0)
    if world.pending:
        _, free = place(free, np.array([p.gpus for p in world.pending]), np.full(len(world.pending), -1,
                                                                                 dtype=np.int64))
    # A running job's GPUs come back when it shrinks: a waiting job may also take those, so its
    # sizes are checked against free + what the elastic jobs hold now (an upper bound).
    free_now = free.copy()
    col = {n: k for k, n in enumerate(world.node_names)}
    for j in mine:
        _give_back(free, j, col, +1)
    spare = bool(free_now.sum() >= 1) and not world.pending and not any(j.gated_pods or not j.bound
                                                                           for j in world.jobs)
    options = [elastic_job(j, world, s, free, free_now, spare) for j in mine]
    if s.srpt_rank_p > 0:
        w = srpt_weights(mine, s)
        options = [replace(o, weight=o.weight * float(x)) for o, x in zip(options, w, strict=True)]
    options, capped = cap_growth(options, mine, settings.bottleneck)  # diagnosis: not grown (scoring.remedy)
    opts = [job_options(o, s) for o in options]
    stuck = {j.key: unplannable(j) for j, o in zip(mine, opts, strict=True) if o.gpus.size == 0}
    if stuck:  # planned again without them (they only ever add: at most one more pass each)
        return _plan_elastic(world, settings, migrator_on, {**held, **stuck})
    refusals.update(capped)
    floor = sum(o.min_gpus for o in options if o.current_gpus > 0)  # running jobs are never stopped
    plan = plan_elastic(options, max(capacity, floor), s, opts)
    if plan.feasible and s.fit_waiting:
        plan = fit_waiting(plan, mine, options, world, s)
    actions: list[Scale] = []
    if plan.feasible:
        for job, d in zip(mine, plan.decisions, strict=True):
            assert job.elastic is not None
            new_batch = d.batch_size if job.batch_size > 0 else 0
            if d.gpus == 0 or (d.gpus == job.live_gpus and (new_batch == job.batch_size or new_batch == 0)):
                continue
            reason = (f"elastic plan {job.live_gpus} -> {d.gpus} GPUs"
                      + (f", batch {job.batch_size} -> {new_batch}" if new_batch and new_batch != job.batch_size
                         else "")
                      + f" (range {job.elastic[0]}-{job.elastic[1]}, {job.per_pod} per pod): "
                      f"{plan.gpus_used}/{plan.capacity} GPUs planned over {len(mine)} elastic job(s), "
                      f"objective {plan.total_value:.3g}; restart cost {s.restart_s:.0f}s over "
                      f"{s.horizon_s:.0f}s, min gain {s.min_gain:.0%}"
                      + (f", batch gain {s.batch_gain:.0%}" if d.gpus == job.live_gpus else ""))
            actions.append(Scale(job.key, d.gpus, job.live_gpus, new_batch, job.batch_size, job.per_pod,
                                 job.elastic[0], job.elastic[1], reason, job.attained_gpu_s))
    actions.sort(key=lambda a: a.gpus - a.from_gpus)  # shrink first: their GPUs go to the growing ones
    return ElasticLoopPlan(tuple(actions), tuple(mine), tuple(options), plan, accounting, refusals)
