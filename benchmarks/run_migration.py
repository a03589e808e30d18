"""With/without the migrator on the Pollux workloads, next to the baselines.

    .venv/bin/python -m benchmarks.run_migration [--workloads 1,2] [--load 1.0] [--seeds 1]

Policies: kube-default (LeastAllocated + BalancedAllocation spread: SpeCon's baseline), binpack,
fifo, tiresias, flowsched (extender scoring, no control loop) and flowsched+migrator
(extender scoring plus the SpeCon migrator, benchmarks/sim/migration.py), and
kube-default+migrator (the migrator alone, on the default scheduler). Which jobs are
checkpointable: all of them (the Pollux artifact's jobs checkpoint and restart on every
reallocation; JobSpec.checkpointable defaults to True), or a deterministic fraction with
--checkpointable-share. Restart cost per migration: the engine's restart_penalty (30 s by
default) plus the time spent back in kube-scheduler's queue (a replacement pod is new: it
queues behind the pods created before it).

`<base>+las` runs the migrator with order="attained" (least attained service through eviction,
scoring/migration.py): --wait-threshold, --min-attained, --las-phases, --las-max-migrations,
--las-cooldown set it. --interference / --interference-scope turn on the engine's interference
model for every variant alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import data_paths
from benchmarks.sim.engine import Engine, EngineSettings, InterferenceSettings
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.migration import SimMigrator
from benchmarks.sim.policies import make_policy
from benchmarks.sim.report import RunMetrics, measure
from benchmarks.sim.workload import JobSpec, read_workload
from scoring.convergence import Phase
from scoring.migration import MigrationSettings

FOLDERS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}
ROOM = [True]  # MigrationSettings.require_room_elsewhere for this run (--requeue-ok sets False)
VARIANTS = ("kube-default", "binpack", "fifo", "tiresias", "flowsched", "kube-default+migrator",
            "flowsched+migrator", "flowsched+las")
PUBLISHED_POLLUX = {"0.5": 1534.0, "1.0": 2751.0, "1.5": 3685.0, "2.0": 5289.0}  # shared/data/README.md
LAS = [MigrationSettings()]  # the +las settings of this run (from the command line)


def with_share(specs: list[JobSpec], share: float) -> list[JobSpec]:
    if share >= 1.0:
        return specs
    # Deterministic per job name, so the same jobs opt in in every variant and seed.
    return [replace(s, checkpointable=(zlib.crc32(s.name.encode()) % 1000) / 1000.0 < share) for s in specs]


def run_one(specs: list[JobSpec], variant: str, seed: int, settings: EngineSettings, profiles: object,
            wname: str) -> tuple[RunMetrics, SimMigrator | None]:
    base, _, loop = variant.partition("+")
    migrator = None
    if loop == "migrator":
        migrator = SimMigrator(profiles)  # type: ignore[arg-type]
        migrator.settings = dataclasses.replace(migrator.settings, require_room_elsewhere=ROOM[0])
    elif loop == "las":
        migrator = SimMigrator(profiles, settings=LAS[0])  # type: ignore[arg-type]
    elif loop:
        raise ValueError(f"unknown control loop {loop!r} in {variant!r}")
    t0 = time.perf_counter()
    eng = Engine(specs, profiles, make_policy(base, seed), replace(settings, seed=seed),  # type: ignore[arg-type]
                 control_loops=[migrator] if migrator else []).run()
    m, _ = measure(eng, wname, seed, time.perf_counter() - t0)
    return replace(m, policy=variant), migrator


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(data_paths.pollux_dir()),
                   help="the Pollux artifact folder (default: the shipped copy, or $FLOWSCHED_DATA/pollux)")
    p.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    p.add_argument("--load", default="1.0", choices=sorted(FOLDERS))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--checkpointable-share", type=float, default=1.0)
    p.add_argument("--requeue-ok", action="store_true",
                   help="migrate even when the job cannot restart elsewhere at once (require_room_elsewhere=false)")
    p.add_argument("--wait-threshold", type=float, default=600.0, help="+las: seconds a pod waits before a move")
    p.add_argument("--min-attained", type=float, default=4 * 3600.0, help="+las: GPU-seconds a victim has had")
    p.add_argument("--las-phases", default="completing", help="+las: phases counted as slow-growing")
    p.add_argument("--las-max-migrations", type=int, default=2)
    p.add_argument("--las-cooldown", type=float, default=1800.0)
    p.add_argument("--las-min-runtime", type=float, default=600.0)
    p.add_argument("--las-max-moves", type=int, default=1, help="+las: moves per round")
    p.add_argument("--interference", type=float, default=0.0, help="throughput lost by co-located jobs (0..1)")
    p.add_argument("--interference-scope", choices=("distributed", "any"), default="distributed")
    a = p.parse_args(argv)
    ROOM[0] = not a.requeue_ok
    LAS[0] = MigrationSettings(
        min_runtime_s=a.las_min_runtime, max_migrations=a.las_max_migrations, cooldown_s=a.las_cooldown,
        min_remaining_s=300.0, require_room_elsewhere=False, max_moves=a.las_max_moves,
        slow_phases=tuple(Phase[x.strip().upper()] for x in a.las_phases.split(",") if x.strip()),
        order="attained", wait_threshold_s=a.wait_threshold, min_attained_gpu_s=a.min_attained)
    data = Path(a.data)
    profiles = load_profiles(data / "traces")
    settings = EngineSettings(interference=InterferenceSettings(a.interference, a.interference_scope))
    variants = a.variants.split(",")
    rows: dict[str, list[RunMetrics]] = {v: [] for v in variants}
    mig: dict[str, list[SimMigrator]] = {v: [] for v in variants}
    print(f"load {a.load}x, workloads {a.workloads}, seeds {a.seeds}, checkpointable share "
          f"{a.checkpointable_share:g}, restart penalty {settings.restart_penalty:g} s, "
          f"{settings.cluster.nodes}x{settings.cluster.gpus_per_node} GPUs, require_room_elsewhere {ROOM[0]}, "
          f"interference {a.interference:g} ({a.interference_scope})")
    if any(v.endswith("+las") for v in variants):
        L = LAS[0]
        print(f"+las: wait_threshold {L.wait_threshold_s:g} s, min_attained {L.min_attained_gpu_s / 3600:g} GPU-h, "
              f"slow phases {','.join(x.name.lower() for x in L.slow_phases)}, max_migrations {L.max_migrations}, "
              f"cooldown {L.cooldown_s:g} s, min_runtime {L.min_runtime_s:g} s, max_moves {L.max_moves}")
    for w in a.workloads.split(","):
        wname = f"workload-{w}"
        specs = with_share(read_workload(data / FOLDERS[a.load] / f"{wname}.csv"), a.checkpointable_share)
        for v in variants:
            for seed in range(a.seeds):
                if seed > 0 and v in ("fifo", "tiresias"):
                    continue
                m, sm = run_one(specs, v, seed, settings, profiles, wname)
                rows[v].append(m)
                if sm is not None:
                    mig[v].append(sm)
                extra = f", {sm.stats.migrations} migrations" if sm else ""
                print(f"  {wname} {v} seed {seed}: avg JCT {m.avg_jct:.0f} s, makespan {m.makespan:.0f} s{extra}"
                      f" ({m.wall_s:.1f} s)", flush=True)

    def mean(v: str, key: str) -> float:
        return float(np.mean([getattr(r, key) for r in rows[v]]))

    print()
    refs = [(r, n) for r, n in (("kube-default", "kube"), ("binpack", "bin"), ("tiresias", "tir")) if r in rows]
    hdr = (f"{'variant':22s} {'avg JCT s':>9s} {'p99 JCT s':>9s} {'makespan':>9s} {'queue s':>7s} {'migr':>5s} "
           f"{'restart':>7s} {'requeue':>8s} " + " ".join(f"{'JCT/' + n:>8s} {'p99/' + n:>8s} {'mk/' + n:>7s}"
                                                        for _, n in refs) + f" {'JCT/Pollux':>10s}")
    print(hdr)
    print("-" * len(hdr))
    pub = PUBLISHED_POLLUX[a.load]
    for v in variants:
        jct, p99, mk = mean(v, "avg_jct"), mean(v, "p99_jct"), mean(v, "makespan")
        ms = mig[v]
        n = sum(x.stats.migrations for x in ms) / len(ms) if ms else 0.0
        rc = sum(x.stats.restart_cost_s for x in ms) / len(ms) if ms else 0.0
        rq = sum(x.stats.requeue_wait_s for x in ms) / len(ms) if ms else 0.0
        mtxt = f"{n:5.1f} {rc:7.0f} {rq:8.0f}" if ms else f"{'-':>5s} {'-':>7s} {'-':>8s}"
        rt = " ".join(f"{jct / mean(r, 'avg_jct'):8.3f} {p99 / mean(r, 'p99_jct'):8.3f} "
                      f"{mk / mean(r, 'makespan'):7.3f}" for r, _ in refs)
        print(f"{v:22s} {jct:9.0f} {p99:9.0f} {mk:9.0f} {mean(v, 'avg_queueing'):7.0f} {mtxt} {rt} "
              f"{jct / pub:10.3f}")
    print("\nmigr / restart s / requeue s: mean per run (a workload x seed): migrations, their restart "
          "penalties, and the time the migrated jobs then waited in the queue.")
    print(f"JCT/Pollux: vs the published Pollux average JCT at {a.load}x ({pub:g} s, the artifact's result files).")
    for base, loop in (("kube-default", "migrator"), ("flowsched", "migrator"), ("flowsched", "las")):
        v = f"{base}+{loop}"
        if v in rows and base in rows:
            d_mk = mean(v, "makespan") / mean(base, "makespan") - 1.0
            d_jct = mean(v, "avg_jct") / mean(base, "avg_jct") - 1.0
            print(f"{v} vs {base}: makespan {d_mk:+.1%}, avg JCT {d_jct:+.1%} "
                  f"(SpeCon's headline vs kube spread: makespan -24.7%, JCT -41.5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
