"""Time scoring.elastic.plan_elastic on large instances (the issue's bound: < 50 ms for 200
jobs and 512 GPUs). Prints median / p90 / max over repeats per instance size.

    .venv/bin/python -m benchmarks.bench_elastic [--repeats 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np

from scoring.elastic import (
    ElasticJob,
    GradientNoise,
    JobOptions,
    StepTimeModel,
    job_options,
    plan_elastic,
    rate_table,
    solve,
)
from scoring.settings import ElasticLoopSettings

BATCHES = np.array([64, 128, 256, 512, 1024, 2048, 4096])
SETTINGS = ElasticLoopSettings()  # the service's restart penalty and hysteresis


def instance(n_jobs: int, max_gpus: int, seed: int) -> list[ElasticJob]:
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n_jobs):
        model = StepTimeModel(rng.uniform(0.01, 0.2), rng.uniform(1e-4, 2e-3), rng.uniform(0.0, 0.1),
                              rng.uniform(0.0, 0.01), max_local_bsz=int(rng.choice([32, 64, 128])))
        noise = GradientNoise(1.0, float(rng.uniform(0.5, 500.0)), 64)
        mx = int(rng.integers(1, max_gpus + 1))
        mn = int(rng.integers(1, min(mx, 4) + 1))
        running = rng.random() < 0.5
        cur = int(rng.integers(mn, mx + 1)) if running else 0
        jobs.append(ElasticJob(f"j{i}", mn, mx, BATCHES, rate_table(model, mx, BATCHES, noise), cur,
                               128 if cur else 0, 64, 4096, weight=float(rng.choice([0.5, 0.75, 1.0]))))
    return jobs


def timeit(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        out.append((clock() - t0) * 1e3)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"plan_elastic timing, {a.repeats} repeats each, ms ('dp' = solve() alone, 'full' = per-job "
          f"options + solve + decisions; 'cpu' = process CPU time); {os.cpu_count()} CPUs, load avg {load:.2f}")
    print(f"{'jobs':>5} {'GPUs':>5} {'maxG/job':>8} | {'dp p50':>7} {'dp p90':>7} | {'full p50':>8} "
          f"{'full p90':>8} {'full max':>8} | {'cpu p50':>7} | used")
    for jobs, gpus, maxg in [(20, 64, 16), (200, 512, 8), (200, 512, 32), (200, 512, 64), (200, 512, 128),
                             (1000, 2048, 32)]:
        inst = instance(jobs, maxg, a.seed)
        opts = [job_options(j, SETTINGS) for j in inst]

        def run_dp(opts: list[JobOptions] = opts, gpus: int = gpus) -> object:
            return solve(opts, gpus)

        def run_full(inst: list[ElasticJob] = inst, gpus: int = gpus) -> object:
            return plan_elastic(inst, gpus, SETTINGS)

        dp = np.array(timeit(run_dp, a.repeats), dtype=np.float64)
        full = np.array(timeit(run_full, a.repeats), dtype=np.float64)
        cpu = np.array(timeit(run_full, a.repeats, time.process_time), dtype=np.float64)
        plan = plan_elastic(inst, gpus, SETTINGS)
        print(f"{jobs:>5} {gpus:>5} {maxg:>8} | {np.median(dp):7.2f} {np.percentile(dp, 90):7.2f} | "
              f"{np.median(full):8.2f} {np.percentile(full, 90):8.2f} {full.max():8.2f} | "
              f"{np.median(cpu):7.2f} | {plan.gpus_used}/{gpus}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
