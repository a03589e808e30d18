"""The headline table: the Pollux artifact's workloads 1-8 at 1.0x and 2.0x load, every baseline
and every flowsched variant (benchmarks/sim/variants.py), means over workloads (and seeds for
the randomised policies), ratios to each baseline and to the artifact's published Pollux; then
the same means on the workloads the defaults were tuned on (`--tuned`, 1-2) and on the others,
unseen while tuning.

    .venv/bin/python -m benchmarks.run_pollux [--data benchmarks/data/pollux] [--seeds 1] \\
        [--loads 1.0,2.0] [--workloads 1-8] [--policies ...] [--procs 2] [--out DIR] [--cluster FILE]
    .venv/bin/python -m benchmarks.run_pollux --report DIR   # the tables again from DIR's runs.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks import data_paths
from benchmarks.code_origin import code_line
from benchmarks.sim.cluster_spec import load_cluster
from benchmarks.sim.engine import EngineSettings
from benchmarks.sim.jobmodel import ProfileSet, load_profiles
from benchmarks.sim.report import RunMetrics, aggregate, read_csv, write_csv, write_summary_csv
from benchmarks.sim.variants import (
    BASELINES,
    DETERMINISTIC,
    END_MIXES,
    END_TEXT,
    FLOWSCHED_VARIANTS,
    INTEGRATED,
    MIX_TEXT,
    MIXES,
    THROUGHPUT_TEXT,
    core_settings,
    known,
    loop_counts,
    overrides_line,
    prepare,
    run_one,
)
from benchmarks.sim.workload import read_workload

# Published averages over workload-1..8 (the artifact's result files, per data/README.md).
PUBLISHED = {"1.0": {"pollux": 2751.0, "tiresias": 4038.0}, "2.0": {"pollux": 5289.0, "tiresias": 10040.0}}
FOLDERS = {"1.0": "workloads", "2.0": "workloads-2.0"}
DEFAULT_POLICIES = (*BASELINES, *FLOWSCHED_VARIANTS)
REFS = (("fifo", "fifo"), ("kube-default", "kube"), ("binpack", "bin"), ("tiresias", "tir"))

_PROFILES: dict[str, ProfileSet] = {}


def _task(data: str, load: str, w: int, policy: str, seed: int, mix: str, sets: tuple[tuple[str, str], ...],
          throughput: str = "learned", ends: str = "default", cluster: str = "") -> tuple[RunMetrics, dict[str, float]]:
    if data not in _PROFILES:
        _PROFILES[data] = load_profiles(Path(data) / "traces")
    profiles = _PROFILES[data]
    specs = prepare(read_workload(Path(data) / FOLDERS[load] / f"workload-{w}.csv"), profiles, mix, ends)
    engine = EngineSettings(cluster=load_cluster(Path(cluster)).settings) if cluster else EngineSettings()
    m, _, v = run_one(specs, profiles, policy, seed, engine, f"workload-{w}", dict(sets), throughput)
    return m, loop_counts(v)


def _wids(spec: str) -> list[int]:
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in spec.split(",")]


def format_headline(summary: dict[str, dict[str, float]], loops: dict[str, dict[str, float]], pollux: float) -> str:
    refs = [(r, n) for r, n in REFS if r in summary]
    w = max([21, *(len(p) + 1 for p in summary)])
    head = (f"{'policy':<{w}}{'avg JCT':>8}{'p50':>7}{'p99':>7}{'makespan':>9}{'queue':>7}{'restarts':>9}{'rst/job':>8}"
            f"{'resize':>7}{'evict':>6}{'GPU alloc':>10}{'GPU busy':>9}"
            + "".join(f"{'/' + n:>7}" for _, n in refs) + f"{'/Pollux':>8}")
    lines = [head, "-" * len(head)]
    for p, s in summary.items():
        lp = loops.get(p, {})

        def num(k: str, lp: dict[str, float] = lp) -> str:
            x = lp.get(k, float("nan"))
            return "-" if not np.isfinite(x) else f"{x:.0f}"

        row = (f"{p:<{w}}{s['avg_jct']:>8.0f}{s['p50_jct']:>7.0f}{s['p99_jct']:>7.0f}{s['makespan']:>9.0f}"
               f"{s['avg_queueing']:>7.0f}{s['restarts']:>9.1f}{s['restarts_per_job']:>8.2f}{num('resizes'):>7}"
               f"{num('evictions'):>6}"
               f"{s['gpu_allocated']:>10.1%}{s['gpu_busy']:>9.1%}"
               + "".join(f"{s['avg_jct'] / summary[r]['avg_jct']:>7.3f}" for r, _ in refs)
               + f"{s['avg_jct'] / pollux:>8.3f}")
        if s.get("unfinished"):
            row += f"  ({s['unfinished']:.0f} jobs never fit)"
        lines.append(row)
    return "\n".join(lines)


def format_split(runs: list[RunMetrics], tuned: list[int]) -> str:
    """avg JCT / p99 / makespan per policy on the tuned workloads and on the unseen ones."""
    names = {f"workload-{w}" for w in tuned}
    groups = [("tuned", [r for r in runs if r.workload in names]),
              ("unseen", [r for r in runs if r.workload not in names])]
    groups = [(g, rs) for g, rs in groups if rs]
    if len(groups) < 2:
        return ""
    ids = {g: sorted({int(r.workload.rsplit("-", 1)[1]) for r in rs}) for g, rs in groups}
    head = f"{'policy':<21}" + "".join(f"{g + ' ' + ','.join(map(str, ids[g])) + ': avg / p99 / makespan':>44}"
                                       for g, _ in groups)
    lines = [head]
    sums = {g: aggregate(rs) for g, rs in groups}
    for pol in sums[groups[0][0]]:
        row = f"{pol:<21}"
        for g, _ in groups:
            x = sums[g].get(pol)
            row += f"{x['avg_jct']:>24.0f} / {x['p99_jct']:>6.0f} / {x['makespan']:>6.0f}" if x else f"{'-':>44}"
        lines.append(row)
    return "\n".join(lines)


def format_seeds(runs: list[RunMetrics], tuned: list[int]) -> str:
    """avg JCT per policy per seed, on the tuned workloads, the unseen ones and all, with the mean
    over seeds (which is the headline's); "" with one seed."""
    seeds = sorted({r.seed for r in runs})
    if len(seeds) < 2:
        return ""
    names = {f"workload-{w}" for w in tuned}
    groups = [("tuned", [r for r in runs if r.workload in names]),
              ("unseen", [r for r in runs if r.workload not in names]), ("all", runs)]
    lines = [f"avg JCT per seed (a policy run on seed 0 only: {', '.join(sorted(DETERMINISTIC))})",
             f"{'policy':<21}{'workloads':>10}" + "".join(f"{'seed ' + str(s):>9}" for s in seeds) + f"{'mean':>9}"]
    for pol in dict.fromkeys(r.policy for r in runs):
        for g, rs in groups:
            mine = [r for r in rs if r.policy == pol]
            if not mine:
                continue
            per = {s: float(np.mean([r.avg_jct for r in mine if r.seed == s])) for s in seeds
                   if any(r.seed == s for r in mine)}
            lines.append(f"{pol:<21}{g:>10}" + "".join(f"{per[s]:>9.0f}" if s in per else f"{'-':>9}" for s in seeds)
                         + f"{float(np.mean(list(per.values()))):>9.0f}")
    return "\n".join(lines)


LOOP_COUNTS = ("resizes", "evictions")


def write_loops(path: Path, loops: dict[str, dict[str, float]]) -> None:
    """The control loops' actions per run, per policy (runs.csv does not hold them)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", *LOOP_COUNTS])
        for pol, counts in loops.items():
            w.writerow([pol, *(counts.get(k, float("nan")) for k in LOOP_COUNTS)])


def read_loops(path: Path) -> dict[str, dict[str, float]]:
    """write_loops' file; empty (the table prints "-") for runs saved before it existed."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {row["policy"]: {k: float(row[k]) for k in LOOP_COUNTS} for row in csv.DictReader(f)}


# The run's settings line, code line and cluster, saved beside runs.csv: a table printed again with
# --report names the code that produced it, as the table printed by the run did.
HEADER_FILE = "header.txt"


def report(folder: Path, tuned: list[int]) -> int:
    """Print the tables of a finished run again from its runs.csv files (--out of that run)."""
    found = sorted(folder.glob("mix-*/load-*/runs.csv"))
    if not found:
        print(f"no mix-*/load-*/runs.csv under {folder}", file=sys.stderr)
        return 2
    for path in found:
        runs = read_csv(path)
        mix, load = path.parent.parent.name.removeprefix("mix-"), path.parent.name.removeprefix("load-")
        seeds = len({r.seed for r in runs})
        print(f"\n== job mix {mix!r}: {MIX_TEXT.get(mix, mix)}\n== load {load}x: "
              f"{len({r.workload for r in runs})} workloads, {seeds} seed(s) for the randomised policies "
              f"(from {path})")
        mode = path.parent / "mode.txt"
        print(f"== {mode.read_text().strip()}" if mode.exists() else "== (saved before the end mix: every job "
              "declared its planned end; ORACLE step times)")
        header = path.parent / HEADER_FILE
        print(header.read_text().rstrip() if header.exists() else "(saved before header.txt: the settings and the "
              "code that ran are not recorded)")
        summary = aggregate(runs)
        print(format_headline(summary, read_loops(path.parent / "loops.csv"),
                              PUBLISHED.get(load, {}).get("pollux", float("nan"))))
        print(format_split(runs, tuned))
        by_seed = format_seeds(runs, tuned)
        if by_seed:
            print(by_seed)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(data_paths.pollux_dir()),
                   help="the Pollux artifact folder (default: the shipped copy, or $FLOWSCHED_DATA/pollux)")
    p.add_argument("--seeds", type=int, default=1, help="seeds for the randomised policies (fifo, tiresias: one)")
    p.add_argument("--loads", default="1.0,2.0")
    p.add_argument("--workloads", default="1-8", help="range a-b or comma list")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    p.add_argument("--procs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--mix", default="all", help=f"job mixes, comma list from {', '.join(MIXES)}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a control-core setting, e.g. elastic.horizon_s=600 (printed with the table)")
    p.add_argument("--ends", choices=tuple(END_MIXES), default="default",
                   help="end mix: what the jobs declare of their end (benchmarks/sim/variants.py)")
    p.add_argument("--throughput", choices=tuple(THROUGHPUT_TEXT), default="learned",
                   help="what flowsched is told of step times: learned (as the service) or oracle (an upper bound)")
    p.add_argument("--out", default="")
    p.add_argument("--tuned", default="1-2", help="workloads the defaults were tuned on (reported apart)")
    p.add_argument("--report", default="", metavar="DIR", help="print the tables of an earlier --out DIR; run nothing")
    p.add_argument("--cluster", default="", metavar="FILE",
                   help="a cluster file with GPU types (benchmarks/clusters/three-types-64.yaml; format in "
                        "benchmarks/sim/cluster_spec.py) instead of the artifact's 16x4 GPUs of one type")
    a = p.parse_args(argv)
    if a.report:
        return report(Path(a.report), _wids(a.tuned))
    policies = [x.strip() for x in a.policies.split(",") if x.strip()]
    bad = [x for x in policies if not known(x)]
    if bad:
        p.error(f"unknown policy {', '.join(bad)}")
    wids = _wids(a.workloads)
    mixes = [x.strip() for x in a.mix.split(",") if x.strip()]
    if any(m not in MIXES for m in mixes):
        p.error(f"--mix from {', '.join(MIXES)}")
    print(f"flowsched = flowsched-placement + {' + '.join(INTEGRATED)}: the control kernel (scoring/kernel.py) "
          "that `flowsched serve` runs")
    sets = tuple((k.strip(), v.strip()) for k, _, v in (s.partition("=") for s in a.set))
    try:
        settings_text = overrides_line(core_settings(EngineSettings(), INTEGRATED, dict(sets)))
    except (ValueError, TypeError) as e:
        p.error(f"--set: {e}")
    print(settings_text)
    code = code_line()
    print(code)
    try:
        where = load_cluster(Path(a.cluster)).describe() if a.cluster else "16x4 GPUs"
    except ValueError as e:
        p.error(str(e))
    header = f"{settings_text}\n{code}\ncluster: {where}\n"
    for mix, load in [(m, ld) for m in mixes for ld in a.loads.split(",")]:
        t0 = time.perf_counter()
        tasks = [(a.data, load, w, pol, seed, mix, sets, a.throughput, a.ends, a.cluster)
                 for w in wids for pol in policies for seed in range(a.seeds)
                 if not (seed > 0 and pol in DETERMINISTIC)]
        if a.procs > 1:
            with ProcessPoolExecutor(a.procs) as ex:
                results = list(ex.map(_task, *zip(*tasks, strict=True)))
        else:
            results = [_task(*t) for t in tasks]
        runs = [m for m, _ in results]
        loops: dict[str, dict[str, float]] = {}
        for pol in policies:
            mine = [lp for (m, lp) in results if m.policy == pol]
            loops[pol] = {k: float(np.mean([lp[k] for lp in mine])) for k in LOOP_COUNTS}
        summary = aggregate(runs)
        pollux = PUBLISHED[load]["pollux"]
        print(f"\n== job mix {mix!r}: {MIX_TEXT[mix]} (the baselines ignore the marks)")
        print(f"== {END_TEXT[a.ends]}; throughput: {THROUGHPUT_TEXT[a.throughput]}")
        print(f"== load {load}x: workload-{','.join(map(str, wids))} (means over workloads x seeds), {where}, "
              f"{a.seeds} seed(s) for the randomised policies (fifo, tiresias: 1); restart penalty "
              f"{EngineSettings().restart_penalty:g} s; {time.perf_counter() - t0:.0f} s wall")
        print(format_headline(summary, loops, pollux))
        split = format_split(runs, _wids(a.tuned))
        if split:
            print(split)
        by_seed = format_seeds(runs, _wids(a.tuned))
        if by_seed:
            print(by_seed)
        print("queue: mean first start - arrival; restarts, resize, evict: per run; rst/job: restarts per job; "
              "/x: avg JCT / x's avg JCT; "
              f"/Pollux: / published Pollux {pollux:.0f} s")
        tir = PUBLISHED[load]["tiresias"]
        if "tiresias" in summary:
            print(f"published tiresias avg JCT {tir:.0f} s; simulated tiresias / published = "
                  f"{summary['tiresias']['avg_jct'] / tir:.3f}")
        sys.stdout.flush()
        if a.out:
            out = Path(a.out) / f"mix-{mix}" / f"load-{load}"
            out.mkdir(parents=True, exist_ok=True)
            write_csv(out / "runs.csv", runs)
            write_summary_csv(out / "summary.csv", summary)
            write_loops(out / "loops.csv", loops)
            (out / "mode.txt").write_text(f"{END_TEXT[a.ends]}; throughput: {THROUGHPUT_TEXT[a.throughput]}\n")
            (out / HEADER_FILE).write_text(header)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
