"""The Pollux artifact's workloads 1-8 at 1.0x and 2.0x load: every policy, ratios to flowsched
and to the artifact's published Pollux/Tiresias averages (../shared/data/README.md).

    .venv/bin/python -m benchmarks.run_pollux [--data ../shared/data/pollux] [--seeds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.sim.engine import EngineSettings
from benchmarks.sim.entry import run_matrix
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.policies import POLICY_NAMES
from benchmarks.sim.report import aggregate, format_table, write_csv, write_summary_csv
from benchmarks.sim.workload import read_workload

# Published averages over workload-1..8 (the artifact's result files, per data/README.md).
PUBLISHED = {"1.0": {"pollux": 2751.0, "tiresias": 4038.0}, "2.0": {"pollux": 5289.0, "tiresias": 10040.0}}
FOLDERS = {"1.0": "workloads", "2.0": "workloads-2.0"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared/data/pollux"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--loads", default="1.0,2.0")
    p.add_argument("--policies", default=",".join(POLICY_NAMES))
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    data = Path(a.data)
    profiles = load_profiles(data / "traces")
    policies = a.policies.split(",")
    for load in a.loads.split(","):
        wl = [(f"workload-{i}", read_workload(data / FOLDERS[load] / f"workload-{i}.csv")) for i in range(1, 9)]
        res = run_matrix(wl, profiles, policies, list(range(a.seeds)), EngineSettings())
        summary = aggregate(res.runs)
        print(f"== load {load}x: workload-1..8, 16x4 GPUs, {a.seeds} seed(s) for randomised policies")
        print(format_table(summary))
        for name, jct in PUBLISHED[load].items():
            fs = summary.get("flowsched", {}).get("avg_jct")
            line = f"published {name} avg JCT {jct:.0f} s"
            if fs:
                line += f"; flowsched / {name} = {fs / jct:.3f}"
            if name == "tiresias" and "tiresias" in summary:
                line += f"; simulated tiresias / published = {summary['tiresias']['avg_jct'] / jct:.3f}"
            print(line)
        if a.out:
            out = Path(a.out) / f"load-{load}"
            out.mkdir(parents=True, exist_ok=True)
            write_csv(out / "runs.csv", res.runs)
            write_summary_csv(out / "summary.csv", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
