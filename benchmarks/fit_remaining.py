"""Regenerate scoring/data/remaining_params.json: the remaining-steps model, fit on even LCBench tasks only.

Data: every prefix (from min_fit_points points on) of every LCBench curve whose OpenML task id
is even, validation cross-entropy and accuracy both (the odd tasks and every Pollux curve are
held out for benchmarks/convergence_eval). For each prefix: the evidence scoring.convergence
computes (curve_evidence, with the prefix's shape), and the truth from the whole curve as the
evaluation defines it (offline_plateau_index): the steps left to the plateau, and whether the
prefix is past it.

Fits (numpy only, no learning library): gradient-boosted regression trees (depth 3, 60 trees,
learning rate 0.1, half the rows per tree, splits on 48 quantile bins per feature, thresholds and
leaves kept to 6 significant digits, as the shipped parameters have always been) for the 10th,
50th and 90th percentile of log((left + unit) / (span + unit)) on the prefixes 10 .. 90 % of the
way (in time) to the plateau (DONE_WINDOW; pinball loss; each curve's prefixes share a weight of 1,
so long-growing curves do not dominate, in proportion to the time each stands until the next point
comes), and boosted classification trees (depth 4, 120 trees; logistic loss, every prefix weighs
1) for "past the plateau". Two numbers are then calibrated on out-of-fold predictions (the even
tasks split in two by task id, each half predicted by trees fit on the other): the
interval's spread (the smallest whose 80 % interval covers 80 % of the true time left at the
prefixes convergence_eval asks at on each metric's curves, in seconds at the rate estimate() uses,
as convergence_eval measures) and the plateau threshold (the lowest probability at which "at the
plateau" is right 90 % of the time on each metric's prefixes); it prints those out-of-fold figures
and the median's error in seconds at the asked prefixes, per metric. The shipped trees are then
fit on all even tasks. Two models: one with no planned end, and one told each curve's last step as
max_steps (as convergence_eval --max-steps).

The parameters file is JSON text (render(); scoring.remaining_params reads it at import).

Usage: python -m benchmarks.fit_remaining [--data DIR] [--out scoring/data/remaining_params.json] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks.convergence_eval import DATA, FRACTIONS, Curve, in_split, lcbench_curves, offline_plateau_index
from scoring.convergence import ConvergenceSettings, clean_series, curve_evidence, normalise, step_rate
from scoring.curve_fit import fit_families
from scoring.remaining import QUANTILES, CurveEvidence, RemainingModel, Trees, feature_vector, predict
from scoring.remaining_params import FORMAT

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
OUT = Path(__file__).resolve().parents[1] / "scoring" / "data" / "remaining_params.json"


def prefix_evidence(c: Curve, m: int, settings: ConvergenceSettings,
                    planned: float | None) -> CurveEvidence | None:
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
    w: list[float] = field(default_factory=list)  # in the quantiles' window (DONE_WINDOW): each curve's rows weigh 1
    asked: list[bool] = field(default_factory=list)  # a prefix convergence_eval asks at (25/50/75 % of the time)
    fraction: list[tuple[float, ...]] = field(default_factory=list)  # the shares of the way it is asked at
    metric: list[str] = field(default_factory=list)  # the curve's data set (lcbench/val_cross_entropy, ...)
    seconds_left: list[float] = field(default_factory=list)  # true seconds to the plateau (0 past it)
    rate: list[float] = field(default_factory=list)  # the steps/s estimate() turns steps into seconds at (NaN none)
    task: list[int] = field(default_factory=list)  # the curve's OpenML task id (folds for calibration)
    curve: list[int] = field(default_factory=list)  # the curve's index in the order collected

    def extend(self, other: Samples) -> None:
        for name in ("evidence", "y", "left", "past", "w", "asked", "fraction", "metric", "seconds_left", "rate",
                     "task", "curve"):
            getattr(self, name).extend(getattr(other, name))


def asked_prefixes(c: Curve, k_star: int, min_points: int) -> dict[int, tuple[float, ...]]:
    """The prefix lengths convergence_eval scores remaining time at (see evaluate_curve), each with
    the shares of the time to the plateau it is asked at (two when they meet at one point)."""
    t0, t_star = float(c.timestamps[0]), float(c.timestamps[k_star])
    out: dict[int, tuple[float, ...]] = {}
    for frac in FRACTIONS:
        m = int(np.searchsorted(c.timestamps, t0 + frac * (t_star - t0), side="right"))
        if m >= min_points and t_star - float(c.timestamps[m - 1]) > 0:
            out[m] = (*out.get(m, ()), frac)
    return out


def collect(curves: Iterator[Curve], settings: ConvergenceSettings) -> dict[bool, Samples]:
    """Per planned end (False: open-ended, True: told the curve's last step), the samples of every prefix;
    the family fits are shared (they do not depend on the planned end)."""
    out = {False: Samples(), True: Samples()}
    for index, c in enumerate(curves):
        s = replace(settings, higher_is_better=c.higher_is_better)
        k_star = offline_plateau_index(c.values, c.higher_is_better, s.plateau_rel_tol)
        if k_star is None:
            continue
        asked = asked_prefixes(c, k_star, s.min_fit_points)
        task = int(c.name.split("/")[0])
        parts = {False: Samples(), True: Samples()}
        inside: dict[bool, list[float]] = {False: [], True: []}  # the time each row stands, 0 outside the window
        t0, t_star = float(c.timestamps[0]), float(c.timestamps[k_star])
        for m in range(s.min_fit_points, c.steps.size + 1):
            clean = clean_series(c.steps[:m], c.values[:m], c.timestamps[:m])
            norm = normalise(clean.values, s.higher_is_better, s.median_points)
            if norm is None or clean.steps.size < s.min_fit_points:
                continue
            fits = fit_families(clean.steps, norm, s.fit_grid, s.fit_families, s.fit_max_points)
            past = m - 1 >= k_star
            left = max(0.0, float(c.steps[k_star] - c.steps[m - 1]))
            seconds_left = max(0.0, float(c.timestamps[k_star] - c.timestamps[m - 1]))
            rate = step_rate(clean, s.remaining_rate_points)  # as estimate() does
            rate = rate if math.isfinite(rate) else step_rate(clean, s.rate_points)
            for planned_end, part in parts.items():
                ev = curve_evidence(clean.steps, norm, fits, s, float(c.steps[-1]) if planned_end else None)
                if ev is None:
                    continue
                part.evidence.append(ev)
                done = (float(c.timestamps[m - 1]) - t0) / (t_star - t0) if t_star > t0 else math.inf
                stands = float(c.timestamps[m] - c.timestamps[m - 1]) if m < c.steps.size else 0.0
                inside[planned_end].append(max(stands, 0.0) if not past and DONE_WINDOW[0] <= done <= DONE_WINDOW[1]
                                           else 0.0)
                part.y.append(math.nan if past else math.log((left + ev.unit) / (ev.span + ev.unit)))
                part.left.append(left)
                part.past.append(float(past))
                part.asked.append(m in asked)
                part.fraction.append(asked.get(m, ()))
                part.metric.append(c.dataset)
                part.seconds_left.append(seconds_left)
                part.rate.append(rate)
                part.task.append(task)
                part.curve.append(index)
        for planned_end, part in parts.items():
            total = sum(inside[planned_end])
            part.w = [v / total if total > 0 else 0.0 for v in inside[planned_end]]
            out[planned_end].extend(part)
    return out


# The quantile trees learn from the prefixes 10 .. 90 % of the way (in time) to the plateau only, each
# curve's weighing 1 in all. Out of fold on the even tasks (two halves by task id, median error of the
# seconds left at 25 / 50 / 75 % of the way) this moved cross-entropy from 34.0 / 35.2 / 37.8 % to
# 34.3 / 30.2 / 33.5 % and accuracy from 39.4 / 40.9 / 37.8 % to 39.2 / 35.5 / 31.0 % (two more seeds:
# within 2.1 points of that): the last prefixes before the plateau, with a step or two left and the
# largest log ratios of error, pulled the median towards "little left" for every curve that looks
# converged, and whether a job is there already is the plateau classifier's question, not the median's.
# [0.05, 0.95] kept most of the error (35.4 / 33.5 / 34.7 %), [0.2, 0.8] traded 75 % for 50 %
# (34.5 / 26.4 / 53.1 %). Within the window a curve's weight is spread over its prefixes by the
# time each stands until the next point comes (a scheduler asks at any moment, and the evaluation
# at shares of the time): against equal weights per prefix, out of fold accuracy at 25 % done went
# from 39.3 % to 33.8 % (cross-entropy 34.8 / 31.8 / 34.4 -> 33.1 / 34.5 / 36.0 %, accuracy
# 39.3 / 36.0 / 32.4 -> 33.8 / 36.8 / 33.6 %: the same sum, one more of the issue's bars met).
DONE_WINDOW = (0.1, 0.9)
BINS = 48
TREES = 60  # per quantile
DEPTH = 3
PLATEAU_TREES = 120  # the plateau classifier: deeper and more trees raised its recall at 90 % precision out
PLATEAU_DEPTH = 4  # of fold on the even tasks (83.7 % to 88.4 % on cross-entropy); the quantiles' error did not move
LEARNING_RATE = 0.1
SUBSAMPLE = 0.5
MIN_LEAF = {"quantile": 0.01, "logistic": 0.002}  # a split leaves at least this share of the weight per side


def _weighted_quantile(v: FloatArray, w: FloatArray, tau: float) -> float:
    order = np.argsort(v, kind="stable")
    c = np.cumsum(w[order])
    if not c.size or c[-1] <= 0:
        return 0.0
    return float(v[order][min(int(np.searchsorted(c, tau * c[-1])), v.size - 1)])


def _bin_edges(x: FloatArray, bins: int) -> list[FloatArray]:
    return [np.unique(np.quantile(x[:, j], np.linspace(0.0, 1.0, bins + 1)[1:-1])) for j in range(x.shape[1])]


def _grow(xb: IntArray, edges: list[FloatArray], g: FloatArray, h: FloatArray, w: FloatArray, depth: int,
          min_w: float) -> tuple[IntArray, FloatArray, IntArray]:
    """One least-squares (Newton) tree on the binned features, level by level: per node, the split
    (feature, bin) with the largest gain G_L^2/H_L + G_R^2/H_R - G^2/H among those leaving at least
    min_w of the weight each side. Returns the flattened features and thresholds and each row's leaf."""
    n, n_feat = xb.shape
    inner = 2 ** depth - 1
    feature = np.zeros(inner, dtype=np.int64)
    threshold = np.full(inner, np.inf)
    node = np.zeros(n, dtype=np.int64)
    wg, wh = w * g, w * h
    for level in range(depth):
        width = 2 ** level
        best_gain = np.zeros(width)
        best_f = np.zeros(width, dtype=np.int64)
        best_b = np.full(width, -1, dtype=np.int64)
        for j in range(n_feat):
            nb = len(edges[j]) + 1
            if nb < 2:
                continue
            key = node * nb + xb[:, j]
            sums = [np.bincount(key, weights=v, minlength=width * nb).reshape(width, nb) for v in (wg, wh, w)]
            gl, hl, wl = (np.cumsum(a, axis=1)[:, :-1] for a in sums)
            gt, ht, wt = (a.sum(axis=1, keepdims=True) for a in sums)
            with np.errstate(divide="ignore", invalid="ignore"):
                gain = gl ** 2 / (hl + 1e-9) + (gt - gl) ** 2 / (ht - hl + 1e-9) - gt ** 2 / (ht + 1e-9)
            gain[(wl < min_w) | (wt - wl < min_w)] = -1.0
            b = np.argmax(gain, axis=1)
            gb = gain[np.arange(width), b]
            better = gb > best_gain
            best_gain[better], best_f[better], best_b[better] = gb[better], j, b[better]
        for k in range(width):
            i = width - 1 + k
            if best_b[k] >= 0:
                feature[i], threshold[i] = best_f[k], float(edges[int(best_f[k])][best_b[k]])
        cut = np.where(best_b >= 0, best_b, np.iinfo(np.int64).max)  # no split: everything goes left
        node = 2 * node + (xb[np.arange(n), best_f[node]] > cut[node])
    return feature, threshold, node


def boost(x: FloatArray, y: FloatArray, w: FloatArray, loss: str, tau: float = 0.5, trees: int = TREES,
          depth: int = DEPTH, seed: int = 0) -> Trees:
    """Gradient boosting in numpy. loss "quantile": pinball loss at tau, each leaf the weighted tau-quantile
    of its rows' residuals (as Friedman's LAD/quantile boosting); "logistic": y in {0, 1}, Newton leaves,
    the value is the logit."""
    rng = np.random.default_rng(seed)
    edges = _bin_edges(x, BINS)
    xb = np.column_stack([np.searchsorted(e, x[:, j], side="left") for j, e in enumerate(edges)]).astype(np.int64)
    n = x.shape[0]
    if loss == "quantile":
        base = _weighted_quantile(y, w, tau)
    else:
        p0 = min(max(float(np.average(y, weights=w)), 1e-4), 1 - 1e-4)
        base = math.log(p0 / (1 - p0))
    base = float(f"{base:.6g}")
    f = np.full(n, base)
    feats: list[IntArray] = []
    thresholds: list[FloatArray] = []
    leaves: list[FloatArray] = []
    min_w = MIN_LEAF[loss] * float(w.sum()) * SUBSAMPLE
    for _ in range(trees):
        rows = rng.random(n) < SUBSAMPLE
        if loss == "quantile":
            g, h = np.where(y > f, tau, tau - 1.0), np.ones(n)
        else:
            p = 1.0 / (1.0 + np.exp(-np.clip(f, -50, 50)))
            h = np.maximum(p * (1 - p), 1e-6)
            g = (y - p) / h
        feature, threshold, leaf_of = _grow(xb, edges, g, h, w * rows, depth, min_w)
        leaf = np.zeros(2 ** depth)
        for j in range(leaf.size):
            mk = (leaf_of == j) & rows
            if not mk.any():
                continue
            if loss == "quantile":
                leaf[j] = _weighted_quantile(y[mk] - f[mk], w[mk], tau)
            else:
                leaf[j] = float(np.sum(w[mk] * g[mk] * h[mk]) / (np.sum(w[mk] * h[mk]) + 1e-9))
        leaf = np.array([float(f"{v:.6g}") for v in LEARNING_RATE * leaf])
        # thresholds to 6 digits, as before (a bin edge needs no more)
        threshold = np.array([float(f"{v:.6g}") if math.isfinite(v) else v for v in threshold])
        # route every row as scoring.remaining.Trees will (with the rounded leaves)
        k = np.zeros(n, dtype=np.int64)
        for level in range(depth):
            i = (1 << level) - 1 + k
            k = 2 * k + (x[np.arange(n), feature[i]] > threshold[i])
        f = f + leaf[k]
        feats.append(feature)
        thresholds.append(threshold)
        leaves.append(leaf)
    finite = [np.where(np.isfinite(t), t, 1e300) for t in thresholds]  # "no split" as a finite number (JSON)
    return Trees(base=base, depth=depth, feature=tuple(int(v) for a in feats for v in a),
                 threshold=tuple(float(v) for a in finite for v in a),
                 leaf=tuple(float(v) for a in leaves for v in a))


def trees_value(t: Trees, x: FloatArray) -> FloatArray:
    """Trees.value over the rows of x at once."""
    inner, width = 2 ** t.depth - 1, 2 ** t.depth
    feature = np.asarray(t.feature, dtype=np.int64).reshape(-1, inner)
    threshold = np.asarray(t.threshold).reshape(-1, inner)
    leaf = np.asarray(t.leaf).reshape(-1, width)
    cols = np.arange(leaf.shape[0])[None, :]
    k = np.zeros((x.shape[0], leaf.shape[0]), dtype=np.int64)
    for level in range(t.depth):
        i = (1 << level) - 1 + k
        k = 2 * k + (x[np.arange(x.shape[0])[:, None], feature[cols, i]] > threshold[cols, i])
    return np.asarray(t.base + leaf[cols, k].sum(axis=1), dtype=np.float64)


def fit_trees(x: FloatArray, samples: Samples, rows: npt.NDArray[np.bool_]) -> RemainingModel:
    """The four tree ensembles on the given rows (spread 1, threshold 1/2: calibrate sets them)."""
    y, past, w = np.asarray(samples.y), np.asarray(samples.past), np.asarray(samples.w)
    before = rows & (w > 0)  # in the window: before the plateau, 10 .. 90 % of the way
    quantile_trees = tuple(boost(x[before], y[before], w[before], "quantile", tau, seed=i)
                           for i, tau in enumerate(QUANTILES))
    plateau = boost(x[rows], past[rows], np.ones(int(rows.sum())), "logistic", trees=PLATEAU_TREES,
                    depth=PLATEAU_DEPTH, seed=len(QUANTILES))
    return RemainingModel(quantiles=QUANTILES, quantile_trees=quantile_trees, plateau_trees=plateau)


def _seconds(steps: float, rate: float) -> float:
    return 0.0 if steps == 0.0 else (steps / rate if math.isfinite(rate) else math.nan)


def calibrate(models: list[tuple[RemainingModel, npt.NDArray[np.bool_]]], x: FloatArray,
              samples: Samples) -> tuple[float, float, str]:
    """(spread, threshold, what they give) from out-of-fold predictions: each model predicts the rows
    of its mask. The spread: the smallest factor (from 0.5 on) whose 80 % interval, in seconds at the
    rate estimate() uses, covers 80 % of the true seconds left at the prefixes convergence_eval asks at
    (as it measures) on each metric's curves; the threshold: the lowest probability at which "at the
    plateau" is right 90 % of the time on every metric's prefixes (all prefixes)."""
    p = np.zeros(len(samples.evidence))
    for model, rows in models:
        p[rows] = 1.0 / (1.0 + np.exp(-np.clip(trees_value(model.plateau_trees, x[rows]), -50, 50)))
    past = np.asarray(samples.past) > 0
    of_metric = {m: np.asarray(samples.metric) == m for m in dict.fromkeys(samples.metric)}
    threshold = 0.5
    for threshold in np.arange(0.5, 0.951, 0.01):
        said = p >= threshold
        if all((said & k).any() and (said & past & k).sum() / (said & k).sum() >= 0.9 for k in of_metric.values()):
            break
    said = p >= threshold
    asked = [(i, model) for model, rows in models for i in np.flatnonzero(rows)  # once per share asked at
             for _ in samples.fraction[i] if math.isfinite(samples.rate[i]) and samples.rate[i] > 0]
    spread, covered = 1.0, 0.0
    for spread in np.arange(0.5, 4.01, 0.05):
        hits: dict[str, list[int]] = {}
        for i, model in asked:
            d = predict(samples.evidence[i], replace(model, spread=float(spread)))
            rate = samples.rate[i]
            hits.setdefault(samples.metric[i], []).append(
                int(_seconds(d.low, rate) <= samples.seconds_left[i] <= _seconds(d.high, rate)))
        covered = sum(sum(h) for h in hits.values()) / max(1, len(asked))
        if all(sum(h) / len(h) >= 0.8 for h in hits.values()):
            break
    ape: dict[tuple[str, float], list[float]] = {}
    for i, model in dict(asked).items():  # the median's error in seconds, as convergence_eval measures it
        d = predict(samples.evidence[i], model)
        for f in samples.fraction[i]:
            ape.setdefault((samples.metric[i], f), []).append(
                abs(_seconds(d.median, samples.rate[i]) - samples.seconds_left[i]) / samples.seconds_left[i])
    errors = "; ".join(
        f"{metric.split('/')[-1]} " + " / ".join(f"{100 * float(np.median(ape[(metric, f)])):.1f}"
                                                 for f in FRACTIONS if (metric, f) in ape)
        for metric in dict.fromkeys(m for m, _ in ape))
    per_metric = ", ".join(f"{m.split('/')[-1]} {100 * (said & past & k).sum() / max(1, (said & k).sum()):.1f} / "
                           f"{100 * (said & past & k).sum() / max(1, (past & k).sum()):.1f} %"
                           for m, k in of_metric.items())
    note = (f"out of fold: interval coverage {100 * covered:.1f} % at {len(asked)} asked prefixes; plateau "
            f"precision / recall {per_metric};\n"
            f"  median error of the seconds left at 25 / 50 / 75 % of the way (asked prefixes): {errors} %")
    return round(float(spread), 2), round(float(threshold), 2), note


def fit_model(samples: Samples) -> RemainingModel:
    x = np.vstack([feature_vector(e) for e in samples.evidence])
    half = (np.asarray(samples.task) // 2) % 2 == 1  # two halves of the even tasks
    if half.all() or not half.any():  # one task only (a --limit run): alternate curves instead
        half = np.asarray(samples.curve) % 2 == 1
    folds = [(fit_trees(x, samples, ~half), half), (fit_trees(x, samples, half), ~half)]
    spread, threshold, note = calibrate(folds, x, samples)
    print(f"  {note}", flush=True)
    model = fit_trees(x, samples, np.ones(len(samples.evidence), dtype=bool))
    return replace(model, spread=spread, plateau_threshold=threshold)


def _numbers(a: tuple[float, ...] | tuple[int, ...], indent: str, per_line: int) -> str:
    """A JSON list, per_line numbers a line (one tree's nodes or leaves); each float as repr() writes it,
    which reads back to the same bits."""
    lines = [", ".join(json.dumps(v, allow_nan=False) for v in a[i:i + per_line]) for i in range(0, len(a), per_line)]
    return "[\n" + ",\n".join(f"{indent}  {line}" for line in lines) + f"\n{indent}]"


def _render_trees(t: Trees, indent: str) -> str:
    inner, nodes, leaves = indent + "  ", 2 ** t.depth - 1, 2 ** t.depth
    fields = [f'"base": {json.dumps(t.base, allow_nan=False)}', f'"depth": {json.dumps(t.depth)}',
              f'"feature": {_numbers(t.feature, inner, nodes)}', f'"threshold": {_numbers(t.threshold, inner, nodes)}',
              f'"leaf": {_numbers(t.leaf, inner, leaves)}']
    return "{\n" + ",\n".join(inner + f for f in fields) + f"\n{indent}}}"


def render(models: dict[str, RemainingModel], note: str) -> str:
    """The parameters file (scoring/data/remaining_params.json, read by scoring.remaining_params): JSON,
    one tree's nodes (or leaves) a line, so that a refit diffs tree by tree."""
    blocks = []
    for name, m in models.items():
        quantile_trees = ",\n".join("        " + _render_trees(t, "        ") for t in m.quantile_trees)
        blocks.append(f'    {json.dumps(name)}: {{\n'
                      f'      "quantiles": {json.dumps(list(m.quantiles), allow_nan=False)},\n'
                      f'      "spread": {json.dumps(m.spread, allow_nan=False)},\n'
                      f'      "plateau_threshold": {json.dumps(m.plateau_threshold, allow_nan=False)},\n'
                      f'      "quantile_trees": [\n{quantile_trees}\n      ],\n'
                      f'      "plateau_trees": {_render_trees(m.plateau_trees, "      ")}\n'
                      f"    }}")
    note_lines = ",\n".join(f"    {json.dumps(line)}" for line in note.splitlines())
    return (f'{{\n  "format": {json.dumps(FORMAT)},\n  "note": [\n{note_lines}\n  ],\n'
            f'  "models": {{\n' + ",\n".join(blocks) + "\n  }\n}\n")


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
    by_end = {False: Samples(), True: Samples()}
    for metric, hib in (("val_cross_entropy", False), ("val_accuracy", True)):
        curves = [c for c in lcbench_curves(args.data / "lcbench/curves.csv", metric, hib) if in_split(c, "even")]
        if args.limit:
            curves = curves[: args.limit]
        for planned, part in collect(iter(curves), settings).items():
            by_end[planned].extend(part)
    print(f"collected the prefixes ({time.perf_counter() - started:.0f} s)", flush=True)
    for name, planned in (("OPEN_END", False), ("PLANNED_END", True)):
        samples = by_end[planned]
        if not samples.evidence:
            raise SystemExit(f"no usable prefixes in {args.data / 'lcbench/curves.csv'}")
        counts[name] = len(samples.evidence)
        models[name] = fit_model(samples)
        print(f"{name}: {len(samples.evidence)} prefixes, {sum(1 for v in samples.past if v == 0)} before the "
              f"plateau, {sum(1 for v in samples.w if v > 0)} of them {DONE_WINDOW[0]:.0%} .. {DONE_WINDOW[1]:.0%} of "
              f"the way; spread {models[name].spread}, plateau threshold {models[name].plateau_threshold} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    note = (f"Fit on the even-numbered OpenML tasks of lcbench/curves.csv (val_cross_entropy and val_accuracy;\n"
            f"{counts['OPEN_END']} prefixes), ConvergenceSettings() defaults; {TREES} boosted trees of depth {DEPTH}\n"
            f"per quantile {QUANTILES} (on the prefixes {DONE_WINDOW[0]:.0%} .. {DONE_WINDOW[1]:.0%} of the way to\n"
            f"the plateau, each curve weighing 1, spread by the time each prefix stands), {PLATEAU_TREES} of depth\n"
            f"{PLATEAU_DEPTH} for the plateau probability; spread and threshold calibrated out of fold.\n"
            f"Regenerate: python -m benchmarks.fit_remaining"
            + (f" --limit {args.limit}" if args.limit else ""))
    args.out.write_text(render(models, note), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
