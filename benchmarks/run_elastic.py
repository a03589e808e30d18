"""The elastic optimizer on the Pollux artifact's workloads 1-8 at 1.0x and 2.0x load:
flowsched with scoring.elastic as a control loop (benchmarks/sim/elastic.py) against the
baselines, and against the artifact's published Pollux averages (../shared/data/README.md).

Every job of these workloads is marked elastic (flowsched.io/elastic "1-N", N = the largest
GPU count the model's largest validated batch can feed at its smallest per-GPU batch, capped
at 64); the baselines ignore the mark and run every job at its row's GPU count and batch.

    .venv/bin/python -m benchmarks.run_elastic [--loads 1.0,2.0] [--workloads 1-8] [--seeds 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import data_paths
from benchmarks.sim.elastic import SimElastic
from benchmarks.sim.engine import ControlLoop, Engine, EngineSettings
from benchmarks.sim.jobmodel import ProfileSet, load_profiles
from benchmarks.sim.policies import make_policy
from benchmarks.sim.report import RunMetrics, measure
from benchmarks.sim.workload import JobSpec, read_workload

PUBLISHED = {"1.0": {"pollux": 2751.0, "tiresias": 4038.0, "optimus": 5682.0},
             "2.0": {"pollux": 5289.0, "tiresias": 10040.0, "optimus": 9721.0}}
FOLDERS = {"1.0": "workloads", "2.0": "workloads-2.0"}
BASELINES = ("fifo", "kube-default", "binpack", "tiresias", "flowsched")
ELASTIC = {  # name -> SimElastic options
    "flowsched+elastic": {},
    "flowsched+elastic-noconv": {"convergence": False},  # every job weight 1
    "flowsched+elastic-fixedbatch": {"adapt_batch": False},  # GPU counts only
}


def mark_elastic(specs: Sequence[JobSpec], profiles: ProfileSet, cap: int = 64) -> list[JobSpec]:
    out = []
    for s in specs:
        app = profiles.apps[s.app]
        most = int(getattr(app, "max_batch_size", s.batch_size)) // max(1, int(getattr(app, "min_local_bsz", 1)))
        out.append(replace(s, elastic_min=1, elastic_max=max(1, min(cap, most))))
    return out


def run_one(specs: Sequence[JobSpec], profiles: ProfileSet, name: str, seed: int, workload: str) -> RunMetrics:
    loops: list[ControlLoop] = []
    policy = name
    if name in ELASTIC:
        loops = [SimElastic(profiles, **ELASTIC[name])]  # type: ignore[arg-type]
        policy = "flowsched"
    t0 = time.perf_counter()
    eng = Engine(specs, profiles, make_policy(policy, seed), replace(EngineSettings(), seed=seed),
                 control_loops=loops).run()
    m, _ = measure(eng, workload, seed, time.perf_counter() - t0)
    return replace(m, policy=name)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(data_paths.pollux_dir()),
                   help="the Pollux artifact folder (default: the shipped copy, or $FLOWSCHED_DATA/pollux)")
    p.add_argument("--loads", default="1.0,2.0")
    p.add_argument("--workloads", default="1-8", help="range a-b or comma list")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--policies", default=",".join([*BASELINES, *ELASTIC]))
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    data = Path(a.data)
    profiles = load_profiles(data / "traces")
    if "-" in a.workloads:
        lo, hi = (int(x) for x in a.workloads.split("-"))
        wids = list(range(lo, hi + 1))
    else:
        wids = [int(x) for x in a.workloads.split(",")]
    names = [x.strip() for x in a.policies.split(",") if x.strip()]
    for load in a.loads.split(","):
        rows: dict[str, list[RunMetrics]] = {n: [] for n in names}
        for w in wids:
            specs = mark_elastic(read_workload(data / FOLDERS[load] / f"workload-{w}.csv"), profiles)
            for n in names:
                for seed in range(a.seeds):
                    if seed > 0 and n in ("fifo", "tiresias"):
                        continue
                    m = run_one(specs, profiles, n, seed, f"workload-{w}")
                    rows[n].append(m)
                    if a.verbose:
                        print(f"  {load}x workload-{w} {n} seed {seed}: avg JCT {m.avg_jct:.0f} s, "
                              f"restarts {m.restarts}, {m.wall_s:.1f} s", file=sys.stderr)
        pol = PUBLISHED[load]["pollux"]
        print(f"== load {load}x: workload-{','.join(map(str, wids))} (mean over workloads), 16x4 GPUs, "
              f"{a.seeds} seed(s) for randomised policies; published Pollux {pol:.0f} s, "
              f"Tiresias {PUBLISHED[load]['tiresias']:.0f} s, Optimus+Oracle {PUBLISHED[load]['optimus']:.0f} s")
        print(f"{'policy':<30} {'avg JCT':>8} {'/Pollux':>7} {'p50':>7} {'p99':>7} {'makespan':>9} "
              f"{'queue':>7} {'GPU alloc':>9} {'restarts':>8} {'finished':>9}")
        for n in names:
            ms = rows[n]
            if not ms:
                continue

            def mean(attr: str, ms: list[RunMetrics] = ms) -> float:
                return float(np.mean([getattr(m, attr) for m in ms]))

            fin = sum(m.finished for m in ms)
            tot = sum(m.jobs for m in ms)
            print(f"{n:<30} {mean('avg_jct'):>8.0f} {mean('avg_jct') / pol:>7.3f} {mean('p50_jct'):>7.0f} "
                  f"{mean('p99_jct'):>7.0f} {mean('makespan'):>9.0f} {mean('avg_queueing'):>7.0f} "
                  f"{mean('gpu_allocated'):>9.2f} {mean('restarts'):>8.0f} {fin:>4}/{tot:<4}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
