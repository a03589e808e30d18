"""The whole Philly population (82,247 jobs of the Pollux artifact's philly.csv) on a
2,000-GPU cluster: arrivals and GPU counts from the trace, models assigned by GPU-hours as the
artifact's workload.py does. Prints the table, wall time and peak memory per policy.

    .venv/bin/python -m benchmarks.run_philly_scale [--policies flowsched] [--nodes 500]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks import data_paths
from benchmarks.code_origin import code_line
from benchmarks.sim import variants
from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.engine import Engine, EngineSettings, TelemetrySettings
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.report import aggregate, format_table, measure
from benchmarks.sim.workload import ModelLimits, philly_jobs, read_philly


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(data_paths.pollux_dir()),
                   help="the Pollux artifact folder (default: the shipped copy, or $FLOWSCHED_DATA/pollux)")
    p.add_argument("--policies", default="flowsched")
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--limit", type=int, default=0, help="first N jobs only (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    data = Path(a.data)
    profiles = load_profiles(data / "traces")
    limits = {
        n: ModelLimits(app.init_batch_size, app.max_batch_size, app.min_local_bsz)
        for n, app in profiles.app_objects().items()
    }
    philly = data / "traces" / "philly.csv"
    if not philly.is_file():
        # Not shipped (3.3 MiB): benchmarks/data/pollux/SOURCE.md.
        print(f"{philly} not found: philly.csv is not shipped with flowsched; pass --data (or set "
              "FLOWSCHED_DATA to a folder holding pollux/) to a full copy of the Pollux artifact's simulator/ "
              "folder (petuum/adaptdl, branch osdi21-artifact)", file=sys.stderr)
        return 2
    rows = read_philly(philly)
    jobs, capped = philly_jobs(rows, limits, a.seed)
    if a.limit:
        jobs = jobs[: a.limit]
    print(f"{len(jobs)} jobs ({capped} capped to the GPUs their model's batch can feed), "
          f"{a.nodes}x4 GPUs; loaded in {time.perf_counter() - t0:.1f} s")
    settings = EngineSettings(
        cluster=ClusterSettings(nodes=a.nodes),
        telemetry=replace(TelemetrySettings(), record_series=False),
        seed=a.seed,
        progress=a.progress,
    )
    runs = []
    elastic_jobs = variants.prepare(jobs, profiles)  # flowsched's assumption; baselines ignore the mark
    for name in a.policies.split(","):
        if not variants.known(name):
            p.error(f"unknown policy {name!r}; known: {', '.join((*variants.BASELINES, *variants.FLOWSCHED_VARIANTS))}")
        t1 = time.perf_counter()
        v = variants.build(name, profiles, a.seed, settings)
        specs = elastic_jobs if name.startswith("flowsched") else jobs
        eng = Engine(specs, profiles, v.policy, settings, control_loops=v.loops, gated=variants.gated(v)).run()
        m, _ = measure(eng, "philly", a.seed, time.perf_counter() - t1)
        runs.append(replace(m, policy=name))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{name}: wall {m.wall_s:.1f} s, {eng.rounds} rounds, peak RSS so far {peak:.0f} MiB", flush=True)
    if any(n.startswith("flowsched") for n in a.policies.split(",")):
        print(f"job mix: {variants.MIX_TEXT['all']}; the baselines ignore the marks")
        print(variants.overrides_line(variants.core_settings(settings, variants.INTEGRATED)))
    print(code_line())
    print(format_table(aggregate(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
