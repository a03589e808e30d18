"""Convergence of one training job from its progress series: phase, growth, remaining time.

Pure: numpy and arithmetic only; time comes in as timestamps, never from a clock.

Pipeline: clean (drop non-finite points with counted reasons; a step going backwards is a
restart from checkpoint, whose new points supersede the old ones from that step on) ->
orient (lower is better) -> median filter -> normalise to [0, 1] by the observed range
(so everything is invariant to scaling and shifting the metric) -> FlowCon windows for
progress P and growth efficiency G = P / share, and curve fits for the steps left to the
plateau (scoring.curve_fit): Optimus' l(k) = 1/(b0*k + b1) + b2, an exponential and a power law, whose remaining
steps are averaged geometrically. scoring.remaining turns the same fits into a distribution of
the steps left (80 % interval, probability of being at the plateau; curve_evidence feeds it).

P is the relative pace: the improvement of the windowed mean between two consecutive
windows, divided by the job's mean improvement per window so far (FlowCon divides by the
window in seconds; a ratio makes alpha independent of the window, of the metric's scale, of
the job's speed and of how long it has run). A job getting worse is not growing: P >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

import numpy as np
import numpy.typing as npt

from scoring import remaining_params
from scoring.curve_fit import (
    FAMILIES,
    CurveFit,
    Family,
    ensemble_remaining_steps,
    fit_families,
    remaining_steps_to_plateau,
    target_steps_left,
)
from scoring.remaining import CurveEvidence, RemainingDistribution, RemainingModel, predict, prefix_shape
from scoring.stopping import JobEnd

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_FLAT_SPAN = 1e-12  # normalised span below which a series counts as constant


class Phase(IntEnum):
    UNKNOWN = 0
    GROWING = 1
    WATCHING = 2
    COMPLETING = 3


@dataclass(frozen=True)
class ConvergenceSettings:
    window_s: float = 30.0  # Δ in seconds (FlowCon); 0 = count windows in points
    window_points: int = 5  # window length when window_s is 0 or there are no timestamps
    alpha: float = 0.15  # relative pace below this is slow growth (chosen on the LCBench/Pollux eval)
    pace_lag_windows: int = 3  # improvement measured over this many windows
    noise_z: float = 2.0  # improvements within this many noise sigmas count as none
    higher_is_better: bool = False  # True for accuracy-like metrics
    median_points: int = 3  # odd width of the spike-removing median filter; 1 = off
    plateau_rel_tol: float = 0.05  # plateau: remaining improvement <= tol * total improvement
    min_fit_points: int = 5
    fit_grid: int = 48  # shape-parameter candidates tried per curve family
    fit_families: tuple[Family, ...] = FAMILIES  # curve families averaged for the remaining steps
    fit_rmse_ratio: float = 3.0  # families fitting worse than this x the best rmse (+ floor) drop out
    fit_rmse_floor: float = 0.002  # in normalised units: noise below this does not separate families
    fit_max_points: int = 256  # longer histories are binned to this many points for the fit
    rate_points: int = 20  # recent points of the current run used for the step rate
    # Recent points of the current run whose rate turns the steps left into seconds (remaining_rate):
    # fewer than for step_rate, as time per step drifts (LCBench's epochs speed up and slow down; the
    # recent rate is the closer one, docs/progress-api.md "Seconds from the recent rate").
    # NaN there falls back to step_rate.
    remaining_rate_points: int = 4
    max_horizon_factor: float = 20.0  # predictions further than this x the observed steps are unknown
    # What remaining_steps reports: "ensemble" = the curve families' geometric mean; "learned" =
    # the median of scoring.remaining's boosted trees (fit on the even LCBench tasks): the steps left
    # if the job has not plateaued yet (whether it has is plateau_probability / plateaued); "auto" =
    # learned when the job gives a planned end (max_steps), else ensemble. Why auto: on held-out
    # curves (odd LCBench tasks, Pollux; docs/progress-api.md) the learned median beats the
    # families' mean on every set and fraction done when told the planned end; without one it was
    # worse on Pollux's curves at 75 % done when auto was chosen, and now beats it there too, but the
    # open-ended default stays until the control loops' figures (which read remaining_steps) are
    # re-measured with it. The interval and plateau probability are the learned model's in every case.
    remaining_model: Literal["auto", "learned", "ensemble"] = "auto"

    def __post_init__(self) -> None:
        if self.remaining_model not in ("auto", "learned", "ensemble"):
            raise ValueError(f"remaining_model must be 'auto', 'learned' or 'ensemble', not {self.remaining_model!r}")
        unknown = [f for f in self.fit_families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"fit_families must be some of {', '.join(FAMILIES)}, not {self.fit_families!r}")


@dataclass(frozen=True)
class CleanSeries:
    """Points in step order with the superseded and invalid ones removed."""

    steps: FloatArray
    values: FloatArray
    timestamps: FloatArray | None
    rejected: Mapping[str, int]
    restarts: int  # times the step went backwards
    superseded: int  # points replaced by a restart's re-run of their steps
    run_start: int  # index of the first kept point of the current run (since the last restart)


@dataclass(frozen=True)
class ConvergenceEstimate:
    phase: Phase
    low_count: int  # consecutive windows with G < alpha; carry into the next step
    progress: float  # P of the latest window pair; NaN before two windows
    growth_efficiency: float  # P / share; NaN when the share is unknown
    remaining_steps: float  # to the plateau; NaN unknown, 0 at the plateau
    remaining_seconds: float  # NaN unknown (no timestamps, no rate, no prediction)
    step_rate: float  # steps/s of the current run; NaN unknown
    points_used: int
    last_step: float  # NaN when no point survived cleaning
    rejected: Mapping[str, int] = field(default_factory=dict)
    restarts: int = 0
    superseded: int = 0
    fit: CurveFit | None = None
    # The distribution of steps left (scoring.remaining): the 80 % interval and P(at the plateau).
    # NaN when unknown; the seconds at the step rate of the current run.
    remaining_steps_low: float = math.nan
    remaining_steps_high: float = math.nan
    remaining_seconds_low: float = math.nan
    remaining_seconds_high: float = math.nan
    plateau_probability: float = math.nan
    plateaued: bool = False  # plateau_probability at or above the model's threshold (precision first)
    ensemble_remaining_steps: float = math.nan  # the curve families' geometric mean, whatever remaining_model
    learned_remaining_steps: float = math.nan  # the learned median (if not plateaued yet), whatever remaining_model
    remaining_rate: float = math.nan  # steps/s the remaining seconds are computed at (recent; see settings)
    # When the job frees its GPUs under its stopping rule (scoring.job_end.predict_end); None: not
    # predicted (the tracker fills it in; estimate() alone does not).
    end: JobEnd | None = None

    def remaining_distribution(self) -> RemainingDistribution:
        """The learned steps-left distribution, e.g. for evidence_weight()."""
        return RemainingDistribution(self.learned_remaining_steps, self.remaining_steps_low,
                                     self.remaining_steps_high, self.plateau_probability, self.plateaued)


def _as_float(a: npt.ArrayLike) -> FloatArray:
    return np.asarray(a, dtype=np.float64).reshape(-1)


def clean_series(
    steps: npt.ArrayLike, values: npt.ArrayLike, timestamps: npt.ArrayLike | None = None
) -> CleanSeries:
    """Arrival-ordered points -> valid points in increasing step order.

    Invalid points are counted by reason. After a restart from checkpoint at step s, the
    earlier points at steps >= s are superseded (the run was rolled back), not corrupt.
    """
    k, v = _as_float(steps), _as_float(values)
    t = None if timestamps is None else _as_float(timestamps)
    if k.shape != v.shape or (t is not None and t.shape != k.shape):
        raise ValueError(f"steps, values and timestamps differ in length: {k.size}, {v.size}, "
                         f"{None if t is None else t.size}")
    if bool(np.isfinite(v).all() and np.isfinite(k).all() and (t is None or np.isfinite(t).all())) \
            and (k.size < 2 or bool(np.all(k[1:] > k[:-1]))) and (k.size == 0 or k[0] >= 0):
        # the usual series: every point valid, steps increasing (no restart): nothing to drop
        return CleanSeries(steps=k.copy(), values=v.copy(), timestamps=None if t is None else t.copy(),
                           rejected={}, restarts=0, superseded=0, run_start=0)
    reasons = {
        "value_nan": np.isnan(v),
        "value_inf": np.isinf(v),
        "step_not_finite": ~np.isfinite(k),
        "step_negative": k < 0,
    }
    if t is not None:
        reasons["timestamp_not_finite"] = ~np.isfinite(t)
    bad = np.zeros(k.shape, dtype=bool)
    rejected: dict[str, int] = {}
    for name, mask in reasons.items():
        first_time = mask & ~bad  # each point is counted under its first reason only
        if first_time.any():
            rejected[name] = int(first_time.sum())
        bad |= mask
    ok = ~bad
    k, v = k[ok], v[ok]
    t = None if t is None else t[ok]

    restarts = int(np.count_nonzero(np.diff(k) < 0)) if k.size else 0
    # Point i survives iff every later point has a larger step (no later re-run covers it).
    later_min = np.append(np.minimum.accumulate(k[::-1])[::-1][1:], np.inf)
    keep = k < later_min
    drops = np.flatnonzero(np.diff(k) < 0)
    restart_at = int(drops[-1]) + 1 if drops.size else 0
    run_start = int(np.count_nonzero(keep[:restart_at]))
    return CleanSeries(
        steps=k[keep],
        values=v[keep],
        timestamps=None if t is None else t[keep],
        rejected=rejected,
        restarts=restarts,
        superseded=int(k.size - np.count_nonzero(keep)),
        run_start=run_start,
    )


def _median_filter(x: FloatArray, width: int) -> FloatArray:
    if width <= 1 or x.size < width:
        return x
    if width == 3:  # the default: median of three as max(min(a, b), min(max(a, b), c)), no sort
        padded = np.concatenate((x[:1], x, x[-1:]))
        a, b, c = padded[:-2], x, padded[2:]
        return np.asarray(np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)), dtype=np.float64)
    half = width // 2
    padded = np.pad(x, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    return np.asarray(np.median(windows, axis=1), dtype=np.float64)


def normalise(values: FloatArray, higher_is_better: bool, median_points: int) -> FloatArray | None:
    """Oriented (lower is better), smoothed, range-normalised to [0, 1]; None if constant."""
    if values.size == 0:
        return None
    oriented = -values if higher_is_better else values
    scale = float(np.max(np.abs(oriented)))
    if scale == 0.0:
        return None
    unit = oriented / scale  # in [-1, 1] first, so the span below cannot overflow
    smooth = _median_filter(unit, median_points)
    lo, hi = float(smooth.min()), float(smooth.max())
    if hi - lo < _FLAT_SPAN:
        return None
    return np.asarray((smooth - lo) / (hi - lo), dtype=np.float64)


def window_ids(
    steps_count: int, timestamps: FloatArray | None, settings: ConvergenceSettings
) -> IntArray:
    """Window index of each point, 0 = the latest window, counted back from the last point."""
    if timestamps is not None and timestamps.size and settings.window_s > 0:
        # Timestamps ~1e308 apart overflow the difference to inf; the clip bounds it (no warning).
        with np.errstate(over="ignore"):
            back = (float(timestamps.max()) - timestamps) / settings.window_s
        return np.floor(np.clip(back, 0.0, 1e12)).astype(np.int64)
    width = max(1, settings.window_points)
    return (steps_count - 1 - np.arange(steps_count, dtype=np.int64)) // width


def _median(a: FloatArray) -> float:
    """np.median of a non-empty 1-d array by partition (np.median's own overhead dominates small ones)."""
    half = a.size // 2
    if a.size % 2:
        return float(np.partition(a, half)[half])
    mid = np.partition(a, (half - 1, half))
    return float(mid[half - 1] + mid[half]) / 2.0


def window_progress(norm: FloatArray, ids: IntArray, lag: int = 3, noise_z: float = 2.0) -> FloatArray:
    """Relative pace at each window after the first, oldest first.

    The improvement over the last `lag` windows, per window, divided by the job's mean
    improvement per window so far (from its first window to the best it has reached). A job
    learning at a steady pace scores 1 however long its history; a plateau tends to 0.
    Measuring against the whole observed range instead makes any long steady run look slow
    (P ~ 1/windows). An improvement within noise_z standard deviations of the window means'
    noise counts as none: late in a long plateau the mean pace is tiny, and noise alone would
    otherwise read as fast growth. Gaps count as elapsed windows; no improvement yet is 0.
    """
    if ids.size and np.all(ids[1:] <= ids[:-1]):  # the usual order (oldest point first): no sort
        starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
        if starts.size < 1:
            return np.empty(0)
        starts = np.concatenate(([0], starts))
        ends = np.concatenate((starts[1:], [ids.size]))
        means = np.add.reduceat(norm, starts) / (ends - starts)
        uniq = ids[starts]  # oldest window first
    else:
        uniq, inverse = np.unique(ids, return_inverse=True)
        if uniq.size < 2:
            return np.empty(0)
        means = np.bincount(inverse, weights=norm) / np.bincount(inverse)
        means, uniq = means[::-1], uniq[::-1]  # oldest window first
    elapsed = (uniq[0] - uniq).astype(np.float64)  # windows since the first, >= 1 from index 1
    here = np.arange(1, means.size)
    back = np.maximum(here - max(1, lag), 0)
    drop = means[back] - means[here]
    diffs = means[1:] - means[:-1]
    # Robust noise of one window mean, from the spread of consecutive differences (MAD).
    sigma = 1.4826 * _median(np.abs(diffs - _median(diffs))) / math.sqrt(2.0) if diffs.size >= 3 else 0.0
    real = drop > noise_z * sigma * math.sqrt(2.0)
    step = np.where(real, np.maximum(drop, 0.0), 0.0) / (elapsed[here] - elapsed[back])
    gained = means[0] - np.minimum.accumulate(means)[1:]  # improvement so far, >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        pace = np.where(gained > _FLAT_SPAN, step / (gained / elapsed[1:]), 0.0)
    return np.asarray(pace, dtype=np.float64)


def advance_phase(previous: Phase, low_count: int, g: float, alpha: float) -> tuple[Phase, int]:
    """FlowCon's state machine, one window: G < alpha once -> watching, twice -> completing."""
    if not math.isfinite(g):
        return previous, low_count  # no evidence: keep what we had
    if g >= alpha:
        return Phase.GROWING, 0
    low = low_count + 1
    return (Phase.WATCHING if low == 1 else Phase.COMPLETING), low


def replay_phase(g: FloatArray, alpha: float) -> tuple[Phase, int]:
    """The phase after feeding every window's G through advance_phase (vectorised)."""
    if g.size == 0:
        return Phase.UNKNOWN, 0
    high = np.flatnonzero(g >= alpha)
    low = int(g.size - 1 - high[-1]) if high.size else int(g.size)
    if low == 0:
        return Phase.GROWING, 0
    return (Phase.WATCHING if low == 1 else Phase.COMPLETING), low


def _recent_gain(steps: FloatArray, norm: FloatArray, last_share: float) -> float:
    """Share of the observed improvement (running best, normalised 0..1) made in the last
    last_share of the observed span."""
    cut = steps[0] + (1.0 - last_share) * (steps[-1] - steps[0])
    before = int(np.searchsorted(steps, cut, side="right"))  # steps increase: the points at or before cut
    if before == 0:
        return math.nan
    return float(norm[:before].min() - norm.min())


def _planned_end(max_steps: float | None) -> float | None:
    return max_steps if max_steps is not None and math.isfinite(max_steps) and max_steps > 0 else None


def normalised_target(values: FloatArray, target: float, settings: ConvergenceSettings) -> float:
    """The job's target metric value in the units of normalise() (NaN when it cannot be placed)."""
    if values.size == 0 or not math.isfinite(target):
        return math.nan
    oriented = -values if settings.higher_is_better else values
    scale = float(np.max(np.abs(oriented)))
    if scale == 0.0:
        return math.nan
    smooth = _median_filter(oriented / scale, settings.median_points)
    lo, hi = float(smooth.min()), float(smooth.max())
    if hi - lo < _FLAT_SPAN:
        return math.nan
    t = (-target if settings.higher_is_better else target) / scale
    return (t - lo) / (hi - lo)


def curve_evidence(
    steps: FloatArray, norm: FloatArray, fits: list[CurveFit], settings: ConvergenceSettings,
    max_steps: float | None = None, norm_target: float = math.nan,
) -> CurveEvidence | None:
    """The inputs of scoring.remaining's model for one cleaned, normalised prefix with its
    family fits; None when there is no span. No fit at all (no family decreases over the prefix:
    a loss rising again after its best, an accuracy falling) is evidence too: the family features
    are then unknown and the prefix's shape speaks alone; those prefixes are mostly past the
    plateau, and without evidence they could never be said to be."""
    if steps.size < 2:
        return None
    span = float(steps[-1] - steps[0])
    if not span > 0 or not math.isfinite(span):
        return None
    planned = _planned_end(max_steps)
    by_family = {f.family: f for f in fits}
    left: list[float] = []
    gap: list[float] = []
    for fam in FAMILIES:
        f = by_family.get(fam)
        if f is None:
            left.append(math.nan)
            gap.append(math.nan)
            continue
        left.append(remaining_steps_to_plateau(f, settings.plateau_rel_tol, settings.max_horizon_factor, planned))
        g_end = f.value_at(planned) - f.c if planned is not None else 0.0
        total = 1.0 - f.c - g_end
        ahead = f.value_at(float(steps[-1])) - f.c - g_end
        gap.append(ahead / total if total > 0 and math.isfinite(ahead) else math.nan)
    best = min(fits, key=lambda f: f.rmse) if fits else None
    target_left = math.nan
    if math.isfinite(norm_target):
        if best is not None:
            target_left = target_steps_left(best, norm_target, float(norm[-1]))
        elif float(norm[-1]) <= norm_target:
            target_left = 0.0
    planned_left = planned - float(steps[-1]) if planned is not None else math.nan
    return CurveEvidence(
        span=span,
        unit=span / max(1, steps.size - 1),
        family_left=tuple(left),
        family_gap=tuple(gap),
        best_rmse=best.rmse if best is not None else math.nan,
        recent_gain=(_recent_gain(steps, norm, 0.25), _recent_gain(steps, norm, 0.1)),
        horizon=settings.max_horizon_factor,
        planned_left=planned_left,
        target_left=target_left,
        last_value=float(norm[-1]),
        recent_value=sum(norm[-3:].tolist()) / min(3, norm.size),
        shape=prefix_shape(steps, norm, planned_left),
    )


def remaining_model_for(max_steps: float | None) -> RemainingModel:
    """The shipped parameters: one model for jobs with a planned end, one for open-ended ones."""
    return remaining_params.PLANNED_END if _planned_end(max_steps) is not None else remaining_params.OPEN_END


def step_rate(clean: CleanSeries, rate_points: int) -> float:
    """Steps per second over the recent points of the current run; NaN if not measurable."""
    if clean.timestamps is None:
        return math.nan
    k = clean.steps[clean.run_start:][-max(2, rate_points):]
    t = clean.timestamps[clean.run_start:][-max(2, rate_points):]
    if k.size < 2:
        return math.nan
    with np.errstate(over="ignore", invalid="ignore"):
        dt, dk = float(t[-1] - t[0]), float(k[-1] - k[0])
        rate = dk / dt if dt > 0 else math.nan
    return rate if math.isfinite(rate) and rate > 0 else math.nan


def estimate(
    steps: npt.ArrayLike,
    values: npt.ArrayLike,
    timestamps: npt.ArrayLike | None,
    settings: ConvergenceSettings,
    resource_share: float | None = None,
    previous_phase: Phase = Phase.UNKNOWN,
    previous_low_count: int = 0,
    max_steps: float | None = None,
    target: float | None = None,
) -> ConvergenceEstimate:
    """Convergence of one job from its whole (arrival-ordered) history.

    previous_phase UNKNOWN: the phase is replayed over every window of the history.
    Otherwise the state machine advances one step from (previous_phase,
    previous_low_count) with the latest window's G; call it once per window.
    resource_share: the job's share of what it could use, in (0, inf); without one, G is
    NaN and the phase is decided on P alone (share 1).
    max_steps: the step the job plans to stop at, if it said; the plateau is then measured
    against the fitted value there and is never later.
    target: the metric value at which the job stops (in the metric's own units and direction),
    if it said; the steps left are then never beyond the best fit's crossing of it.
    """
    clean = clean_series(steps, values, timestamps)
    share = resource_share if resource_share is not None and math.isfinite(resource_share) \
        and resource_share > 0 else None
    n = int(clean.steps.size)
    last_step = float(clean.steps[-1]) if n else math.nan
    rate = step_rate(clean, settings.rate_points)
    recent_rate = step_rate(clean, settings.remaining_rate_points)
    if not math.isfinite(recent_rate):
        recent_rate = rate
    norm = normalise(clean.values, settings.higher_is_better, settings.median_points)

    ids = window_ids(n, clean.timestamps, settings)
    if norm is None:
        # Constant (or empty) series: no improvement at all in every window pair.
        windows = int(np.unique(ids).size) if n else 0
        p_all = np.zeros(max(0, windows - 1))
    else:
        p_all = window_progress(norm, ids, settings.pace_lag_windows, settings.noise_z)
    with np.errstate(over="ignore"):
        g_all = p_all / (share if share is not None else 1.0)
    if previous_phase == Phase.UNKNOWN:
        phase, low = replay_phase(g_all, settings.alpha)
    else:
        latest = float(g_all[-1]) if g_all.size else math.nan
        phase, low = advance_phase(previous_phase, previous_low_count, latest, settings.alpha)
    progress = float(p_all[-1]) if p_all.size else math.nan
    growth = progress / share if share is not None and p_all.size else math.nan
    growth = growth if math.isfinite(growth) else math.nan  # a subnormal share overflows: unknown, not inf

    fit = None
    ensemble = math.nan
    dist = RemainingDistribution.unknown()
    if norm is None:
        ensemble = 0.0 if phase == Phase.COMPLETING else math.nan
        if phase == Phase.COMPLETING:
            dist = RemainingDistribution(0.0, 0.0, 0.0, 1.0, True)
    elif n >= settings.min_fit_points:
        fits = fit_families(clean.steps, norm, settings.fit_grid, settings.fit_families, settings.fit_max_points)
        fit = min(fits, key=lambda f: f.rmse) if fits else None
        ms = _planned_end(max_steps)
        ensemble = ensemble_remaining_steps(fits, settings.plateau_rel_tol, settings.max_horizon_factor, n, ms,
                                            settings.fit_rmse_ratio, settings.fit_rmse_floor)
        norm_target = normalised_target(clean.values, target, settings) if target is not None else math.nan
        evidence = curve_evidence(clean.steps, norm, fits, settings, ms, norm_target)
        if evidence is not None:
            dist = predict(evidence, remaining_model_for(ms))
            if not math.isnan(evidence.target_left) and not math.isnan(ensemble):
                # The families' mean too stops where the best fit crosses the job's target.
                ensemble = min(ensemble, max(evidence.target_left, 0.0))
    learned = settings.remaining_model == "learned" or (
        settings.remaining_model == "auto" and _planned_end(max_steps) is not None)
    remaining = dist.median if learned else ensemble
    seconds, seconds_low, seconds_high = (_seconds(r, recent_rate) for r in (remaining, dist.low, dist.high))
    return ConvergenceEstimate(
        phase=phase,
        low_count=low,
        progress=progress,
        growth_efficiency=growth,
        remaining_steps=remaining,
        remaining_seconds=seconds,
        step_rate=rate,
        points_used=n,
        last_step=last_step,
        rejected=clean.rejected,
        restarts=clean.restarts,
        superseded=clean.superseded,
        fit=fit,
        remaining_steps_low=dist.low,
        remaining_steps_high=dist.high,
        remaining_seconds_low=seconds_low,
        remaining_seconds_high=seconds_high,
        plateau_probability=dist.plateau_probability,
        plateaued=dist.plateaued,
        ensemble_remaining_steps=ensemble,
        learned_remaining_steps=dist.median,
        remaining_rate=recent_rate,
    )


def _seconds(steps_left: float, rate: float) -> float:
    """Steps at the rate: 0 steps is 0 s even at an unknown rate; unknown stays NaN."""
    if steps_left == 0.0:
        return 0.0
    seconds = steps_left / rate if math.isfinite(rate) else math.nan
    return seconds if math.isfinite(seconds) else math.nan
