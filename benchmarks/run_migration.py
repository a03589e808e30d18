"""With/without the migrator on the Pollux workloads, next to the baselines.

    .venv/bin/python -m benchmarks.run_migration [--workloads 1,2] [--load 1.0] [--seeds 1]

Policies: kube-default (LeastAllocated + BalancedAllocation spread: SpeCon's baseline), binpack,
fifo, tiresias, flowsched (extender scoring, no control loop) and flowsched+migrator
(extender scoring plus the SpeCon migrator, benchmarks/sim/migration.py), and
kube-default+migrator (the migrator alone, on the default scheduler). Which jobs are
checkpointable: all of them (the Pollux artifact's jobs checkpoint and restart on every
reallocation; JobSpec.checkpointable defaults to True), or a deterministic fraction with
--checkpointable-share. Restart cost per migration: the engine's restart_penalty (30 s by
default) plus the time spent back in kube-scheduler's queue.
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

from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.migration import SimMigrator
from benchmarks.sim.policies import make_policy
from benchmarks.sim.report import RunMetrics, measure
from benchmarks.sim.workload import JobSpec, read_workload

FOLDERS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}
ROOM = [True]  # MigrationSettings.require_room_elsewhere for this run (--requeue-ok sets False)
VARIANTS = ("kube-default", "binpack", "fifo", "tiresias", "flowsched", "kube-default+migrator",
            "flowsched+migrator")


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
    t0 = time.perf_counter()
    eng = Engine(specs, profiles, make_policy(base, seed), replace(settings, seed=seed),  # type: ignore[arg-type]
                 control_loops=[migrator] if migrator else []).run()
    m, _ = measure(eng, wname, seed, time.perf_counter() - t0)
    return replace(m, policy=variant), migrator


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared/data/pollux"))
    p.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    p.add_argument("--load", default="1.0", choices=sorted(FOLDERS))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--checkpointable-share", type=float, default=1.0)
    p.add_argument("--requeue-ok", action="store_true",
                   help="migrate even when the job cannot restart elsewhere at once (require_room_elsewhere=false)")
    a = p.parse_args(argv)
    ROOM[0] = not a.requeue_ok
    data = Path(a.data)
    profiles = load_profiles(data / "traces")
    settings = EngineSettings()
    variants = a.variants.split(",")
    rows: dict[str, list[RunMetrics]] = {v: [] for v in variants}
    mig: dict[str, list[SimMigrator]] = {v: [] for v in variants}
    print(f"load {a.load}x, workloads {a.workloads}, seeds {a.seeds}, checkpointable share "
          f"{a.checkpointable_share:g}, restart penalty {settings.restart_penalty:g} s, "
          f"{settings.cluster.nodes}x{settings.cluster.gpus_per_node} GPUs, require_room_elsewhere {ROOM[0]}")
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
    ref_k = rows.get("kube-default")
    ref_f = rows.get("flowsched")

    def mean(v: str, key: str) -> float:
        return float(np.mean([getattr(r, key) for r in rows[v]]))

    print()
    hdr = (f"{'variant':24s} {'avg JCT s':>10s} {'p99 JCT s':>10s} {'makespan s':>11s} {'queue s':>8s} "
           f"{'JCT/kube':>9s} {'mksp/kube':>9s} {'JCT/fs':>7s} {'mksp/fs':>7s} {'migr':>5s} {'restart s':>9s} "
           f"{'requeue s':>9s}")
    print(hdr)
    print("-" * len(hdr))
    for v in variants:
        jct, mk = mean(v, "avg_jct"), mean(v, "makespan")
        rk = f"{jct / mean('kube-default', 'avg_jct'):9.3f} {mk / mean('kube-default', 'makespan'):9.3f}" \
            if ref_k else f"{'':9s} {'':9s}"
        rf = f"{jct / mean('flowsched', 'avg_jct'):7.3f} {mk / mean('flowsched', 'makespan'):7.3f}" \
            if ref_f else f"{'':7s} {'':7s}"
        ms = mig[v]
        n = sum(x.stats.migrations for x in ms) / len(ms) if ms else 0.0
        rc = sum(x.stats.restart_cost_s for x in ms) / len(ms) if ms else 0.0
        rq = sum(x.stats.requeue_wait_s for x in ms) / len(ms) if ms else 0.0
        mtxt = f"{n:5.1f} {rc:9.0f} {rq:9.0f}" if ms else f"{'-':>5s} {'-':>9s} {'-':>9s}"
        print(f"{v:24s} {jct:10.0f} {mean(v, 'p99_jct'):10.0f} {mk:11.0f} {mean(v, 'avg_queueing'):8.0f} "
              f"{rk} {rf} {mtxt}")
    print("\nmigr / restart s / requeue s: mean per run (a workload x seed): migrations, their restart "
          "penalties, and the time the migrated jobs then waited in the queue.")
    for base in ("kube-default", "flowsched"):
        v = f"{base}+migrator"
        if v in rows and base in rows:
            d_mk = mean(v, "makespan") / mean(base, "makespan") - 1.0
            d_jct = mean(v, "avg_jct") / mean(base, "avg_jct") - 1.0
            print(f"{v} vs {base}: makespan {d_mk:+.1%}, avg JCT {d_jct:+.1%} "
                  f"(SpeCon's headline vs kube spread: makespan -24.7%, JCT -41.5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
