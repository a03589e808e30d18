"""Regenerate scoring/remaining_params.py: the remaining-steps model, fit on even LCBench tasks only.

Data: every prefix (from min_fit_points points on) of every LCBench curve whose OpenML task id
is even, validation cross-entropy and accuracy both (the odd tasks and every Pollux curve are
held out for benchmarks/convergence_eval). For each prefix: the evidence scoring.convergence
computes (curve_evidence), and the truth from the whole curve as the evaluation defines it
(offline_plateau_index): the steps left to the plateau, and whether the prefix is past it.

Fits (numpy only): linear quantile regressions (10th, 50th, 90th percentile) of
log((left + unit) / (span + unit)) on the prefixes before the plateau, and a logistic regression
of "past the plateau" on all prefixes; both lightly ridge-regularised. Each curve weighs the same
(its prefixes share a weight of 1), so long-growing curves do not dominate. Then two numbers are
calibrated on the same even tasks (see calibrate): the interval's spread and the plateau threshold. Two models: one with
no planned end, and one told each curve's last step as max_steps (as convergence_eval --max-steps).

Usage: python -m benchmarks.fit_remaining [--data DIR] [--out scoring/remaining_params.py]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks.convergence_eval import DATA, FRACTIONS, Curve, in_split, lcbench_curves, offline_plateau_index
from scoring.convergence import ConvergenceSettings, clean_series, curve_evidence, fit_families, normalise
from scoring.remaining import QUANTILES, CurveEvidence, RemainingModel, feature_vector, predict

FloatArray = npt.NDArray[np.float64]
OUT = Path(__file__).resolve().parents[1] / "scoring" / "remaining_params.py"


def prefix_evidence(c: Curve, m: int, settings: ConvergenceSettings, planned: float | None) -> CurveEvidence | None:
    """What estimate() would hand scoring.remaining after seeing the first m points of c."""
    clean = clean_series(c.steps[:m], c.values[:m], c.timestamps[:m])
    norm = normalise(clean.values, settings.higher_is_better, settings.median_points)
    if norm is None or clean.steps.size < settings.min_fit_points:
        return None
    fits = fit_families(clean.steps, norm, settings.fit_grid, settings.fit_families, settings.fit_max_points)
    return curve_evidence(clean.steps, norm, fits, settings, planned)


@dataclass
class Samples:
    evidence: list[CurveEvidence] = field(default_factory=list)
    y: list[float] = field(default_factory=list)  # log ratio of the true steps left; NaN when past the plateau
    left: list[float] = field(default_factory=list)  # true steps left (0 past the plateau)
    past: list[float] = field(default_factory=list)  # 1 past the plateau, else 0
    w: list[float] = field(default_factory=list)  # before the plateau: each curve's rows weigh 1 in all
    asked: list[bool] = field(default_factory=list)  # a prefix convergence_eval asks at (25/50/75 % of the time)

    def extend(self, other: Samples) -> None:
        for name in ("evidence", "y", "left", "past", "w", "asked"):
            getattr(self, name).extend(getattr(other, name))


def asked_prefixes(c: Curve, k_star: int, min_points: int) -> set[int]:
    """The prefix lengths convergence_eval scores remaining time at (see evaluate_curve)."""
    t0, t_star = float(c.timestamps[0]), float(c.timestamps[k_star])
    out = set()
    for frac in FRACTIONS:
        m = int(np.searchsorted(c.timestamps, t0 + frac * (t_star - t0), side="right"))
        if m >= min_points and t_star - float(c.timestamps[m - 1]) > 0:
            out.add(m)
    return out


def collect(curves: Iterator[Curve], settings: ConvergenceSettings, planned_end: bool) -> Samples:
    out = Samples()
    for c in curves:
        s = replace(settings, higher_is_better=c.higher_is_better)
        k_star = offline_plateau_index(c.values, c.higher_is_better, s.plateau_rel_tol)
        if k_star is None:
            continue
        planned = float(c.steps[-1]) if planned_end else None
        asked = asked_prefixes(c, k_star, s.min_fit_points)
        part = Samples()
        for m in range(s.min_fit_points, c.steps.size + 1):
            ev = prefix_evidence(c, m, s, planned)
            if ev is None:
                continue
            past = m - 1 >= k_star
            left = max(0.0, float(c.steps[k_star] - c.steps[m - 1]))
            part.evidence.append(ev)
            part.y.append(math.nan if past else math.log((left + ev.unit) / (ev.span + ev.unit)))
            part.left.append(left)
            part.past.append(float(past))
            part.asked.append(m in asked)
        before = sum(1 for v in part.past if v == 0.0)
        part.w = [0.0 if v else 1.0 / before for v in part.past]
        out.extend(part)
    return out


def quantile_regression(x: FloatArray, y: FloatArray, w: FloatArray, tau: float, ridge: float = 1e-3,
                        iters: int = 200) -> FloatArray:
    """Weighted linear quantile regression by majorise-minimise (Hunter & Lange 2000):
    |r| <= r^2 / (2|r_k|) + |r_k| / 2 turns the pinball loss into weighted least squares."""
    n_feat = x.shape[1]
    reg = ridge * np.eye(n_feat)
    reg[0, 0] = 0.0  # the intercept is not shrunk
    beta = np.linalg.solve(x.T @ (w[:, None] * x) + reg, x.T @ (w * y))
    eps = 1e-4
    for _ in range(iters):
        r = y - x @ beta
        ww = w / (4.0 * (np.abs(r) + eps))
        rhs = x.T @ (ww * y) + 0.5 * (tau - 0.5) * (x.T @ w)
        new = np.linalg.solve(x.T @ (ww[:, None] * x) + reg, rhs)
        if np.max(np.abs(new - beta)) < 1e-7:
            return np.asarray(new, dtype=np.float64)
        beta = new
    return np.asarray(beta, dtype=np.float64)


def logistic_regression(x: FloatArray, t: FloatArray, w: FloatArray, ridge: float = 1e-3,
                        iters: int = 50) -> FloatArray:
    """Weighted ridge logistic regression by Newton's method."""
    n_feat = x.shape[1]
    reg = ridge * np.eye(n_feat)
    reg[0, 0] = 0.0
    beta = np.zeros(n_feat)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ beta, -50, 50)))
        grad = x.T @ (w * (p - t)) + reg @ beta
        hess = x.T @ ((w * p * (1 - p))[:, None] * x) + reg
        step = np.linalg.solve(hess, grad)
        beta = beta - step
        if np.max(np.abs(step)) < 1e-8:
            break
    return np.asarray(beta, dtype=np.float64)


def calibrate(model: RemainingModel, samples: Samples) -> RemainingModel:
    """The interval's spread: the smallest factor whose 80 % interval covers 80 % of the true
    steps left at the prefixes convergence_eval asks at (even tasks only); the plateau threshold:
    the lowest probability at which "at the plateau" is right 90 % of the time (all prefixes)."""
    asked = [i for i, a in enumerate(samples.asked) if a]
    spread = 1.0
    for spread in np.arange(1.0, 4.01, 0.05):
        trial = replace(model, spread=float(spread))
        hits = 0
        for i in asked:
            d = predict(samples.evidence[i], trial)
            hits += int(d.low <= samples.left[i] <= d.high)
        if hits >= 0.8 * len(asked):
            break
    x = np.vstack([feature_vector(e) for e in samples.evidence])
    p = 1.0 / (1.0 + np.exp(-np.clip(x @ np.asarray(model.plateau_coef), -50, 50)))
    past = np.asarray(samples.past) > 0
    threshold = 0.5
    for threshold in np.arange(0.5, 0.991, 0.01):
        said = p >= threshold
        if said.any() and (said & past).sum() / said.sum() >= 0.9:
            break
    return replace(model, spread=round(float(spread), 2), plateau_threshold=round(float(threshold), 2))


def fit_model(samples: Samples) -> RemainingModel:
    x = np.vstack([feature_vector(e) for e in samples.evidence])
    y = np.asarray(samples.y)
    past = np.asarray(samples.past)
    w = np.asarray(samples.w)
    before = past == 0.0
    coef = [quantile_regression(x[before], y[before], w[before], q) for q in QUANTILES]
    plateau = logistic_regression(x, past, np.ones_like(past))  # every prefix weighs 1
    model = RemainingModel(quantiles=QUANTILES, coef=tuple(tuple(float(v) for v in c) for c in coef),
                           plateau_coef=tuple(float(v) for v in plateau))
    return calibrate(model, samples)


def _tuple(a: tuple[float, ...], indent: str) -> str:
    """A tuple literal, eight numbers a line (the file stays within the line length)."""
    cells = [f"{v:.6g}" for v in a]
    lines = [", ".join(cells[i:i + 8]) for i in range(0, len(cells), 8)]
    return "(\n" + "".join(f"{indent}    {line},\n" for line in lines) + f"{indent})"


def render(models: dict[str, RemainingModel], note: str) -> str:
    lines = [
        '"""Parameters of scoring.remaining\'s model. GENERATED by benchmarks/fit_remaining.py; do not edit.',
        "",
        note,
        '"""',
        "",
        "from scoring.remaining import RemainingModel",
        "",
    ]
    for name, m in models.items():
        lines += [f"{name} = RemainingModel(", f"    quantiles={m.quantiles!r},", "    coef=("]
        lines += [f"        {_tuple(row, '        ')}," for row in m.coef]
        lines += ["    ),", f"    plateau_coef={_tuple(m.plateau_coef, '    ')},", f"    spread={m.spread!r},",
                  f"    plateau_threshold={m.plateau_threshold!r},", ")", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=DATA, help="folder holding lcbench/curves.csv")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=0, help="at most this many curves per metric (0 = all)")
    args = ap.parse_args(argv)
    settings = ConvergenceSettings()
    started = time.perf_counter()
    models: dict[str, RemainingModel] = {}
    counts: dict[str, int] = {}
    for name, planned in (("OPEN_END", False), ("PLANNED_END", True)):
        samples = Samples()
        for metric, hib in (("val_cross_entropy", False), ("val_accuracy", True)):
            curves = [c for c in lcbench_curves(args.data / "lcbench/curves.csv", metric, hib) if in_split(c, "even")]
            if args.limit:
                curves = curves[: args.limit]
            samples.extend(collect(iter(curves), settings, planned))
        if not samples.evidence:
            raise SystemExit(f"no usable prefixes in {args.data / 'lcbench/curves.csv'}")
        counts[name] = len(samples.evidence)
        models[name] = fit_model(samples)
        print(f"{name}: {len(samples.evidence)} prefixes, {sum(1 for v in samples.past if v == 0)} before the "
              f"plateau; spread {models[name].spread}, plateau threshold {models[name].plateau_threshold} "
              f"({time.perf_counter() - started:.0f} s)")
    note = (f"Fit on the even-numbered OpenML tasks of lcbench/curves.csv (val_cross_entropy and val_accuracy;\n"
            f"{counts['OPEN_END']} prefixes), ConvergenceSettings() defaults, quantiles {QUANTILES}.\n"
            f"Regenerate: python -m benchmarks.fit_remaining"
            + (f" --limit {args.limit}" if args.limit else ""))
    args.out.write_text(render(models, note))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
