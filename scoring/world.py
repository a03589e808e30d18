"""The World: everything the control loops decide from, as plain values.

Two shells build it: `extender/control/world_builder.py` from the watched snapshot and the
progress store, `benchmarks/sim/world.py` from the simulator's engine. The core
(scoring.control) plans from it alone; it never calls back into either shell.

Times are ages in seconds relative to `now` (NaN unknown, inf never), so nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scoring.bottleneck import Diagnosis
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.elastic import GradientNoise
from scoring.remaining import evidence_weight

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class NodeState:
    name: str
    gpus: float  # allocatable
    used_gpus: float  # requested by pods holding resources there
    gpu_type: str = ""  # scoring.gpu_types short type (gpu.product); "": untyped

    @property
    def free_gpus(self) -> float:
        return self.gpus - self.used_gpus


@dataclass(frozen=True)
class Throughput:
    """Seconds per step of a job at g GPUs (row g, 0..G) and candidate global batch b (column),
    and the batch it actually runs there (micro-batches x accumulation); NaN where infeasible.
    The simulator measures it from its profiles; the service fits it to reported step times."""

    batches: IntArray  # (B,)
    step_s: FloatArray  # (G+1, B)
    realised: FloatArray  # (G+1, B)


@dataclass(frozen=True)
class JobState:
    key: str  # namespace/job
    namespace: str
    gpus_on: Mapping[str, float]  # node -> GPUs its bound pods hold
    live_gpus: int  # GPUs of all its live pods, bound or waiting
    per_pod: int  # GPUs per pod (the granularity of a rescale)
    checkpointable: bool  # every pod annotated flowsched.io/checkpointable: "true"
    elastic: tuple[int, int] | None  # flowsched.io/elastic range on every pod; None: not elastic
    running: bool  # every pod bound and Running, none terminating or restarting
    settling: bool  # some pod terminating or waiting: the job is mid-change
    runtime_s: float  # since its latest pod started; NaN unknown
    # GPU-seconds of service: since its pods started, plus what it had attained when flowsched last
    # evicted it (recorded in its eviction mark); NaN unknown.
    attained_gpu_s: float
    estimate: ConvergenceEstimate | None = None
    migrations: int = 0
    since_migration_s: float = math.inf
    since_scaled_s: float = math.inf  # since the elastic optimizer last changed its GPU count
    planned_gpus: int = 0  # GPUs of the elastic optimizer's latest plan for it; 0: none
    batch_size: int = 0  # global batch it runs at; 0 unknown
    batch_range: tuple[int, int] | None = None  # batches the job accepts (reported); None: its own only
    # The largest batch one GPU holds (reported: training.batch_local_max); a larger share of the
    # global batch runs as accumulated micro-batches. 0: not reported (no limit assumed).
    batch_local_max: int = 0
    noise: GradientNoise | None = None  # reported gradient statistics
    throughput: Throughput | None = None  # None: the core's prior, scaled by step_samples
    step_samples: Mapping[int, float] = field(default_factory=dict)  # GPUs -> measured seconds per step
    # GPUs -> the global batch its step_samples entry was measured at; a GPU count not here: batch_size.
    step_batches: Mapping[int, int] = field(default_factory=dict)
    # (GPUs, batch) -> seconds per step, the latest at each batch it ran at with that many GPUs
    # (scoring.step_samples.record_step_sample's by_batch); the fit reads them beside step_samples.
    batch_samples: Mapping[tuple[int, int], float] = field(default_factory=dict)
    gated_pods: tuple[float, ...] = ()  # GPUs of each live pod still behind flowsched's scheduling gate
    # How a rescaled job's GPUs split into pods: 0 = pods of per_pod GPUs each (a PyTorchJob's
    # workers); k > 0 = one pod per node of up to k GPUs (the simulator's kube-scheduler model).
    pod_chunk: int = 0
    wait_s: float = math.nan  # since its oldest live pod was created (a replacement waits afresh)
    diagnosis: Diagnosis | None = None  # its bottleneck (scoring.bottleneck); None: not diagnosed
    workload: str = "training"  # scoring/workload.py WorkloadClass of its pods
    planned_steps: float = math.nan  # the planned end the job reports (max_steps, in its step unit); NaN: none
    # The job adopts a planned batch size while it runs, at its next report, without a restart
    # (reported: training.batch_live, as AdaptDL's data loader does); False: at its next start only.
    batch_live: bool = False
    # GPUs its bound pods hold on nodes not in the World (cordoned or NotReady): not in gpus_on,
    # which counts schedulable nodes only. 0: none, or not filled in by the shell.
    gpus_elsewhere: float = 0.0
    # GPU types (scoring/gpu_types.py): the job's measured speed on each type it ran on (relative to
    # the type its throughput describes), its model class for the prior, and the weight a typed
    # elastic plan gives it on the type it plans it for (1.0: untyped, neutral).
    gpu_measured: Mapping[str, float] = field(default_factory=dict)
    model_class: str = ""
    type_weight: float = 1.0

    def remaining_gpu_s(self) -> float:
        """GPU-seconds of work left if the job runs to its planned end: the service attained so far
        scaled by the share of planned steps still to go. NaN unknown (no planned end, no step yet)."""
        if not math.isfinite(self.planned_steps) or self.estimate is None:
            return math.nan
        last = self.estimate.last_step
        if not (math.isfinite(last) and last > 0 and math.isfinite(self.attained_gpu_s)):
            return math.nan
        return max(0.0, self.attained_gpu_s) * max(0.0, self.planned_steps - last) / last

    def seconds_to_planned_end(self) -> float:
        """Seconds until its planned end at the step rate of its current run; NaN unknown."""
        if not math.isfinite(self.planned_steps) or self.estimate is None:
            return math.nan
        last, rate = self.estimate.last_step, self.estimate.step_rate
        if not (math.isfinite(last) and math.isfinite(rate) and rate > 0):
            return math.nan
        return max(0.0, self.planned_steps - last) / rate

    def predicted_end_s(self, min_evidence: float) -> float:
        """Seconds until it ends, as far as a loop may lean on it (admission's order and
        finish-first, its preemption guard, the elastic horizon: one rule for all): its end under
        its stopping rule (seconds_to_end) when its estimate has one; else its planned end at its
        step rate, else its time to the plateau when that interval weighs at least min_evidence;
        NaN when there is no such prediction (a job that never reported is never ahead)."""
        if self.estimate is not None and self.estimate.end is not None:
            return self.seconds_to_end(min_evidence)
        end = self.seconds_to_planned_end()
        if math.isfinite(end):
            return end
        est = self.estimate
        if est is None or not math.isfinite(est.remaining_seconds):
            return math.nan
        return est.remaining_seconds if evidence_weight(est.remaining_distribution()) >= min_evidence else math.nan

    def seconds_to_end(self, min_evidence: float = 0.0) -> float:
        """Seconds until it frees its GPUs under its stopping rule (end_seconds() of its estimate);
        without a predicted end, its planned end at its step rate. NaN unknown."""
        if self.estimate is None or self.estimate.end is None:
            return self.seconds_to_planned_end()
        return end_seconds(self.estimate, min_evidence)

    @property
    def held_gpus(self) -> float:
        """GPUs its bound pods hold on the World's (schedulable) nodes."""
        return float(sum(self.gpus_on.values()))

    @property
    def bound(self) -> bool:
        """Whether any of its pods is bound to a node, schedulable or not: a job whose pods run on a
        cordoned or NotReady node holds no GPUs in the World but is running, not waiting."""
        return self.held_gpus > 0 or self.gpus_elsewhere > 0 or self.running

    @property
    def unlisted_gpus(self) -> float:
        """GPUs its bound pods hold on nodes not in the World (all its live GPUs minus those in the
        World when every pod is bound and running)."""
        seen = float(self.live_gpus) - self.held_gpus if self.running else 0.0
        return max(0.0, self.gpus_elsewhere, seen)

    @property
    def phase(self) -> Phase:
        return self.estimate.phase if self.estimate is not None else Phase.UNKNOWN


@dataclass(frozen=True)
class PendingPod:
    """A GPU pod kube-scheduler has not bound, in kube-scheduler's queue order."""

    key: str  # namespace/pod
    job: str
    gpus: float
    wait_s: float  # since it was created (a replacement pod waits afresh); NaN unknown


@dataclass(frozen=True)
class IdlePod:
    """A running pod that holds GPUs, as the idle loop sees it."""

    key: str  # "namespace/name"
    namespace: str
    workload: str  # scoring/workload.py class
    gpus: float
    reclaim: str | None  # its flowsched.io/reclaim-idle value, raw
    samples: tuple[float, ...]  # utilisation % of each of its GPUs now (empty: no telemetry)


@dataclass(frozen=True)
class ResizeRow:
    """One pod opted in to in-place CPU resize (flowsched.io/resizable), as the resizer plans it."""

    pod: str  # namespace/name
    uid: str
    job: str
    container: str
    request_m: float  # the container's CPU request in effect
    limit_ratio: float | None  # limit / request to keep (None: no CPU limit)
    original_m: float
    min_m: float
    max_m: float
    may_shrink: bool
    since_resize_s: float
    in_flight: bool  # spec and status differ, or a resize is pending: left alone
    pending: tuple[str, str] | None  # (reason, message) of PodResizePending
    had_original: bool
    phase: Phase  # its job's convergence phase (UNKNOWN: not tracked)
    progress: float  # its job's progress P; NaN unknown
    diagnosis: Diagnosis | None = None  # its job's bottleneck (scoring.bottleneck); None: not diagnosed


@dataclass(frozen=True)
class ResizeNode:
    """A node with opted-in pods: what the resizer shares among them."""

    node: str
    allocatable_m: float
    others_m: float  # CPU requested by the node's pods outside the plan
    rows: tuple[ResizeRow, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)  # pod -> why it is not a row


@dataclass(frozen=True)
class World:
    now: float
    nodes: tuple[NodeState, ...]  # schedulable ones (ready, not cordoned)
    jobs: tuple[JobState, ...]  # every job with a live GPU pod, sorted by key
    pending: tuple[PendingPod, ...]  # kube-scheduler's queue order
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Inputs of the loops that look below the job: filled by the shells that run those loops.
    gpu_pods: tuple[IdlePod, ...] = ()  # running pods holding GPUs, with their utilisation (idle loop)
    gpu_pods_waiting: int = 0  # GPU pods not bound yet (kube-scheduler's queue and flowsched's gate)
    resize_nodes: tuple[ResizeNode, ...] = ()  # nodes with resizable pods (resizer)

    def job(self, key: str) -> JobState | None:
        return next((j for j in self.jobs if j.key == key), None)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def free_gpus(self) -> FloatArray:
        return np.array([n.free_gpus for n in self.nodes], dtype=np.float64)

    def total_gpus(self) -> float:
        return float(sum(n.gpus for n in self.nodes))

    @property
    def node_gpus(self) -> int:
        """The GPUs of the largest node: a job of more spans nodes (the step-time model's sync
        across nodes, scoring.elastic.StepTimeModel); 0 without nodes."""
        return int(max((n.gpus for n in self.nodes), default=0.0))


def pods_for(job: JobState, gpus: int) -> list[float]:
    """The pods `job` runs as at `gpus` GPUs."""
    if job.pod_chunk > 0:
        full, rest = divmod(gpus, job.pod_chunk)
        return [float(job.pod_chunk)] * full + ([float(rest)] if rest else [])
    per = max(1, job.per_pod)
    return [float(per)] * (gpus // per)


def end_seconds(est: ConvergenceEstimate | None, min_evidence: float = 0.0) -> float:
    """Seconds until the job ends under its stopping rule (est.end: planned end, target, early
    stopping, or the plateau when it declared none) when that prediction weighs at least
    min_evidence; NaN unknown or too weak. Without est.end (an estimate made without the
    tracker), the older reading: remaining_seconds to its planned end or plateau."""
    if est is None:
        return math.nan
    end = est.end
    if end is None:
        return est.remaining_seconds
    if not math.isfinite(end.remaining_seconds) or end.evidence < min_evidence:
        return math.nan
    return end.remaining_seconds


def is_completing(phase: Phase, remaining_s: float, horizon_s: float) -> bool | None:
    """The placement's "finishing soon": COMPLETING, or predicted at its plateau within horizon_s.
    None when nothing is known (neutral). Both shells count a node's completing GPUs with this."""
    if phase == Phase.UNKNOWN:
        return None
    return phase == Phase.COMPLETING or (math.isfinite(remaining_s) and remaining_s <= horizon_s)
