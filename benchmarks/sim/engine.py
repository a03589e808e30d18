"""Discrete-event engine: scheduling rounds every `interval` seconds (the artifact's 60 s),
visited only when something can change (an arrival, a completion, a policy wake-up, or a
control loop that wants every round). Jobs advance lazily: a running job's state is brought
up to date only when it is touched, and its completion is an event in a heap.

Timing follows the artifact's simulator: a job is seen at the first round at or after its
arrival; every (re)allocation costs `restart_penalty` seconds before progress resumes; a job
completes at its exact time but its GPUs are freed at the next round.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from benchmarks.sim.cluster import Cluster, ClusterSettings, Placement
from benchmarks.sim.ends import end_progress, metric_noise, stop_epoch
from benchmarks.sim.jobmodel import ProfileSet, RateTable
from benchmarks.sim.workload import JobSpec

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class InterferenceSettings:
    """Throughput lost by co-located jobs. scope "distributed" is the artifact's rule: a
    multi-node job slows down when it shares a node with another multi-node job; "any": any
    job sharing a node with another job slows down. 0 disables (the artifact's default)."""

    slowdown: float = 0.0
    scope: str = "distributed"


@dataclass(frozen=True)
class TelemetrySettings:
    noise_pct: float = 3.0  # std of GPU_UTIL noise, percent points
    restart_util_pct: float = 3.0  # a pod loading its checkpoint barely uses the GPU
    missing_prob: float = 0.01  # chance a node's sample is stale (unknown, NaN) in a round
    metric_noise: float = 0.01  # relative noise on emitted validation metrics
    record_series: bool = True  # keep each job's (time, epoch, metric) series


@dataclass(frozen=True)
class EngineSettings:
    interval: float = 60.0
    restart_penalty: float = 30.0
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    interference: InterferenceSettings = field(default_factory=InterferenceSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    seed: int = 0
    progress: bool = False  # stderr progress bar


@dataclass(eq=False)
class SimJob:
    idx: int
    spec: JobSpec
    replicas: int
    atomic: int
    accum: int
    progress: float = 0.0
    synced_at: float = 0.0
    placement: tuple[tuple[int, int], ...] = ()
    table: RateTable | None = None
    restart_until: float = 0.0
    slowdown: float = 0.0
    cpu_speed: float = 1.0  # throughput factor from the CPU share (1 = as profiled); see cpu_model.py
    type_speed: float = 1.0  # throughput factor of the GPU type it runs on (1 = as profiled); cluster.py
    batch_size: int = 0  # global batch size the job runs at (its spec's until an elastic resize)
    first_start: float | None = None
    completion: float | None = None
    allocations: int = 0
    restarts: int = 0
    gpu_seconds: float = 0.0
    seg_start: float = 0.0
    version: int = 0
    series: list[tuple[float, int, float]] = field(default_factory=list)  # (time, epoch, metric)
    # What the job's step counter read at each point of `series` (optimizer steps): what it
    # reports as the point's step, and `steps` the counter now (at synced_at).
    series_steps: list[float] = field(default_factory=list)
    steps: float = 0.0
    # A job with a planned end declares it in optimizer steps (training.max_steps): the steps it has
    # run and those its remaining epochs take at its batch; set when it starts, again when its batch
    # changes (NaN before it first starts).
    planned_steps: float = math.nan
    stop_epoch: int = 0  # epochs it runs before it stops (benchmarks/sim/ends.py); set when it starts

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.placement)

    @property
    def key(self) -> str:
        """namespace/name, as the World names the job (its pods' owner)."""
        return f"{self.spec.namespace}/{self.spec.name}"

    @property
    def multi_node(self) -> bool:
        return len(self.placement) > 1


class Policy(Protocol):
    name: str

    def on_arrival(self, job: SimJob, now: float) -> None: ...

    def on_requeue(self, job: SimJob, now: float) -> None: ...

    def on_complete(self, job: SimJob, now: float) -> None: ...

    def schedule(self, engine: Engine, now: float) -> None: ...

    def next_wakeup(self, now: float) -> float | None: ...


# A control loop runs after the scheduler in every round; it may only call engine.evict
# (checkpointable jobs) or engine.resize (elastic jobs), as flowsched's loops in a real cluster.
ControlLoop = Callable[["Engine", float], None]
# Convergence hook: given a job's emitted series, True = completing soon, None = unknown.
CompletingFn = Callable[[SimJob], bool | None]


@dataclass
class Timeline:
    time: list[float] = field(default_factory=list)
    gpus_allocated: list[int] = field(default_factory=list)
    gpus_busy: list[float] = field(default_factory=list)  # GPU-equivalents computing (util)
    queue: list[int] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        specs: Sequence[JobSpec],
        profiles: ProfileSet,
        policy: Policy,
        settings: EngineSettings,
        control_loops: Sequence[ControlLoop] = (),
        completing: CompletingFn | None = None,
        gated: bool = False,
    ):
        self.settings = settings
        self.profiles = profiles
        self.policy = policy
        self.control_loops = list(control_loops)
        self.completing = completing  # HOOK: scoring.convergence plugs in here (see telemetry.py)
        self.cluster = Cluster(settings.cluster)
        # Scheduling gates (flowsched's admission): with `gated`, every job's pods arrive carrying
        # the gate, as do the replacement pods of an evicted or rescaled job; kube-scheduler (the
        # policy) does not see them until a control loop calls release(). job idx -> created at.
        self.gate_pods = gated
        self.gated: dict[int, float] = {}
        self.rng = np.random.default_rng(settings.seed)
        self._metric_z: dict[int, FloatArray] = {}  # job idx -> noise on its reported metric (ends.py)
        self.jobs: list[SimJob] = []
        for i, s in enumerate(sorted(specs, key=lambda s: s.arrival)):
            atomic, accum = profiles.apps[s.app].batch_config(s.replicas, s.batch_size)
            self.jobs.append(SimJob(i, s, s.replicas, atomic, accum, batch_size=s.batch_size))
        n = len(self.jobs)
        # Per-job columns for vectorised telemetry.
        self._busy = np.zeros(n + 1)
        self._restart_until = np.zeros(n + 1)
        self.active: dict[int, SimJob] = {}
        self.now = 0.0
        self.done = 0
        self.unfinished: list[SimJob] = []
        self._heap: list[tuple[float, int, int]] = []
        self._busy_sum = 0.0
        self._running = 0  # jobs holding GPUs
        self._alloc_changed = False
        self._util_cache: tuple[float, FloatArray] | None = None
        self.timeline = Timeline()
        self.rounds = 0

    # -- time --------------------------------------------------------------------------
    def _round_at_or_after(self, t: float) -> float:
        iv = self.settings.interval
        return max(iv, math.ceil(t / iv - 1e-9) * iv)

    def run(self) -> Engine:
        iv = self.settings.interval
        n = len(self.jobs)
        nxt = 0  # next arrival
        t = 0.0
        bar = _Progress(n) if self.settings.progress else None
        while self.done + len(self.unfinished) < n:
            cands: list[float] = []
            if nxt < n:
                cands.append(self._round_at_or_after(self.jobs[nxt].spec.arrival))
            while self._heap and not self._heap_top_valid():
                heapq.heappop(self._heap)
            if self._heap:
                cands.append(self._round_at_or_after(self._heap[0][0]))
            w = self.policy.next_wakeup(t)
            if w is not None:
                cands.append(w)
            if self.control_loops and self.active:
                cands.append(t + iv)
            if not cands:  # jobs that can never be placed (bigger than the cluster)
                self.unfinished = [j for j in self.active.values() if j.completion is None]
                break
            t = max(min(cands), t + iv)
            self.now = t
            self.rounds += 1
            self._util_cache = None
            self._complete_until(t)
            while nxt < n and self.jobs[nxt].spec.arrival <= t + 1e-9:
                job = self.jobs[nxt]
                job.synced_at = t
                self.active[job.idx] = job
                if self.gate_pods:
                    self.gated[job.idx] = job.spec.arrival
                else:
                    self.policy.on_arrival(job, t)
                nxt += 1
            self.policy.schedule(self, t)
            for loop in self.control_loops:
                loop(self, t)
            if self._alloc_changed and self.settings.interference.slowdown > 0:
                self._update_interference()
            self._alloc_changed = False
            tl = self.timeline
            tl.time.append(t)
            tl.gpus_allocated.append(self.cluster.total_gpus - self.cluster.total_free)
            tl.gpus_busy.append(self._busy_sum)
            tl.queue.append(len(self.active) - self._running)
            if bar is not None:
                bar.update(self.done, t)
        if bar is not None:
            bar.close(self.done, t)
        return self

    def _heap_top_valid(self) -> bool:
        _, version, idx = self._heap[0]
        job = self.jobs[idx]
        return job.version == version and job.completion is None and bool(job.placement)

    def _complete_until(self, t: float) -> None:
        while self._heap and self._heap[0][0] <= t + 1e-9:
            c, version, idx = heapq.heappop(self._heap)
            job = self.jobs[idx]
            if job.version != version or job.completion is not None or not job.placement:
                continue
            self._sync(job, c)
            if job.table is not None:
                job.progress = end_progress(job.table.progress_at, job.stop_epoch)
            job.completion = c
            self._release(job, t)
            del self.active[idx]
            self.done += 1
            self.policy.on_complete(job, t)

    # -- job state ---------------------------------------------------------------------
    def _sync(self, job: SimJob, t: float) -> None:
        table = job.table
        if table is not None and job.placement:
            start = max(job.synced_at, job.restart_until)
            if t > start:
                keep = (1.0 - job.slowdown) * job.cpu_speed * job.type_speed
                p0 = job.progress
                t0 = table.time_at(p0)
                p1 = table.progress_after(p0, (t - start) * keep)
                if self.settings.telemetry.record_series:
                    self._emit_series(job, table, p0, p1, t0, start, keep)
                job.steps += table.steps_between(p0, p1)
                job.progress = p1
        job.synced_at = max(job.synced_at, t)

    def _plan_steps(self, job: SimJob) -> None:
        """The planned end a job declares, in optimizer steps: what it ran and what its remaining
        epochs take at its batch now (a whole number, as a script's max_steps is)."""
        t = job.table
        if t is not None:
            job.planned_steps = float(round(job.steps + t.steps_between(job.progress, float(t.progress_at[-1]))))

    def _emit_series(
        self, job: SimJob, table: RateTable, p0: float, p1: float, t0: float, start: float, keep: float
    ) -> None:
        e0, e1 = table.epoch_of(p0), table.epoch_of(p1)
        if e1 <= e0:
            return
        app = self.profiles.apps[job.spec.app]
        noise = self.settings.telemetry.metric_noise
        z = self._noise(job)
        for k in range(e0 + 1, min(e1, job.stop_epoch or app.max_epochs) + 1):
            when = start + (float(table.cum_time[k]) - t0) / keep
            m = app.metric(table.batch_size, k - 1)
            job.series.append((when, k, m * (1.0 + noise * float(z[k - 1]))))
            job.series_steps.append(job.steps + table.steps_between(p0, float(table.progress_at[k])))

    def _noise(self, job: SimJob) -> FloatArray:
        z = self._metric_z.get(job.idx)
        if z is None:
            z = self._metric_z[job.idx] = metric_noise(self.settings.seed, job.idx,
                                                       self.profiles.apps[job.spec.app].max_epochs)
        return z

    def _schedule_completion(self, job: SimJob) -> None:
        job.version += 1
        table = job.table
        assert table is not None
        start = max(self.now, job.restart_until)
        # where it stops: its epochs' end, or where its early-stopping rule fires on its curve
        job.stop_epoch = stop_epoch(self.profiles.apps[job.spec.app], job.spec.end_rule, job.series,
                                    table.epoch_of(job.progress), table.batch_size, self._noise(job),
                                    self.settings.telemetry.metric_noise)
        keep = (1.0 - job.slowdown) * job.cpu_speed * job.type_speed
        remaining = (float(table.cum_time[job.stop_epoch]) - table.time_at(job.progress)) / keep
        heapq.heappush(self._heap, (start + remaining, job.version, job.idx))

    def _release(self, job: SimJob, t: float) -> None:
        self.cluster.release(job.idx, job.placement)
        job.gpu_seconds += (min(t, job.completion or t) - job.seg_start) * job.gpus
        if job.table is not None:
            self._busy_sum -= job.table.busy_fraction * job.gpus
        job.placement = ()
        job.version += 1
        self._running -= 1
        self._busy[job.idx] = 0.0
        self._alloc_changed = True

    # -- actions for policies and control loops -------------------------------------------
    def start(self, job: SimJob, placement: Placement) -> None:
        """Give a pending job its GPUs (kube: bind its pods); costs a restart."""
        if job.placement or job.completion is not None:
            raise ValueError(f"job {job.spec.name} is running or done")
        if sum(g for _, g in placement) != job.replicas:
            raise ValueError(f"job {job.spec.name} wants {job.replicas} GPUs, got {placement}")
        self._sync(job, self.now)
        self.cluster.allocate(job.idx, placement)
        job.placement = tuple(placement)
        job.table = self.profiles.rate_table(job.spec.app, [g for _, g in placement], job.atomic, job.accum)
        self._plan_steps(job)
        job.restart_until = self.now + self.settings.restart_penalty
        job.synced_at = self.now
        job.seg_start = self.now
        if job.allocations:
            job.restarts += 1
        job.allocations += 1
        if job.first_start is None:
            job.first_start = self.now
        job.slowdown = 0.0
        job.cpu_speed = 1.0  # a (re)started pod comes back with its template's CPU request
        job.type_speed = self.cluster.settings.speed(job.spec.app, [n for n, _ in placement])
        self._busy[job.idx] = job.table.busy_fraction * 100.0
        self._restart_until[job.idx] = job.restart_until
        self._busy_sum += job.table.busy_fraction * job.gpus
        self._running += 1
        self._alloc_changed = True
        self._schedule_completion(job)

    def preempt(self, job: SimJob) -> None:
        """Stop a running job, keeping its progress (checkpoint); it becomes pending."""
        if not job.placement:
            return
        self._sync(job, self.now)
        self._release(job, self.now)

    def evict(self, job: SimJob) -> bool:
        """Control-loop eviction: only opted-in (checkpointable) jobs; kube requeues the pods
        (behind the scheduling gate again when pods are gated)."""
        if not job.spec.checkpointable or not job.placement:
            return False
        self.preempt(job)
        self._requeue(job)
        return True

    def _requeue(self, job: SimJob) -> None:
        if self.gate_pods:
            self.gated[job.idx] = self.now
        else:
            self.policy.on_requeue(job, self.now)

    def release(self, job: SimJob) -> bool:
        """Remove the scheduling gate from a job's pods: kube-scheduler sees them from now on,
        queued by when they were created. False when the job holds no gate."""
        created = self.gated.pop(job.idx, None)
        if created is None or job.completion is not None:
            return False
        if job.allocations == 0 and created == job.spec.arrival:
            self.policy.on_arrival(job, self.now)
        else:
            self.policy.on_requeue(job, created)
        return True

    def resize(self, job: SimJob, replicas: int, batch_size: int | None = None) -> bool:
        """Elastic scaling: change an opted-in job's replica count and optionally its global
        batch size (a restart at the new size). A pending job stays in the queue it is in
        (kube: its pods are replaced by the new count); a running one is requeued."""
        s = job.spec
        if not (s.elastic_min <= replicas <= s.elastic_max) or s.elastic_max == 0 or job.completion is not None:
            return False
        running = bool(job.placement)
        self.preempt(job)
        job.replicas = replicas
        batch = batch_size if batch_size is not None else job.batch_size
        job.atomic, job.accum = self.profiles.apps[s.app].batch_config(replicas, batch)
        job.batch_size = batch
        if running:
            self._requeue(job)
        return True

    def rebatch(self, job: SimJob, batch_size: int) -> bool:
        """A running job changes its global batch size in place, without a restart (a job that
        adopts a planned batch live, as AdaptDL's data loader does): progress so far is kept and
        it goes on at the new batch's goodput. False when it is not running or the batch is its own."""
        if not job.placement or job.completion is not None or batch_size == job.batch_size or batch_size < 1:
            return False
        self._sync(job, self.now)
        old = job.table
        job.batch_size = batch_size
        job.atomic, job.accum = self.profiles.apps[job.spec.app].batch_config(job.replicas, batch_size)
        job.table = self.profiles.rate_table(job.spec.app, [g for _, g in job.placement], job.atomic, job.accum)
        self._plan_steps(job)
        if old is not None:
            self._busy_sum -= old.busy_fraction * job.gpus
        self._busy_sum += job.table.busy_fraction * job.gpus
        self._busy[job.idx] = job.table.busy_fraction * 100.0
        self._schedule_completion(job)
        return True

    def set_cpu_speed(self, job: SimJob, speed: float) -> None:
        """In-place CPU resize of a running job: its throughput becomes `speed` x the profiled
        one from now on (no restart). Only the resizer control loop calls this."""
        if not speed > 0:
            raise ValueError(f"cpu speed must be positive, got {speed}")
        if speed == job.cpu_speed:
            return
        self._sync(job, self.now)
        job.cpu_speed = speed
        if job.placement and job.completion is None:
            self._schedule_completion(job)

    # -- what the control loops would see (benchmarks/sim/world.py) ----------------------
    def sync(self, job: SimJob) -> None:
        """Bring a job's progress and emitted series up to now (reading it changes nothing else)."""
        self._sync(job, self.now)

    def queue_time(self, job: SimJob) -> float:
        """When the job's current pods were created: its arrival, or its last requeue."""
        if job.idx in self.gated:
            return self.gated[job.idx]
        queued: dict[int, float] = getattr(self.policy, "queued_at", {})
        return queued.get(job.idx, job.spec.arrival)

    # -- what the extender would see -----------------------------------------------------
    def gpu_util(self) -> FloatArray:
        """Per-GPU utilisation as DCGM would report it this round (percent, NaN = stale).
        Sampled at the start of the round: pods bound in this round still read idle."""
        if self._util_cache is not None and self._util_cache[0] == self.now:
            return self._util_cache[1]
        ts = self.settings.telemetry
        slots = self.cluster.slot_job
        idx = np.where(slots >= 0, slots, len(self.jobs))
        util = np.where(self.now < self._restart_until[idx], ts.restart_util_pct, self._busy[idx])
        util = np.clip(util + self.rng.normal(0.0, ts.noise_pct, util.shape), 0.0, 100.0)
        if ts.missing_prob > 0:
            stale = self.rng.random(util.shape[0]) < ts.missing_prob
            util[stale] = np.nan
        self._util_cache = (self.now, util)
        return util

    def completing_gpus(self) -> FloatArray:
        """GPUs per node held by jobs the convergence hook calls completing; NaN where no
        job on the node has a verdict (or no hook is installed)."""
        n = self.cluster.settings.nodes
        out = np.full(n, np.nan)
        if self.completing is None:
            return out
        for job in self.active.values():
            if not job.placement:
                continue
            self._sync(job, self.now)
            verdict = self.completing(job)
            if verdict is None:
                continue
            for node, g in job.placement:
                out[node] = (0.0 if np.isnan(out[node]) else out[node]) + (g if verdict else 0)
        return out

    def _update_interference(self) -> None:
        s = self.settings.interference
        slots = self.cluster.slot_job
        running = [j for j in self.active.values() if j.placement]
        if s.scope == "distributed":
            multi = np.zeros(len(self.jobs) + 1, dtype=bool)
            for j in running:
                multi[j.idx] = j.multi_node
            per_node = [set(int(x) for x in row if x >= 0 and multi[x]) for row in slots]
        else:
            per_node = [set(int(x) for x in row if x >= 0) for row in slots]
        crowded = np.array([len(s_) > 1 for s_ in per_node])
        for j in running:
            hit = (j.multi_node or s.scope != "distributed") and any(crowded[node] for node, _ in j.placement)
            want = s.slowdown if hit else 0.0
            if want != j.slowdown:
                self._sync(j, self.now)
                j.slowdown = want
                self._schedule_completion(j)


class _Progress:
    """A minimal stderr progress bar (no dependencies)."""

    def __init__(self, total: int):
        self.total = max(total, 1)
        self.last = -1

    def update(self, done: int, t: float) -> None:
        pct = int(100 * done / self.total)
        if pct != self.last:
            self.last = pct
            bar = "#" * (pct // 4)
            sys.stderr.write(f"\r[{bar:<25}] {pct:3d}% {done}/{self.total} jobs, t={t / 3600:.1f} h")
            sys.stderr.flush()

    def close(self, done: int, t: float) -> None:
        self.last = -1
        self.update(done, t)
        sys.stderr.write("\n")
