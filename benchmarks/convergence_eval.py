"""How well scoring.convergence spots plateaus and predicts the time left, on real curves.

Curves: LCBench (1,020 curves x 52 epochs; validation cross-entropy and accuracy, with the
cumulative training time) and the Pollux artifact's validation curves (one row per epoch;
no wall clock, so a constant time per step is assumed and time error equals step error).

Offline truth from the full curve: orient (lower is better), median-filter (3), take the
running best; the plateau starts at the first point whose running best is within
plateau_rel_tol of the final best, relative to the whole improvement (worst - final best).
Online: the estimator sees only the prefix up to each point. Three remaining-time predictors,
measured in the same run on the same prefixes:
  - ensemble: the curve families' geometric mean (estimate()'s remaining_steps by default, as
    before issue 21; also ensemble_remaining_steps), in seconds at step_rate (the last 20 points);
  - ensemble_rr: the same steps in seconds at remaining_rate (the last 4 points), the rate the
    learned model's seconds use: what the recent rate alone changes;
  - learned: scoring.remaining's boosted trees (estimate()'s learned_remaining_steps: the median of
    the steps left if the curve has not plateaued yet, the 80 % interval remaining_*_low/high and
    plateau_probability; remaining_steps with remaining_model="learned"), fit on the even LCBench
    tasks only by benchmarks/fit_remaining;
  - bayes: candidate (a), a Bayesian average over the same families (benchmarks/remaining_bayes).
  Per method: plateau precision and recall per (curve, prefix) against "prefix is past the
  offline plateau" (ensemble: 0 steps left; learned: plateau_probability over the model's
  threshold; bayes: over 1/2), and FlowCon's phase == COMPLETING beside them; remaining time
  when the curve is 25/50/75 % of the way (in time) from its first point to its offline plateau:
  median absolute percentage error of the predicted seconds against the true time to the
  plateau (ans = share of curves with a prediction), and the share of those whose true time
  lies in the 80 % interval.

Split (to avoid tuning on what is reported): the learned model and every choice above were made
on the LCBench tasks with an even OpenML task id only (--split even); report --split odd (held
out) and --split all. Pollux was not used for fitting or choosing and is in every split.
--max-steps: the estimator is told each curve's last step as the job's planned end (LCBench
jobs run a fixed 52 epochs); without it the plateau is measured against the fitted asymptote.
--data: the folder holding lcbench/curves.csv and pollux/traces/ (default: the shared data).

Usage: python -m benchmarks.convergence_eval --out out/convergence [--limit N] [--split odd] [--max-steps]
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks import data_paths
from benchmarks.csv_rows import write_rows
from benchmarks.remaining_bayes import bayes_remaining
from scoring.convergence import ConvergenceEstimate, ConvergenceSettings, Phase, clean_series, estimate, normalise
from scoring.remaining import RemainingDistribution

FloatArray = npt.NDArray[np.float64]

DATA = data_paths.data_root()
# Pollux validation metric per model: accuracy, F1 and hit rate go up; WER and loss go down.
POLLUX_HIGHER_IS_BETTER = {"cifar10": True, "imagenet": True, "bert": True, "ncf": True,
                           "deepspeech2": False, "yolov3": False}
FRACTIONS = (0.25, 0.5, 0.75)
PLATEAU_PROBABILITY = 0.5  # candidate (a) says "at the plateau" from this probability on


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


# The curve families' geometric mean (the estimator before issue 21, in seconds at step_rate), the same
# at remaining_rate (the recent rate estimate() now turns steps into seconds at: what the rate alone
# changes), scoring.remaining's learnt model (at remaining_rate), and candidate (a), the Bayesian family
# average of benchmarks/remaining_bayes (at step_rate).
METHODS = ("ensemble", "ensemble_rr", "learned", "bayes")


@dataclass
class MethodResult:
    """One remaining-time predictor on one dataset."""

    plateau: Counts = field(default_factory=Counts)  # "at the plateau" per (curve, prefix)
    ape: dict[float, list[float]] = field(default_factory=lambda: {f: [] for f in FRACTIONS})
    asked: dict[float, int] = field(default_factory=lambda: dict.fromkeys(FRACTIONS, 0))
    covered: dict[float, int] = field(default_factory=lambda: dict.fromkeys(FRACTIONS, 0))  # truth in the 80 % interval
    intervals: dict[float, int] = field(default_factory=lambda: dict.fromkeys(FRACTIONS, 0))  # asked with an interval


@dataclass
class DatasetResult:
    curves: int = 0
    skipped_flat: int = 0
    phase: Counts = field(default_factory=Counts)
    methods: dict[str, MethodResult] = field(default_factory=lambda: {m: MethodResult() for m in METHODS})


def in_split(c: Curve, split: str) -> bool:
    """LCBench curves by the parity of their OpenML task id; other datasets are in every split."""
    if split == "all" or not c.dataset.startswith("lcbench/"):
        return True
    odd = int(c.name.split("/")[0]) % 2 == 1
    return odd if split == "odd" else not odd


def _seconds(steps_left: float, rate: float) -> float:
    return 0.0 if steps_left == 0.0 else (steps_left / rate if math.isfinite(rate) else math.nan)


def predictions(
    e: ConvergenceEstimate, bayes: RemainingDistribution
) -> dict[str, tuple[float, float, float, bool]]:
    """Per method: (remaining seconds, 80 % interval low, high, says "at the plateau")."""
    rate, recent = e.step_rate, e.remaining_rate
    ens = e.ensemble_remaining_steps
    return {
        "ensemble": (_seconds(ens, rate), math.nan, math.nan, ens == 0.0),
        "ensemble_rr": (_seconds(ens, recent), math.nan, math.nan, ens == 0.0),
        "learned": (_seconds(e.learned_remaining_steps, recent), e.remaining_seconds_low, e.remaining_seconds_high,
                    e.plateaued),
        "bayes": (_seconds(bayes.median, rate), _seconds(bayes.low, rate), _seconds(bayes.high, rate),
                  bayes.plateau_probability >= PLATEAU_PROBABILITY),
    }


def bayes_prediction(c: Curve, m: int, s: ConvergenceSettings, planned: float | None) -> RemainingDistribution:
    clean = clean_series(c.steps[:m], c.values[:m], c.timestamps[:m])
    norm = normalise(clean.values, s.higher_is_better, s.median_points)
    if norm is None:
        return RemainingDistribution.unknown()
    return bayes_remaining(clean.steps, norm, s, planned)


def evaluate_curve(
    c: Curve, settings: ConvergenceSettings, res: DatasetResult, max_steps: bool = False, bayes: bool = True
) -> list[dict[str, object]]:
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
    preds = {m: predictions(e, bayes_prediction(c, m, s, planned) if bayes else RemainingDistribution.unknown())
             for m, e in ests.items()}
    for m, e in ests.items():
        truth = m - 1 >= k_star
        res.phase.add(e.phase == Phase.COMPLETING, truth)
        for method in METHODS:
            res.methods[method].plateau.add(preds[m][method][3], truth)
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
        row: dict[str, object] = {"dataset": c.dataset, "curve": c.name, "fraction": frac, "points_seen": m,
                                  "true_remaining_s": truth_s}
        for method in METHODS:
            r = res.methods[method]
            pred, lo, hi, _ = preds[m][method]
            r.asked[frac] += 1
            ape = abs(pred - truth_s) / truth_s if math.isfinite(pred) else math.nan
            if math.isfinite(ape):
                r.ape[frac].append(ape)
            if math.isfinite(lo) and math.isfinite(hi):
                r.intervals[frac] += 1
                r.covered[frac] += int(lo <= truth_s <= hi)
            row |= {f"{method}_s": pred, f"{method}_low_s": lo, f"{method}_high_s": hi, f"{method}_ape": ape}
        rows.append(row)
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
    ap.add_argument("--skip-bayes", action="store_true", help="leave out candidate (a) (about half the run time)")
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
        res = DatasetResult()
        for i, curve in enumerate(c for c in load() if in_split(c, args.split)):
            if args.limit and i >= args.limit:
                break
            detail.extend(evaluate_curve(curve, settings, res, args.max_steps, bayes=not args.skip_bayes))
        if args.skip_bayes:
            del res.methods["bayes"]
        summary.append({"dataset": name, "method": "flowcon_phase", "curves": res.curves,
                        "flat_skipped": res.skipped_flat, "plateau_precision": res.phase.precision,
                        "plateau_recall": res.phase.recall})
        for method, mr in res.methods.items():
            row: dict[str, object] = {"dataset": name, "method": method, "curves": res.curves,
                                      "flat_skipped": res.skipped_flat, "plateau_precision": mr.plateau.precision,
                                      "plateau_recall": mr.plateau.recall}
            for f in FRACTIONS:
                apes, pct = mr.ape[f], int(f * 100)
                row[f"mdape_{pct}"] = float(np.median(apes)) if apes else math.nan
                row[f"n_{pct}"] = mr.asked[f]
                row[f"answered_{pct}"] = len(apes) / mr.asked[f] if mr.asked[f] else math.nan
                row[f"interval80_coverage_{pct}"] = mr.covered[f] / mr.intervals[f] if mr.intervals[f] else math.nan
            asked = sum(mr.intervals.values())
            row["interval80_coverage"] = sum(mr.covered.values()) / asked if asked else math.nan
            summary.append(row)

    print(f"settings: window={args.window_points} points, alpha={args.alpha}, plateau tol={args.tol}, "
          f"max_steps {'given' if args.max_steps else 'not given'}; data {args.data}")
    print(f"split: {args.split} (LCBench tasks by task-id parity; the learned model is fit on even tasks only, "
          f"odd = held out; pollux never used for fitting or tuning)")
    header = (f"{'dataset':26} {'method':13} {'curves':>6} {'prec':>6} {'recall':>6} | "
              + " | ".join(f"MdAPE@{int(f * 100)}% (n, ans)" for f in FRACTIONS)
              + " | 80% interval coverage (25/50/75, all)")
    print(header)
    print("-" * len(header))
    for r in summary:
        line = (f"{r['dataset']!s:26} {r['method']!s:13} {r['curves']!s:>6} "
                f"{fmt(float(str(r['plateau_precision']))):>6} {fmt(float(str(r['plateau_recall']))):>6} | ")
        if r["method"] != "flowcon_phase":
            line += " | ".join(
                f"{fmt(float(str(r[f'mdape_{int(f * 100)}']))):>6} ({r[f'n_{int(f * 100)}']}, "
                f"{fmt(float(str(r[f'answered_{int(f * 100)}'])))})"
                for f in FRACTIONS
            )
            line += " | " + "/".join(fmt(float(str(r[f"interval80_coverage_{int(f * 100)}"]))) for f in FRACTIONS)
            line += f", {fmt(float(str(r['interval80_coverage'])))}"
        print(line.rstrip())
    print(f"({time.perf_counter() - started:.1f} s)")

    keys = list(dict.fromkeys(k for r in summary for k in r))  # the phase rows have no remaining-time columns
    write_rows(args.out / "summary.csv", [{k: r.get(k, "") for k in keys} for r in summary])
    if detail:
        write_rows(args.out / "remaining_time.csv", detail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
