"""GPU types in the simulator's shell: what the World reports of them, and the extender's filter.

TypeBook is what the service learns and reads (DESIGN §7: no more): each node's type (its
gpu.product label), each job's model class (what its pods would declare) and its measured speed
on each type it has run on; a job that ran on a type measured its step time there, i.e. its
speed there over the profile's (SimJob.type_speed), and nothing about the types it has not run on.
With types off (CoreSettings.gpu_types.enabled False: flowsched-typeblind) or a cluster of one
type, the World has no type and nothing here filters.

TypedPlacement is kube-scheduler with flowsched's extender whose filter keeps a job's pods on one
type: the types scoring.typed_placement.TypePlan.allowed gives it, tried in order, from the
latest plan (TypeBook.plan: SimControl builds it with plan_types from its World after each round,
as the service's filter reads the plan it refreshes from its World; extender/http/gpu_type_gate.py).
No plan yet: no constraint, as in the service.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.cluster_spec import app_classes
from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.policies import IntArray, KubeSchedulerPolicy, NodeScorer, pod_sizes
from scoring.gpu_types import ANY, GpuTypeSettings, cluster_types, typed
from scoring.typed_placement import TypePlan
from scoring.world import FloatArray


@dataclass
class TypeBook:
    settings: GpuTypeSettings = field(default_factory=GpuTypeSettings)
    measured: dict[int, dict[str, float]] = field(default_factory=dict)  # job idx -> type -> speed measured
    pinned: dict[int, str] = field(default_factory=dict)  # job idx -> type of its latest elastic plan
    plan: TypePlan | None = None  # the latest World's types (SimControl, after each round)
    classes: dict[str, str] = field(default_factory=app_classes)

    def types(self, engine: Engine) -> tuple[str, ...]:
        t = cluster_types(engine.cluster.settings.node_types)
        return t if typed(t, self.settings) else ()

    def node_type(self, engine: Engine, k: int) -> str:
        return engine.cluster.settings.node_types[k] if self.types(engine) else ""

    def running_type(self, engine: Engine, job: SimJob) -> str | None:
        """The one type a job's pods run on; None when it runs nowhere, on several, or types are off."""
        if not job.placement or not self.types(engine):
            return None
        kinds = {engine.cluster.settings.node_types[n] for n, _ in job.placement}
        return kinds.pop() if len(kinds) == 1 else None

    def observe(self, engine: Engine, job: SimJob, now: float) -> None:
        """A running job past its restart has measured its step time on the type it runs on."""
        kind = self.running_type(engine, job) if now >= job.restart_until else None
        if kind is not None:
            self.measured.setdefault(job.idx, {})[kind] = job.type_speed

    def model_class(self, job: SimJob) -> str:
        return self.classes.get(job.spec.app, "")

    def pin(self, job: SimJob, gpu_type: str) -> None:
        if gpu_type:
            self.pinned[job.idx] = gpu_type


@dataclass
class TypeFilter:
    """The extender's filter with a type constraint: the inner scorer on the nodes of `allowed`."""

    inner: NodeScorer
    node_types: np.ndarray  # per node
    allowed: str | None = None

    def __call__(self, engine: Engine, idx: IntArray, gpus: int) -> tuple[IntArray, FloatArray]:
        if self.allowed is not None and self.allowed != ANY:
            idx = idx[self.node_types[idx] == self.allowed]
            if idx.size == 0:
                return idx, np.zeros(0)
        return self.inner(engine, idx, gpus)


class TypedPlacement(KubeSchedulerPolicy):
    def __init__(self, name: str, scorer: NodeScorer, book: TypeBook, node_types: tuple[str, ...], seed: int = 0):
        self.filter = TypeFilter(scorer, np.array(node_types, dtype=object))
        super().__init__(name, self.filter, seed)
        self.book = book

    def schedule(self, engine: Engine, now: float) -> None:
        """Every waiting job in queue order, as kube-scheduler tries every pod: with types, a job
        that does not fit on its type says nothing of a later job of the same size on another."""
        order = sorted(((e, shape) for shape, h in self.pending.items() for e in h), key=lambda x: x[0])
        placed = {e[2] for e, _ in order if self._place(engine, self.by_idx[e[2]])}
        if placed:
            for shape, h in self.pending.items():
                kept = [e for e in h if e[2] not in placed]
                heapq.heapify(kept)
                self.pending[shape] = kept

    def _place(self, engine: Engine, job: SimJob) -> bool:
        if engine.cluster.total_free < job.replicas:
            return False
        plan = self.book.plan
        allowed = () if plan is None else plan.allowed(
            job.key, engine.now, self.book.settings, pinned=self.book.pinned.get(job.idx, ""),
            model_class=self.book.model_class(job), created_at=engine.queue_time(job),
            gpus=float(pod_sizes(job.replicas, engine.cluster.settings.gpus_per_node)[0]))  # one pod's, as the filter's
        if not allowed:
            self.filter.allowed = None
            return super()._place(engine, job)
        try:
            for t in allowed:
                self.filter.allowed = t
                if super()._place(engine, job):
                    return True
            return False
        finally:
            self.filter.allowed = None
