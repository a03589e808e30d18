"""The simulator shell's other half: run the control kernel each round and carry out its typed
actions through the engine's public API only (engine.resize / engine.rebatch for Scale,
engine.evict for Evict and Preempt, engine.release for Release), and Resize through the pods'
CPU (benchmarks/sim/resizer.py: the request in effect, its count against the node, the job's
speed under cpu_model).

Per round, scoring.kernel.run_round runs every enabled loop whose interval has come, in
scoring.kernel.LOOP_ORDER, with the same CoreSettings `flowsched serve` runs, within the loops'
budgets (scoring.safety.Budget, kept here between rounds), and asks this shell for each loop's
World (benchmarks/sim/world.py, built from the engine as the earlier loops left it) and to carry
out each action. After the optimizer's rescales and admission's releases, kube-scheduler (the
engine's policy) binds what now fits before the next loop's World is built: a real kube-scheduler
binds new pods within seconds, not a round later. Nothing here decides anything: an action the
engine refuses is reported SKIPPED, as the service reports a refused eviction.

What the engine does not model comes from the scenario (benchmarks/sim/world.py WorldSources):
the jobs' diagnoses, which every loop's World carries (the remedies plan from them), and the GPU
pods' utilisation samples, workload class and reclaim opt-in (the idle loop's World). Without
them, as in every benchmark, the idle loop finds no idle pod and the remedies none to remedy.
The notices (IdleReport, IdleWarn and the remedies, Events in the service) are counted as the
service's recorder delivers them, with the service's outcome label; Reclaim evicts the opted-in
notebook's job through engine.evict (the engine accepts only a checkpointable one: its pod is
recreated and waits again, as a notebook's controller recreates it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.resizer import SimResizer
from benchmarks.sim.typed import TypeBook
from benchmarks.sim.world import SimWorldBuilder, WorldSources, changes_batch_live, job_key, pod_name
from scoring.actions import (
    AddPs,
    Consolidate,
    ControlAction,
    Evict,
    GiveCpu,
    IdleReport,
    IdleWarn,
    MoveReplica,
    Preempt,
    Reclaim,
    Release,
    Resize,
    Scale,
)
from scoring.idle import parse_duration_s
from scoring.kernel import (
    DONE,
    GONE,
    LOOP_ORDER,
    PREEMPT_BUDGET,
    SKIPPED,
    UNBUDGETED,
    Memory,
    Round,
    plan_loop,
    run_round,
)
from scoring.safety import Budget
from scoring.settings import CoreSettings
from scoring.tracker import ConvergenceTracker
from scoring.typed_placement import plan_types
from scoring.world import ResizeNode, World

# The service's outcome labels for a notice it told (extender/control/idle.py: an Event recorded;
# extender/control/remedies.py: a remedy recommended).
RECORDED, RECOMMENDED = "recorded", "recommended"
REMEDY_INTERVAL_S = 30.0  # the service plans remedies as often as it diagnoses (diagnosis.interval_s)


@dataclass
class ControlStats:
    plans: dict[str, int] = field(default_factory=dict)
    resizes: int = 0
    grows: int = 0
    shrinks: int = 0
    batch_changes: int = 0
    migrations: int = 0
    jobs_migrated: set[int] = field(default_factory=set)
    admitted: int = 0
    preempted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # safety rule -> jobs x rounds it kept out
    notices: dict[str, int] = field(default_factory=dict)  # action kind (idle_event, give-cpu, ...) -> told
    reclaimed: int = 0  # idle notebooks evicted


@dataclass
class SimControl:
    settings: CoreSettings
    loops: tuple[str, ...]
    resizer: SimResizer = field(default_factory=SimResizer)  # the pods' CPU, opt-ins and cpu_model
    sources: WorldSources = field(default_factory=WorldSources)  # what the engine does not model
    remedies_interval_s: float = REMEDY_INTERVAL_S
    throughput: str = "learned"  # what the World tells of step times (benchmarks/sim/world.py THROUGHPUT_MODES)
    builder: SimWorldBuilder = field(init=False)
    budgets: dict[str, Budget] = field(init=False)
    memory: Memory = field(default_factory=Memory)
    stats: ControlStats = field(default_factory=ControlStats)
    _last: dict[str, float] = field(default_factory=dict)
    _jobs: dict[str, SimJob] = field(default_factory=dict)
    _bind: bool = False  # pods were created or released: kube-scheduler binds before the next World
    # This round's World for the planning loops, kept until anything is carried out or bound: the
    # engine has not changed, so the next loop's World would be the same (only rebuilt slower).
    _world: World | None = None
    last_round: Round | None = None  # the kernel's latest round (plans, outcomes), for reports and tests

    def __post_init__(self) -> None:
        unknown = [x for x in self.loops if x not in LOOP_ORDER]
        if unknown:
            raise ValueError(f"unknown control loops {unknown}; known: {', '.join(LOOP_ORDER)}")
        self.builder = SimWorldBuilder(self.settings, ConvergenceTracker(self.settings.convergence),
                                       sources=self.sources, throughput_mode=self.throughput,
                                       types=TypeBook(self.settings.gpu_types))
        self.budgets = {n: Budget(self.settings.loop(n).max_per_interval, self.settings.loop(n).max_per_hour)
                        for n in self.loops if n not in UNBUDGETED}
        a = self.settings.admission
        self.budgets[PREEMPT_BUDGET] = Budget(a.max_preemptions_per_interval, a.max_preemptions_per_hour)

    @property
    def preempt_budget(self) -> Budget:
        return self.budgets[PREEMPT_BUDGET]

    def _job(self, engine: Engine, key: str) -> SimJob:
        if not self._jobs:
            self._jobs = {job_key(j): j for j in engine.jobs}
        return self._jobs[key]

    def __call__(self, engine: Engine, now: float) -> None:
        due = [n for n in LOOP_ORDER if n in self.loops
               and now - self._last.get(n, -math.inf) >= self._interval_s(n) - 1e-9]
        for n in due:
            self._last[n] = now
            self.stats.plans[n] = self.stats.plans.get(n, 0) + 1

        self._world = None

        def world(loop: str) -> World:
            self._bound(engine, now)
            if loop == "resizer":  # what the service's resizer reads: its nodes' pods only
                return World(now, (), (), (), resize_nodes=self._resize_nodes(engine, now))
            if loop == "idle":
                return self.builder.idle_world(engine, now)
            if self._world is None:
                self._world = self.builder.build(engine, now)
            return self._world

        if "resizer" in self.loops:
            self.resizer.forget_gone(engine, now)
        done = run_round(world, due, self.budgets, self.memory, self.settings, enabled=self.loops,
                         carry_out=lambda _loop, a: self._carry_out(engine, a, now))
        if "resizer" in self.loops:
            self.resizer.settle(engine)  # before kube-scheduler binds: raised requests hold the CPU
        self._bound(engine, now)
        if self.builder.types.types(engine):  # the extender's filter reads the types of the latest World
            if self._world is None:
                self._world = self.builder.build(engine, now)
            self.builder.types.plan = plan_types(self._world, self.settings)
        self.memory = done.memory
        self.last_round = done
        for p in done.plans.values():
            for why in p.refusals.values():
                self.stats.refused[why] = self.stats.refused.get(why, 0) + 1

    def _interval_s(self, loop: str) -> float:
        return self.remedies_interval_s if loop == "remedies" else self.settings.loop(loop).interval_s

    def _resize_nodes(self, engine: Engine, now: float) -> tuple[ResizeNode, ...]:
        nodes = self.resizer.nodes(engine, now, lambda j: self.builder.estimate(engine, j),
                                   self.builder.namespace_labels, self.settings.safety)
        if self.sources.diagnoses is None:
            return nodes
        d = self.sources.diagnoses(engine, now)  # on each row, as the service's resizer reads them
        return tuple(replace(n, rows=tuple(replace(r, diagnosis=d.get(r.job)) for r in n.rows)) for n in nodes)

    def _bound(self, engine: Engine, now: float) -> None:
        if self._bind:
            self._bind = False
            self._world = None
            engine.policy.schedule(engine, now)

    def plan(self, loop: str, world: World, budget_left: int) -> tuple[ControlAction, ...]:
        """The kernel's actions for one loop on this World (what the service's controller would plan)."""
        return plan_loop(loop, world, self.settings, self.memory, budget_left, self.loops).actions

    # ---- carrying out (the engine's public API) ----
    def _carry_out(self, engine: Engine, a: ControlAction, now: float) -> str:
        self._world = None  # whatever it comes to, the next loop reads the engine afresh
        if isinstance(a, Scale):
            return self._scale(engine, a, now)
        if isinstance(a, Evict | Preempt):
            job = self._job(engine, a.job)
            if not engine.evict(job):  # the engine refuses anything not opted in
                return SKIPPED
            self._mark_evicted(job, a.attained_gpu_s, now)
            if isinstance(a, Evict):
                self.stats.migrations += 1
                self.stats.jobs_migrated.add(job.idx)
            else:
                self.stats.preempted += 1
            return DONE
        if isinstance(a, Release):
            if not engine.release(self._job(engine, a.job)):
                return SKIPPED
            self.stats.admitted += 1
            self._bind = True
            return DONE
        if isinstance(a, Resize):
            return self.resizer.carry_out(engine, a, now)
        if isinstance(a, IdleReport | IdleWarn):
            return self._told(a, RECORDED)  # a warning counts from now (the kernel notes its delivery)
        if isinstance(a, GiveCpu | Consolidate | AddPs | MoveReplica):
            if not self._job(engine, a.job).placement:
                return GONE  # no bound pod to tell it on
            return self._told(a, RECOMMENDED)
        if isinstance(a, Reclaim):
            return self._reclaim(engine, a)
        raise ValueError(f"the simulator cannot carry out {a.kind} ({type(a).__name__})")

    def _told(self, a: ControlAction, outcome: str) -> str:
        self.stats.notices[a.kind] = self.stats.notices.get(a.kind, 0) + 1
        return outcome

    def _reclaim(self, engine: Engine, a: Reclaim) -> str:
        job = next((j for j in engine.active.values() if j.completion is None
                    and any(pod_name(j, i) == a.pod for i in range(len(j.placement)))), None)
        if job is None:
            return GONE
        # The last line of defence, as the service's: the pod as it is now is an opted-in notebook.
        if self.sources.workload_of(job) != "notebook" or parse_duration_s(self.sources.reclaim_of(job)) is None:
            return SKIPPED
        if not engine.evict(job):  # the engine evicts only a checkpointable job
            return SKIPPED
        self.stats.reclaimed += 1
        return DONE

    def _scale(self, engine: Engine, a: Scale, now: float) -> str:
        job = self._job(engine, a.job)
        before, batch_before = job.gpus if job.placement else job.replicas, job.batch_size
        if a.gpus == before and job.placement and a.batch_size and changes_batch_live(job):
            # It adopts the batch in place: no restart. Its size did not change, so neither does
            # the time of its last rescale (cooldown).
            if not engine.rebatch(job, a.batch_size):
                return SKIPPED
            self.stats.resizes += 1
            self.stats.batch_changes += 1
            return DONE
        if not engine.resize(job, a.gpus, a.batch_size or None):
            return SKIPPED
        self.builder.types.pin(job, a.gpu_type)  # its pods go to the type the plan sized it for
        self._bind = True
        self.builder.marks.scaled_at[job.idx] = now
        self._record_attained(job, a.attained_gpu_s, now)
        self.stats.resizes += 1
        self.stats.grows += int(a.gpus > before)
        self.stats.shrinks += int(a.gpus < before)
        self.stats.batch_changes += int(job.batch_size != batch_before)
        return DONE

    def _mark_evicted(self, job: SimJob, attained: float, now: float) -> None:
        m = self.builder.marks
        m.migrations[job.idx] = m.migrations.get(job.idx, 0) + 1
        m.migrated_at[job.idx] = now
        self._record_attained(job, attained, now)

    def _record_attained(self, job: SimJob, attained: float, now: float) -> None:
        """What the service writes into its eviction mark or plan annotation: the job's service so far."""
        if math.isfinite(attained):
            self.builder.marks.attained[job.idx] = attained
            self.builder.marks.attained_at[job.idx] = now
