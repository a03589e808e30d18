"""Where the learnt plateau detector is wrong: its false alarms per model, and how far from the plateau they are.

A diagnostic beside benchmarks/convergence_eval (issue 21), which reports one precision / recall per
data set: "plateaued" (scoring.remaining's plateau_probability over the model's threshold, as
estimate() says it) against "the prefix is past the offline plateau" (convergence_eval's
offline_plateau_index), over every prefix, but grouped by the model that produced the curve (Pollux:
cifar10, imagenet, ...; LCBench: the metric). Per group:
  - prefixes, the share past the plateau (precision depends on it: the same detector is right more
    often on curves that run long after their plateau), TP / FP / FN, precision and recall, and
    the false-alarm rate (FP over the prefixes before the plateau), which does not depend on it;
  - for the false alarms, how much of the curve's total improvement was still ahead (the running best's
    distance to the final best, in the units of the truth's tolerance: 1 = just outside it);
then, for the whole set, precision / recall if "plateaued" began at other probabilities (the shipped
threshold is chosen on the even LCBench tasks only; this only shows how the two trade on this set),
and precision / recall against a variant of the truth whose final level is the median of the last
TAIL_POINTS points instead of the (median-of-3-filtered) final best, so that a noisy tail's luckiest
point does not push the plateau later.

Usage: python -m benchmarks.plateau_errors [--dataset pollux|lcbench/val_cross_entropy|lcbench/val_accuracy]
       [--split odd] [--data DIR]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks.convergence_eval import (
    DATA,
    Counts,
    Curve,
    in_split,
    lcbench_curves,
    offline_plateau_index,
    pollux_curves,
)
from scoring.convergence import ConvergenceSettings, estimate, remaining_model_for

FloatArray = npt.NDArray[np.float64]

THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
TAIL_POINTS = 5


def smoothed_oriented(values: FloatArray, higher_is_better: bool) -> FloatArray:
    """Lower is better, median of 3 (edges repeated): the series offline_plateau_index reads."""
    s = -values if higher_is_better else values
    if s.size >= 3:
        padded = np.pad(s, 1, mode="edge")
        s = np.median(np.lib.stride_tricks.sliding_window_view(padded, 3), axis=1)
    return np.asarray(s, dtype=np.float64)


def remaining_gap(values: FloatArray, higher_is_better: bool) -> FloatArray:
    """Per point: the share of the curve's total improvement still ahead of its running best."""
    s = smoothed_oriented(values, higher_is_better)
    best = np.minimum.accumulate(s)
    total = float(s.max() - best[-1])
    return (best - best[-1]) / total if total > 0 else np.zeros_like(best)


def tail_level_plateau_index(values: FloatArray, higher_is_better: bool, tol: float,
                             tail: int = TAIL_POINTS) -> int | None:
    """As offline_plateau_index, but within tol of the median of the last `tail` points (the
    tail's level), not of the final best."""
    s = smoothed_oriented(values, higher_is_better)
    best = np.minimum.accumulate(s)
    final = float(np.median(s[-tail:]))
    total = float(s.max() - final)
    if not total > 0:
        return None
    return int(np.argmax(best - final <= tol * total))


@dataclass
class Group:
    counts: Counts = field(default_factory=Counts)
    alarm_gaps: list[float] = field(default_factory=list)  # share of the improvement ahead at each false alarm


@dataclass
class Tally:
    groups: dict[str, Group] = field(default_factory=dict)
    scored: list[tuple[float, bool, bool]] = field(default_factory=list)  # (probability, past, past by the tail level)


def group_of(c: Curve) -> str:
    return c.name.split("/")[0] if c.dataset == "pollux" else c.dataset


def tally_curve(c: Curve, settings: ConvergenceSettings, tally: Tally) -> None:
    s = replace(settings, higher_is_better=c.higher_is_better)
    k_star = offline_plateau_index(c.values, c.higher_is_better, s.plateau_rel_tol)
    k_tail = tail_level_plateau_index(c.values, c.higher_is_better, s.plateau_rel_tol)
    if k_star is None or k_tail is None:
        return
    gap = remaining_gap(c.values, c.higher_is_better)
    g = tally.groups.setdefault(group_of(c), Group())
    for m in range(s.min_fit_points, c.steps.size + 1):
        e = estimate(c.steps[:m], c.values[:m], c.timestamps[:m], s)
        past = m - 1 >= k_star
        g.counts.add(e.plateaued, past)
        if e.plateaued and not past:
            g.alarm_gaps.append(float(gap[m - 1]))
        p = e.plateau_probability
        tally.scored.append((p if math.isfinite(p) else 0.0, past, m - 1 >= k_tail))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def _ratio(a: int, b: int) -> float:
    return a / b if b else math.nan


def report(tally: Tally, tol: float, threshold: float) -> list[str]:
    lines = [f"{'group':26} {'prefixes':>8} {'past':>6} {'TP':>5} {'FP':>5} {'FN':>5} {'prec':>6} {'recall':>6} "
             f"{'FP rate':>7} | improvement ahead at the false alarms, in tolerances (10/50/90 %), share <= 2"]
    total = Group()
    for g in tally.groups.values():
        total.alarm_gaps += g.alarm_gaps
        for k in ("tp", "fp", "fn", "tn"):
            setattr(total.counts, k, getattr(total.counts, k) + getattr(g.counts, k))
    rows = sorted(tally.groups.items())
    for name, g in (*rows, ("all", total)) if len(rows) > 1 else rows:
        c = g.counts
        n = c.tp + c.fp + c.fn + c.tn
        if not n:  # curves too short for a fit (Pollux's bert: 2 points)
            continue
        line = (f"{name:26} {n:>8} {_pct(_ratio(c.tp + c.fn, n)):>6} {c.tp:>5} {c.fp:>5} {c.fn:>5} "
                f"{_pct(c.precision):>6} {_pct(c.recall):>6} {_pct(_ratio(c.fp, c.fp + c.tn)):>7} |")
        if g.alarm_gaps:
            q = np.quantile(np.asarray(g.alarm_gaps) / tol, (0.1, 0.5, 0.9))
            near = float(np.mean(np.asarray(g.alarm_gaps) <= 2 * tol))
            line += f" {q[0]:.1f} / {q[1]:.1f} / {q[2]:.1f}, {_pct(near)}"
        lines.append(line.rstrip())
    p = np.asarray([s[0] for s in tally.scored])
    past = np.asarray([s[1] for s in tally.scored], dtype=bool)
    past_tail = np.asarray([s[2] for s in tally.scored], dtype=bool)
    lines.append(f"precision / recall if 'plateaued' began at (the model's threshold: {threshold}):")
    for t in (*THRESHOLDS, threshold):
        said = p >= t
        lines.append(f"  {t:.2f}: {_pct(_ratio(int((said & past).sum()), int(said.sum())))} / "
                     f"{_pct(_ratio(int((said & past).sum()), int(past.sum())))}")
    said = p >= threshold
    lines.append(f"against the tail-level truth (final level = median of the last {TAIL_POINTS} points): "
                 f"precision {_pct(_ratio(int((said & past_tail).sum()), int(said.sum())))} / recall "
                 f"{_pct(_ratio(int((said & past_tail).sum()), int(past_tail.sum())))} "
                 f"({int((past != past_tail).sum())} prefixes change side)")
    return lines


def curves_of(dataset: str, data: Path, split: str) -> Iterator[Curve]:
    if dataset == "pollux":
        yield from pollux_curves(data / "pollux/traces")
        return
    metric = dataset.split("/", 1)[1]
    for c in lcbench_curves(data / "lcbench/curves.csv", metric, metric == "val_accuracy"):
        if in_split(c, split):
            yield c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dataset", default="pollux",
                    choices=("pollux", "lcbench/val_cross_entropy", "lcbench/val_accuracy"))
    ap.add_argument("--split", choices=("all", "even", "odd"), default="odd", help="LCBench tasks by task-id parity")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)
    # as convergence_eval's defaults (the window settings do not reach the learnt model)
    settings = ConvergenceSettings(window_s=0.0, window_points=4, alpha=0.05, plateau_rel_tol=0.05)
    tally = Tally()
    for c in curves_of(args.dataset, args.data, args.split):
        tally_curve(c, settings, tally)
    if not tally.scored:
        raise SystemExit(f"no curves with a plateau for {args.dataset} under {args.data}")
    print(f"{args.dataset}" + (f", split {args.split}" if args.dataset != "pollux" else "")
          + f"; plateau tol {settings.plateau_rel_tol}, no planned end")
    for line in report(tally, settings.plateau_rel_tol, remaining_model_for(None).plateau_threshold):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
