"""The resizer in the simulator: a FlowCon-style experiment and the Pollux workloads.

FlowCon (ICPP'19) ran ten training containers of mixed models on one host, arriving over
100 s, and reported per-job completion times with and without its elastic CPU limits
(headline: one job -42.06 %, no makespan loss). Here: one node with 10 GPUs and 40 cores, ten
1-GPU jobs of mixed Pollux-profiled models arriving evenly over 100 s, every pod requesting
4 cores (limit = request, so a pod never uses more than its request); the baseline keeps those
requests, the resizer runs every 30 s (FlowCon's window). Then the Pollux
workloads (16 nodes x 4 GPUs, 64 cores each, 12 cores requested per GPU) with the flowsched
policy, with and without the resizer.

The resizer is the control kernel's (scoring.kernel.run_round, the loop `resizer`), run by the
simulator shell (benchmarks/sim/control.py SimControl, benchmarks/sim/resizer.py) with the
service's settings except the experiment's: the resizer's (RESIZE, POLLUX_RESIZE below; no rate
budget, as the experiment has always run) and the tracker's convergence windows (WINDOW_POINTS,
ALPHA: three points a window, alpha 0.05).

Every figure depends on the CPU-sensitivity ASSUMPTIONS in benchmarks/sim/cpu_model.py, which
are printed with the tables.

    .venv/bin/python -m benchmarks.run_flowcon [--seeds 5] [--pollux 1,2,...,8] [--no-pollux]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks import data_paths
from benchmarks.sim.cluster import ClusterSettings, GiB
from benchmarks.sim.control import SimControl
from benchmarks.sim.cpu_model import describe
from benchmarks.sim.engine import Engine, EngineSettings, SimJob
from benchmarks.sim.jobmodel import ProfileSet, load_profiles
from benchmarks.sim.policies import make_policy
from benchmarks.sim.resizer import SimResizer
from benchmarks.sim.variants import core_settings
from benchmarks.sim.workload import JobSpec, read_workload
from scoring.settings import CoreSettings, ResizerLoopSettings

DATA = data_paths.pollux_dir()
# imagenet is left out of the one-node mix: ~150 h on one GPU would be the whole experiment.
FLOWCON_MODELS = ("cifar10", "ncf", "deepspeech2", "yolov3", "bert")
FLOWCON_NODE = ClusterSettings(nodes=1, gpus_per_node=10, cpu_per_node=40_000.0, mem_per_node=1024 * GiB,
                               cpu_per_gpu=4_000.0, mem_per_gpu=48 * GiB)
UNBUDGETED = 1 << 30  # max_per_interval / max_per_hour: the experiment never bounded the resizer's rate
RESIZE = ResizerLoopSettings(beta=2.0, min_step_m=100.0, hysteresis=0.10, cooldown_s=60.0,
                             max_per_interval=UNBUDGETED, max_per_hour=UNBUDGETED)
POLLUX_RESIZE = ResizerLoopSettings(beta=2.0, min_step_m=100.0, hysteresis=0.10, cooldown_s=120.0,
                                    max_per_interval=UNBUDGETED, max_per_hour=UNBUDGETED)
# The tracker's windows (for every job): three points each, a slow pace below 5 %.
WINDOW_POINTS, ALPHA = 3, 0.05


def resizer_control(engine: EngineSettings, resize: ResizerLoopSettings, *, dry_run: bool = False,
                    shrink: bool = True) -> SimControl:
    """The kernel's resizer, every engine round, in the simulator shell (dry run: the kernel's)."""
    base = core_settings(engine)
    settings: CoreSettings = replace(
        base, resizer=replace(resize, interval_s=engine.interval),
        convergence=replace(base.convergence, window_s=0.0, window_points=WINDOW_POINTS, alpha=ALPHA),
        safety=replace(base.safety, dry_run=dry_run))
    return SimControl(settings, ("resizer",), resizer=SimResizer(may_shrink=_const(shrink)))


def flowcon_workload(profiles: ProfileSet, seed: int, jobs: int = 10, span_s: float = 100.0) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    apps = rng.choice(FLOWCON_MODELS, size=jobs)
    arrivals = np.linspace(0.0, span_s, jobs)
    return [JobSpec(f"{a}-{i}", float(t), str(a), 1, profiles.apps[str(a)].init_batch_size)
            for i, (a, t) in enumerate(zip(apps, arrivals, strict=True))]


@dataclass(frozen=True)
class Outcome:
    jct: dict[str, float]
    makespan: float
    resizes: int


def run(specs: Sequence[JobSpec], profiles: ProfileSet, settings: EngineSettings, policy: str,
        control: SimControl | None) -> Outcome:
    eng = Engine(specs, profiles, make_policy(policy, settings.seed), settings,
                 control_loops=[control] if control is not None else []).run()
    done = [j for j in eng.jobs if j.completion is not None]
    jct = {j.spec.name: float(j.completion - j.spec.arrival) for j in done if j.completion is not None}
    first = min(j.spec.arrival for j in eng.jobs)
    last = max(j.completion for j in done if j.completion is not None)
    return Outcome(jct, float(last - first), control.resizer.stats.resizes if control is not None else 0)


def _const(value: bool) -> Callable[[SimJob], bool]:
    def f(_job: SimJob) -> bool:
        return value

    return f


def pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old


def flowcon_experiment(profiles: ProfileSet, seeds: Sequence[int], interval: float) -> None:
    print(f"== FlowCon-style: 1 node, 10 GPUs, 40 cores; 10 x 1-GPU jobs of {', '.join(FLOWCON_MODELS)} "
          f"arriving over 100 s; 4 cores requested each; resizer every {interval:g} s "
          f"(beta {RESIZE.beta:g}, step {RESIZE.min_step_m:g} m, hysteresis {RESIZE.hysteresis:.0%}, "
          f"cooldown {RESIZE.cooldown_s:g} s)")
    variants = (("shrink", True), ("no-shrink", False))
    header = (f"{'seed':>4} {'variant':<9} {'avg JCT base':>12} {'avg JCT':>9} {'best job':>24} "
              f"{'worst job':>24} {'makespan':>9} {'resizes':>7}")
    print(header)
    agg: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v, _ in variants}
    for seed in seeds:
        specs = flowcon_workload(profiles, seed)
        settings = EngineSettings(interval=interval, restart_penalty=30.0, cluster=FLOWCON_NODE, seed=seed)
        # The baseline runs the resizer dry (plans, changes nothing): the same rounds and random
        # draws, so the only difference is the resizes.
        base = run(specs, profiles, settings, "kube-default", resizer_control(settings, RESIZE, dry_run=True))
        for vname, shrink in variants:
            out = run(specs, profiles, settings, "kube-default", resizer_control(settings, RESIZE, shrink=shrink))
            ch = {n: pct(out.jct[n], base.jct[n]) for n in base.jct}
            best = min(ch, key=lambda n: ch[n])
            worst = max(ch, key=lambda n: ch[n])
            avg_b, avg_r = float(np.mean(list(base.jct.values()))), float(np.mean(list(out.jct.values())))
            ms = pct(out.makespan, base.makespan)
            agg[vname].append((ch[best], ch[worst], pct(avg_r, avg_b), ms))
            print(f"{seed:>4} {vname:<9} {avg_b:>11.0f}s {pct(avg_r, avg_b):>+8.2f}% "
                  f"{best + f' {ch[best]:+.2f}%':>24} {worst + f' {ch[worst]:+.2f}%':>24} {ms:>+8.2f}% "
                  f"{out.resizes:>7}")
    for vname, rows in agg.items():
        a = np.array(rows)
        print(f"mean over {len(seeds)} seeds, {vname}: best single job {a[:, 0].mean():+.2f}% "
              f"(min {a[:, 0].min():+.2f}%), worst single job {a[:, 1].mean():+.2f}%, "
              f"avg JCT {a[:, 2].mean():+.2f}%, makespan {a[:, 3].mean():+.2f}% (max {a[:, 3].max():+.2f}%)")


def pollux_effect(profiles: ProfileSet, data: Path, workloads: Sequence[int], seed: int) -> None:
    print(f"\n== Pollux workloads {','.join(map(str, workloads))} (1.0x load, 16x4 GPUs, 64 cores/node, "
          f"12 cores/GPU requested), flowsched policy, seed {seed}; resizer every 60 s, all jobs opted in")
    print(f"{'workload':<11} {'variant':<10} {'avg JCT':>9} {'p99 JCT':>9} {'makespan':>9} {'resizes':>8} "
          f"{'vs base avg':>11} {'makespan':>9}")
    settings = EngineSettings(seed=seed)
    totals: dict[str, list[tuple[float, float]]] = {"shrink": [], "no-shrink": []}
    for w in workloads:
        specs = read_workload(data / "workloads" / f"workload-{w}.csv")
        t0 = time.perf_counter()
        base = run(specs, profiles, settings, "flowsched", resizer_control(settings, POLLUX_RESIZE, dry_run=True))
        jb = np.array(list(base.jct.values()))
        print(f"workload-{w:<2} {'base':<10} {jb.mean():>8.0f}s {np.percentile(jb, 99):>8.0f}s "
              f"{base.makespan:>8.0f}s {'(dry)':>8}")
        for vname, shrink in (("shrink", True), ("no-shrink", False)):
            out = run(specs, profiles, settings, "flowsched", resizer_control(settings, POLLUX_RESIZE, shrink=shrink))
            jr = np.array([out.jct[n] for n in base.jct if n in out.jct])
            a, m = pct(float(jr.mean()), float(jb.mean())), pct(out.makespan, base.makespan)
            totals[vname].append((a, m))
            print(f"{'':<11} {vname:<10} {jr.mean():>8.0f}s {np.percentile(jr, 99):>8.0f}s {out.makespan:>8.0f}s "
                  f"{out.resizes:>8} {a:>+10.2f}% {m:>+8.2f}%")
        print(f"{'':<11} ({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr)
    for vname, rows in totals.items():
        arr = np.array(rows)
        print(f"mean over workloads, {vname}: avg JCT {arr[:, 0].mean():+.2f}%, makespan {arr[:, 1].mean():+.2f}%")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--interval", type=float, default=30.0, help="FlowCon experiment round (FlowCon's window)")
    p.add_argument("--pollux", default="1,2,3,4,5,6,7,8", help="Pollux workload numbers (1..8)")
    p.add_argument("--no-pollux", action="store_true")
    a = p.parse_args(argv)
    data = Path(a.data)
    profiles = load_profiles(data / "traces")
    print(describe())
    print()
    flowcon_experiment(profiles, list(range(a.seeds)), a.interval)
    if not a.no_pollux:
        pollux_effect(profiles, data, [int(x) for x in a.pollux.split(",") if x], 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
