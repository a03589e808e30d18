"""Sampled futures of a monitored series, and where each sample's stopping rule fires
(scoring.job_end's forecast under early stopping or a target).

The futures are drawn a block of evaluations at a time (ForecastSettings.block_evaluations) and
read in order, so a forecast stops drawing once the samples its point and interval read have all
ended: most early-stopping forecasts end within the first hundred of up to 2,000 evaluations, and
drawing the whole horizon was most of the simulator's time. The samples are the same random
process whatever the block (one block of the whole horizon is the draw before 2026-11-29, to the
bit); only which random numbers land where changes with it.

Pure: numpy and the standard library; the random samples come from a fixed seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from scoring.convergence import ConvergenceSettings
from scoring.curve_fit import fit_families
from scoring.forecast_settings import ForecastSettings
from scoring.stopping import EarlyStopping

FloatArray = npt.NDArray[np.float64]


def path_blocks(steps: FloatArray, oriented: FloatArray, evaluations: int, cadence: float,
                conv: ConvergenceSettings, fs: ForecastSettings, stall: float = 0.0) -> Iterator[FloatArray]:
    """(samples, b) blocks of the future values of an oriented (lower is better) series at steps
    steps[-1] + cadence * (1..evaluations), in order, in its own units; the share `stall` of the
    samples improve no more (flat at the recent level, its noise around it). Each block is drawn
    when it is asked for."""
    spans = [(a, min(a + fs.block_evaluations, evaluations)) for a in range(0, evaluations, fs.block_evaluations)]
    lo, hi = float(oriented.min()), float(oriented.max())
    rng = np.random.default_rng(fs.seed)
    if not hi - lo > 1e-12 * max(1.0, abs(hi)):
        for a, b in spans:
            yield np.full((fs.samples, b - a), float(oriented[-1]))
        return
    z = (oriented - lo) / (hi - lo)
    fits = fit_families(steps, z, conv.fit_grid, conv.fit_families, conv.fit_max_points)
    if fits:
        best = min(f.rmse for f in fits)
        fits = [f for f in fits if f.rmse <= conv.fit_rmse_ratio * best + conv.fit_rmse_floor]
    tail = slice(-fs.noise_points, None)
    last = float(steps[-1])
    if fits:
        top = min(fits, key=lambda f: f.rmse)
        sigma = float(np.std(z[tail] - top.predict(steps[tail])))
        # each family's future improvement from its own value at the last step, anchored at the
        # recent level the best fit gives there
        anchor = top.value_at(last)
        at_last = [f.value_at(last) for f in fits]
        pick = rng.integers(0, len(fits), fs.samples)
        scale = np.exp(rng.normal(0.0, fs.improvement_sd, fs.samples))
        if stall > 0:
            scale[rng.random(fs.samples) < stall] = 0.0
    else:  # nothing improves any more (a loss rising again): flat at the recent level
        recent = z[tail]
        sigma = float(np.std(np.diff(recent))) / math.sqrt(2.0) if recent.size > 1 else 0.0
        level = float(np.mean(z[-3:]))
    unit = grid_unit(oriented) if fs.quantise else math.nan
    for a, b in spans:
        if fits:
            future = last + cadence * np.arange(a + 1, b + 1, dtype=np.float64)
            drops = np.stack([f.predict(future) - v for f, v in zip(fits, at_last, strict=True)])
            drops = np.where(np.isfinite(drops), np.minimum(drops, 0.0), 0.0)
            mean = anchor + drops[pick] * scale[:, None]
        else:
            mean = np.full((fs.samples, b - a), level)
        noise = rng.normal(0.0, sigma if math.isfinite(sigma) else 0.0, (fs.samples, b - a))
        paths = np.asarray(lo + (hi - lo) * (mean + noise), dtype=np.float64)
        if math.isfinite(unit):  # an accuracy over a fixed set moves in steps of 1/N: a tie is no improvement
            paths = lo + np.round((paths - lo) / unit) * unit
        yield paths


def sample_paths(steps: FloatArray, oriented: FloatArray, evaluations: int, cadence: float,
                 conv: ConvergenceSettings, fs: ForecastSettings, stall: float = 0.0) -> FloatArray:
    """path_blocks, every block: (samples, evaluations)."""
    return np.concatenate(list(path_blocks(steps, oriented, evaluations, cadence, conv, fs, stall)), axis=1)


def grid_unit(values: FloatArray) -> float:
    """The step of a series that moves on a grid (an accuracy over a fixed validation set: k / N),
    NaN when it does not: its smallest change, when every change is a whole multiple of it."""
    moves = np.abs(np.diff(values))
    moves = moves[moves > 1e-12 * max(1.0, float(np.max(np.abs(values))))]
    if moves.size < 3:
        return math.nan
    ratio = moves / float(moves.min())
    whole = np.round(ratio)
    # reported values are rounded (5 significant digits in the shipped curves): 2 % slack per move
    if not bool(np.all(np.abs(ratio - whole) < 0.02 * whole)):
        return math.nan
    return float(np.mean(moves / whole))


def first_stop(paths: FloatArray, best: float, wait: int, rule: EarlyStopping | None,
               target: float) -> tuple[FloatArray, FloatArray]:
    """Per sample, the 1-based future evaluation at which early stopping fires and at which the
    (oriented) target is crossed; inf when never within the paths."""
    return first_stops([paths], best, wait, rule, target, paths.shape[0])


def first_stops(blocks: Iterable[FloatArray], best: float, wait: int, rule: EarlyStopping | None,
                target: float, need: int) -> tuple[FloatArray, FloatArray]:
    """first_stop over consecutive blocks of the paths, read until the end of the block in which at
    least `need` samples have stopped (either event); the blocks after it are not drawn. A sample's
    event found in no block read is inf, so the `need` earliest stops (the first of the two
    events of each) are what reading every block gives; the rest are only known to come later."""
    es_at = target_at = np.zeros(0)
    bests = waits = last = np.zeros(0)
    open_ = np.zeros(0, dtype=bool)
    at = 0  # evaluations read before this block
    for paths in blocks:
        m, k = paths.shape
        if es_at.size != m:  # the first block
            es_at, target_at = np.full(m, math.inf), np.full(m, math.inf)
            bests = np.full(m, best)
            last = np.full(m, -1.0 - wait)  # the evaluation of the latest improvement (0-based, -1: now)
            waits = np.full(m, wait, dtype=np.int64)
            open_ = np.ones(m, dtype=bool)
        if k == 0:
            continue
        if math.isfinite(target):
            hit = paths <= target
            first = hit.any(axis=1) & np.isinf(target_at)
            target_at[first] = at + np.argmax(hit[first], axis=1) + 1.0
        cols = at + np.arange(k, dtype=np.float64)
        if rule is not None and rule.min_delta == 0.0:  # the frameworks' default: running minima, no loop
            before = np.minimum.accumulate(np.concatenate([bests[:, None], paths[:, :-1]], axis=1), axis=1)
            since = np.maximum(np.maximum.accumulate(np.where(paths < before, cols, -np.inf), axis=1), last[:, None])
            fired = (cols - since) >= rule.patience
            first = fired.any(axis=1) & np.isinf(es_at)
            es_at[first] = at + np.argmax(fired[first], axis=1) + 1.0
            bests, last = np.minimum(before[:, -1], paths[:, -1]), since[:, -1]
        elif rule is not None:  # the best moves only by more than min_delta: evaluation by evaluation
            for j in range(k):
                v = paths[:, j]
                better = v < bests - rule.min_delta
                bests = np.where(better, v, bests)
                waits = np.where(better, 0, waits + 1)
                fired = open_ & (waits >= rule.patience)
                es_at[fired] = at + j + 1.0
                open_ &= ~fired
                if not open_.any():
                    break
        at += k
        if int(np.count_nonzero(np.isfinite(es_at) | np.isfinite(target_at))) >= need:
            break
    return es_at, target_at
