"""JCT on time-sliced GPUs with the interference model on: flowsched's live-utilisation term
against allocation-only binpack and spread (benchmarks/fgd/interference.py states the model).

    python -m benchmarks.run_sharing_jct --seeds 5               # pods' own utilisation only
    python -m benchmarks.run_sharing_jct --seeds 5 --hidden 0.25 # plus load counts cannot see
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from benchmarks.fgd.interference import POLICIES, Model, make_jobs, simulate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=Model.jobs, help="pods per run")
    ap.add_argument("--overhead", type=float, default=Model.overhead)
    ap.add_argument("--hidden", type=float, default=Model.hidden_gpu_share,
                    help="share of physical GPUs with load allocation counts cannot see")
    a = ap.parse_args(argv)
    m = Model(jobs=a.jobs, overhead=a.overhead, hidden_gpu_share=a.hidden)
    print("model:", m.describe(), flush=True)
    rows: dict[str, list[tuple[float, float, float]]] = {p: [] for p in POLICIES}
    for s in range(a.seeds):
        jobs = make_jobs(m, np.random.default_rng(s))
        for p in POLICIES:  # same jobs for every policy
            r = simulate(m, jobs, p)
            rows[p].append((r.mean_jct_s, r.p95_jct_s, r.mean_slowdown))
    print(f"\n{a.seeds} seeds (0..{a.seeds - 1}), means over seeds")
    print("| placement | mean JCT s | p95 JCT s | mean slowdown | mean JCT vs flowsched |")
    print("|---|---:|---:|---:|---:|")
    ref = statistics.fmean(x[0] for x in rows["flowsched"])
    for p in POLICIES:
        mj = statistics.fmean(x[0] for x in rows[p])
        print(f"| {p} | {mj:.0f} | {statistics.fmean(x[1] for x in rows[p]):.0f} | "
              f"{statistics.fmean(x[2] for x in rows[p]):.3f} | {mj / ref:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
