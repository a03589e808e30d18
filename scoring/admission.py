"""Admission: which gated jobs kube-scheduler may see now, in which order, and which running
jobs yield to them. Pure; the shells remove the gates (service) or release the job (simulator).

flowsched changes the order of work only through scheduling gates and evictions, as it can in a
real cluster (DESIGN §7): a job's pods carry the gate `flowsched.io/admission` (from the user's
template or flowsched's webhook) and kube-scheduler ignores them until the gate is removed.

Per interval:
1. The order: Tiresias' discretised least attained service. A job's queue is the number of
   `queue_thresholds_gpu_s` its attained GPU-seconds have passed (a job evicted earlier keeps
   what it had attained); lower queues first; within a queue, shortest first (`order_value`):
   by the predicted remaining GPU-time where the evidence allows (predicted_gpu_s), else by
   attained service; then the job whose pods have waited longest. A job waiting longer than
   `starvation_factor` x max(attained, 1 GPU-hour) goes ahead of all queues (the starvation bound).
2. Gangs: the pods kube-scheduler already sees (ungated pending pods) are placed best-fit on the
   free GPUs first; then each gated job in order is admitted only if *all* its pods fit what is
   left (no partial gang ever holds GPUs); a job that does not fit is skipped and later, smaller
   ones may go (as Tiresias admits), unless it is starving: then nothing behind it is admitted
   and the GPUs it needs are kept for it. On a cluster of several GPU types a job that is not
   elastic fits only on the nodes of the types the extender's filter allows it
   (scoring.typed_placement), and a starving one keeps only those.
3. Preemption (DynamoML): the first job in order that has waited `preempt_after_s` and does not
   fit may have running jobs of a *later* queue evicted for it (checkpointable, namespace
   allowed, running at least `min_runtime_s`, not predicted to end within the migrator's
   `min_remaining_s`), latest queue first and, among equals, the most work left, only as many as its
   pods need to fit, and only if they then do. The evicted jobs' replacement pods carry the gate
   again and are ordered by what they had attained.
4. Namespaces flowsched must not touch (excluded or labelled out) are never held: their gated
   jobs are admitted at once, whatever fits.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scoring.actions import Preempt, Release
from scoring.migration import place
from scoring.safety import namespace_refusal
from scoring.settings import AdmissionLoopSettings, CoreSettings
from scoring.typed_placement import node_masks, plan_types
from scoring.world import JobState, World

_ONE_GPU_HOUR = 3600.0


@dataclass(frozen=True)
class AdmissionPlan:
    admits: tuple[Release, ...]  # scheduling gates removed
    preempts: tuple[Preempt, ...]
    order: tuple[tuple[str, int, float, str], ...]  # (job, queue, wait_s, decision) of every gated job

    def describe(self, now: float) -> dict[str, Any]:
        return {"at": now, "queue": [{"job": j, "queue": q, "wait_s": w if math.isfinite(w) else None,
                                      "decision": d} for j, q, w, d in self.order],
                "admit": [a.job for a in self.admits], "preempt": [p.job for p in self.preempts]}


def queue_of(attained_gpu_s: float, thresholds: tuple[float, ...]) -> int:
    a = attained_gpu_s if math.isfinite(attained_gpu_s) else 0.0
    return bisect.bisect_right(list(thresholds), a)


def job_queue(job: JobState, gpus: float, s: AdmissionLoopSettings) -> int:
    """The job's queue (queue_of): by attained service, or with queue_by "remaining" by its
    predicted remaining GPU-seconds at `gpus` GPUs where the evidence allows (attained where not)."""
    if s.queue_by == "remaining":
        left = predicted_gpu_s(job, gpus, s)
        if math.isfinite(left):
            return queue_of(left, s.queue_thresholds_gpu_s)
    return queue_of(job.attained_gpu_s, s.queue_thresholds_gpu_s)


def _asked(job: JobState) -> float:
    """The GPUs a gated job asks for (its gated pods), else the GPUs it runs at."""
    return float(sum(job.gated_pods)) or float(job.live_gpus)


def starving(job: JobState, factor: float) -> bool:
    att = job.attained_gpu_s if math.isfinite(job.attained_gpu_s) else 0.0
    return factor > 0 and math.isfinite(job.wait_s) and job.wait_s > factor * max(att, _ONE_GPU_HOUR)


def predicted_end_s(job: JobState, s: AdmissionLoopSettings) -> float:
    """Seconds until the job ends, as far as admission leans on it (JobState.predicted_end_s at
    min_evidence); NaN when there is no such prediction."""
    return job.predicted_end_s(s.min_evidence)


def predicted_gpu_s(job: JobState, gpus: float, s: AdmissionLoopSettings) -> float:
    """GPU-seconds left at `gpus` GPUs until its predicted end (predicted_end_s); NaN unknown."""
    end = predicted_end_s(job, s)
    return end * gpus if math.isfinite(end) else math.nan


def order_value(job: JobState, s: AdmissionLoopSettings) -> tuple[int, float]:
    """Within a queue: a job predicted to end within finish_first_s first, then shortest first
    (order "remaining"): by its predicted remaining GPU-seconds where the evidence allows, else by
    its attained GPU-seconds, Tiresias' least attained service. One axis: for the heavy-tailed job
    sizes of real clusters a job's expected remaining work grows with what it attained, so
    attained service stands in for the remaining work nothing predicts. Order "finish_first":
    the first tier only (then the longest waiting)."""
    soon = 0 if predicted_end_s(job, s) <= s.finish_first_s else 1  # NaN: not soon
    if s.order == "finish_first":
        return (soon, 0.0)
    left = predicted_gpu_s(job, _asked(job), s)
    return (soon, left if math.isfinite(left) else (job.attained_gpu_s if math.isfinite(job.attained_gpu_s) else 0.0))


@dataclass
class _Room:
    """Free GPUs per node as the plan goes, and what has been promised."""

    names: list[str]
    free: np.ndarray

    def fits(self, pods: tuple[float, ...], extra: np.ndarray | None = None, on: np.ndarray | None = None) -> bool:
        """Whether every pod fits the free GPUs (plus `extra`), on the nodes `on` only (None: all)."""
        left = self.free + extra if extra is not None else self.free
        if on is not None:
            left = np.where(on, left, 0.0)
        where, _ = place(left, np.asarray(pods, dtype=np.float64), np.full(len(pods), -1, dtype=np.int64))
        return bool((where >= 0).all())

    def take(self, pods: tuple[float, ...], on: np.ndarray | None = None) -> None:
        left = self.free if on is None else np.where(on, self.free, 0.0)
        _, after = place(left, np.asarray(pods, dtype=np.float64), np.full(len(pods), -1, dtype=np.int64))
        self.free = after if on is None else np.where(on, after, self.free)


@dataclass
class _Budget:
    admits: int
    preempts: int
    used_admits: int = 0
    used_preempts: int = 0
    notes: dict[str, str] = field(default_factory=dict)


def plan_admission_for(world: World, settings: CoreSettings, *, max_admits: int | None = None,
                       max_preempts: int | None = None) -> AdmissionPlan:
    s = settings.admission
    names = world.node_names
    col = {n: k for k, n in enumerate(names)}
    room = _Room(names, np.maximum(world.free_gpus(), 0.0))
    # What kube-scheduler sees already goes first: its queue takes GPUs before any admission.
    ungated = tuple(p.gpus for p in world.pending)
    if ungated:
        room.take(ungated)
    budget = _Budget(s.max_per_interval if max_admits is None else max_admits,
                     s.max_preemptions_per_interval if max_preempts is None else max_preempts)
    gated = [j for j in world.jobs if j.gated_pods]
    open_ns = [j for j in gated if namespace_refusal(j.namespace, world.namespace_labels, settings.safety) is None]
    closed = [j for j in gated if j not in open_ns]

    ends = {j.key: predicted_end_s(j, s) for j in open_ns}
    types = plan_types(world, settings)  # the empty plan on a cluster of one type

    kept = np.zeros(len(names), dtype=bool)  # the nodes a starving job ahead waits on

    def where_to(j: JobState) -> list[np.ndarray]:
        """The nodes the extender's filter will let the job bind to, a mask per allowed type in
        its order (scoring.typed_placement), less those a starving job ahead keeps: a gang released
        where it fits by count but not on its types would wait in kube-scheduler's queue. An
        elastic job is admitted by count as on one type: its pods carry the type of its latest
        elastic plan, which the World does not (with its typed room the typed demo with every job
        elastic read 10875 s against 9715)."""
        left = [m & ~kept for m in node_masks(types, world, j, settings.gpu_types)]
        return [m for m in left if m.any()]

    def key(j: JobState) -> tuple[int, int, int, float, float, str]:
        q = job_queue(j, _asked(j), s)
        wait = j.wait_s if math.isfinite(j.wait_s) else 0.0
        return (0 if starving(j, s.starvation_factor) else 1, q, *order_value(j, s), -wait, j.key)

    admits: list[Release] = []
    preempts: list[Preempt] = []
    order: list[tuple[str, int, float, str]] = []
    for j in closed:  # flowsched may not hold these
        q = job_queue(j, _asked(j), s)
        admits.append(Release(j.key, len(j.gated_pods), float(sum(j.gated_pods)), q,
                            "namespace not managed by flowsched: released at once"))
        order.append((j.key, q, j.wait_s, "released: namespace not managed"))
    preempted_for: str | None = None
    running = [r for r in world.jobs if r.held_gpus > 0]
    for j in sorted(open_ns, key=key):
        q = job_queue(j, _asked(j), s)
        starve = starving(j, s.starvation_factor)
        on_nodes = where_to(j)
        if not on_nodes:
            order.append((j.key, q, j.wait_s, "held: a starving job ahead keeps the GPUs it needs"))
            continue
        fit = [m for m in on_nodes if room.fits(j.gated_pods, on=m)]
        if fit:
            on = fit[0]
            if budget.used_admits >= budget.admits:
                order.append((j.key, q, j.wait_s, "fits, admission budget spent"))
                continue
            room.take(j.gated_pods, on)
            budget.used_admits += 1
            why = "starving: ahead of every queue" if starve else f"queue {q}"
            if ends[j.key] <= s.finish_first_s:
                why += f", predicted to end in {ends[j.key]:.0f}s"
            admits.append(Release(j.key, len(j.gated_pods), float(sum(j.gated_pods)), q,
                                f"{why}, waited {j.wait_s:.0f}s, attained {_h(j.attained_gpu_s)} GPU-h; "
                                f"all {len(j.gated_pods)} pod(s) ({sum(j.gated_pods):g} GPUs) fit now"))
            order.append((j.key, q, j.wait_s, "admitted"))
            continue
        decision = "waits: its pods do not all fit"
        if s.preempt and preempted_for is None and math.isfinite(j.wait_s) and j.wait_s >= s.preempt_after_s:
            victims = _victims(j, q, running, world, settings, room, col, on_nodes)
            if victims and len(victims) <= budget.preempts - budget.used_preempts:
                preempted_for = j.key
                budget.used_preempts += len(victims)
                for v in victims:
                    vq = job_queue(v, v.held_gpus, s)
                    preempts.append(Preempt(v.key, j.key, v.held_gpus, v.attained_gpu_s,
                                            f"preempted for {j.key} (queue {q}, waited {j.wait_s:.0f}s): {v.key} is "
                                            f"in queue {vq} with {_h(v.attained_gpu_s)} GPU-h attained; frees "
                                            f"{v.held_gpus:g} GPUs", count=v.migrations + 1))
                decision = f"waits: preempting {len(victims)} job(s) for it"
        if starve:
            for m in on_nodes:  # nothing behind a starving job takes the GPUs it waits for
                kept |= m
            decision += "; starving: nothing behind it is admitted"
        order.append((j.key, q, j.wait_s, decision))
    return AdmissionPlan(tuple(admits), tuple(preempts), tuple(order))


def _victims(job: JobState, q: int, running: list[JobState], world: World, settings: CoreSettings,
             room: _Room, col: dict[str, int], on: list[np.ndarray]) -> list[JobState]:
    """The fewest running jobs of later queues (most attained first) whose GPUs let `job` fit on
    the nodes of one of `on` (a job on nodes it may not bind to frees nothing for it)."""
    usable = np.logical_or.reduce(on)
    s = settings.admission
    cands = []
    for r in running:
        rq = job_queue(r, r.held_gpus, s)
        if rq <= q or not r.checkpointable or not r.running or r.workload == "inference":
            continue
        if namespace_refusal(r.namespace, world.namespace_labels, settings.safety) is not None:
            continue
        if not (math.isfinite(r.runtime_s) and r.runtime_s >= s.min_runtime_s):
            continue
        if r.seconds_to_end(s.min_evidence) < settings.migrator.min_remaining_s:
            continue  # ends by itself soon, cheaper than a restart
        if r.since_migration_s < settings.safety.hold_s or r.since_scaled_s < settings.safety.hold_s:
            continue
        if not any(usable[col[n]] for n in r.gpus_on if n in col):
            continue
        cands.append(r)
    # Latest queue first; among equals, the most work left (predicted, else attained service):
    # evicting it costs the same restart and frees its GPUs for longest.
    def most_left(r: JobState) -> tuple[int, float, str]:
        att = r.attained_gpu_s if math.isfinite(r.attained_gpu_s) else 0.0
        left = predicted_gpu_s(r, r.held_gpus, s) if s.order == "remaining" else math.nan
        return (-job_queue(r, r.held_gpus, s), -(left if math.isfinite(left) else att), r.key)

    cands.sort(key=most_left)
    extra = np.zeros_like(room.free)
    chosen: list[JobState] = []
    for r in cands:
        for node, g in r.gpus_on.items():
            if node in col:
                extra[col[node]] += g
        chosen.append(r)
        if any(room.fits(job.gated_pods, extra, m) for m in on):
            return chosen
    return []


def _h(gpu_s: float) -> str:
    return f"{gpu_s / 3600.0:.1f}" if math.isfinite(gpu_s) else "unknown"
