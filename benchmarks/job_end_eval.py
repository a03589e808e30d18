"""When does the job end? The estimators on the real training runs, held out by run family.

Each run of benchmarks/data/real_curves (made by benchmarks.curves.train_runs; SOURCE.md there)
is replayed as the job would have reported it: at 25 / 50 / 75 % of the run's true duration the
estimator sees the points reported by then and answers remaining_seconds with its 80 % interval.
The truth is the run's true end minus the last reported point's time (the estimator's own frame,
as in benchmarks.convergence_eval). Per group (the run's rule) and fraction: median APE, the
share of asks answered, 80 % coverage (truth inside the interval, over the asks) and the share of
answers whose point lies inside its own interval.

What each run declares (and reports), whatever the estimator:
  planned         max_steps = its planned end; reports the training loss every kept step
  early_stopping  max_steps = its cap, early stopping (patience, min_delta, the monitored
                  validation series and direction); reports the training loss every kept step and
                  each evaluation's val_loss / val_metric
  target          max_steps = its cap, target on its monitored validation series; reports that
                  series at each evaluation as its value (the API's target_metric is in the
                  reported value's units)
  none            nothing; reports the training loss (its end, a cap it never told, is unknown)
Estimators (each a thin adapter from JobView to Answer):
  api          extender.http.progress_api.job_summary, what GET /v1/jobs/{ns}/{job} answers, with
               the service's default convergence settings: it takes max_steps and target_metric, and
               the early-stopping rule where it has a parameter for it (issue 35); before that
               early-stopping runs give it only their cap
  convergence  scoring.convergence.estimate, what job_summary answered before issue 35
  job_end      scoring.job_end.predict_end (issue 35), when this tree has it
  mean_rate    a reference: the declared max_steps at the run's mean seconds per step so far
Split: the rule, model and schedule choices of the new estimator may be tuned on TUNE_FAMILIES;
--split heldout (default) reports the other families only.
Clock (--clock, default cpu): every second (the points' times, the true end, the answers) is read
on the training thread's CPU time, the job's own time, as it would run on an accelerator of its
own. The runs were trained on a 2-core machine shared with other sessions, whose load changes a
run's wall step time by tens of per cent (SOURCE.md): --clock wall measures that load too.

--data long reads the second, third and fourth campaigns (benchmarks/data/real_curves_long, runs of one to
five CPU minutes, made after the choices above but early stopping's stall share and the calibration on
all tuning runs) and the fifth, early-stopping runs of the tuning families made to tune on; --split leaves
out the tuning families as on the short set.

Usage: python -m benchmarks.job_end_eval [--data short|long|DIR] [--split heldout|tune|all] [--clock cpu|wall]
                                         [--out DIR]
                                         [--estimators api convergence job_end mean_rate]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.csv_rows import write_rows
from benchmarks.curves.real_curves import CLOCKS, RULES, FloatArray, RealRun, data_dir, load_runs, on_clock
from extender.http.progress_api import job_summary
from extender.progress.store import JobHistory
from scoring.convergence import estimate
from scoring.settings import TrackerSettings

FRACTIONS = (0.25, 0.5, 0.75)
TUNE_FAMILIES = frozenset({"digits_mlp", "cancer_logreg", "synth_reg_mlp", "chars_gru"})
EPOCH = 1.7e9  # the replay's wall clock starts here (any real-looking timestamp)


@dataclass(frozen=True)
class JobView:
    """What a job has reported by the time of the question, and the rule it declared."""

    steps: FloatArray  # the reported series: training loss (target runs: the monitored series)
    values: FloatArray
    timestamps: FloatArray
    higher_is_better: bool
    eval_steps: FloatArray  # every evaluation so far, and the series the rule watches
    eval_timestamps: FloatArray
    monitored: FloatArray
    monitor: str
    monitor_higher_is_better: bool
    rule: str
    max_steps: float | None  # declared planned end or cap; None when nothing is declared
    target: float | None
    patience: int | None
    min_delta: float | None


@dataclass(frozen=True)
class Answer:
    remaining_seconds: float  # NaN: no answer
    low: float
    high: float


Estimator = Callable[[JobView], Answer]


def view_at(run: RealRun, seconds: float) -> JobView:
    """The run as reported up to `seconds` after its start."""
    t, e = run.train_seconds <= seconds, run.eval_seconds <= seconds
    spec = run.spec
    declared = run.rule != "none"
    ev_steps, ev_ts, mon = run.eval_steps[e], EPOCH + run.eval_seconds[e], run.monitored()[e]
    if run.rule == "target":
        steps, values, ts, hib = ev_steps, mon, ev_ts, run.higher_is_better
    else:
        steps, values, ts, hib = run.train_steps[t], run.train_loss[t], EPOCH + run.train_seconds[t], False
    return JobView(
        steps=steps, values=values, timestamps=ts, higher_is_better=hib,
        eval_steps=ev_steps, eval_timestamps=ev_ts, monitored=mon, monitor=spec["monitor"],
        monitor_higher_is_better=run.higher_is_better, rule=run.rule,
        max_steps=float(run.max_steps) if declared else None,
        target=float(spec["target"]) if run.rule == "target" else None,
        patience=int(spec["patience"]) if run.rule == "early_stopping" else None,
        min_delta=float(spec["min_delta"]) if run.rule == "early_stopping" else None,
    )


def _interval(pair: Sequence[float] | None) -> tuple[float, float]:
    return (float(pair[0]), float(pair[1])) if pair else (math.nan, math.nan)


def _early_stopping(view: JobView) -> Any:
    """The run's rule as scoring.stopping.EarlyStopping (issue 35), None without one."""
    if view.patience is None:
        return None
    st: Any = importlib.import_module("scoring.stopping")
    return st.EarlyStopping(patience=view.patience, min_delta=view.min_delta or 0.0, metric=view.monitor,
                            higher_is_better=view.monitor_higher_is_better)


def api(view: JobView) -> Answer:
    """GET /v1/jobs' summary: job_summary over the job's history with the service's defaults,
    given the early-stopping rule and its series where job_summary takes them (issue 35)."""
    history = JobHistory("real-runs", "replay", view.steps.astype(np.int64), view.values, view.timestamps,
                         view.higher_is_better)
    ms = int(view.max_steps) if view.max_steps is not None else None
    rule: dict[str, Any] = {}
    if view.patience is not None and "early_stopping" in inspect.signature(job_summary).parameters:
        rule = {"early_stopping": _early_stopping(view), "monitored": (view.eval_steps, view.monitored)}
    s = job_summary(history, TrackerSettings(), max_steps=ms, target=view.target, **rule)
    low, high = _interval(s["remaining_seconds_interval"])
    rem = s["remaining_seconds"]
    return Answer(float(rem) if rem is not None else math.nan, low, high)


def job_end(view: JobView, forecast: Any = None) -> Answer:
    """scoring.job_end.predict_end (issue 35), looked up at run time so that this module runs on
    trees without it (an ImportError there). The one place to edit if its signature changes.
    forecast: its ForecastSettings (None: the default, with the calibrated intervals)."""
    je: Any = importlib.import_module("scoring.job_end")
    st: Any = importlib.import_module("scoring.stopping")
    es = _early_stopping(view)
    rule = st.StoppingRule(max_steps=view.max_steps if view.max_steps is not None else math.nan,
                           target=view.target if view.target is not None else math.nan,
                           higher_is_better=view.higher_is_better, early_stopping=es)
    end = je.predict_end(view.steps, view.values, view.timestamps, rule, TrackerSettings(),
                         monitored=(view.eval_steps, view.monitored) if es is not None else None,
                         **({} if forecast is None else {"forecast": forecast}))
    return Answer(float(end.remaining_seconds), float(end.seconds_low), float(end.seconds_high))


def convergence(view: JobView) -> Answer:
    """scoring.convergence.estimate as job_summary called it before issue 35 (remaining_model auto:
    the learnt median with a planned end, else the curve families' mean): kept beside the new
    estimator after the merge, so that both are measured in the same run."""
    s = replace(TrackerSettings(), higher_is_better=view.higher_is_better)
    e = estimate(view.steps, view.values, view.timestamps, s, max_steps=view.max_steps, target=view.target)
    return Answer(e.remaining_seconds, e.remaining_seconds_low, e.remaining_seconds_high)


def mean_rate(view: JobView) -> Answer:
    """A reference, not a candidate: the declared max_steps at the run's mean time per step so
    far. With a planned end its error is the step rate's drift alone (no interval)."""
    if view.max_steps is None or view.steps.size < 2:
        return Answer(math.nan, math.nan, math.nan)
    per_step = (view.timestamps[-1] - EPOCH) / view.steps[-1]
    return Answer(max(0.0, view.max_steps - float(view.steps[-1])) * float(per_step), math.nan, math.nan)


ESTIMATORS: dict[str, Estimator] = {"api": api, "convergence": convergence, "job_end": job_end,
                                    "mean_rate": mean_rate}


@dataclass
class Tally:
    asked: int = 0
    answered: int = 0
    intervals: int = 0  # answers with a finite interval
    covered: int = 0
    inside: int = 0
    ape: list[float] = field(default_factory=list)

    def add(self, truth: float, a: Answer) -> float:
        self.asked += 1
        if not math.isfinite(a.remaining_seconds):
            return math.nan
        self.answered += 1
        ape = abs(a.remaining_seconds - truth) / truth
        self.ape.append(ape)
        if math.isfinite(a.low) and math.isfinite(a.high):
            self.intervals += 1
            self.covered += int(a.low <= truth <= a.high)
            self.inside += int(a.low <= a.remaining_seconds <= a.high)
        return ape


def evaluate(runs: Sequence[RealRun], estimators: dict[str, Estimator]
             ) -> tuple[dict[tuple[str, str, float], Tally], list[dict[str, object]]]:
    """Tallies by (estimator, rule, fraction) and one row per (run, fraction, estimator)."""
    tallies: dict[tuple[str, str, float], Tally] = defaultdict(Tally)
    rows: list[dict[str, object]] = []
    for run in runs:
        for frac in FRACTIONS:
            view = view_at(run, frac * run.true_end_seconds)
            if view.steps.size == 0:
                continue
            truth = run.true_end_seconds - (float(view.timestamps[-1]) - EPOCH)
            if not truth > 0:
                continue
            for name, est in estimators.items():
                a = est(view)
                ape = tallies[(name, run.rule, frac)].add(truth, a)
                rows.append({"run": run.run_id, "family": run.family, "rule": run.rule, "fraction": frac,
                             "estimator": name, "true_remaining_s": round(truth, 3),
                             "remaining_s": a.remaining_seconds, "low_s": a.low, "high_s": a.high, "ape": ape})
    return tallies, rows


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def report(tallies: dict[tuple[str, str, float], Tally], runs: Sequence[RealRun], estimators: Sequence[str]) -> str:
    count = {r: sum(1 for x in runs if x.rule == r) for r in RULES}
    lines = [f"{'':34}" + "".join(f"{f'at {int(f * 100)} % of the run':^28}" for f in FRACTIONS) + "   all",
             f"{'estimator':11} {'rule':15} {'runs':>4}  " + "".join(
                 f"  {'mdAPE':>6} {'ans':>5} {'cov80':>6} {'in':>6}" for _ in FRACTIONS) + f"  {'cov80':>6}"]
    for name in estimators:
        for rule in RULES:
            cells = []
            pooled = [tallies.get((name, rule, f), Tally()) for f in FRACTIONS]
            for t in pooled:
                md = float(np.median(t.ape)) if t.ape else math.nan
                n = max(t.asked, 1)
                inside = t.inside / t.intervals if t.intervals else math.nan
                cover = t.covered / n if t.intervals else math.nan
                cells.append(f"  {_pct(md):>6} {t.answered / n:5.0%} {_pct(cover):>6} {_pct(inside):>6}")
            asked, covered = sum(t.asked for t in pooled), sum(t.covered for t in pooled)
            cells.append(f"  {_pct(covered / asked if asked and any(t.intervals for t in pooled) else math.nan):>6}")
            lines.append(f"{name:11} {rule:15} {count[rule]:>4}  " + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=data_dir, default=None,
                    help="short (default: the shipped real_curves), long (real_curves_long: runs of minutes, "
                         "the second to fifth campaigns), gpu (real_curves_gpu: read it with --clock wall) or "
                         "a folder of runs.csv")
    ap.add_argument("--split", choices=("heldout", "tune", "all"), default="heldout")
    ap.add_argument("--clock", choices=CLOCKS, default="cpu",
                    help="cpu: the training thread's CPU seconds (the job's own time); wall: wall seconds on "
                         "the shared machine that trained the runs")
    ap.add_argument("--estimators", nargs="+", choices=sorted(ESTIMATORS), default=list(ESTIMATORS))
    ap.add_argument("--runs", nargs="*", default=None, help="only these run ids")
    ap.add_argument("--out", type=Path, default=None, help="write one CSV row per (run, fraction, estimator)")
    args = ap.parse_args(argv)
    runs = load_runs(args.data)
    if args.split != "all":
        runs = [r for r in runs if (r.family in TUNE_FAMILIES) == (args.split == "tune")]
    if args.runs:
        runs = [r for r in runs if r.run_id in args.runs]
    try:
        runs = [on_clock(r, args.clock) for r in runs]
    except ValueError as e:
        ap.error(str(e))
    chosen = {}
    for name in args.estimators:
        try:
            if name == "job_end":
                importlib.import_module("scoring.job_end")
            chosen[name] = ESTIMATORS[name]
        except ImportError:
            print(f"{name}: not in this tree (scoring.job_end missing); left out")
    families = sorted({r.family for r in runs})
    clock = "CPU seconds of the training thread" if args.clock == "cpu" else "wall seconds"
    print(f"{len(runs)} runs ({args.split}: {', '.join(families)}); clock: {args.clock} ({clock}); "
          "fractions of each run's true duration")
    tallies, rows = evaluate(runs, chosen)
    print(report(tallies, runs, list(chosen)))
    print("mdAPE: median |predicted - true| / true remaining seconds; ans: share answered; "
          "cov80: share of asks whose truth is in the 80 % interval (all: over the three fractions); "
          "in: share of answers inside their interval (n/a: no interval)")
    if args.out is not None and rows:
        print(f"rows: {write_rows(args.out / 'job_end_eval.csv', rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
