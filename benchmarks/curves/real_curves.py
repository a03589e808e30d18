"""The shipped real training runs (benchmarks/data/real_curves/): read, and packed from the raw runs.

runs.csv holds one row per run (its spec, its rule and its true end); <family>.csv one row per
kept training step (kind "t": seconds, loss) and per evaluation (kind "e": seconds, val_loss,
val_metric). Every evaluation is kept; training steps are thinned to at most MAX_TRAIN_POINTS
per run, always keeping the last. Two clocks: `seconds` is wall time, `cpu_seconds` the training
thread's CPU time (the job's own work; what its seconds would be on a machine of its own).
Pack (no torch needed):

    python -m benchmarks.curves.real_curves /work/real_runs benchmarks/data/real_curves
    python -m benchmarks.curves.real_curves /work/real_runs_long benchmarks/data/real_curves_long
    python -m benchmarks.curves.real_curves --beside RAW benchmarks/data/real_curves_gpu  # keep the shipped runs

`--beside`: the runs already in the folder whose raw records are gone stay as they are, and the new
ones join them in pack's order (the same files packing all records at once would write).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import data_paths

FloatArray = npt.NDArray[np.float64]
MAX_TRAIN_POINTS = 600
RUN_FIELDS = ("run_id", "family", "dataset", "model", "optimizer", "lr", "schedule", "batch_size", "seed", "rule",
              "max_steps", "eval_every", "monitor", "higher_is_better", "patience", "min_delta", "target",
              "stopped_by", "true_end_step", "true_end_seconds", "true_end_cpu_seconds", "plan_s", "device")
RUN_DEFAULTS = {"plan_s": 0.0, "device": "cpu"}  # fields that runs recorded before the GPU campaign lack
RULES = ("planned", "early_stopping", "target", "none")
CLOCKS = ("cpu", "wall")


@dataclass(frozen=True)
class RealRun:
    """One run: its spec and rule, its true end, its training points and its evaluations."""

    spec: dict[str, str]  # runs.csv's row
    train_steps: FloatArray
    train_seconds: FloatArray
    train_loss: FloatArray
    eval_steps: FloatArray
    eval_seconds: FloatArray
    val_loss: FloatArray
    val_metric: FloatArray
    train_cpu_seconds: FloatArray  # NaN where the data has no CPU clock (runs recorded before it)
    eval_cpu_seconds: FloatArray

    @property
    def run_id(self) -> str:
        return self.spec["run_id"]

    @property
    def family(self) -> str:
        return self.spec["family"]

    @property
    def rule(self) -> str:
        return self.spec["rule"]

    @property
    def max_steps(self) -> int:
        return int(self.spec["max_steps"])

    @property
    def true_end_step(self) -> int:
        return int(self.spec["true_end_step"])

    @property
    def true_end_seconds(self) -> float:
        return float(self.spec["true_end_seconds"])

    @property
    def higher_is_better(self) -> bool:
        return self.spec["higher_is_better"] == "1"

    def monitored(self) -> FloatArray:
        """The series the run's rule watched (val_loss or the task's metric)."""
        return self.val_loss if self.spec["monitor"] == "val_loss" else self.val_metric


def default_dir() -> Path:
    return data_paths.data_root() / "real_curves"


def long_dir() -> Path:
    """The second, third and fourth campaigns: runs of minutes (train_runs.py --matrix long, long3, long4), and the
    fifth (--matrix tune5); only the runs of job_end_eval's tuning families are tuned on."""
    return data_paths.data_root() / "real_curves_long"


def gpu_dir() -> Path:
    """The GPU campaign (train_runs.py --matrix gpu, then gpu2, on lent H200s), never used for tuning."""
    return data_paths.data_root() / "real_curves_gpu"


def data_dir(name: str) -> Path:
    """"short" (the shipped real_curves), "long" (real_curves_long), "gpu" (real_curves_gpu), or a
    folder of runs.csv."""
    return {"short": default_dir(), "long": long_dir(), "gpu": gpu_dir()}.get(name) or Path(name)


def load_runs(folder: Path | None = None, families: set[str] | None = None) -> list[RealRun]:
    folder = default_dir() if folder is None else folder
    with (folder / "runs.csv").open() as f:
        specs = [r for r in csv.DictReader(f) if families is None or r["family"] in families]
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    for family in sorted({s["family"] for s in specs}):
        with (folder / f"{family}.csv").open() as f:
            for r in csv.DictReader(f):
                rows[r["run_id"]].append(r)
    out = []
    for s in specs:
        t = [r for r in rows[s["run_id"]] if r["kind"] == "t"]
        e = [r for r in rows[s["run_id"]] if r["kind"] == "e"]
        if not t:
            raise ValueError(f"{folder}: run {s['run_id']} has no training points")

        def col(rs: list[dict[str, str]], name: str) -> FloatArray:
            return np.array([float(r.get(name) or "nan") for r in rs], dtype=np.float64)

        out.append(RealRun(s, col(t, "step"), col(t, "seconds"), col(t, "loss"),
                           col(e, "step"), col(e, "seconds"), col(e, "val_loss"), col(e, "val_metric"),
                           col(t, "cpu_seconds"), col(e, "cpu_seconds")))
    return out


def has_cpu_clock(run: RealRun) -> bool:
    return bool(run.spec.get("true_end_cpu_seconds")) and bool(np.all(np.isfinite(run.train_cpu_seconds)))


def on_clock(run: RealRun, clock: str) -> RealRun:
    """The run with its seconds (points and true end) read on `clock`: "wall" as recorded, "cpu" the
    training thread's CPU time. A ValueError where the data has no CPU clock."""
    if clock == "wall":
        return run
    if clock != "cpu":
        raise ValueError(f"clock {clock!r}: expected one of {CLOCKS}")
    if not has_cpu_clock(run):
        raise ValueError(f"run {run.run_id} has no CPU clock (recorded before train_runs kept one); use wall")
    spec = {**run.spec, "true_end_seconds": run.spec["true_end_cpu_seconds"]}
    return replace(run, spec=spec, train_seconds=run.train_cpu_seconds, eval_seconds=run.eval_cpu_seconds)


def _thin(train: list[list[float]]) -> list[list[float]]:
    if len(train) <= MAX_TRAIN_POINTS:
        return train
    keep = np.unique(np.linspace(0, len(train) - 1, MAX_TRAIN_POINTS).round().astype(int))
    return [train[i] for i in keep]


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and math.isnan(v):
        return ""
    return str(v)


CURVE_FIELDS = ("run_id", "kind", "step", "seconds", "loss", "val_loss", "val_metric", "cpu_seconds")


def _packed_rows(r: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """One raw record as its runs.csv row and its family CSV's rows (numbers as csv writes them)."""
    merged = {**RUN_DEFAULTS, **r["spec"], "true_end_cpu_seconds": math.nan,
              **{k: r[k] for k in ("stopped_by", "true_end_step", "true_end_seconds", "true_end_cpu_seconds")
                 if k in r}}
    rid = r["spec"]["run_id"]
    curve: list[list[Any]] = [[rid, "t", step, sec, loss, "", "", _cell(cpu[0] if cpu else math.nan)]
                              for step, sec, loss, *cpu in _thin(r["train"])]  # cpu_s: absent in older runs
    curve += [[rid, "e", step, sec, "", vl, vm, _cell(cpu[0] if cpu else math.nan)]
              for step, sec, vl, vm, *cpu in r["evals"]]
    return [_cell(merged[k]) for k in RUN_FIELDS], curve


def _shipped_rows(dest: Path) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """The runs already packed in `dest`, as pack wrote them, by run id."""
    if not (dest / "runs.csv").exists():
        return {}
    with (dest / "runs.csv").open(newline="") as f:
        reader = csv.reader(f)
        if tuple(next(reader)) != RUN_FIELDS:
            raise ValueError(f"{dest}/runs.csv: not this packer's columns")
        specs = {row[0]: row for row in reader}
    curves: dict[str, list[list[Any]]] = defaultdict(list)
    for family in sorted({row[1] for row in specs.values()}):
        with (dest / f"{family}.csv").open(newline="") as f:
            reader = csv.reader(f)
            next(reader)
            for row in reader:
                curves[row[0]].append(row)
    return {rid: (row, curves[rid]) for rid, row in specs.items()}


def pack(raw: Path, dest: Path, beside: bool = False) -> tuple[int, dict[str, int]]:
    """Raw per-run JSON (train_runs.py) -> runs.csv and one CSV per family; returns (runs, bytes per file).
    beside: keep the runs already packed in `dest` that the raw records do not hold."""
    records = [json.loads(p.read_text()) for p in sorted(raw.glob("*.json"))]
    if not records:
        raise ValueError(f"{raw}: no run files")
    rows = {r["spec"]["run_id"]: _packed_rows(r) for r in records}
    if beside:
        rows = {**_shipped_rows(dest), **rows}
    dest.mkdir(parents=True, exist_ok=True)
    order = sorted(rows, key=lambda rid: (rows[rid][0][1], rid))  # (family, run id)
    with (dest / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RUN_FIELDS)
        w.writerows(rows[rid][0] for rid in order)
    for family in sorted({rows[rid][0][1] for rid in order}):
        with (dest / f"{family}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CURVE_FIELDS)
            for rid in order:
                if rows[rid][0][1] == family:
                    w.writerows(rows[rid][1])
    sizes = {p.name: p.stat().st_size for p in sorted(dest.glob("*.csv"))}
    return len(rows), sizes


def describe(runs: list[RealRun]) -> str:
    """Runs per family and rule, how they ended, their true durations and step-time drift, on each clock."""
    clocks = [c for c in CLOCKS if c == "wall" or all(has_cpu_clock(r) for r in runs)]
    lines = [f"{'family':18} {'runs':>4} " + " ".join(f"{r:>14}" for r in RULES)
             + "".join(f"  {c} s min/median/max" for c in clocks)]
    for family in sorted({r.family for r in runs}):
        rs = [r for r in runs if r.family == family]
        cells = []
        for rule in RULES:
            ended = Counter(r.spec["stopped_by"] for r in rs if r.rule == rule)
            cells.append(f"{'/'.join(f'{v}{k[0]}' for k, v in sorted(ended.items())) or '-':>14}")
        spans = []
        for c in clocks:
            secs = np.array([on_clock(r, c).true_end_seconds for r in rs])
            spans.append(f"  {f'{secs.min():.1f}/{np.median(secs):.1f}/{secs.max():.1f}':>20}")
        lines.append(f"{family:18} {len(rs):>4} " + " ".join(cells) + "".join(spans))
    steps = np.array([r.true_end_step for r in runs])
    lines.append(f"{len(runs)} runs; {steps.min()}..{steps.max()} steps (median {np.median(steps):.0f})"
                 "; ended by m = max_steps, e = early_stopping, t = target")
    for c in clocks:
        on = [on_clock(r, c) for r in runs]
        secs = np.array([r.true_end_seconds for r in on])
        drift = np.nanpercentile([step_time_drift(r) for r in on], [10, 50, 90])
        lines.append(f"{c:4} clock: true end {secs.min():.1f}..{secs.max():.1f} s (median {np.median(secs):.1f} s, "
                     f"total {secs.sum() / 60:.1f} min); step-time drift (slowest quarter of a run's steps over "
                     f"its fastest, - 1): p10 {drift[0]:.0%}, median {drift[1]:.0%}, p90 {drift[2]:.0%}")
    return "\n".join(lines)


def step_time_drift(run: RealRun) -> float:
    """How much the seconds per step of one run change over it: its slowest quarter over its fastest, - 1."""
    per_step = []
    for idx in np.array_split(np.arange(run.train_steps.size), 4):
        if idx.size >= 2:
            a, b = idx[0], idx[-1]
            per_step.append((run.train_seconds[b] - run.train_seconds[a]) / (run.train_steps[b] - run.train_steps[a]))
    return max(per_step) / min(per_step) - 1 if len(per_step) >= 2 and min(per_step) > 0 else math.nan


if __name__ == "__main__":
    args = sys.argv[1:]
    keep = args[:1] == ["--beside"]
    raw_dir, dest_dir = (Path(a) for a in args[keep:])
    n, sizes = pack(raw_dir, dest_dir, beside=keep)
    print(f"{n} runs; " + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in sizes.items())
          + f"; total {sum(sizes.values()) / 1024:.0f} KiB")
    print(describe(load_runs(dest_dir)))
