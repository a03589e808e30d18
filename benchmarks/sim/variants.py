"""flowsched as one policy in the simulator: placement + elastic optimizer + migrator, each part
switchable by name, and how the two control loops compose.

Names (`flowsched simulate --policies`, `flowsched demo`, `benchmarks/run_pollux.py`):
- the baselines of policies.make_policy: fifo, kube-default, binpack, tiresias;
- `flowsched-placement`: kube-scheduler with flowsched's extender (scoring.placement) only;
- `flowsched+<loop>[+<loop>]`: the extender plus control loops, loops from
  `elastic` (benchmarks/sim/elastic.py: replicas and batch size of elastic jobs),
  `migrator` (benchmarks/sim/migration.py, SpeCon's benefit order, require_room_elsewhere off) and
  `las` (the same migrator with order="attained": least attained service through eviction);
  at most one of migrator / las;
- `flowsched`: the integrated policy, `flowsched+` + "+".join(INTEGRATED).

Composition rule (both loops on):
1. Order within a round: kube-scheduler binds what fits, then the elastic optimizer (resizes,
   then lets kube-scheduler bind the new pods), then the migrator sees the result.
2. The migrator never evicts an elastic job the optimizer can still shrink (running above its
   minimum): shrinking frees GPUs without stopping the job, so it is the optimizer's move. It
   also skips any job the optimizer resized in the last `hold_s` seconds.
3. The optimizer leaves a job the migrator evicted alone for `hold_s` seconds (does not plan for
   it: it waits in kube-scheduler's queue at the size it had, and does not count as capacity).
So no job is both resized and evicted within `hold_s` (the migrator's cooldown, 1800 s).

Which jobs may be touched (DESIGN §7: the loops act only on opted-in jobs): `prepare` marks every
job elastic 1..N (flowsched.io/elastic; N = the largest global batch the model was validated at
divided by its smallest per-GPU batch, at most 64) and leaves every job checkpointable
(flowsched.io/checkpointable, JobSpec's default): the Pollux artifact's jobs all checkpoint and
restart on every reallocation. The baselines ignore the marks. ASSUMPTION says so in one line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from benchmarks.sim.elastic import SimElastic
from benchmarks.sim.engine import CompletingFn, ControlLoop, Engine, EngineSettings, Policy, SimJob
from benchmarks.sim.jobmodel import ProfileSet
from benchmarks.sim.migration import SimMigrator
from benchmarks.sim.policies import make_policy
from benchmarks.sim.report import RunMetrics, RunTrace, measure
from benchmarks.sim.workload import JobSpec
from scoring.convergence import Phase
from scoring.migration import MigrationSettings

BASELINES = ("fifo", "kube-default", "binpack", "tiresias")
LOOPS = ("elastic", "migrator", "las")
# The integrated policy's loops; the migrator order chosen on workloads 1-2 at 1.0x with the optimizer on
# (elastic+migrator 2752 s, elastic+las 2762 s: +las never moved a job; see
# docs/control-loops.md, "One integrated flowsched").
INTEGRATED = ("elastic", "migrator")
# flowsched+elastic+migrator is left out: it is flowsched (the same runs).
FLOWSCHED_VARIANTS = ("flowsched-placement", "flowsched+elastic", "flowsched+migrator", "flowsched+las",
                      "flowsched+elastic+las", "flowsched")
DETERMINISTIC = ("fifo", "tiresias")  # no random tie-breaks: one seed is enough
ELASTIC_CAP = 64
LAS_POWER = [0.5]  # SimElastic.las_power for "elastic": tried 0, .25, .5, .75, 1 on workloads 1-2 at 1.0x
ASSUMPTION = (
    "jobs: every job elastic 1..N GPUs (N = largest validated batch / smallest per-GPU batch, <= "
    f"{ELASTIC_CAP}) and checkpointable (the Pollux artifact's jobs checkpoint and restart on every "
    "reallocation); restarts cost the engine's restart penalty; the baselines ignore the elastic mark"
)


def las_settings() -> MigrationSettings:
    """The +las migrator as measured in docs/control-loops.md (thresholds tuned on workloads 1-2)."""
    return MigrationSettings(
        min_runtime_s=600.0, max_migrations=2, cooldown_s=1800.0, min_remaining_s=300.0,
        require_room_elsewhere=False, max_moves=1, slow_phases=(Phase.COMPLETING,),
        order="attained", wait_threshold_s=600.0, min_attained_gpu_s=4 * 3600.0)


def specon_settings() -> MigrationSettings:
    """SpeCon's benefit order with require_room_elsewhere off (with it on nothing ever moves on
    these workloads: whenever pods wait the cluster is full)."""
    return MigrationSettings(min_runtime_s=600.0, max_migrations=2, cooldown_s=1800.0, min_remaining_s=300.0,
                             require_room_elsewhere=False, max_moves=1)


def mark_elastic(specs: Sequence[JobSpec], profiles: ProfileSet, cap: int = ELASTIC_CAP) -> list[JobSpec]:
    """Every job elastic 1..N (see ASSUMPTION); checkpointable as it is (default True)."""
    out = []
    for s in specs:
        app = profiles.apps[s.app]
        most = int(getattr(app, "max_batch_size", s.batch_size)) // max(1, int(getattr(app, "min_local_bsz", 1)))
        out.append(replace(s, elastic_min=1, elastic_max=max(1, min(cap, most))))
    return out


prepare = mark_elastic


@dataclass
class Coordination:
    """Rules 2 and 3 of the module docstring."""

    hold_s: float = 1800.0
    resized_at: dict[int, float] = field(default_factory=dict)
    evicted_at: dict[int, float] = field(default_factory=dict)
    migrator_skips_shrinkable: int = 0  # planner rounds x jobs left to the optimizer (for reports)

    def on_resize(self, job: SimJob, now: float) -> None:
        self.resized_at[job.idx] = now

    def on_evict(self, job: SimJob, now: float) -> None:
        self.evicted_at[job.idx] = now

    def migrator_skips(self, job: SimJob, now: float) -> bool:
        s = job.spec
        if s.elastic_max > 0 and job.gpus > max(1, s.elastic_min):
            self.migrator_skips_shrinkable += 1
            return True
        t = self.resized_at.get(job.idx)
        return t is not None and now - t < self.hold_s

    def optimizer_skips(self, job: SimJob, now: float) -> bool:
        t = self.evicted_at.get(job.idx)
        return t is not None and now - t < self.hold_s


@dataclass
class Variant:
    name: str
    policy: Policy
    loops: list[ControlLoop]
    elastic: SimElastic | None = None
    migrator: SimMigrator | None = None
    coordination: Coordination | None = None


def loops_of(name: str) -> tuple[str, ...] | None:
    """The control loops of a flowsched variant, () for placement only, None for a baseline."""
    if name == "flowsched":
        return INTEGRATED
    if name == "flowsched-placement":
        return ()
    base, sep, rest = name.partition("+")
    if base != "flowsched" or not sep:
        return None
    parts = tuple(rest.split("+"))
    unknown = [p for p in parts if p not in LOOPS]
    if unknown or len(set(parts)) != len(parts) or {"migrator", "las"} <= set(parts):
        raise ValueError(f"bad flowsched variant {name!r}: loops from {', '.join(LOOPS)}, "
                         "each once, at most one of migrator/las")
    return parts


def known(name: str) -> bool:
    try:
        return name in BASELINES or loops_of(name) is not None
    except ValueError:
        return False


def build(name: str, profiles: ProfileSet, seed: int = 0) -> Variant:
    loops = loops_of(name)
    if loops is None:
        if name not in BASELINES:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(BASELINES + FLOWSCHED_VARIANTS)}, "
                             f"or flowsched+<loops> with loops from {', '.join(LOOPS)}")
        return Variant(name, make_policy(name, seed), [])
    policy = make_policy("flowsched", seed)  # kube-scheduler with flowsched's extender
    elastic = SimElastic(profiles, las_power=LAS_POWER[0]) if "elastic" in loops else None
    migrator = None
    if "migrator" in loops:
        migrator = SimMigrator(profiles, settings=specon_settings())
    elif "las" in loops:
        migrator = SimMigrator(profiles, settings=las_settings())
    coord = None
    if elastic is not None and migrator is not None:
        coord = Coordination(hold_s=migrator.settings.cooldown_s)
        elastic.skip, elastic.on_resize = coord.optimizer_skips, coord.on_resize
        migrator.skip, migrator.on_evict = coord.migrator_skips, coord.on_evict
    run: list[ControlLoop] = [x for x in (elastic, migrator) if x is not None]  # rule 1: this order
    return Variant(name, policy, run, elastic, migrator, coord)


def run_one(specs: Sequence[JobSpec], profiles: ProfileSet, name: str, seed: int, settings: EngineSettings,
            workload: str, completing: CompletingFn | None = None) -> tuple[RunMetrics, RunTrace, Variant]:
    """One variant on one workload (specs as `prepare` marked them)."""
    v = build(name, profiles, seed)
    t0 = time.perf_counter()
    eng = Engine(specs, profiles, v.policy, replace(settings, seed=seed), control_loops=v.loops,
                 completing=completing if name.startswith("flowsched") else None).run()
    m, tr = measure(eng, workload, seed, time.perf_counter() - t0)
    return replace(m, policy=name), replace(tr, policy=name), v
