"""flowsched as one policy in the simulator: placement + the control core's loops, each part
switchable by name, job mixes, and the settings overrides every table prints.

Names (`flowsched simulate --policies`, `flowsched demo`, `benchmarks/run_pollux.py`):
- the baselines of policies.make_policy: fifo, kube-default, binpack, tiresias;
- `flowsched-placement`: kube-scheduler with flowsched's extender (scoring.placement) only;
- `flowsched+<loop>[+<loop>]` with loops from `elastic`, `admission` (every pod arrives behind the
  scheduling gate, as flowsched's webhook would put it there, and the admission loop releases
  jobs), `migrator` and `las` (the migrator with the override migrator.order="attained"); at most
  one of migrator / las;
- `flowsched`: the integrated policy, `flowsched+` + "+".join(INTEGRATED);
- `flowsched-typeblind`: the integrated policy with GPU types ignored (gpu_types.enabled=False),
  the ablation on clusters of several types (benchmarks/sim/typed.py).

The loops are the service's: benchmarks/sim/control.py runs scoring.control's plans (composition
and safety rules included) with `core_settings()`: CoreSettings() plus the overrides
SIM_OVERRIDES names, which every table header prints (`overrides_line`).

Job mixes (DESIGN §7: every table names its mix). `prepare(specs, profiles, mix)` marks jobs:
- "all": every job elastic 1..N (N = the largest validated batch / smallest per-GPU batch, at
  most ELASTIC_CAP) and checkpointable;
- "half": every other job (by arrival) elastic as above, all checkpointable;
- "none": no job elastic (users' own GPU counts), all checkpointable.
The Pollux artifact's jobs all checkpoint and restart on every reallocation. Baselines ignore the marks.

End mixes (DESIGN §7: how each job ends and what it declares about it, beside the elastic mix;
benchmarks/sim/ends.py). `mark_ends(specs, ends)`, every job by arrival order:
- "default": 2 of 4 declare a planned end (max_steps, as a script with a fixed epoch count does)
  and end there, 1 of 4 an early-stopping rule (ends.EARLY_STOPPING) and end where it fires on
  their own reported curve, 1 of 4 nothing (stopped by a person at the trace's epochs). A guess at
  a realistic cluster, not a measured one; the end estimate (scoring.job_end, through the
  tracker) is all flowsched has for the other two;
- "planned": every job declares its planned end (the tables before the end mix existed);
- "none": no job declares anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.sim.control import SimControl
from benchmarks.sim.engine import CompletingFn, ControlLoop, Engine, EngineSettings, Policy, SimJob
from benchmarks.sim.jobmodel import ProfileSet
from benchmarks.sim.policies import FlowschedScorer, make_policy
from benchmarks.sim.report import RunMetrics, RunTrace, measure
from benchmarks.sim.typed import TypedPlacement
from benchmarks.sim.workload import JobSpec
from scoring.gpu_types import cluster_types, typed
from scoring.settings import CoreSettings, differences, with_overrides
from scoring.world import end_seconds, is_completing

BASELINES = ("fifo", "kube-default", "binpack", "tiresias")
LOOPS = ("elastic", "admission", "migrator", "las")
INTEGRATED = ("elastic", "admission", "migrator")
FLOWSCHED_VARIANTS = ("flowsched-placement", "flowsched+elastic", "flowsched+migrator", "flowsched+las",
                      "flowsched+admission", "flowsched+elastic+migrator", "flowsched")
TYPEBLIND = "flowsched-typeblind"  # flowsched with gpu_types.enabled=False: the GPU-type ablation
DETERMINISTIC = ("fifo", "tiresias")  # no random tie-breaks: one seed is enough
ELASTIC_CAP = 64
MIXES = ("all", "half", "none")
MIX_TEXT = {
    "all": "every job elastic 1..N GPUs (its batch size changed live, as AdaptDL's) and checkpointable",
    "half": "half the jobs elastic 1..N GPUs (every other arrival; batch size changed live), every job checkpointable",
    "none": "no job elastic (users' own GPU counts), every job checkpointable",
}
END_RULES = ("planned", "early", "none")
END_MIXES = {"default": ("planned", "planned", "early", "none"), "planned": ("planned",), "none": ("none",)}
END_TEXT = {
    "default": "ends: 1/2 declare a planned end (max_steps), 1/4 early stopping (patience 10, ends where it fires), "
               "1/4 nothing (a guessed mix)",
    "planned": "ends: every job declares its planned end (max_steps)",
    "none": "ends: no job declares its end",
}
THROUGHPUT_TEXT = {
    "learned": "step times learned: each job's measured step times at the sizes it ran (5 % noise), "
               "the core's prior for the rest",
    "oracle": "ORACLE step times (the profile at every size and batch; an upper bound no cluster gives)",
}


def core_settings(engine: EngineSettings | None = None, loops: Sequence[str] = (),
                  overrides: dict[str, str] | None = None) -> CoreSettings:
    """The service's defaults, except what the simulated environment fixes: the loops act
    (`--act`), a rescale costs what the engine's restart costs, and `las` asks for the
    attained-service order."""
    e = engine or EngineSettings()
    base = CoreSettings()
    s = replace(base, safety=replace(base.safety, dry_run=False),
                elastic=replace(base.elastic, restart_s=e.restart_penalty))
    if "las" in loops:
        s = replace(s, migrator=replace(s.migrator, order="attained"))
    result: CoreSettings = with_overrides(s, overrides or {})
    return result


def overrides_line(settings: CoreSettings) -> str:
    diff = differences(settings, CoreSettings())
    if not diff:
        return "settings: the service's defaults"
    return "settings: the service's defaults except " + ", ".join(f"{k}={v[0]!r}" for k, v in sorted(diff.items()))


def mark_elastic(specs: Sequence[JobSpec], profiles: ProfileSet, mix: str = "all", cap: int = ELASTIC_CAP
                 ) -> list[JobSpec]:
    """The job mix (module docstring); checkpointable as each spec says (default True)."""
    if mix not in MIXES:
        raise ValueError(f"unknown job mix {mix!r}; known: {', '.join(MIXES)}")
    out = []
    for i, s in enumerate(sorted(specs, key=lambda s: s.arrival)):
        if mix == "none" or (mix == "half" and i % 2):
            out.append(replace(s, elastic_min=0, elastic_max=0))
            continue
        app = profiles.apps[s.app]
        most = int(getattr(app, "max_batch_size", s.batch_size)) // max(1, int(getattr(app, "min_local_bsz", 1)))
        out.append(replace(s, elastic_min=1, elastic_max=max(1, min(cap, most))))
    return out


def mark_ends(specs: Sequence[JobSpec], ends: str = "default") -> list[JobSpec]:
    """The end mix (module docstring), cycling over the jobs by arrival."""
    if ends not in END_MIXES:
        raise ValueError(f"unknown end mix {ends!r}; known: {', '.join(END_MIXES)}")
    cycle = END_MIXES[ends]
    return [replace(s, end_rule=cycle[i % len(cycle)]) for i, s in enumerate(sorted(specs, key=lambda s: s.arrival))]


def prepare(specs: Sequence[JobSpec], profiles: ProfileSet, mix: str = "all", ends: str = "default",
            cap: int = ELASTIC_CAP) -> list[JobSpec]:
    """The job mix and the end mix, both printed in every table header."""
    return mark_ends(mark_elastic(specs, profiles, mix, cap), ends)


@dataclass
class Variant:
    name: str
    policy: Policy
    loops: list[ControlLoop]
    control: SimControl | None = None
    settings: CoreSettings | None = None


def loops_of(name: str) -> tuple[str, ...] | None:
    """The control loops of a flowsched variant, () for placement only, None for a baseline."""
    if name in ("flowsched", TYPEBLIND):
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


def build(name: str, profiles: ProfileSet, seed: int = 0, engine: EngineSettings | None = None,
          overrides: dict[str, str] | None = None, throughput: str = "learned") -> Variant:
    loops = loops_of(name)
    if loops is None:
        if name not in BASELINES:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(BASELINES + FLOWSCHED_VARIANTS)}, "
                             f"or flowsched+<loops> with loops from {', '.join(LOOPS)}")
        return Variant(name, make_policy(name, seed), [])
    settings = core_settings(engine, loops, overrides)
    if name == TYPEBLIND:  # the same core with GPU types ignored (the ablation)
        settings = replace(settings, gpu_types=replace(settings.gpu_types, enabled=False))
    policy = make_policy("flowsched", seed, settings.placement)  # kube-scheduler with flowsched's extender
    core_loops = tuple(dict.fromkeys("migrator" if x == "las" else x for x in loops))
    control = SimControl(settings, core_loops, throughput=throughput) if core_loops else None
    node_types = (engine or EngineSettings()).cluster.node_types
    if control is not None and typed(cluster_types(node_types), settings.gpu_types):
        # The extender's filter keeps each job on one type (benchmarks/sim/typed.py).
        policy = TypedPlacement("flowsched", FlowschedScorer(settings.placement), control.builder.types,
                                node_types, seed)
    return Variant(name, policy, [control] if control else [], control, settings)


def completing_hook(v: Variant, profiles: ProfileSet) -> CompletingFn | None:
    """The placement's convergence term: the same tracker and "finishing soon" rule as the service."""
    settings = v.settings or core_settings()
    control = v.control or SimControl(settings, ())
    builder = control.builder

    def completing(job: SimJob) -> bool | None:
        est = builder.series_estimate(job, profiles.apps[job.spec.app])  # the World's estimate, its end included
        return None if est is None else is_completing(est.phase, end_seconds(est), settings.completing_horizon_s)

    return completing


def run_one(specs: Sequence[JobSpec], profiles: ProfileSet, name: str, seed: int, settings: EngineSettings,
            workload: str, overrides: dict[str, str] | None = None, throughput: str = "learned"
            ) -> tuple[RunMetrics, RunTrace, Variant]:
    """One variant on one workload (specs as `prepare` marked them); `throughput`: what the
    control core is told of step times (benchmarks/sim/world.py THROUGHPUT_MODES)."""
    eng, v, wall_s = simulate(specs, profiles, name, seed, settings, overrides, throughput)
    m, tr = measure(eng, workload, seed, wall_s)
    return replace(m, policy=name), replace(tr, policy=name), v


def simulate(specs: Sequence[JobSpec], profiles: ProfileSet, name: str, seed: int, settings: EngineSettings,
             overrides: dict[str, str] | None = None, throughput: str = "learned") -> tuple[Engine, Variant, float]:
    """The engine after one variant's run on `specs` (every job's record in it), the variant, and
    the run's wall seconds."""
    v = build(name, profiles, seed, settings, overrides, throughput)
    t0 = time.perf_counter()
    completing = completing_hook(v, profiles) if name.startswith("flowsched") else None
    eng = Engine(specs, profiles, v.policy, replace(settings, seed=seed), control_loops=v.loops,
                 completing=completing, gated=gated(v)).run()
    return eng, v, time.perf_counter() - t0


def gated(v: Variant) -> bool:
    """Pods arrive behind flowsched's scheduling gate when the admission loop runs."""
    return v.control is not None and "admission" in v.control.loops


def loop_counts(v: Variant) -> dict[str, Any]:
    c = v.control
    if c is None:
        return {"resizes": float("nan"), "evictions": float("nan")}
    evictions = (c.stats.migrations if "migrator" in c.loops else 0) + (c.stats.preempted if "admission" in c.loops
                                                                         else 0)
    return {"resizes": float(c.stats.resizes) if "elastic" in c.loops else float("nan"),
            "evictions": float(evictions) if {"migrator", "admission"} & set(c.loops) else float("nan")}

