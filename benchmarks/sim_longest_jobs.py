"""The jobs that make a policy's tail: the longest jobs of one simulated run, with where they ran.

    python -m benchmarks.sim_longest_jobs --policy flowsched-typeblind \\
        --cluster benchmarks/clusters/three-types-64.yaml [--mix all] [--seed 0] [--workload-seed 0] [--top 8]

Runs one of the demo's generated workloads (160 jobs over 8 h; `flowsched demo --seed S` runs
workload seeds S and S + 1, its generated-0 and generated-1, each with policy seeds S and S + 1) once and
prints, per job, its JCT, how long it ran, its GPU-seconds and average GPUs while running, its
restarts and the speed of the GPU type it ended on (1 = the profile's V100). Written to find
out why flowsched-typeblind's makespan ran to millions of seconds (docs/gpu-types.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.cluster_spec import load_cluster
from benchmarks.sim.engine import EngineSettings
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.variants import prepare, simulate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--policy", default="flowsched-typeblind")
    ap.add_argument("--cluster", default="", help="a cluster file (default: the demo's 16x4 GPUs of one type)")
    ap.add_argument("--mix", default="all", help="job mix: all, half, none")
    ap.add_argument("--seed", type=int, default=0, help="the policy's seed")
    ap.add_argument("--workload-seed", type=int, default=0,
                    help="the generated workload's seed (0: `flowsched demo`'s generated-0)")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args(argv)
    cluster = load_cluster(Path(a.cluster)).settings if a.cluster else ClusterSettings()
    settings = EngineSettings(cluster=cluster)
    profiles = calibrated_profiles(cluster.gpus_per_node)
    specs = prepare(generate(GeneratorSettings(160, 8.0, a.workload_seed)), profiles, a.mix, "default")
    eng, _, wall_s = simulate(specs, profiles, a.policy, a.seed, settings)
    done = [j for j in eng.jobs if j.completion is not None and j.first_start is not None]
    makespan = max((j.completion or 0.0) for j in done) - min(j.spec.arrival for j in eng.jobs)
    print(f"{a.policy} on {a.cluster or 'the demo cluster'}, job mix {a.mix}, workload seed {a.workload_seed}, "
          f"seed {a.seed}: {len(done)} of "
          f"{len(eng.jobs)} jobs finished, makespan {makespan:.0f} s ({wall_s:.0f} s wall)")
    print(f"{'app':14s} {'JCT s':>9s} {'ran s':>9s} {'GPU-s':>9s} {'avg GPUs':>8s} {'restarts':>8s} "
          f"{'type speed':>10s}")
    for j in sorted(done, key=lambda j: (j.completion or 0.0) - j.spec.arrival, reverse=True)[:a.top]:
        ran = (j.completion or 0.0) - (j.first_start or 0.0)
        print(f"{j.spec.app:14s} {(j.completion or 0.0) - j.spec.arrival:9.0f} {ran:9.0f} {j.gpu_seconds:9.0f} "
              f"{j.gpu_seconds / max(ran, 1.0):8.2f} {j.restarts:8d} {j.type_speed:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
