"""kube-scheduler emulation (shared by kube-default, binpack and flowsched) and FIFO.

kube-scheduler decides the queue order: priority, then arrival. A pod that fits nowhere is
set aside and retried in a later round while later pods go ahead. Each pod: in-tree
NodeResourcesFit filter (GPUs, CPU, memory), then the profile's filter/score, then the
highest total score (ties broken at random, as selectHost does).

How a multi-GPU job maps to pods: one pod per node-sized fragment (a 6-GPU job on 4-GPU
nodes is a 4-GPU pod and a 2-GPU pod), scheduled as a gang (coscheduling's Permit: all pods
bind or none; a failed gang releases what it had assumed). Pods of one job go largest first.
Priorities are equal in these workloads, so kube-scheduler's preemption (PostFilter) never
fires; nothing here preempts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from benchmarks.sim.cluster import Cluster
from benchmarks.sim.engine import Engine, Policy, SimJob
from scoring.nodes import NodeArrays
from scoring.pipeline import CandidateNodes, Stages, filter_and_score
from scoring.placement import PlacementSettings, PodDemand
from scoring.workload import WorkloadClass

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# (engine, candidate node indices that passed the in-tree filter, pod GPUs)
#   -> (indices kept by the profile's filter, their total scores)
NodeScorer = Callable[[Engine, IntArray, int], tuple[IntArray, FloatArray]]


def pod_sizes(gpus: int, per_node: int) -> list[int]:
    return [per_node] * (gpus // per_node) + ([gpus % per_node] if gpus % per_node else [])


# -- kube-scheduler's in-tree scoring plugins (baselines; formulas of pkg/scheduler/framework/
#    plugins/noderesources: least_allocated.go, most_allocated.go, balanced_allocation.go) --
def _fractions(c: Cluster, idx: IntArray, gpus: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    s = c.settings
    cpu = (c.cpu_used[idx] + gpus * s.cpu_per_gpu) / c.cpu_alloc[idx]
    mem = (c.mem_used[idx] + gpus * s.mem_per_gpu) / c.mem_alloc[idx]
    gpu = (c.gpu_used[idx] + gpus) / c.gpu_alloc[idx]
    return np.clip(cpu, 0, 1), np.clip(mem, 0, 1), np.clip(gpu, 0, 1)


def balanced_allocation(c: Cluster, idx: IntArray, gpus: int) -> FloatArray:
    cpu, mem, _ = _fractions(c, idx, gpus)
    std = np.abs(cpu - mem) / 2.0  # population std of two values
    out: FloatArray = (1.0 - std) * 100.0
    return out


def kube_default_scorer(engine: Engine, idx: IntArray, gpus: int) -> tuple[IntArray, FloatArray]:
    """LeastAllocated (cpu, memory; weight 1 each) + BalancedAllocation: the default profile."""
    cpu, mem, _ = _fractions(engine.cluster, idx, gpus)
    least = ((1 - cpu) + (1 - mem)) / 2.0 * 100.0
    return idx, least + balanced_allocation(engine.cluster, idx, gpus)


def binpack_scorer(engine: Engine, idx: IntArray, gpus: int) -> tuple[IntArray, FloatArray]:
    """MostAllocated over cpu, memory and nvidia.com/gpu (weight 1 each) + BalancedAllocation."""
    cpu, mem, gpu = _fractions(engine.cluster, idx, gpus)
    most = (cpu + mem + gpu) / 3.0 * 100.0
    return idx, most + balanced_allocation(engine.cluster, idx, gpus)


@dataclass
class FlowschedScorer:
    """The extender's /filter and /prioritize, i.e. scoring.pipeline (the verbs' one placement
    pipeline) on a NodeArrays built from the simulated cluster and telemetry: the simulated
    jobs train, share no GPUs and carry no migration origin or demand mix, so those terms are
    neutral. The profile is assumed to disable the in-tree resource scorers, so the extender's
    score (x weight x 10) alone ranks nodes."""

    settings: PlacementSettings = field(default_factory=PlacementSettings)
    weight: float = 1.0
    calls: int = 0  # times scoring.pipeline was consulted (tests check it is)

    def snapshot(self, engine: Engine, idx: IntArray) -> NodeArrays:
        c = engine.cluster
        return NodeArrays(
            gpu_alloc=c.gpu_alloc[idx],
            gpu_used=c.gpu_used[idx],
            cpu_alloc=c.cpu_alloc[idx],
            cpu_used=c.cpu_used[idx],
            mem_alloc=c.mem_alloc[idx],
            mem_used=c.mem_used[idx],
            gpu_util=engine.gpu_util()[idx],
            fb_free_mib=np.full((idx.size, c.settings.gpus_per_node), np.nan),
            completing_gpus=engine.completing_gpus()[idx],
        )

    def __call__(self, engine: Engine, idx: IntArray, gpus: int) -> tuple[IntArray, FloatArray]:
        self.calls += 1
        nodes = self.snapshot(engine, idx)
        demand = PodDemand(gpus=float(gpus), cpu=gpus * engine.cluster.settings.cpu_per_gpu,
                           mem=gpus * engine.cluster.settings.mem_per_gpu)
        # Stages.RANK: the filter, then the scores of the nodes it passed only.
        verdict = filter_and_score(CandidateNodes(nodes), demand, WorkloadClass.TRAINING, self.settings, Stages.RANK)
        if verdict.scored is None or verdict.terms is None or verdict.scored.size == 0:
            return idx[:0], np.zeros(0)
        return idx[verdict.scored], verdict.terms.score.astype(np.float64) * self.weight * 10.0


class KubeSchedulerPolicy:
    """The queue and per-pod cycle of kube-scheduler; `scorer` is the profile's filter+score."""

    def __init__(self, name: str, scorer: NodeScorer, seed: int = 0):
        self.name = name
        self.scorer = scorer
        self.rng = np.random.default_rng(seed)
        # Pending jobs per demand shape, each a heap by (-priority, arrival, index). Within a
        # round, once a shape fails every later job of that shape would fail too.
        self.pending: dict[int, list[tuple[int, float, int]]] = {}
        self.by_idx: dict[int, SimJob] = {}
        # When each pending job's pods entered the queue: its arrival, or for a job evicted or
        # resized while running the time its replacement pods were created (DESIGN §7: a
        # replacement is a new pod and queues behind the pods created before it).
        self.queued_at: dict[int, float] = {}

    def _enqueue(self, job: SimJob, at: float) -> None:
        self.by_idx[job.idx] = job
        self.queued_at[job.idx] = at
        heapq.heappush(self.pending.setdefault(job.replicas, []), (-job.spec.priority, at, job.idx))

    def on_arrival(self, job: SimJob, now: float) -> None:
        self._enqueue(job, job.spec.arrival)

    def on_requeue(self, job: SimJob, now: float) -> None:
        self._enqueue(job, now)

    def on_complete(self, job: SimJob, now: float) -> None:
        self.by_idx.pop(job.idx, None)
        self.queued_at.pop(job.idx, None)

    def next_wakeup(self, now: float) -> float | None:
        return None

    def schedule(self, engine: Engine, now: float) -> None:
        heads = [(h[0], shape) for shape, h in self.pending.items() if h]
        heapq.heapify(heads)
        while heads:
            _, shape = heapq.heappop(heads)
            queue = self.pending[shape]
            job = self.by_idx[queue[0][2]]
            if self._place(engine, job):
                heapq.heappop(queue)
                if queue:
                    heapq.heappush(heads, (queue[0], shape))

    def _place(self, engine: Engine, job: SimJob) -> bool:
        c = engine.cluster
        if c.total_free < job.replicas:
            return False
        s = c.settings
        placement: list[tuple[int, int]] = []
        ok = True
        for size in pod_sizes(job.replicas, s.gpus_per_node):
            fit = (
                (c.free >= size)
                & (c.cpu_used + size * s.cpu_per_gpu <= c.cpu_alloc + 1e-6)
                & (c.mem_used + size * s.mem_per_gpu <= c.mem_alloc + 1e-6)
            )
            idx = np.flatnonzero(fit)
            if idx.size == 0:
                ok = False
                break
            if idx.size > 1:
                idx, score = self.scorer(engine, idx, size)
                if idx.size == 0:
                    ok = False
                    break
                best = np.flatnonzero(score == score.max())
                node = int(idx[best[int(self.rng.integers(best.size))]])
            else:
                # kube-scheduler skips scoring with one feasible node, but extenders still filter.
                kept, _ = self.scorer(engine, idx, size)
                if kept.size == 0:
                    ok = False
                    break
                node = int(kept[0])
            c.allocate(-2, [(node, size)])  # assume the pod (kube's cache) while its gang forms
            placement.append((node, size))
        c.release(-2, placement)  # undo the assumed pods; engine.start binds for real
        if not ok:
            return False
        engine.start(job, _merge(placement))
        return True


def _merge(placement: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Two pods of one job on the same node are one node of its placement."""
    out: dict[int, int] = {}
    for node, g in placement:
        out[node] = out.get(node, 0) + g
    return list(out.items())


class FifoPolicy:
    """Strict first-in-first-out: the head job blocks everything behind it; no preemption.
    GPUs are taken from the nodes with most free first (fragmentation allowed)."""

    name = "fifo"

    def __init__(self) -> None:
        self.queue: list[tuple[int, float, int]] = []
        self.by_idx: dict[int, SimJob] = {}

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.by_idx[job.idx] = job
        heapq.heappush(self.queue, (-job.spec.priority, job.spec.arrival, job.idx))

    on_requeue = on_arrival

    def on_complete(self, job: SimJob, now: float) -> None:
        self.by_idx.pop(job.idx, None)

    def next_wakeup(self, now: float) -> float | None:
        return None

    def schedule(self, engine: Engine, now: float) -> None:
        while self.queue:
            job = self.by_idx[self.queue[0][2]]
            placement = engine.cluster.greedy_most_free(job.replicas)
            if placement is None:
                return
            heapq.heappop(self.queue)
            engine.start(job, placement)


POLICY_NAMES = ("fifo", "kube-default", "binpack", "tiresias", "flowsched")


def make_policy(name: str, seed: int = 0, placement: PlacementSettings | None = None) -> Policy:
    from benchmarks.sim.tiresias import TiresiasPolicy

    if name == "fifo":
        return FifoPolicy()
    if name == "kube-default":
        return KubeSchedulerPolicy(name, kube_default_scorer, seed)
    if name == "binpack":
        return KubeSchedulerPolicy(name, binpack_scorer, seed)
    if name == "tiresias":
        return TiresiasPolicy()
    if name == "flowsched":
        return KubeSchedulerPolicy(name, FlowschedScorer(placement or PlacementSettings()), seed)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
