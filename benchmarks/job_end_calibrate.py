"""Calibrate the job end's 80 % intervals per stopping rule on the tuning families' real runs.

For every ask of benchmarks.job_end_eval (a run of TUNE_FAMILIES at 25 / 50 / 75 % of its
duration, CPU clock; the short set's tuning runs and the long set's)
scoring.job_end.predict_end answers with unit scales (its raw interval).
Per rule and side, each answer needs a scale s for the rescaled side (scoring.end_interval.rescale)
to reach the truth: below the point ln(point / truth) / ln(point / low), above it
ln(truth / point) / ln(high / point); 0 when the truth is on the other side, inf when that side
has no width. A side's scale is the smallest under which at most 10 % of the rule's asks miss on
that side, unanswered asks counted as misses on both sides' shared budget (split conformal
calibration of each tail at 80 % in all). The printed pairs are EndIntervalSettings' defaults;
tests/sim/test_job_end_calibrate.py checks that they still are.

Usage: python -m benchmarks.job_end_calibrate [--data DIR [DIR ...]]
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Sequence
from pathlib import Path

from benchmarks import job_end_eval
from benchmarks.curves.real_curves import default_dir, load_runs, long_dir, on_clock
from scoring.end_interval import RULE_GROUPS, UNSCALED, EndIntervalSettings, IntervalScale
from scoring.forecast_settings import ForecastSettings

COVERAGE = 0.8
MIN_SCALE = 0.05  # a side never shrinks below 5 % of its raw log-width (IntervalScale needs > 0)
MAX_SCALE = 10.0  # nor grows past 10x: beyond that the misses are out of any scale's reach (zero-width sides)


def side_needs(truth: float, a: job_end_eval.Answer) -> tuple[float, float]:
    """(low, high) scale each side needs for the interval to hold the truth; inf: no scale does."""
    p, lo, hi = a.remaining_seconds, a.low, a.high
    if not math.isfinite(p):
        return math.inf, math.inf
    if p <= 0:  # rescale leaves a zero point's interval as it is
        return 0.0, 0.0 if truth <= hi else math.inf
    if truth < p:
        if lo <= 0:
            return 0.0, 0.0
        return (math.log(p / truth) / math.log(p / lo) if lo < p else math.inf), 0.0
    if truth > p:
        return 0.0, (math.log(truth / p) / math.log(hi / p) if hi > p else math.inf)
    return 0.0, 0.0


def tail_scale(needs: Sequence[float], allowed: float) -> float:
    """The smallest scale with at most `allowed` needs above it, within [MIN_SCALE, MAX_SCALE]
    (MAX_SCALE: more needs than allowed are out of any scale's reach)."""
    ordered = sorted(needs, reverse=True)
    k = max(0, math.floor(allowed + 1e-9))
    return min(MAX_SCALE, max(MIN_SCALE, ordered[k])) if k < len(ordered) else MIN_SCALE


def calibrate(data: Sequence[Path] | None = None) -> tuple[EndIntervalSettings, list[str]]:
    """The per-rule scales, from the tuning runs of the folders `data` (default: the short and the
    long set), and the lines that explain them."""
    folders = (default_dir(), long_dir()) if data is None else data
    runs = [on_clock(r, "cpu") for d in folders for r in load_runs(d, set(job_end_eval.TUNE_FAMILIES))]
    raw = functools.partial(job_end_eval.job_end, forecast=ForecastSettings(intervals=UNSCALED))
    _, rows = job_end_eval.evaluate(runs, {"raw": raw})
    lines = [f"{len(runs)} runs (tune: {', '.join(sorted(job_end_eval.TUNE_FAMILIES))}); clock: cpu; "
             f"raw intervals of scoring.job_end at 25 / 50 / 75 %",
             f"{'rule':15} {'asks':>4} {'unans':>5} {'raw cov80':>9} {'scale low':>9} {'scale high':>10} {'cov80':>6}"]
    scales: dict[str, IntervalScale] = {}
    for group in RULE_GROUPS:
        mine = [r for r in rows if r["rule"] == group]
        needs = [side_needs(float(str(r["true_remaining_s"])), job_end_eval.Answer(
            float(str(r["remaining_s"])), float(str(r["low_s"])), float(str(r["high_s"])))) for r in mine]
        unanswered = sum(1 for r in mine if not math.isfinite(float(str(r["remaining_s"]))))
        answered = [n for r, n in zip(mine, needs, strict=True) if math.isfinite(float(str(r["remaining_s"])))]
        allowed = max(0.0, (1.0 - COVERAGE) * len(mine) - unanswered) / 2.0
        lo = tail_scale([n[0] for n in answered], allowed)
        hi = tail_scale([n[1] for n in answered], allowed)
        # the defaults carry two decimals, rounded up (wider): the printed coverage is theirs
        scale = IntervalScale(math.ceil(lo * 100) / 100, math.ceil(hi * 100) / 100)
        scales[group] = scale
        raw_cov = sum(1 for n in answered if n[0] <= 1.0 and n[1] <= 1.0) / max(1, len(mine))
        cov = sum(1 for n in answered if n[0] <= scale.low and n[1] <= scale.high) / max(1, len(mine))
        lines.append(f"{group:15} {len(mine):>4} {unanswered:>5} {raw_cov:>9.1%} {scale.low:>9.2f} "
                     f"{scale.high:>10.2f} {cov:>6.1%}")
    return EndIntervalSettings(**scales), lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, nargs="+", default=None,
                    help="folders of runs.csv (default: the shipped real_curves and real_curves_long)")
    args = ap.parse_args(argv)
    settings, lines = calibrate(args.data)
    print("\n".join(lines))
    current = EndIntervalSettings()
    print("EndIntervalSettings defaults: " + ("match" if current == settings else f"differ (now {current})"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
