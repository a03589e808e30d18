"""Simulator speed: one flowsched run (the service's defaults, run_pollux's job mix, end mix and
learned step times) on a large workload drawn from the shipped Philly population, timed.

The workload: `--jobs` jobs (default 960) with Poisson arrivals over `--hours` (default 48, the
artifact's rate of 20 jobs an hour), each (model, GPUs, batch) drawn with the frequencies of the
1,280 Philly-derived jobs of the shipped Pollux workload-1..8 (benchmarks/sim/generator.py MIX),
run on the Pollux profiles (benchmarks/data/pollux/traces) on the artifact's 16x4 GPUs. With
`--workloads a-b` instead: the shipped workload-a..b files back to back, each one `--hours` / count
later than the one before (workload-3..8 over 48 h: 960 jobs, each file at its own 1.0x rate).
Prints wall seconds, CPU seconds of this process, the load average around the run, jobs, avg JCT
and rounds.

    .venv/bin/python -m benchmarks.sim_speed [--jobs 960] [--hours 48] [--seed 0] [--workloads 3-8]
        [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks import data_paths
from benchmarks.code_origin import code_line
from benchmarks.sim import variants
from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.generator import MIX, GeneratorSettings, generate
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.report import measure
from benchmarks.sim.workload import JobSpec, read_workload

POLICY = "flowsched"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(data_paths.pollux_dir()),
                   help="the Pollux artifact folder (default: the shipped copy, or $FLOWSCHED_DATA/pollux)")
    p.add_argument("--jobs", type=int, default=960)
    p.add_argument("--hours", type=float, default=48.0)
    p.add_argument("--seed", type=int, default=0, help="the workload's draw and the run's seed")
    p.add_argument("--policy", default=POLICY, help="a flowsched variant or baseline (benchmarks/sim/variants.py)")
    p.add_argument("--workloads", default="", metavar="A-B",
                   help="the shipped workload-A..B back to back over --hours instead of a draw (--jobs ignored)")
    p.add_argument("--profile", default="", metavar="FILE", help="write a cProfile of the run to FILE")
    a = p.parse_args(argv)
    if a.jobs < 1 or not a.hours > 0:
        p.error("--jobs must be >= 1 and --hours > 0")
    if not variants.known(a.policy):
        p.error(f"unknown policy {a.policy!r}")
    profiles = load_profiles(Path(a.data) / "traces")
    engine = EngineSettings()
    where = f"{engine.cluster.nodes}x{engine.cluster.gpus_per_node} GPUs"
    if a.workloads:
        try:
            jobs = back_to_back(Path(a.data) / "workloads", a.workloads, a.hours)
        except ValueError as e:
            p.error(str(e))
        print(f"workload: {len(jobs)} jobs, the Pollux workload-{a.workloads} (Philly-derived) back to back over "
              f"{a.hours:g} h; {where}")
    else:
        jobs = generate(GeneratorSettings(a.jobs, a.hours, a.seed))
        print(f"workload: {a.jobs} jobs, Poisson arrivals over {a.hours:g} h, (model, GPUs, batch) drawn as the "
              f"{sum(MIX.values())} jobs of the Pollux workload-1..8 (Philly-derived), seed {a.seed}; {where}")
    specs = variants.prepare(jobs, profiles)
    print(f"job mix: {variants.MIX_TEXT['all']}; {variants.END_TEXT['default']}; "
          f"throughput: {variants.THROUGHPUT_TEXT['learned']}")
    print(variants.overrides_line(variants.core_settings(engine, variants.INTEGRATED)))
    print(code_line())
    prof = cProfile.Profile() if a.profile else None
    load0 = os.getloadavg()
    c0, w0 = time.process_time(), time.perf_counter()
    if prof is not None:
        prof.enable()
    # variants.run_one's steps, kept apart to report the engine's rounds.
    v = variants.build(a.policy, profiles, a.seed, engine)
    completing = variants.completing_hook(v, profiles) if a.policy.startswith("flowsched") else None
    eng = Engine(specs, profiles, v.policy, replace(engine, seed=a.seed), control_loops=v.loops,
                 completing=completing, gated=variants.gated(v)).run()
    if prof is not None:
        prof.disable()
        prof.dump_stats(a.profile)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    load1 = os.getloadavg()
    m, _ = measure(eng, f"sim-speed-{len(specs)}", a.seed, wall)
    rounds = v.control.stats.plans if v.control is not None else {}
    print(f"{a.policy}: {m.finished}/{m.jobs} jobs finished, avg JCT {m.avg_jct:.1f} s, p99 {m.p99_jct:.0f} s, "
          f"makespan {m.makespan:.0f} s, {m.restarts} restarts")
    print(f"rounds: {eng.rounds} engine rounds; plans per loop {dict(sorted(rounds.items()))}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (this process); load average {load0[0]:.2f} before, "
          f"{load1[0]:.2f} after (1 min), {os.cpu_count()} CPUs")
    return 0


def back_to_back(folder: Path, span: str, hours: float) -> list[JobSpec]:
    """workload-A..B (the artifact's 1.0x files), the k-th shifted by k x hours / count."""
    lo, _, hi = span.partition("-")
    try:
        ids = list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--workloads wants A-B (e.g. 3-8), got {span!r}") from None
    paths = [folder / f"workload-{w}.csv" for w in ids]
    missing = [str(x) for x in paths if not x.is_file()]
    if not ids or missing:
        raise ValueError(f"no workload files for {span!r}: {', '.join(missing) or 'empty range'}")
    shift = hours * 3600.0 / len(paths)
    return [replace(j, name=f"w{w}-{j.name}", arrival=j.arrival + k * shift)
            for k, (w, x) in enumerate(zip(ids, paths, strict=True)) for j in read_workload(x)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
