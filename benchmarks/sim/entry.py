"""`flowsched simulate` and `flowsched demo`: argument parsing, the run matrix, the report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import data_paths
from benchmarks.code_origin import code_line
from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.cluster_spec import load_cluster
from benchmarks.sim.engine import EngineSettings, InterferenceSettings
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.html_report import write_html_report
from benchmarks.sim.jobmodel import ProfileSet, load_profiles
from benchmarks.sim.report import (
    RunMetrics,
    RunTrace,
    aggregate,
    format_table,
    plot,
    write_csv,
    write_summary_csv,
)
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
    overrides_line,
    prepare,
    run_one,
)
from benchmarks.sim.workload import JobSpec, read_workload, scale_load

DEFAULT_TRACES = data_paths.pollux_traces()
POLICY_NAMES = (*BASELINES, "flowsched-placement", "flowsched")


@dataclass(frozen=True)
class MatrixResult:
    runs: list[RunMetrics]
    traces: list[RunTrace]  # the first workload's first seed, one per policy (for plots)


def run_matrix(
    workloads: Sequence[tuple[str, list[JobSpec]]],
    profiles: ProfileSet,
    policies: Sequence[str],
    seeds: Sequence[int],
    settings: EngineSettings,
    mix: str = "all",
    log: Callable[[str], None] | None = None,
    ends: str = "default",
    throughput: str = "learned",
) -> MatrixResult:
    """Every policy (benchmarks.sim.variants names) on every workload; deterministic policies
    (fifo, tiresias) run one seed. Jobs are marked with the job mix and the end mix
    (variants.prepare); `throughput`: what flowsched is told of step times."""
    runs: list[RunMetrics] = []
    traces: list[RunTrace] = []
    for wi, (wname, raw) in enumerate(workloads):
        specs = prepare(raw, profiles, mix, ends)
        for policy in policies:
            for si, seed in enumerate(seeds):
                if si > 0 and policy in DETERMINISTIC:  # no randomness in these
                    continue
                m, tr, _ = run_one(specs, profiles, policy, seed, settings, wname, throughput=throughput)
                runs.append(m)
                if wi == 0 and si == 0:
                    traces.append(tr)
                if log:
                    log(f"{wname} {policy} seed={seed}: avg JCT {m.avg_jct:.0f} s ({m.wall_s:.2f} s)")
    return MatrixResult(runs, traces)


def _common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default=",".join(POLICY_NAMES),
                   help="comma-separated, from: " + ", ".join(BASELINES + FLOWSCHED_VARIANTS)
                   + f" or flowsched+<loops> (elastic, migrator|las); flowsched = flowsched+{'+'.join(INTEGRATED)}")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--seeds", type=int, default=3, help="seeds averaged (seed, seed+1, ...)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--interval", type=float, default=60.0, help="scheduling round, seconds")
    p.add_argument("--restart-penalty", type=float, default=30.0, help="seconds lost per (re)start")
    p.add_argument("--interference", type=float, default=0.0, help="throughput lost by co-located jobs (0..1)")
    p.add_argument("--interference-scope", choices=("distributed", "any"), default="distributed")
    p.add_argument("--mix", choices=MIXES, default="all", help="job mix: which jobs are elastic (all checkpointable)")
    p.add_argument("--ends", choices=tuple(END_MIXES), default="default",
                   help="end mix: what jobs declare of their end")
    p.add_argument("--throughput", choices=tuple(THROUGHPUT_TEXT), default="learned",
                   help="what flowsched is told of step times: learned (as the service) or oracle (an upper bound)")
    p.add_argument("--cluster", default="", metavar="FILE",
                   help="a cluster file with GPU types (benchmarks/clusters/*.yaml); replaces --nodes/--gpus-per-node")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    p.add_argument("--verbose", action="store_true", help="one line per run on stderr")


def _settings(a: argparse.Namespace) -> EngineSettings:
    return EngineSettings(
        interval=a.interval,
        restart_penalty=a.restart_penalty,
        cluster=load_cluster(Path(a.cluster)).settings if a.cluster else ClusterSettings(nodes=a.nodes,
                                                                                          gpus_per_node=a.gpus_per_node),
        interference=InterferenceSettings(a.interference, a.interference_scope),
        seed=a.seed,
        progress=a.progress,
    )


def _check_cluster(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.cluster:
        try:
            load_cluster(Path(a.cluster))
        except ValueError as e:
            p.error(str(e))


def _where(a: argparse.Namespace) -> str:
    """The cluster as the header names it."""
    return load_cluster(Path(a.cluster)).describe() if a.cluster else f"{a.nodes}x{a.gpus_per_node} GPUs"


def _policies(a: argparse.Namespace) -> list[str]:
    policies = [x.strip() for x in a.policies.split(",") if x.strip()]
    bad = [x for x in policies if not known(x)]
    if bad:
        raise SystemExit(f"unknown policy {', '.join(bad)}; see --help")
    return policies


def _finish(a: argparse.Namespace, result: MatrixResult, title: str) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = aggregate(result.runs)
    notes = [f"flowsched = flowsched-placement + {' + '.join(INTEGRATED)} (the control kernel, scoring/kernel.py); "
             f"job mix: {MIX_TEXT[a.mix]}; the baselines ignore the marks",
             f"{END_TEXT[a.ends]}; {THROUGHPUT_TEXT[a.throughput]}",
             overrides_line(core_settings(_settings(a), INTEGRATED)), code_line()]
    table = format_table(summary)
    print(title)
    for n in notes:
        print(n)
    print(table)
    write_csv(out / "runs.csv", result.runs)
    write_summary_csv(out / "summary.csv", summary)
    written = [out / "runs.csv", out / "summary.csv"]
    if not a.no_plots:
        try:
            written += plot(out, result.traces)
        except ImportError:
            print("matplotlib not installed: no plots (pip install 'flowsched[plots]')", file=sys.stderr)
    written.append(write_html_report(out / "report.html", title, notes, summary, table, written))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def simulate_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="flowsched simulate", description="Replay workload files on a simulated cluster.")
    p.add_argument("--workload", action="append", required=True, help="workload CSV or a folder of them (repeatable)")
    p.add_argument("--profiles", default=str(DEFAULT_TRACES), help="the Pollux artifact's traces/ folder")
    p.add_argument("--load", type=float, default=1.0, help="compress arrivals by this factor")
    p.add_argument("--out", default="flowsched-sim")
    _common_args(p)
    a = p.parse_args(argv)
    _check_cluster(p, a)
    files: list[Path] = []
    for w in a.workload:
        path = Path(w)
        files += sorted(path.glob("*.csv")) if path.is_dir() else [path]
    profiles_dir = Path(a.profiles)
    if not profiles_dir.is_dir():
        print(f"profiles folder {profiles_dir} not found", file=sys.stderr)
        return 2
    profiles = load_profiles(profiles_dir)
    workloads = [(f.stem, scale_load(read_workload(f), a.load)) for f in files]
    policies = _policies(a)
    seeds = list(range(a.seed, a.seed + max(1, a.seeds)))
    log = (lambda s: print(s, file=sys.stderr)) if a.verbose else None
    result = run_matrix(workloads, profiles, policies, seeds, _settings(a), a.mix, log, a.ends, a.throughput)
    title = f"{len(files)} workload(s) x {len(seeds)} seed(s), load {a.load}x, {_where(a)}"
    return _finish(a, result, title)


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="flowsched demo", description="Compare policies on a generated workload (no data files needed)."
    )
    p.add_argument("--out", default="flowsched-demo")
    p.add_argument("--jobs", type=int, default=160)
    p.add_argument("--hours", type=float, default=8.0)
    p.add_argument("--workloads", type=int, default=2, help="generated workloads (seeds) averaged")
    _common_args(p)
    p.set_defaults(seeds=2)  # keeps the demo under a minute on a 2-core machine
    a = p.parse_args(argv)
    _check_cluster(p, a)
    profiles = calibrated_profiles(a.gpus_per_node)
    workloads = [
        (f"generated-{k}", generate(GeneratorSettings(a.jobs, a.hours, a.seed + k))) for k in range(max(1, a.workloads))
    ]
    policies = _policies(a)
    seeds = list(range(a.seed, a.seed + max(1, a.seeds)))
    log = (lambda s: print(s, file=sys.stderr)) if a.verbose else None
    t0 = time.perf_counter()
    result = run_matrix(workloads, profiles, policies, seeds, _settings(a), a.mix, log, a.ends, a.throughput)
    title = (
        f"flowsched demo: {len(workloads)} generated workload(s) of {a.jobs} jobs over {a.hours:g} h "
        f"(calibrated from the Pollux artifact's profiles), {_where(a)}, "
        f"{len(seeds)} seed(s); {time.perf_counter() - t0:.1f} s"
    )
    return _finish(a, result, title)


if __name__ == "__main__":
    raise SystemExit(demo_main(sys.argv[1:]))
