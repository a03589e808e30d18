"""Per-run metrics, the comparison table (ratios to flowsched), CSV files and PNG plots."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.sim.engine import Engine

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RunMetrics:
    policy: str
    workload: str
    seed: int
    jobs: int
    finished: int
    avg_jct: float
    p50_jct: float
    p99_jct: float
    makespan: float  # last completion - first arrival
    avg_queueing: float  # first start - arrival
    gpu_allocated: float  # time-weighted share of GPUs held by jobs, over the makespan
    gpu_busy: float  # share of GPU time spent computing (what DCGM would average to)
    restarts: int
    wall_s: float


@dataclass(frozen=True)
class RunTrace:
    """What the plots need from one run."""

    policy: str
    jct: FloatArray
    time: FloatArray
    gpus_allocated: FloatArray
    gpus_busy: FloatArray
    queue: FloatArray
    total_gpus: int


def measure(engine: Engine, workload: str, seed: int, wall_s: float) -> tuple[RunMetrics, RunTrace]:
    done = [j for j in engine.jobs if j.completion is not None]
    jct = np.array([j.completion - j.spec.arrival for j in done if j.completion is not None])
    first = min((j.spec.arrival for j in engine.jobs), default=0.0)
    last = max((j.completion for j in done if j.completion is not None), default=first)
    queueing = [j.first_start - j.spec.arrival for j in engine.jobs if j.first_start is not None]
    tl = engine.timeline
    t = np.array([*tl.time, max(last, tl.time[-1] if tl.time else last)])
    dt = np.diff(t)
    total = engine.cluster.total_gpus
    span = max(float(t[-1] - t[0]), 1e-9) if t.size > 1 else 1e-9
    alloc = np.array(tl.gpus_allocated, dtype=np.float64)
    busy = np.array(tl.gpus_busy, dtype=np.float64)
    m = RunMetrics(
        policy=engine.policy.name,
        workload=workload,
        seed=seed,
        jobs=len(engine.jobs),
        finished=len(done),
        avg_jct=float(jct.mean()) if jct.size else float("nan"),
        p50_jct=float(np.percentile(jct, 50)) if jct.size else float("nan"),
        p99_jct=float(np.percentile(jct, 99)) if jct.size else float("nan"),
        makespan=float(last - first),
        avg_queueing=float(np.mean(queueing)) if queueing else float("nan"),
        gpu_allocated=float((alloc * dt).sum() / (total * span)) if dt.size else 0.0,
        gpu_busy=float((busy * dt).sum() / (total * span)) if dt.size else 0.0,
        restarts=sum(j.restarts for j in engine.jobs),
        wall_s=wall_s,
    )
    trace = RunTrace(
        engine.policy.name,
        np.sort(jct),
        np.array(tl.time),
        alloc,
        busy,
        np.array(tl.queue, dtype=np.float64),
        total,
    )
    return m, trace


METRIC_FIELDS = ("avg_jct", "p50_jct", "p99_jct", "makespan", "avg_queueing", "gpu_allocated", "gpu_busy", "restarts")


def aggregate(runs: Sequence[RunMetrics]) -> dict[str, dict[str, float]]:
    """Mean of each metric per policy over all runs (workloads x seeds), in first-seen order."""
    out: dict[str, dict[str, float]] = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy]
        out[policy] = {f: float(np.mean([float(getattr(r, f)) for r in mine])) for f in METRIC_FIELDS}
        out[policy]["restarts_per_job"] = float(np.mean([r.restarts / max(1, r.jobs) for r in mine]))
        out[policy]["runs"] = float(len(mine))
        out[policy]["unfinished"] = float(sum(r.jobs - r.finished for r in mine))
    return out


def format_table(summary: dict[str, dict[str, float]], reference: str = "flowsched") -> str:
    """One row per policy; the x/fs columns are the policy's figure divided by flowsched's
    (above 1: flowsched is better on that figure)."""
    ref = summary.get(reference)
    w = max([13, *(len(p) + 1 for p in summary)])
    head = (
        f"{'policy':<{w}}{'avg JCT s':>11}{'p50 JCT':>10}{'p99 JCT':>10}{'makespan':>10}{'queue s':>9}"
        f"{'GPU alloc':>10}{'GPU busy':>9}{'restarts':>9}{'rst/job':>8}"
    )
    if ref:
        head += f"{'avg/fs':>8}{'p99/fs':>8}{'mkspn/fs':>9}"
    lines = [head]
    for policy, s in summary.items():
        row = (
            f"{policy:<{w}}{s['avg_jct']:>11.0f}{s['p50_jct']:>10.0f}{s['p99_jct']:>10.0f}{s['makespan']:>10.0f}"
            f"{s['avg_queueing']:>9.0f}{s['gpu_allocated']:>10.1%}{s['gpu_busy']:>9.1%}{s['restarts']:>9.1f}"
            f"{s['restarts_per_job']:>8.2f}"
        )
        if ref:
            row += (
                f"{s['avg_jct'] / ref['avg_jct']:>8.3f}{s['p99_jct'] / ref['p99_jct']:>8.3f}"
                f"{s['makespan'] / ref['makespan']:>9.3f}"
            )
        if s.get("unfinished"):
            row += f"  ({s['unfinished']:.0f} jobs never fit)"
        lines.append(row)
    return "\n".join(lines)


def write_csv(path: Path, runs: Sequence[RunMetrics]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(RunMetrics)])
        w.writeheader()
        for r in runs:
            w.writerow(asdict(r))


def read_csv(path: Path) -> list[RunMetrics]:
    """The runs write_csv wrote."""
    kinds = {x.name: x.type for x in fields(RunMetrics)}
    with path.open(newline="") as f:
        return [RunMetrics(**{k: (str(v) if kinds[k] in ("str", str) else
                                  int(float(v)) if kinds[k] in ("int", int) else float(v))
                              for k, v in row.items()})  # type: ignore[arg-type]
                for row in csv.DictReader(f)]


def write_summary_csv(path: Path, summary: dict[str, dict[str, float]], reference: str = "flowsched") -> None:
    ref = summary.get(reference)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        cols = [*METRIC_FIELDS, "runs"]
        w.writerow(["policy", *cols, *([f"{c}_ratio_to_{reference}" for c in METRIC_FIELDS] if ref else [])])
        for policy, s in summary.items():
            ratios = [s[c] / ref[c] if ref and ref[c] else float("nan") for c in METRIC_FIELDS] if ref else []
            w.writerow([policy, *(s[c] for c in cols), *ratios])


def plot(out: Path, traces: Sequence[RunTrace]) -> list[Path]:
    """JCT CDF, GPUs allocated over time and queue length over time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    out.mkdir(parents=True, exist_ok=True)

    fig, ax = plt.subplots(figsize=(6, 4))
    for tr in traces:
        if tr.jct.size:
            ax.step(tr.jct / 3600.0, np.arange(1, tr.jct.size + 1) / tr.jct.size, where="post", label=tr.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "jct_cdf.png"))

    panels: list[tuple[str, str, Callable[[RunTrace], FloatArray]]] = [
        ("utilisation.png", "GPUs allocated (%)", lambda tr: 100.0 * tr.gpus_allocated / tr.total_gpus),
        ("queue_length.png", "jobs waiting", lambda tr: tr.queue),
    ]
    for name, ylabel, get in panels:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for tr in traces:
            if tr.time.size:
                ax.step(tr.time / 3600.0, get(tr), where="post", label=tr.policy, linewidth=0.9)
        ax.set_xlabel("time (h)")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(_save(fig, out / name))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close("all")
    return path
