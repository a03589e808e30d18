"""Early stopping's end on the Pollux artifact's validation traces, the curves the simulator's jobs report.

For each application with traced validation curves, at each traced batch size, `--draws` noise draws
(the simulator's: TelemetrySettings.metric_noise relative noise, benchmarks.sim.ends.metric_noise)
give the reported per-epoch series; early stopping (benchmarks.sim.ends.EARLY_STOPPING) is replayed
on it, and where it fires scoring.job_end.predict_end is asked at 25 / 50 / 75 % of the epochs
before it fires. A regression set beside the real runs of benchmarks.job_end_eval: the traces'
accuracies move in steps where their learning rate decays, which those runs rarely do
(docs/progress-api.md, "Early stopping reads the recent part of its series").

Usage: python -m benchmarks.job_end_traces [--draws N] [--stopping-recent-share S] [--seed K]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmarks import data_paths
from benchmarks.sim.ends import EARLY_STOPPING, metric_noise
from benchmarks.sim.engine import TelemetrySettings
from benchmarks.sim.jobmodel import load_profiles
from scoring.convergence import ConvergenceSettings
from scoring.forecast_settings import ForecastSettings
from scoring.job_end import predict_end, rule_state
from scoring.stopping import StoppingRule

FRACTIONS = (0.25, 0.5, 0.75)
EPOCH_STEPS = 100.0  # steps an epoch (any unit: the errors are relative)


@dataclass
class AppErrors:
    curves: int = 0  # curves on which the rule fired
    ape: dict[float, list[float]] = field(default_factory=lambda: {f: [] for f in FRACTIONS})  # inf: unknown
    covered: int = 0
    asked: int = 0


def evaluate(forecast: ForecastSettings, draws: int = 8) -> dict[str, AppErrors]:
    """Per application: the errors of the steps left to where early stopping fires."""
    conv, noise_sd = ConvergenceSettings(), TelemetrySettings().metric_noise
    out: dict[str, AppErrors] = {}
    for name, app in sorted(load_profiles(data_paths.pollux_dir() / "traces").app_objects().items()):
        errs = out.setdefault(name, AppErrors())
        es = dataclasses.replace(EARLY_STOPPING, higher_is_better=app.metric_increases)
        rule = StoppingRule(early_stopping=es, higher_is_better=app.metric_increases)
        steps = np.arange(1, app.max_epochs + 1, dtype=np.float64) * EPOCH_STEPS
        for batch in app.batch_sizes:
            for draw in range(draws):
                z = metric_noise(draw, sum(map(ord, name)), app.max_epochs)
                values = np.array([app.metric(float(batch), k) * (1.0 + noise_sd * float(z[k]))
                                   for k in range(app.max_epochs)])
                fired = rule_state(-values if app.metric_increases else values, EARLY_STOPPING)[2]
                if fired < 0:
                    continue
                errs.curves += 1
                for frac in FRACTIONS:
                    k = max(2, round(frac * (fired + 1)))
                    if k > fired:
                        continue
                    end = predict_end(steps[:k], values[:k], steps[:k] / 10.0, rule, conv, forecast=forecast)
                    truth = float(steps[fired] - steps[k - 1])
                    errs.asked += 1
                    if not math.isfinite(end.remaining_steps):
                        errs.ape[frac].append(math.inf)
                        continue
                    errs.ape[frac].append(abs(end.remaining_steps - truth) / max(truth, 1.0))
                    errs.covered += int(end.steps_low <= truth <= end.steps_high)
    return {n: e for n, e in out.items() if e.curves}


def pooled(errors: dict[str, AppErrors]) -> float:
    """Median error over every answered ask of every application."""
    ape = [a for e in errors.values() for f in FRACTIONS for a in e.ape[f] if math.isfinite(a)]
    return float(np.median(ape)) if ape else math.nan


def _row(name: str, e: AppErrors) -> str:
    cells = []
    for f in FRACTIONS:
        answered = [a for a in e.ape[f] if math.isfinite(a)]
        cells.append(f"{100 * np.median(answered):6.1f}% {len(answered):3d}/{len(e.ape[f]):3d}" if answered else
                     f"{'n/a':>7} {0:3d}/{len(e.ape[f]):3d}")
    return f"{name:12s} {e.curves:6d}  " + "  ".join(cells) + f"  {100 * e.covered / max(e.asked, 1):6.1f}%"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=8, help="noise draws per application and batch size")
    p.add_argument("--stopping-recent-share", type=float, default=None,
                   help="ForecastSettings.stopping_recent_share (default: the service's)")
    p.add_argument("--seed", type=int, default=0, help="ForecastSettings.seed")
    a = p.parse_args(argv)
    fs = ForecastSettings(seed=a.seed)
    if a.stopping_recent_share is not None:
        fs = dataclasses.replace(fs, stopping_recent_share=a.stopping_recent_share)
    errors = evaluate(fs, a.draws)
    print(f"Pollux validation traces, early stopping (patience {EARLY_STOPPING.patience}) where it fires; "
          f"stopping_recent_share {fs.stopping_recent_share:g}, forecast seed {fs.seed}, {a.draws} noise draws")
    print(f"{'app':12s} {'curves':>6s}  " + "  ".join(f"{'at ' + str(int(100 * f)) + ' %':>15s}" for f in FRACTIONS)
          + "    cov80")
    for name, e in errors.items():
        print(_row(name, e))
    total = AppErrors(curves=sum(e.curves for e in errors.values()),
                      ape={f: [x for e in errors.values() for x in e.ape[f]] for f in FRACTIONS},
                      covered=sum(e.covered for e in errors.values()), asked=sum(e.asked for e in errors.values()))
    print(_row("all", total))
    print(f"pooled median error over the answered asks: {100 * pooled(errors):.1f}%")
    print("cells: median |predicted - true| / true steps left, answered / asked; "
          "cov80: share of asks in the 80 % interval")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
