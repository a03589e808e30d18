"""When a job frees its GPUs, under its own stopping rule (DESIGN.md §11): predict_end().

- Planned end (max_steps): the steps left are known; the seconds' interval comes from the step
  rate alone (the recent and the longer-run rate, each widened by rate_slack).
- Early stopping and target: the monitored series is forecast as sampled curves (each a fitted
  curve family of scoring.convergence, its future improvement scaled by a random factor, plus the
  series' recent noise around the fit; under early stopping the families read only the recent
  part of the series and a share of the samples improve no more from now on), and the rule is
  run on every sample as the frameworks run
  it (each future point one evaluation, at the series' recent cadence). The point is the median
  sample's end, the 80 % interval the samples' 10th..90th percentiles, so the point lies inside.
  With a planned end too, each sample ends at whichever comes first.
- Nothing declared: the curve families on the recent half of the curve, normalised to its own
  range, so that "plateau" is measured against the recent scale, not against the initial drop (a
  real run's first minutes are most of its range: the learnt model's plateau_probability read
  >= 0.995 while the loss still fell 41 %; on the recent half alone its classifier still said
  "plateaued" for a curve declining linearly, tests/core/test_job_end.py).

Pure: numpy and the standard library; the random samples come from a fixed seed (deterministic).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt

from scoring.convergence import CleanSeries, ConvergenceEstimate, ConvergenceSettings, clean_series, estimate, normalise
from scoring.curve_fit import ensemble_remaining_steps, fit_families, remaining_steps_to_plateau
from scoring.end_interval import IntervalScale, rescale
from scoring.end_paths import first_stops, path_blocks
from scoring.forecast_settings import ForecastSettings
from scoring.remaining import RemainingDistribution, evidence_weight
from scoring.stopping import EarlyStopping, EndReason, JobEnd, StoppingRule

FloatArray = npt.NDArray[np.float64]
INTERVAL = (0.1, 0.9)  # the samples' quantiles an early-stopping or target end's interval spans
Series = tuple[npt.ArrayLike, npt.ArrayLike]  # (steps, values)
DEFAULT_FORECAST = ForecastSettings()  # frozen: a shared default changes nothing


def rule_state(oriented: FloatArray, rule: EarlyStopping) -> tuple[float, int, int]:
    """Replay early stopping over observed evaluations (lower is better): (best, evaluations since
    it, index of the evaluation at which it fired or -1). Lightning's improvement test: a value
    below best - min_delta."""
    best, wait = math.inf, 0
    for i, v in enumerate(oriented.tolist()):
        if v < best - rule.min_delta:
            best, wait = v, 0
        else:
            wait += 1
            if wait >= rule.patience:
                return best, wait, i
    return best, wait, -1


def _cadence(steps: FloatArray) -> float:
    gaps = np.diff(steps[-11:])
    return float(np.median(gaps)) if gaps.size else math.nan


def _rates(clean: CleanSeries, est: ConvergenceEstimate, fs: ForecastSettings) -> tuple[float, float, float]:
    """(point, low, high) steps/s to the end. The point is the current run's average rate, pauses
    (evaluations, checkpoints) included, as they will recur until the end; the interval spans the
    rates of the run's rate_windows equal spans of time and the recent rate (the estimate's),
    each widened by rate_slack. Without timestamps: the estimate's rates."""
    recent = [r for r in (est.remaining_rate, est.step_rate) if math.isfinite(r) and r > 0]
    ts = clean.timestamps
    k = clean.steps[clean.run_start:]
    if ts is not None and k.size >= 3:
        t = ts[clean.run_start:]
        span = float(t[-1] - t[0])
        if span > 0:
            whole = float(k[-1] - k[0]) / span
            edges = np.searchsorted(t, t[0] + span * np.linspace(0.0, 1.0, fs.rate_windows + 1))
            parts = []
            for a, b in zip(edges[:-1], np.minimum(edges[1:], k.size - 1), strict=True):
                a = max(0, int(a) - 1)  # from the point before the window: its first step's time counts
                if b > a and t[b] > t[a]:
                    parts.append(float(k[b] - k[a]) / float(t[b] - t[a]))
            rates = [r for r in (whole, *parts, *recent) if math.isfinite(r) and r > 0]
            if math.isfinite(whole) and whole > 0:
                return whole, min(rates) / (1.0 + fs.rate_slack), max(rates) * (1.0 + fs.rate_slack)
    if not recent:
        return math.nan, math.nan, math.nan
    return recent[0], min(recent) / (1.0 + fs.rate_slack), max(recent) * (1.0 + fs.rate_slack)


def _finish(steps: tuple[float, float, float], rates: tuple[float, float, float], reason: EndReason,
            scale: IntervalScale, evidence: float | None = None) -> JobEnd:
    """A JobEnd from (point, low, high) steps: seconds at the rates, both intervals rescaled by the
    rule's calibration (scoring.end_interval) and ordered so that the point lies inside."""
    point, low, high = steps
    if not math.isfinite(point):
        return JobEnd.unknown(reason)
    rate, rate_lo, rate_hi = rates

    def secs(s: float, r: float) -> float:
        return 0.0 if s == 0.0 else (s / r if math.isfinite(r) else math.nan)

    seconds = secs(point, rate)
    s_low, s_high = rescale(seconds, secs(low, rate_hi), secs(high, rate_lo), scale)
    low, high = rescale(point, low, high, scale)
    weight = evidence if evidence is not None else evidence_weight(RemainingDistribution(point, low, high, math.nan))
    return JobEnd(point, low, high, seconds, s_low, s_high, reason, weight)


def recent_part(steps: FloatArray, values: FloatArray, share: float, min_points: int) -> tuple[FloatArray, FloatArray]:
    """The points in the last `share` of the span steps[0]..steps[-1], at least min_points of them."""
    cut = float(steps[-1]) - share * float(steps[-1] - steps[0])
    first = min(int(np.searchsorted(steps, cut)), max(0, steps.size - min_points))
    return steps[first:], values[first:]


def _series_ends(cs: FloatArray, oriented: FloatArray, es: EarlyStopping | None, target: float, last_step: float,
                 limit: float, conv: ConvergenceSettings, fs: ForecastSettings, need: int
                 ) -> tuple[FloatArray, FloatArray] | None:
    """Per sample, steps from last_step until early stopping fires / the oriented target is crossed
    on this series (inf: not within `limit`); None when the series is too short to forecast. The
    `need` earliest ends (the first of the two of each sample) are exact, the others may read inf
    (end_paths.first_stops)."""
    cadence = _cadence(cs)
    if cs.size < max(conv.min_fit_points, 2) or not cadence > 0:
        return None
    if es is None:  # a target alone: its cadence does not matter, only its reach
        cadence = max(cadence, limit / fs.target_evaluations)
    best, wait, _ = rule_state(oriented, es) if es is not None else (math.inf, 0, -1)
    evaluations = int(min(fs.max_evaluations, max(1.0, math.ceil(limit / cadence))))
    fit_s, fit_v = (cs, oriented) if es is None else recent_part(cs, oriented, fs.stopping_recent_share,
                                                                  conv.min_fit_points)
    paths = path_blocks(fit_s, fit_v, evaluations, cadence, conv, fs, fs.stall_share if es is not None else 0.0)
    es_at, target_at = first_stops(paths, best, wait, es, target, need)
    offset = float(cs[-1]) - last_step  # the monitored series may lag the loss's last step
    return np.maximum(offset + es_at * cadence, 0.0), np.maximum(offset + target_at * cadence, 0.0)


def _forecast_end(loss: tuple[FloatArray, FloatArray], monitored: tuple[FloatArray, FloatArray], rule: StoppingRule,
                  conv: ConvergenceSettings, fs: ForecastSettings) -> tuple[float, float, float, EndReason] | None:
    """(point, low, high) steps to the end under early stopping and/or target (and the planned
    end when declared), and the median sample's reason; None when a series is too short."""
    es = rule.early_stopping
    ls, lv = loss
    last_step = float(ls[-1])
    loss_oriented = -lv if rule.higher_is_better else lv
    target = -rule.target if rule.higher_is_better else rule.target
    if math.isfinite(target) and float(loss_oriented[-1]) <= target:
        return 0.0, 0.0, 0.0, EndReason.TARGET  # crossed at its last report: it stops now
    ms, mv = monitored
    m_oriented = -mv if _monitored_hib(rule) else mv
    if es is not None and rule_state(m_oriented, es)[2] >= 0:
        return 0.0, 0.0, 0.0, EndReason.EARLY_STOPPING  # the rule fired already: it stops now
    planned_left = max(0.0, rule.max_steps - last_step) if rule.planned else math.inf
    limit = planned_left if math.isfinite(planned_left) else conv.max_horizon_factor * float(ls[-1] - ls[0])
    same = es is None or (ms is ls and _monitored_hib(rule) == rule.higher_is_better)
    inf = np.full(fs.samples, math.inf)
    if same:  # the point and the interval read the earliest ends up to the high quantile's: those must be exact
        need = math.ceil(INTERVAL[1] * (fs.samples - 1)) + 1
        got = _series_ends(ls, loss_oriented, es, target, last_step, limit, conv, fs, need)
        if got is None:
            return None
        es_ends, target_ends = got
    else:
        # two series: each sample ends at the first of its two ends, so every sample's end is read on both
        got = _series_ends(ms, m_oriented, es, math.inf, last_step, limit, conv, fs, fs.samples)
        if got is None:
            return None
        es_ends, target_ends = got[0], inf
        if math.isfinite(target):
            loss_got = _series_ends(ls, loss_oriented, None, target, last_step, limit, conv, fs, fs.samples)
            target_ends = loss_got[1] if loss_got is not None else inf
    ends = np.stack([np.full(fs.samples, planned_left), es_ends, target_ends])
    which = np.argmin(ends, axis=0)
    end = ends[which, np.arange(fs.samples)]
    mid = int(np.argsort(end, kind="stable")[fs.samples // 2])
    point = float(end[mid])
    reason = (EndReason.PLANNED_END, EndReason.EARLY_STOPPING, EndReason.TARGET)[int(which[mid])]
    if not math.isfinite(point):  # most samples end beyond the horizon: unknown, under the declared rule
        return math.nan, math.nan, math.nan, EndReason.EARLY_STOPPING if es is not None else EndReason.TARGET
    low, high = (_quantile(end, q) for q in INTERVAL)
    return point, low, high, reason


def _quantile(x: FloatArray, q: float) -> float:
    """np.quantile, but inf where it falls among samples ending beyond the horizon (numpy's
    interpolation between two infs gives NaN, which read as an unknown interval)."""
    above = float(np.sort(x)[math.ceil(q * (x.size - 1))])  # the upper of the two samples it lies between
    return math.inf if math.isinf(above) else float(np.quantile(x, q))


def few_evaluations_end(ms: FloatArray, mv: FloatArray, rule: StoppingRule, last_step: float, fs: ForecastSettings
                        ) -> tuple[float, float, float, EndReason] | None:
    """(point, low, high) steps to the end when the series has too few evaluations to fit, from the
    rule alone: early stopping cannot fire before `patience` evaluations without improvement from
    its state now, a target not before the next evaluation (the low end); the high end is a Lindy
    prior's 90th percentile (prior_high x the steps run), capped by the planned end. The point: as
    many steps again as the job has run (prior_share x its last step), within those bounds.
    Evaluations are assumed at the cadence of those reported (one evaluation: at multiples of its
    step). None without any evaluation: no cadence."""
    if ms.size == 0:
        return None
    cadence = float(np.median(np.diff(ms))) if ms.size >= 2 else float(ms[0])
    if not cadence > 0:
        return None
    es = rule.early_stopping
    next_at = max(0.0, float(ms[-1]) + cadence - last_step)
    if es is not None:
        oriented = -mv if _monitored_hib(rule) else mv
        _, wait, fired = rule_state(oriented, es)
        if fired >= 0:
            return 0.0, 0.0, 0.0, EndReason.EARLY_STOPPING
        low = next_at + (es.patience - wait - 1) * cadence
        reason = EndReason.EARLY_STOPPING
    else:
        low, reason = next_at, EndReason.TARGET
    # the 80 % range of a Lindy prior (P(left > x * run) = 1 / (1 + x)): up to 9 x the steps run
    high = max(low, fs.prior_high * max(last_step, cadence))
    if rule.planned:
        high = min(high, max(0.0, rule.max_steps - last_step))
    if low >= high:  # the planned end comes first
        return high, high, high, EndReason.PLANNED_END
    point = min(high, max(low, fs.prior_share * last_step))
    return point, low, high, reason


def _plateau_end(steps: FloatArray, values: FloatArray, rule: StoppingRule, conv: ConvergenceSettings,
                 fs: ForecastSettings) -> tuple[float, float, float]:
    """(point, low, high) steps to the plateau, measured on the recent part of the curve alone:
    the curve families fitted to the last recent_share of the span, normalised to that part's own
    range, so "5 % of the improvement left" means 5 % of the recent improvement, not of the initial
    drop. The point is the families' geometric mean, the interval their spread, each widened by
    the improvement's uncertainty (x exp(+-1.28 improvement_sd), its 80 % range)."""
    if steps.size < max(2, conv.min_fit_points):
        return math.nan, math.nan, math.nan  # too few points to say anything
    ks, kv = recent_part(steps, values, fs.recent_share, conv.min_fit_points)
    norm = normalise(kv, rule.higher_is_better, conv.median_points)
    if norm is None:
        return 0.0, 0.0, 0.0  # flat over the recent part: at its plateau
    fits = fit_families(ks, norm, conv.fit_grid, conv.fit_families, conv.fit_max_points)
    if not fits:
        return 0.0, 0.0, 0.0  # nothing improves any more (worse than its best): past its plateau
    point = ensemble_remaining_steps(fits, conv.plateau_rel_tol, conv.max_horizon_factor, int(ks.size), None,
                                     conv.fit_rmse_ratio, conv.fit_rmse_floor)
    if not math.isfinite(point):
        return math.nan, math.nan, math.nan  # beyond the horizon: still improving, end unknown
    best = min(f.rmse for f in fits)
    each = [remaining_steps_to_plateau(f, conv.plateau_rel_tol, conv.max_horizon_factor)
            for f in fits if f.rmse <= conv.fit_rmse_ratio * best + conv.fit_rmse_floor]
    each = [r for r in each if math.isfinite(r)] or [point]
    unit = float(ks[-1] - ks[0]) / max(1, ks.size - 1)
    widen = math.exp(1.2816 * fs.improvement_sd)
    low = max(0.0, (min(each) + unit) / widen - unit)
    high = (max(each) + unit) * widen - unit
    return point, min(low, point), max(high, point)


def predict_end(
    steps: npt.ArrayLike, values: npt.ArrayLike, timestamps: npt.ArrayLike | None, rule: StoppingRule,
    conv: ConvergenceSettings, *, est: ConvergenceEstimate | None = None, monitored: Series | None = None,
    forecast: ForecastSettings = DEFAULT_FORECAST,
) -> JobEnd:
    """The job's end under `rule`, from its reported series (steps, values, timestamps: the loss
    as reported; they give the step rate) and, for early stopping on a named metric, that
    metric's (steps, values). est: the loss's ConvergenceEstimate when the caller has it (its step
    rates are used; computed here otherwise). Unknown (NaN, evidence 0) when nothing can be said."""
    clean = clean_series(steps, values, timestamps)
    if clean.steps.size == 0:
        return JobEnd.unknown()
    if est is None:
        est = estimate(clean.steps, clean.values, clean.timestamps,
                       dataclasses.replace(conv, higher_is_better=rule.higher_is_better))
    rates = _rates(clean, est, forecast)
    scale = forecast.intervals.for_rule(rule)
    last = float(clean.steps[-1])
    if rule.planned and last >= rule.max_steps:
        return _finish((0.0, 0.0, 0.0), rates, EndReason.PLANNED_END, scale, 1.0)
    planned = (max(0.0, rule.max_steps - last),) * 3
    if rule.early_stopping is None and not math.isfinite(rule.target):
        if rule.planned:  # the end is known; only the rate is uncertain
            return _finish(planned, rates, EndReason.PLANNED_END, scale, 1.0)
        point, low, high = _plateau_end(clean.steps, clean.values, rule, conv, forecast)
        # nothing stops the job at its plateau: a person may let it run on, as long as the high end of a
        # Lindy prior (P(left > x * run) = 1 / (1 + x)) on the steps run, as few_evaluations_end's
        high = max(high, forecast.prior_high * last)
        return _finish((point, low, high), rates, EndReason.PLATEAU, scale)
    # a named metric never reported is an empty series: its early stopping is unknown, not the loss's
    series = clean_series(*monitored) if rule.early_stopping is not None and monitored is not None else clean
    out = _forecast_end((clean.steps, clean.values), (series.steps, series.values), rule, conv, forecast)
    if out is None:  # too few evaluations to forecast: what the rule itself allows, a wide interval
        out = few_evaluations_end(series.steps, series.values, rule, float(clean.steps[-1]), forecast)
    if out is None:  # not one evaluation yet: no cadence, nothing to say (the planned end is only a cap)
        return JobEnd.unknown(EndReason.EARLY_STOPPING if rule.early_stopping else EndReason.TARGET)
    point, low, high, reason = out
    return _finish((point, low, high), rates, reason, scale)


def _monitored_hib(rule: StoppingRule) -> bool:
    es = rule.early_stopping
    return rule.higher_is_better if es is None or es.higher_is_better is None else es.higher_is_better
