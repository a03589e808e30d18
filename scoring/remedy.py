"""The remedies of bottleneck diagnosis, composed with the existing loops (after NEARCHUS).

A job's diagnosis (scoring.bottleneck, carried on `JobState.diagnosis`) changes what the loops
may do to it; nothing here acts on a job whose diagnosis is missing, unknown or below
`act_confidence` (neutral: the loops behave as without diagnosis).

    diagnosis            elastic optimizer        resizer               own remedy
    input-bound          must not grow it         may raise its CPU     GiveCpu (the resizer's hint)
    communication-bound  must not grow it         must not raise CPU    Consolidate (checkpointable,
                                                                        spans >1 node, room on one)
                                                                        or AddPs (PS/worker, in range)
    compute-bound        may grow it (if it       must not raise CPU    -
                         scales, or unmeasured)
    straggler            must not grow it         may raise CPU         MoveReplica (checkpointable)
    idle                 must not grow it         must not raise CPU    -

Pure: a World in, actions out. The opt-ins and namespace rules (scoring.safety) apply as for
every loop; a job another loop changed within hold_s is left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from scoring.actions import AddPs, Consolidate, GiveCpu, MoveReplica, Remedy
from scoring.bottleneck import PS, Bottleneck, BottleneckSettings, Diagnosis, scaling_from_samples
from scoring.elastic import ElasticJob
from scoring.safety import namespace_refusal
from scoring.settings import SafetySettings
from scoring.world import JobState, World


class Planned(Protocol):
    """Any loop's action: the job it is for and what it does ("scale-up", "scale-down", ...)."""

    @property
    def job(self) -> str: ...

    @property
    def kind(self) -> str: ...


A = TypeVar("A", bound=Planned)

_NO_GROWTH = {
    Bottleneck.INPUT: "input-bound: more GPUs would wait on the same input pipeline",
    Bottleneck.COMMUNICATION: "communication-bound: more replicas would add to the traffic that limits it",
    Bottleneck.STRAGGLER: "a straggler: more replicas would wait on the same slow one",
    Bottleneck.IDLE: "idle: no steps",
}
_NO_CPU = {
    Bottleneck.COMPUTE: "compute-bound: its GPUs are busy, more CPU would not help",
    Bottleneck.COMMUNICATION: "communication-bound: more CPU would not help",
    Bottleneck.IDLE: "idle: no steps",
}


def _confident(d: Diagnosis | None, s: BottleneckSettings) -> Diagnosis | None:
    return d if d is not None and d.confident(s) else None


def _says(d: Diagnosis) -> str:
    return f"diagnosed {d.kind} ({d.confidence:.0%}: {'; '.join(d.evidence[:3])})"


def growth_refusal(d: Diagnosis | None, s: BottleneckSettings) -> str | None:
    """Why the elastic optimizer must not give this job more GPUs (None: it may)."""
    d = _confident(d, s)
    if d is None:
        return None
    if d.kind in _NO_GROWTH:
        return f"not grown: {_NO_GROWTH[d.kind]}; {_says(d)}"
    if d.kind == Bottleneck.COMPUTE and math.isfinite(d.scaling) and d.scaling < s.scaling_poor:
        return f"not grown: compute-bound but scales poorly ({d.scaling:.0%} per GPU); {_says(d)}"
    return None


def resize_refusal(d: Diagnosis | None, raising: bool, s: BottleneckSettings) -> str | None:
    """Why the resizer must not raise this job's CPU (None: it may). Lowering is never refused."""
    d = _confident(d, s)
    if not raising or d is None or d.kind not in _NO_CPU:
        return None
    return f"CPU not raised: {_NO_CPU[d.kind]}; {_says(d)}"


def wants_cpu(d: Diagnosis | None, s: BottleneckSettings) -> bool:
    """The resizer should treat this job's (opted-in) pods as growing: its input pipeline starves it."""
    d = _confident(d, s)
    return d is not None and d.kind == Bottleneck.INPUT


def with_diagnoses(world: World, diagnoses: Mapping[str, Diagnosis]) -> World:
    """The World with each job's latest diagnosis (job key -> Diagnosis) on its JobState; jobs
    without one keep what they had. The service's shell calls this on the World it built."""
    if not diagnoses:
        return world
    jobs = tuple(replace(j, diagnosis=_with_scaling(diagnoses[j.key], j)) if j.key in diagnoses else j
                 for j in world.jobs)
    return replace(world, jobs=jobs)


def _with_scaling(d: Diagnosis, job: JobState) -> Diagnosis:
    """The diagnosis with the job's measured scaling filled in when the telemetry had none."""
    if math.isfinite(d.scaling):
        return d
    scaling = scaling_from_samples(job.step_samples, job.live_gpus)
    return replace(d, scaling=scaling) if math.isfinite(scaling) else d


def resize_targets(jobs: Sequence[str], current_m: npt.ArrayLike, planned_m: npt.ArrayLike, max_m: npt.ArrayLike,
                   pool_m: float, diagnoses: Mapping[str, Diagnosis | None], s: BottleneckSettings,
                   frozen: npt.ArrayLike | None = None) -> tuple[npt.NDArray[np.float64], dict[int, str]]:
    """The resizer's per-pod plan on one node (rows: pods, their job, current / planned / cpu-max
    millicores, the node's pool) with the diagnoses applied, and why each changed row changed:
    a raise the diagnosis refuses goes back to the current value; an input-bound job's pod the plan
    did not raise is raised to cpu_target, in row order, while the rows' sum stays within the pool.
    `frozen` rows (a resize in flight or pending, resized within the resizer's cooldown) are not raised."""
    cur = np.asarray(current_m, dtype=np.float64)
    out = np.asarray(planned_m, dtype=np.float64).copy()
    top = np.asarray(max_m, dtype=np.float64)
    why: dict[int, str] = {}
    for i, job in enumerate(jobs):
        d = diagnoses.get(job)
        refused = resize_refusal(d, bool(out[i] > cur[i]), s)
        if refused is not None:
            out[i] = cur[i]
            why[i] = refused
    held = np.zeros(len(jobs), dtype=bool) if frozen is None else np.asarray(frozen, dtype=bool)
    for i, job in enumerate(jobs):
        d = diagnoses.get(job)
        if not wants_cpu(d, s) or out[i] > cur[i] or held[i]:
            continue
        want = cpu_target(cur[i], top[i], s)
        room = pool_m - float(out.sum())
        step = min(want - out[i], room)
        if step > 0:
            out[i] += step
            assert d is not None
            why[i] = f"CPU raised for its input pipeline: {_says(d)}"
    return out, why


def cpu_target(current_m: float, max_m: float, s: BottleneckSettings) -> float:
    """The CPU request (millicores) GiveCpu asks the resizer for: one step of cpu_raise, never above
    the pod's cpu-max, never below what it has."""
    return max(current_m, min(max_m, current_m * (1.0 + s.cpu_raise)))


def constrain(actions: Sequence[A], world: World, s: BottleneckSettings) -> tuple[tuple[A, ...], dict[str, str]]:
    """A loop's plan with the scale-ups its jobs' diagnoses forbid removed, and why (job -> reason).
    Shrinks, rebatches and evictions pass unchanged (they only free resources)."""
    kept: list[A] = []
    dropped: dict[str, str] = {}
    for a in actions:
        job = world.job(a.job)
        why = growth_refusal(job.diagnosis if job is not None else None, s) if a.kind == "scale-up" else None
        if why is None:
            kept.append(a)
        else:
            dropped[a.job] = why
    return tuple(kept), dropped


def cap_growth(options: Sequence[ElasticJob], jobs: Sequence[JobState], s: BottleneckSettings
               ) -> tuple[list[ElasticJob], dict[str, str]]:
    """The elastic optimizer's options with each running job its diagnosis forbids to grow capped
    at its current size (before the plan, so the GPUs it would have had go to the others), and why.
    It may still shrink; pending jobs (no GPUs yet, no telemetry) are untouched."""
    out: list[ElasticJob] = []
    capped: dict[str, str] = {}
    for o, job in zip(options, jobs, strict=True):
        why = growth_refusal(job.diagnosis, s) if o.current_gpus > 0 else None
        if why is not None and o.max_gpus > o.current_gpus:
            o = replace(o, max_gpus=max(o.current_gpus, o.min_gpus))
            capped[job.key] = why
        out.append(o)
    return out, capped


def _held(job: JobState, safety: SafetySettings) -> bool:
    return min(job.since_migration_s, job.since_scaled_s) < safety.hold_s


def _consolidation_target(job: JobState, world: World) -> str | None:
    """The node that can hold all of the job's GPUs once it is gone (its own GPUs there count),
    the one already holding most of it first."""
    best: tuple[float, float, str] | None = None
    for n in world.nodes:
        own = job.gpus_on.get(n.name, 0.0)
        if n.free_gpus + own >= job.held_gpus and n.gpus >= job.held_gpus:
            key = (own, n.free_gpus, n.name)
            if best is None or key > best:
                best = key
    return best[2] if best is not None else None


def plan_remedies(world: World, s: BottleneckSettings, safety: SafetySettings) -> tuple[Remedy, ...]:
    """Each confidently diagnosed job's remedy, where its opt-ins allow one. Sorted by job."""
    out: list[Remedy] = []
    for job in world.jobs:
        d = _confident(job.diagnosis, s)
        if d is None or not job.running or job.settling or _held(job, safety):
            continue
        if namespace_refusal(job.namespace, world.namespace_labels, safety) is not None:
            continue
        if d.kind == Bottleneck.INPUT:
            out.append(GiveCpu(job.key, f"{_says(d)}: more CPU for its input pipeline"))
        elif d.kind == Bottleneck.COMMUNICATION:
            shape = d.shape
            if d.where == PS and shape.ps_range is not None and shape.ps < shape.ps_range[1]:
                out.append(AddPs(job.key, shape.ps + 1, shape.ps,
                                 f"{_says(d)}: parameter servers {shape.ps} -> {shape.ps + 1} "
                                 f"(range {shape.ps_range[0]}-{shape.ps_range[1]})"))
                continue
            spans = sum(1 for g in job.gpus_on.values() if g > 0)
            target = _consolidation_target(job, world) if job.checkpointable and spans > 1 else None
            if target is not None:
                out.append(Consolidate(job.key, target, job.held_gpus, spans,
                                       f"{_says(d)}: {job.held_gpus:g} GPUs over {spans} nodes fit on {target}"))
        elif d.kind == Bottleneck.STRAGGLER and job.checkpointable and d.slow_pods:
            node = d.where.split(",")[0]
            out.append(MoveReplica(job.key, d.slow_pods[0], node, f"{_says(d)}: move {d.slow_pods[0]} off {node}"))
    return tuple(out)
