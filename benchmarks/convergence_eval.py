"""How well scoring.convergence spots plateaus and predicts the time left, on real curves.

Curves: LCBench (1,020 curves x 52 epochs; validation cross-entropy and accuracy, with the
cumulative training time) and the Pollux artifact's validation curves (one row per epoch;
no wall clock, so a constant time per step is assumed and time error equals step error).

Offline truth from the full curve: orient (lower is better), median-filter (3), take the
running best; the plateau starts at the first point whose running best is within
plateau_rel_tol of the final best, relative to the whole improvement (worst - final best).
Online: the estimator sees only the prefix up to each point.
  - plateau detectors, per (curve, prefix): phase == COMPLETING (FlowCon), and the curve
    fit saying 0 steps remain (Optimus); precision and recall against "prefix is past
    the offline plateau".
  - remaining time when the curve is 25/50/75 % of the way (in time) from its first point
    to its offline plateau: median absolute percentage error of remaining_seconds against
    the true time to the plateau; coverage = share of curves with a prediction.

Split (to avoid tuning on what is reported): the remaining-time method and its parameters
were chosen on the LCBench tasks with an even OpenML task id only (--split even); report
--split odd (held out) and --split all. Pollux was not used for choosing and is in every split.
--max-steps: the estimator is told each curve's last step as the job's planned end (LCBench
jobs run a fixed 52 epochs); without it the plateau is measured against the fitted asymptote.

Usage: python -m benchmarks.convergence_eval --out out/convergence [--limit N] [--split odd] [--max-steps]
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks import data_paths
from benchmarks.csv_rows import write_rows
from scoring.convergence import ConvergenceSettings, Phase, estimate

FloatArray = npt.NDArray[np.float64]

DATA = data_paths.data_root()
# Pollux validation metric per model: accuracy, F1 and hit rate go up; WER and loss go down.
POLLUX_HIGHER_IS_BETTER = {"cifar10": True, "imagenet": True, "bert": True, "ncf": True,
                           "deepspeech2": False, "yolov3": False}
FRACTIONS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class Curve:
    dataset: str
    name: str
    steps: FloatArray
    values: FloatArray
    timestamps: FloatArray
    higher_is_better: bool


def lcbench_curves(path: Path, metric: str, higher_is_better: bool) -> Iterator[Curve]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["curve"]), []).append(r)
    for (task, curve), rs in sorted(groups.items()):
        rs.sort(key=lambda r: int(r["epoch"]))
        yield Curve(
            dataset=f"lcbench/{metric}",
            name=f"{task}/{curve}",
            steps=np.array([float(r["epoch"]) for r in rs]),
            values=np.array([float(r[metric]) for r in rs]),
            timestamps=np.array([float(r["time_s"]) for r in rs]),
            higher_is_better=higher_is_better,
        )


def pollux_curves(traces: Path) -> Iterator[Curve]:
    for path in sorted(traces.glob("*/validation-*.csv")):
        model = path.parent.name
        with path.open() as f:
            rs = list(csv.DictReader(f))
        steps = np.array([float(r["iteration"]) for r in rs])
        yield Curve(
            dataset="pollux",
            name=f"{model}/{path.stem}",
            steps=steps,
            values=np.array([float(r["metric"]) for r in rs]),
            timestamps=steps * 1.0,  # constant 1 s per step: the traces carry no wall clock
            higher_is_better=POLLUX_HIGHER_IS_BETTER[model],
        )


def offline_plateau_index(values: FloatArray, higher_is_better: bool, tol: float) -> int | None:
    """First index at which the curve has done all but tol of its total improvement."""
    s = -values if higher_is_better else values
    if s.size >= 3:
        padded = np.pad(s, 1, mode="edge")
        s = np.median(np.lib.stride_tricks.sliding_window_view(padded, 3), axis=1)
    best = np.minimum.accumulate(s)
    total = float(s.max() - best[-1])
    if not total > 0:
        return None
    return int(np.argmax(best - best[-1] <= tol * total))


@dataclass
class Counts:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, predicted: bool, truth: bool) -> None:
        if predicted and truth:
            self.tp += 1
        elif predicted:
            self.fp += 1
        elif truth:
            self.fn += 1
        else:
            self.tn += 1

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else math.nan

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else math.nan


@dataclass
class DatasetResult:
    curves: int = 0
    skipped_flat: int = 0
    phase: Counts | None = None
    fit: Counts | None = None
    ape: dict[float, list[float]] | None = None  # fraction -> APEs of curves with a prediction
    asked: dict[float, int] | None = None  # fraction -> curves evaluated at that fraction


def in_split(c: Curve, split: str) -> bool:
    """LCBench curves by the parity of their OpenML task id; other datasets are in every split."""
    if split == "all" or not c.dataset.startswith("lcbench/"):
        return True
    odd = int(c.name.split("/")[0]) % 2 == 1
    return odd if split == "odd" else not odd


def evaluate_curve(
    c: Curve, settings: ConvergenceSettings, res: DatasetResult, max_steps: bool = False
) -> list[dict[str, object]]:
    assert res.phase is not None and res.fit is not None and res.ape is not None and res.asked is not None
    s = replace(settings, higher_is_better=c.higher_is_better)
    k_star = offline_plateau_index(c.values, c.higher_is_better, s.plateau_rel_tol)
    res.curves += 1
    if k_star is None:
        res.skipped_flat += 1
        return []
    n = c.steps.size
    planned = float(c.steps[-1]) if max_steps else None
    ests = {m: estimate(c.steps[:m], c.values[:m], c.timestamps[:m], s, max_steps=planned)
            for m in range(s.min_fit_points, n + 1)}
    for m, e in ests.items():
        truth = m - 1 >= k_star
        res.phase.add(e.phase == Phase.COMPLETING, truth)
        res.fit.add(e.remaining_steps == 0.0, truth)
    rows: list[dict[str, object]] = []
    t0, t_star = float(c.timestamps[0]), float(c.timestamps[k_star])
    for frac in FRACTIONS:
        now = t0 + frac * (t_star - t0)
        m = int(np.searchsorted(c.timestamps, now, side="right"))  # points seen by then
        if m not in ests:  # too early for a fit, or at the plateau already
            continue
        truth_s = t_star - float(c.timestamps[m - 1])
        if not truth_s > 0:
            continue
        res.asked[frac] += 1
        pred = ests[m].remaining_seconds
        ape = abs(pred - truth_s) / truth_s if math.isfinite(pred) else math.nan
        if math.isfinite(ape):
            res.ape[frac].append(ape)
        rows.append({"dataset": c.dataset, "curve": c.name, "fraction": frac, "points_seen": m,
                     "true_remaining_s": truth_s, "predicted_remaining_s": pred, "ape": ape})
    return rows


def fmt(x: float, pct: bool = True) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, required=True, help="directory for the CSV files")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--limit", type=int, default=0, help="at most this many curves per dataset (0 = all)")
    ap.add_argument("--window-points", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--split", choices=("all", "even", "odd"), default="all",
                    help="LCBench tasks by task-id parity; method chosen on even, report odd and all")
    ap.add_argument("--max-steps", action="store_true", help="tell the estimator each curve's planned last step")
    args = ap.parse_args(argv)

    settings = ConvergenceSettings(window_s=0.0, window_points=args.window_points, alpha=args.alpha,
                                   plateau_rel_tol=args.tol)
    sources: dict[str, Callable[[], Iterator[Curve]]] = {
        "lcbench/val_cross_entropy": lambda: lcbench_curves(args.data / "lcbench/curves.csv",
                                                            "val_cross_entropy", False),
        "lcbench/val_accuracy": lambda: lcbench_curves(args.data / "lcbench/curves.csv", "val_accuracy", True),
        "pollux": lambda: pollux_curves(args.data / "pollux/traces"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    detail: list[dict[str, object]] = []
    summary: list[dict[str, object]] = []
    started = time.perf_counter()
    for name, load in sources.items():
        res = DatasetResult(phase=Counts(), fit=Counts(), ape={f: [] for f in FRACTIONS},
                            asked=dict.fromkeys(FRACTIONS, 0))
        for i, curve in enumerate(c for c in load() if in_split(c, args.split)):
            if args.limit and i >= args.limit:
                break
            detail.extend(evaluate_curve(curve, settings, res, args.max_steps))
        assert res.phase is not None and res.fit is not None and res.ape is not None and res.asked is not None
        row: dict[str, object] = {
            "dataset": name, "curves": res.curves, "flat_skipped": res.skipped_flat,
            "phase_precision": res.phase.precision, "phase_recall": res.phase.recall,
            "fit_precision": res.fit.precision, "fit_recall": res.fit.recall,
        }
        for f in FRACTIONS:
            apes = res.ape[f]
            row[f"mdape_{int(f * 100)}"] = float(np.median(apes)) if apes else math.nan
            row[f"n_{int(f * 100)}"] = res.asked[f]
            row[f"coverage_{int(f * 100)}"] = len(apes) / res.asked[f] if res.asked[f] else math.nan
        summary.append(row)

    header = (f"{'dataset':28} {'curves':>6} {'det':>5} {'precision':>9} {'recall':>7} | "
              + " | ".join(f"MdAPE@{int(f * 100)}% (n, cov)" for f in FRACTIONS))
    print(f"settings: window={args.window_points} points, alpha={args.alpha}, plateau tol={args.tol}, "
          f"max_steps {'given' if args.max_steps else 'not given'}")
    print(f"split: {args.split} (LCBench tasks by task-id parity; method tuned on even tasks only, "
          f"odd = held out; pollux never used for tuning)")
    print(header)
    print("-" * len(header))
    for r in summary:
        cells = " | ".join(
            f"{fmt(float(str(r[f'mdape_{int(f * 100)}']))):>7} ({r[f'n_{int(f * 100)}']}, "
            f"{fmt(float(str(r[f'coverage_{int(f * 100)}'])))})"
            for f in FRACTIONS
        )
        for det in ("phase", "fit"):
            print(f"{r['dataset']!s:28} {r['curves']!s:>6} {det:>5} "
                  f"{fmt(float(str(r[f'{det}_precision']))):>9} {fmt(float(str(r[f'{det}_recall']))):>7} | "
                  + (cells if det == "phase" else ""))
    print(f"({time.perf_counter() - started:.1f} s)")

    write_rows(args.out / "summary.csv", summary)
    if detail:
        write_rows(args.out / "remaining_time.csv", detail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
