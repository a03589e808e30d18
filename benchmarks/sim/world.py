"""The simulator shell's half of the control core: the engine -> scoring.world.World.

It reports what the service's World builder reads from a real cluster, no more: nodes and the
GPUs their pods hold, each job's pods (bound or waiting, in kube-scheduler's queue order with
the time each was created), its opt-ins (JobSpec.checkpointable, elastic_min/max), the marks
the loops leave on pods (migration count and time, the elastic plan's time), its convergence
estimate from the points it would post to /v1/progress (scoring.tracker, the service's
tracker), and, as a job reporting through the progress API's optional fields would, its batch
size, batch range, gradient noise, measured step times and what it declares of its end
(benchmarks/sim/ends.py: its planned end `max_steps` in the optimizer steps it reports, one point
an epoch at the step its counter read, or its early-stopping rule, or nothing); an elastic job also says it changes its
batch size live (`batch_live`), as the artifact's AdaptDL jobs do between epochs. Not its
remaining time: the core derives that from what it attained and the steps left
(JobState.remaining_gpu_s).

What the engine does not model comes from the scenario (WorldSources, each optional; without
them the World is what it always was): each job's bottleneck diagnosis (what the service's
diagnoser puts on JobState.diagnosis), and for the idle loop the GPU utilisation of each of its
pods (DCGM attributed to the pod), its workload class and its flowsched.io/reclaim-idle opt-in.

Step times (`throughput`): "learned", the default, is what the service has: for each elastic
job the seconds per step it measured at each GPU count it has run at (its true step time on its
placement, batch and CPU share, read once it has run `measure_after_s` past its restart, times a
lognormal measurement error of `step_noise`, drawn once per size and batch),
recorded by the service's rule (scoring.step_samples), and the core's prior for the other sizes
(scoring.step_prior.prior_throughput, fitted by scoring.elastic.fit_step_time). "oracle" hands the
core the profile's step time at every size and candidate batch (the Pollux artifact's measured
placements): an upper bound no cluster gives, which tables label as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.ends import declared
from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.jobmodel import AppModel
from benchmarks.sim.policies import pod_sizes
from benchmarks.sim.typed import TypeBook
from benchmarks.sim.world_keep import job_key_now
from scoring.bottleneck import Diagnosis
from scoring.convergence import ConvergenceEstimate
from scoring.elastic import GradientNoise
from scoring.remedy import with_diagnoses
from scoring.settings import CoreSettings
from scoring.step_prior import batch_grid
from scoring.step_samples import MeasuredSteps, record_step_sample
from scoring.tracker import ConvergenceTracker
from scoring.workload import WorkloadClass
from scoring.world import IdlePod, JobState, NodeState, PendingPod, Throughput, World

NAMESPACE = "sim"


def job_key(job: SimJob) -> str:
    return job.key


def pod_name(job: SimJob, i: int) -> str:
    """namespace/name of the job's i-th pod (its placement's i-th entry), as the World names pods."""
    return f"{job_key(job)}-{i}"


Diagnoses = Callable[[Engine, float], Mapping[str, Diagnosis]]  # job key -> its latest diagnosis now
PodSamples = Callable[[SimJob, int, float], Sequence[float]]  # utilisation % of the job's i-th pod's GPUs now


@dataclass(frozen=True)
class WorldSources:
    """What the engine does not model, given by a scenario. Each None: the World has none of it
    (no diagnosis, no utilisation samples: no pod is ever idle), every job a training job that
    has not opted in to idle reclamation, as every workload the benchmarks run."""

    diagnoses: Diagnoses | None = None
    gpu_samples: PodSamples | None = None
    workload: Callable[[SimJob], WorkloadClass] | None = None  # its pods' scoring/workload.py class
    reclaim_idle: Callable[[SimJob], str | None] | None = None  # its pods' flowsched.io/reclaim-idle value, raw

    def workload_of(self, job: SimJob) -> WorkloadClass:
        return self.workload(job) if self.workload is not None else WorkloadClass.TRAINING

    def reclaim_of(self, job: SimJob) -> str | None:
        return self.reclaim_idle(job) if self.reclaim_idle is not None else None


@dataclass
class Marks:
    """What the loops write on pods (the service reads them back from its pod watch)."""

    migrations: dict[int, int] = field(default_factory=dict)
    migrated_at: dict[int, float] = field(default_factory=dict)
    # GPU-seconds the job had attained when a loop last restarted it (evicted or rescaled), and when.
    attained: dict[int, float] = field(default_factory=dict)
    attained_at: dict[int, float] = field(default_factory=dict)
    scaled_at: dict[int, float] = field(default_factory=dict)


def changes_batch_live(job: SimJob) -> bool:
    """The simulated elastic jobs adopt a planned batch while they run (JobState.batch_live)."""
    return job.spec.elastic_max > 0


def node_name(k: int) -> str:
    return f"node-{k:03d}"


THROUGHPUT_MODES = ("learned", "oracle")
STEP_NOISE = 0.05  # sd of log(measured / true step time) in one report: jitter of a real job's timing


@dataclass
class SimWorldBuilder:
    settings: CoreSettings
    tracker: ConvergenceTracker
    marks: Marks = field(default_factory=Marks)
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    sources: WorldSources = field(default_factory=WorldSources)
    throughput_mode: str = "learned"  # THROUGHPUT_MODES (module docstring)
    step_noise: float = STEP_NOISE
    measure_after_s: float = 60.0  # a job reports a steady step time this long after its restart
    _tables: dict[tuple[str, int, tuple[int, ...]], Throughput] = field(default_factory=dict)
    types: TypeBook = field(default_factory=TypeBook)  # GPU types (none on an untyped cluster)
    _measured: dict[int, MeasuredSteps] = field(default_factory=dict)  # job idx -> its step times (learned mode)
    _errors: dict[tuple[int, int, int], float] = field(default_factory=dict)  # (job idx, GPUs, batch) -> error
    _kept: dict[int, tuple[tuple[Hashable, ...], JobState]] = field(default_factory=dict)  # world_keep.py
    _kept_at: float = math.nan
    _grads: dict[tuple[str, int, int], tuple[float, float]] = field(default_factory=dict)  # _grad_stats

    def __post_init__(self) -> None:
        if self.throughput_mode not in THROUGHPUT_MODES:
            raise ValueError(f"unknown throughput mode {self.throughput_mode!r}; known: {', '.join(THROUGHPUT_MODES)}")
        if not (math.isfinite(self.step_noise) and self.step_noise >= 0):
            raise ValueError(f"step_noise must be a finite number >= 0, got {self.step_noise!r}")

    def measured_steps(self, engine: Engine, job: SimJob) -> MeasuredSteps:
        """The job's measured seconds per step by GPU count and batch (learned mode), this round's
        added."""
        m = self._measured.setdefault(job.idx, MeasuredSteps())
        steady = bool(job.placement) and engine.now >= job.restart_until + self.measure_after_s
        true_s = true_step_s(engine.profiles.apps[job.spec.app], job) if steady else math.nan
        err = 1.0
        if self.step_noise > 0 and math.isfinite(true_s):
            err = self._error(engine.settings.seed, job)
        record_step_sample(m, 1.0 / true_s if math.isfinite(true_s) else math.nan, job.gpus, settling=not steady,
                           noise=err, batch=int(job.batch_size), gpu_type=self.types.running_type(engine, job) or "")
        return m

    def _error(self, seed: int, job: SimJob) -> float:
        """The measurement's error at the job's size and batch now: drawn once per configuration
        (a step time averaged over a window is biased by that configuration's noise, not redrawn)."""
        key = (job.idx, job.gpus, int(job.batch_size))
        err = self._errors.get(key)
        if err is None:
            rng = np.random.default_rng([seed, *key])
            err = self._errors[key] = math.exp(self.step_noise * float(rng.standard_normal()))
        return err

    def estimate(self, engine: Engine, job: SimJob) -> ConvergenceEstimate | None:
        engine.sync(job)  # its series up to now, as the job would have posted it
        if not job.series:
            return None
        if engine.now - float(job.series[-1][0]) > self.settings.convergence.active_within_s:
            return self.tracker.get(job_key(job))  # the service re-estimates only jobs that reported lately
        return self.series_estimate(job, engine.profiles.apps[job.spec.app])

    def series_estimate(self, job: SimJob, app: AppModel) -> ConvergenceEstimate | None:
        """The tracker's estimate of the job's series so far under the end it declared (ends.py), as
        the service's tracker passes the report on. The World and the placement's convergence term
        (variants.completing_hook) both read this one: asked without the declaration, the tracker
        kept an estimate with no planned end under the same series, which the World then reused."""
        if not job.series:
            return None
        signature = (len(job.series), float(job.series[-1][0]))
        max_steps, early_stopping = declared(job.spec.end_rule, job.planned_steps)
        if self.tracker.unchanged(job_key(job), signature, max_steps, early_stopping=early_stopping):
            return self.tracker.get(job_key(job))  # what update() returns for it, without the series' array
        pts = np.asarray(job.series, dtype=np.float64)
        # each point at the step its counter read (optimizer steps, as a real job posts them)
        return self.tracker.update(job_key(job), np.asarray(job.series_steps, dtype=np.float64), pts[:, 2], pts[:, 0],
                                   higher_is_better=app.metric_increases, signature=signature,
                                   max_steps=max_steps, early_stopping=early_stopping)

    def throughput(self, engine: Engine, job: SimJob, hi: int) -> Throughput:
        app = engine.profiles.apps[job.spec.app]
        grid = batch_grid(int(app.init_batch_size), int(getattr(app, "max_batch_size", app.init_batch_size)),
                          self.settings.elastic.batch_points)
        batches = tuple(sorted({*grid.tolist(), int(job.batch_size)}))
        key = (job.spec.app, hi, batches)
        hit = self._tables.get(key)
        if hit is None:
            hit = measured_throughput(app, hi, engine.cluster.settings.gpus_per_node, np.array(batches))
            self._tables[key] = hit
        return hit

    def build(self, engine: Engine, now: float) -> World:
        c = engine.cluster
        nodes = tuple(NodeState(node_name(k), float(c.gpu_alloc[k]), float(c.gpu_used[k]),
                                self.types.node_type(engine, k)) for k in range(c.gpu_alloc.shape[0]))
        per_node = c.settings.gpus_per_node
        active = [j for j in engine.active.values() if j.completion is None]
        pending: list[PendingPod] = []
        for j in sorted((j for j in active if not j.placement and j.idx not in engine.gated),
                        key=lambda j: (-j.spec.priority, engine.queue_time(j), j.idx)):
            waited = now - engine.queue_time(j)
            for i, g in enumerate(pod_sizes(j.replicas, per_node)):
                pending.append(PendingPod(f"{job_key(j)}-{i}", job_key(j), float(g), waited))
        jobs = tuple(sorted((self._kept_job(engine, j, now) for j in active), key=lambda s: s.key))
        world = World(now, nodes, jobs, tuple(pending), self.namespace_labels)
        diagnoses = self.sources.diagnoses
        return with_diagnoses(world, diagnoses(engine, now)) if diagnoses is not None else world

    def idle_world(self, engine: Engine, now: float) -> World:
        """What the service's idle loop reads (extender/control/idle.py world()): the pods holding
        GPUs with their utilisation samples, workload class and reclaim opt-in, how many GPU pods
        wait (kube-scheduler's queue and flowsched's gate), the namespaces' labels."""
        src = self.sources
        active = [j for j in engine.active.values() if j.completion is None]
        pods = tuple(
            IdlePod(key=pod_name(j, i), namespace=j.spec.namespace, workload=src.workload_of(j), gpus=float(g),
                    reclaim=src.reclaim_of(j),
                    samples=tuple(src.gpu_samples(j, i, now)) if src.gpu_samples is not None else ())
            for j in sorted(active, key=job_key) for i, (_node, g) in enumerate(j.placement))
        per_node = engine.cluster.settings.gpus_per_node
        waiting = sum(len(pod_sizes(j.replicas, per_node)) for j in active if not j.placement)
        return World(now, (), (), (), self.namespace_labels, gpu_pods=pods, gpu_pods_waiting=waiting)

    def _kept_job(self, engine: Engine, j: SimJob, now: float) -> JobState:
        """_job, or the same job's state from this round's last World when nothing it is made
        of changed since (benchmarks/sim/world_keep.py)."""
        if now != self._kept_at:
            self._kept, self._kept_at = {}, now  # a new round: nothing kept holds
        epoch = epoch_of(engine.profiles.apps[j.spec.app], j.progress)
        key = job_key_now(engine, j, now, self.marks, self.types, epoch)
        hit = self._kept.get(j.idx)
        if hit is not None and hit[0] == key:
            return hit[1]
        state = self._job(engine, j, now)
        self._kept[j.idx] = (key, state)
        return state

    def _grad_stats(self, app: AppModel, name: str, batch: int, epoch: int) -> tuple[float, float]:
        """The profile's gradient statistics (pure in the model, batch and epoch), kept."""
        got = self._grads.get((name, batch, epoch))
        if got is None:
            got = self._grads[(name, batch, epoch)] = app.grad_stats(batch, epoch)
        return got

    def _job(self, engine: Engine, j: SimJob, now: float) -> JobState:
        s = j.spec
        app = engine.profiles.apps[s.app]
        placed = bool(j.placement)
        gpus_on: dict[str, float] = {}
        for node, g in j.placement:
            gpus_on[node_name(node)] = gpus_on.get(node_name(node), 0.0) + g
        elastic = (max(1, s.elastic_min), min(s.elastic_max, engine.cluster.total_gpus)) if s.elastic_max > 0 else None
        m = self.marks
        noise = None
        batch_range = None
        throughput = None
        steps = MeasuredSteps()
        if elastic is not None:
            sqr, var = self._grad_stats(app, s.app, j.batch_size, epoch_of(app, j.progress))
            noise = GradientNoise(sqr, var, int(app.init_batch_size))
            batch_range = (int(app.init_batch_size), int(getattr(app, "max_batch_size", app.init_batch_size)))
            if self.throughput_mode == "oracle":
                throughput = self.throughput(engine, j, elastic[1])
            else:
                steps = self.measured_steps(engine, j)
        before = m.attained.get(j.idx, 0.0)
        since = max(j.seg_start, m.attained_at.get(j.idx, -math.inf))
        gated = j.idx in engine.gated
        self.types.observe(engine, j, now)
        return JobState(
            key=job_key(j), namespace=s.namespace, gpus_on=gpus_on,
            live_gpus=j.gpus if placed else j.replicas,
            # An elastic job's workers are 1-GPU pods kube-scheduler packs; other jobs' pods are per node.
            per_pod=1 if elastic is not None else max(pod_sizes(j.replicas, engine.cluster.settings.gpus_per_node)),
            checkpointable=s.checkpointable, elastic=elastic,
            running=placed and now >= j.restart_until, settling=not placed,
            runtime_s=now - j.seg_start if placed else math.nan,
            attained_gpu_s=before + ((now - since) * j.gpus if placed else 0.0),
            estimate=self.estimate(engine, j) if placed or j.series else None,
            migrations=m.migrations.get(j.idx, 0),
            since_migration_s=now - m.migrated_at[j.idx] if j.idx in m.migrated_at else math.inf,
            since_scaled_s=now - m.scaled_at[j.idx] if j.idx in m.scaled_at else math.inf,
            # The engine carries a plan out at once: the job's replicas are its latest plan's GPUs.
            planned_gpus=j.replicas if j.idx in m.scaled_at else 0,
            batch_size=int(j.batch_size), batch_range=batch_range, noise=noise, throughput=throughput,
            step_samples=dict(steps.samples), step_batches=dict(steps.batches), batch_samples=dict(steps.by_batch),
            batch_live=changes_batch_live(j),
            gated_pods=tuple(float(g) for g in pod_sizes(j.replicas, engine.cluster.settings.gpus_per_node))
            if gated else (),
            wait_s=math.nan if placed else now - engine.queue_time(j),
            pod_chunk=engine.cluster.settings.gpus_per_node,
            # Only a job that declares its planned end reports it (JobSpec.end_rule); the others'
            # ends are what the core estimates from their curves.
            planned_steps=j.planned_steps if s.end_rule == "planned" else math.nan,
            workload=self.sources.workload_of(j),
            gpu_measured=dict(self.types.measured.get(j.idx, {})) if self.types.types(engine) else {},
            model_class=self.types.model_class(j),
            # An elastic job reports the largest batch one of its GPUs holds, as it reports its batch
            # range (the artifact's jobs declare both; training.batch_local_max).
            batch_local_max=int(getattr(app, "max_local_bsz", 0)) if elastic is not None else 0,
        )


def epoch_of(app: AppModel, progress: float) -> int:
    e = int(np.searchsorted(app.progress_at, progress * (1 + 1e-12), side="right")) - 1
    return min(max(e, 0), app.max_epochs - 1)


def true_step_s(app: AppModel, job: SimJob) -> float:
    """Seconds per optimizer step the job runs at now: its placement, micro-batch and gradient
    accumulation, slowed by interference, its CPU share and its GPU type as the engine runs it
    (engine.py's keep factor; type_speed is 1 on an untyped cluster)."""
    step, sync = app.throughput([g for _, g in job.placement], job.atomic)
    keep = (1.0 - job.slowdown) * job.cpu_speed * job.type_speed
    return (step + (step - sync) * job.accum) / keep if keep > 0 else math.nan


def measured_throughput(app: AppModel, max_gpus: int, gpus_per_node: int, batches: np.ndarray) -> Throughput:
    """Seconds per step and the batch actually run at (g, b), from the profile: the packed
    placement kube-scheduler's pod split gives, with the artifact's batch_config (micro-batch
    and gradient accumulation)."""
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
    return Throughput(batches.astype(np.int64), step_s, realised)
