"""The job's end under its stopping rule (scoring/job_end.py, scoring/stopping.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from scoring.convergence import ConvergenceSettings
from scoring.end_interval import UNSCALED
from scoring.end_paths import grid_unit, sample_paths
from scoring.forecast_settings import ForecastSettings
from scoring.job_end import (
    _quantile,
    predict_end,
    recent_part,
    rule_state,
)
from scoring.settings import TrackerSettings
from scoring.stopping import EarlyStopping, EndReason, JobEnd, StoppingRule
from scoring.tracker import ConvergenceTracker
from scoring.world import end_seconds

CONV = ConvergenceSettings()
RAW = ForecastSettings(intervals=UNSCALED)  # the models' own intervals, before the per-rule calibration


def _curve(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray, EarlyStopping]:
    rng = np.random.default_rng(seed)
    rule = EarlyStopping(patience=int(rng.integers(3, 10)), min_delta=float(rng.choice([0.0, 1e-3, 1e-2])))
    tau, noise = rng.uniform(20, 120), rng.uniform(0.002, 0.02)
    values = 0.5 + 2.0 * np.exp(-np.arange(n) / tau) + rng.normal(0.0, noise, n)
    return np.arange(1, n + 1) * 100.0, values, rule


def test_rule_state_fires_as_lightning_does() -> None:
    # best 1.0 at eval 0; 0.9995 is no improvement with min_delta 0.001; 0.95 is
    v = np.array([1.0, 0.9995, 0.95, 0.96, 0.97, 0.951])
    assert rule_state(v, EarlyStopping(patience=3, min_delta=0.001)) == (0.95, 3, 5)
    assert rule_state(v[:5], EarlyStopping(patience=3, min_delta=0.001)) == (0.95, 2, -1)
    assert rule_state(-v[::-1], EarlyStopping(patience=10))[2] == -1


def test_planned_end_is_known_and_interval_is_the_rate_only() -> None:
    steps = np.arange(0, 1000, 10.0)
    values = 1.0 / (1.0 + steps / 100.0)
    end = predict_end(steps, values, steps / 20.0, StoppingRule(max_steps=3000.0), CONV)
    assert end.reason == EndReason.PLANNED_END
    assert end.remaining_steps == end.steps_low == end.steps_high == 3000.0 - 990.0
    assert end.remaining_seconds == pytest.approx(2010.0 / 20.0)
    assert end.seconds_low < end.remaining_seconds < end.seconds_high
    assert end.evidence == 1.0


def test_early_stopping_forecast_covers_the_known_firing() -> None:
    hits, errors, cases, unknown = 0, [], 0, 0
    for seed in range(30):
        steps, values, rule = _curve(seed)
        fired = rule_state(values, rule)[2]
        assert fired > 0
        for frac in (0.25, 0.5, 0.75):
            k = max(6, int(fired * frac))
            if k >= fired:
                continue
            end = predict_end(steps[:k], values[:k], steps[:k] / 10.0, StoppingRule(early_stopping=rule), CONV)
            truth = steps[fired] - steps[k - 1]
            assert end.reason == EndReason.EARLY_STOPPING
            cases += 1
            if not math.isfinite(end.remaining_steps):
                # the recent part still falls in a straight line (with stopping_recent_share 0.6, seed
                # 17 at a quarter; none at the default 0.9): its end lies beyond the horizon for most
                # samples, so unknown, which counts as a miss here
                assert math.isnan(end.steps_low) and math.isnan(end.remaining_seconds)
                unknown += 1
                continue
            hits += end.steps_low <= truth <= end.steps_high
            errors.append(abs(end.remaining_steps - truth) / truth)
            assert end.remaining_seconds == pytest.approx(end.remaining_steps / 10.0)
    assert unknown <= 0.05 * cases
    assert hits / cases >= 0.7
    assert float(np.median(errors)) <= 0.4


def test_fired_rule_and_reached_target_end_now() -> None:
    steps = np.arange(1, 21) * 10.0
    flat = np.r_[np.linspace(2.0, 1.0, 10), np.full(10, 1.0)]
    end = predict_end(steps, flat, None, StoppingRule(early_stopping=EarlyStopping(patience=5)), CONV)
    assert (end.remaining_steps, end.reason) == (0.0, EndReason.EARLY_STOPPING)
    acc = np.linspace(0.1, 0.9, 20)
    end = predict_end(steps, acc, None, StoppingRule(target=0.85, higher_is_better=True), CONV)
    assert (end.remaining_steps, end.reason) == (0.0, EndReason.TARGET)


def test_target_ahead_is_forecast() -> None:
    steps = np.arange(1, 101) * 10.0
    values = 1.0 + 2.0 * np.exp(-steps / 600.0)
    end = predict_end(steps, values, steps, StoppingRule(target=1.2), CONV)
    truth = 600.0 * math.log(10.0) - 1000.0  # where 2 exp(-s / 600) = 0.2
    assert end.reason == EndReason.TARGET
    assert end.steps_low <= end.remaining_steps <= end.steps_high
    assert end.remaining_steps == pytest.approx(truth, rel=0.5)


def test_planned_end_caps_early_stopping() -> None:
    steps, values, rule = _curve(3)
    end = predict_end(steps[:40], values[:40], None, StoppingRule(max_steps=4500.0, early_stopping=rule), CONV)
    assert end.remaining_steps <= 4500.0 - 4000.0
    assert end.steps_high <= 500.0


def test_plateau_judged_on_the_recent_scale() -> None:
    # a huge initial drop (6.0), then a slow decline still worth 40 % of the recent level: not at
    # its plateau (the learnt model's classifier, fitted on whole-range plateaus, says it is)
    steps = np.arange(1, 3001, dtype=np.float64)
    rng = np.random.default_rng(0)
    drop = 6.0 * np.exp(-steps / 100.0) + rng.normal(0.0, 0.005, steps.size)
    linear = predict_end(steps, 0.4 + drop + 0.4 * (1.0 - steps / 6000.0), steps / 100.0, StoppingRule(), CONV)
    assert linear.reason == EndReason.PLATEAU
    assert not (linear.known and linear.remaining_steps == 0.0)
    flat = predict_end(steps, 0.4 + drop, steps / 100.0, StoppingRule(), CONV)
    assert flat.remaining_steps < 300.0
    # a slow exponential after the drop: 5 % of the recent half's improvement (0.5 e^-0.75) is left
    # at 2000 ln(20 e^-0.75) = 4491 steps from now
    late = predict_end(steps, 0.4 + drop + 0.5 * np.exp(-steps / 2000.0), steps / 100.0, StoppingRule(), CONV)
    assert late.steps_low <= 4491.0 <= late.steps_high
    assert late.remaining_steps == pytest.approx(4491.0, rel=0.25)


@pytest.mark.parametrize("seed", range(40))
def test_point_always_inside_interval(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(8, 300))
    steps = np.cumsum(rng.integers(1, 50, n)).astype(np.float64)
    values = rng.uniform(0.1, 1.0) + rng.uniform(0, 5) * (steps / steps[-1] + 0.05) ** -rng.uniform(0.1, 2) \
        + rng.normal(0, rng.uniform(0, 0.3), n)
    rules = [StoppingRule(), StoppingRule(max_steps=float(steps[-1]) * 2),
             StoppingRule(early_stopping=EarlyStopping(patience=int(rng.integers(1, 20)), min_delta=0.01)),
             StoppingRule(target=float(np.min(values)) * 0.9, max_steps=float(steps[-1]) * 3)]
    for rule in rules:
        end = predict_end(steps, values, steps * 0.1, rule, CONV)
        if end.known:
            assert end.steps_low <= end.remaining_steps <= end.steps_high, rule
            assert end.seconds_low <= end.remaining_seconds <= end.seconds_high, rule
            assert 0.0 <= end.evidence <= 1.0


@pytest.mark.parametrize("values", [[], [math.nan] * 10, [1.0] * 3])
def test_empty_and_invalid_input_is_neutral(values: list[float]) -> None:
    steps = np.arange(len(values), dtype=np.float64)
    rules = (StoppingRule(), StoppingRule(early_stopping=EarlyStopping(patience=3)), StoppingRule(target=0.5))
    for rule in rules if len(values) != 3 else rules[:1]:
        end = predict_end(steps, values, None, rule, CONV)
        assert not end.known and end.evidence == 0.0
        assert math.isnan(end.remaining_seconds)


def test_three_flat_evaluations_under_a_rule_are_answered_from_the_rule() -> None:
    # best at the first, two without improvement: patience 3 can fire at the very next evaluation
    # (the raw interval's low end; the calibrated one, narrower, lies above it)
    steps = np.arange(3, dtype=np.float64)
    rule = StoppingRule(early_stopping=EarlyStopping(patience=3))
    end = predict_end(steps, [1.0] * 3, None, rule, CONV, forecast=RAW)
    assert end.steps_low == 1.0 and end.steps_low <= end.remaining_steps <= end.steps_high
    assert math.isnan(end.remaining_seconds)  # no timestamps: no rate, no seconds


def test_bad_rules_are_refused() -> None:
    for kwargs in ({"patience": 0}, {"patience": 2, "min_delta": -1.0}, {"patience": 2, "min_delta": math.nan},
                   {"patience": 2, "metric": ""}):
        with pytest.raises(ValueError):
            EarlyStopping(**kwargs)  # type: ignore[arg-type]


def test_tracker_carries_the_end_and_end_seconds_reads_it() -> None:
    steps, values, rule = _curve(5)
    tracker = ConvergenceTracker(TrackerSettings())
    est = tracker.update("ns/a", steps[:50], values[:50], steps[:50] / 10.0, higher_is_better=False,
                         signature=(50, 1.0), early_stopping=rule)
    assert est is not None and est.end is not None and est.end.reason == EndReason.EARLY_STOPPING
    assert end_seconds(est) == est.end.remaining_seconds
    assert math.isnan(end_seconds(est, min_evidence=1.1))
    assert not tracker.unchanged("ns/a", (50, 1.0))  # the rule is part of what was estimated
    assert tracker.unchanged("ns/a", (50, 1.0), early_stopping=rule)
    off = ConvergenceTracker(TrackerSettings(), job_ends=False)
    est = off.update("ns/a", steps[:50], values[:50], None, higher_is_better=False, signature=(50, 1.0))
    assert est is not None and est.end is None


def test_the_trackers_forecast_settings_reach_the_end_it_carries() -> None:
    # The service's convergence.forecast (TrackerSettings.forecast): every future stalled answers
    # sooner than the default's fifth; the default equals predict_end's own default.
    steps, values, rule = _curve(5)

    def end(forecast: ForecastSettings) -> JobEnd:
        tracker = ConvergenceTracker(TrackerSettings(forecast=forecast))
        est = tracker.update("ns/a", steps[:50], values[:50], steps[:50] / 10.0, higher_is_better=False,
                             signature=(50, 1.0), early_stopping=rule)
        assert est is not None and est.end is not None
        return est.end

    default = end(ForecastSettings())
    assert default == predict_end(steps[:50], values[:50], steps[:50] / 10.0, StoppingRule(early_stopping=rule), CONV)
    stalled = end(ForecastSettings(stall_share=0.99))
    assert stalled.remaining_steps < default.remaining_steps


def test_unknown_end() -> None:
    end = JobEnd.unknown()
    assert not end.known and end.reason is None and end.evidence == 0.0


def test_seconds_come_from_the_runs_average_rate_pauses_included() -> None:
    # 10 steps/s, plus a 5 s evaluation pause every 100 steps: 15 s per 100 steps on average
    steps = np.arange(1, 1001, dtype=np.float64)
    timestamps = steps / 10.0 + 5.0 * (steps // 100)
    end = predict_end(steps, 1.0 / steps, timestamps, StoppingRule(max_steps=2000.0), CONV)
    assert end.remaining_steps == 1000.0
    assert end.remaining_seconds == pytest.approx(1000.0 * (timestamps[-1] - timestamps[0]) / 999.0)
    assert end.seconds_low <= 150.0 <= end.seconds_high


def test_too_few_evaluations_answer_what_the_rule_allows_not_the_cap() -> None:
    # 3 evaluations every 100 steps, patience 4, the last one no improvement: the rule cannot fire
    # before 3 more evaluations (step 600), and the cap ends it at 5000 at the latest
    steps = np.arange(1, 4) * 100.0
    rule = StoppingRule(max_steps=5000.0, early_stopping=EarlyStopping(patience=4))
    end = predict_end(steps, [1.0, 0.8, 0.85], steps / 10.0, rule, CONV, forecast=RAW)
    assert end.reason == EndReason.EARLY_STOPPING
    assert (end.steps_low, end.remaining_steps, end.steps_high) == (300.0, 300.0, 2700.0)  # 9 x 300 run
    assert end.seconds_low <= end.remaining_seconds <= end.seconds_high
    # a target: not before the next evaluation, the point as many steps again as run so far
    end = predict_end(steps, [1.0, 0.8, 0.7], steps, StoppingRule(max_steps=5000.0, target=0.1), CONV, forecast=RAW)
    assert end.reason == EndReason.TARGET
    assert (end.steps_low, end.remaining_steps, end.steps_high) == (100.0, 300.0, 2700.0)
    # the cap comes before the rule could fire: the planned end
    end = predict_end(steps, [1.0, 0.8, 0.85], steps, dataclasses.replace(rule, max_steps=450.0), CONV, forecast=RAW)
    assert (end.remaining_steps, end.steps_high, end.reason) == (150.0, 150.0, EndReason.PLANNED_END)


def test_one_evaluation_gives_the_cadence_none_leaves_it_unknown() -> None:
    loss = (np.arange(1, 31) * 10.0, np.linspace(2.0, 1.0, 30))
    rule = StoppingRule(max_steps=10_000.0, early_stopping=EarlyStopping(patience=5, metric="val"))
    end = predict_end(*loss, None, rule, CONV, monitored=([250.0], [1.3]))
    # evaluations every 250: five in a row without improvement after the best at 250 end it at
    # 1500 at the soonest, 1200 steps after the last reported step
    assert end.steps_low == 1200.0 and end.steps_low <= end.remaining_steps <= end.steps_high
    assert not predict_end(*loss, None, rule, CONV, monitored=([], [])).known


def test_grid_unit_finds_an_accuracy_over_a_fixed_set() -> None:
    acc = np.array([61, 64, 64, 66, 65, 69, 69, 70]) / 170.0
    assert grid_unit(np.round(acc, 5)) == pytest.approx(1 / 170.0, rel=1e-3)
    assert math.isnan(grid_unit(np.array([1.0, 0.71, 0.6234, 0.5, 0.4811])))


def test_a_metric_on_a_grid_is_forecast_on_it() -> None:
    # an accuracy over 170 examples: ties with the best are no improvement, so the forecast
    # values must be ties too, not a continuum that improves by 1e-6
    steps = np.arange(1, 13, dtype=np.float64) * 25.0
    acc = np.array([150, 155, 160, 162, 163, 163, 165, 164, 165, 166, 166, 166], dtype=np.float64) / 170.0
    paths = sample_paths(steps, -acc, 50, 25.0, CONV, ForecastSettings())
    k = np.round(-paths * 170.0)
    assert np.allclose(-paths * 170.0, k, atol=1e-6)
    loose = sample_paths(steps, -acc, 50, 25.0, CONV, ForecastSettings(quantise=False))
    assert not np.allclose(-loose * 170.0, np.round(-loose * 170.0), atol=1e-6)


def test_no_rule_high_end_reaches_the_lindy_prior_nothing_stops_it_at_its_plateau() -> None:
    steps = np.arange(1, 201, dtype=np.float64)
    values = 0.3 + np.exp(-steps / 20.0)  # at its plateau well before step 200
    end = predict_end(steps, values, steps, StoppingRule(), CONV, forecast=RAW)
    assert end.known and end.reason == EndReason.PLATEAU
    assert end.steps_high >= RAW.prior_high * 200.0 and end.steps_low <= end.remaining_steps <= end.steps_high
    calibrated = predict_end(steps, values, steps, StoppingRule(), CONV)
    assert calibrated.remaining_steps == end.remaining_steps  # calibration moves the interval, not the point
    assert calibrated.steps_low <= calibrated.remaining_steps <= calibrated.steps_high


def test_an_interval_whose_high_end_lies_beyond_the_horizon_is_inf_not_nan() -> None:
    # Most samples end, but more than a tenth never do within the horizon: numpy's quantile
    # interpolates inf - inf there (NaN, an "unknown" interval), the end's high is inf.
    ends = np.array([5.0] * 100 + [math.inf] * 28)
    assert _quantile(ends, 0.9) == math.inf
    assert _quantile(ends, 0.1) == 5.0
    finite = np.linspace(0.0, 10.0, 128)
    assert _quantile(finite, 0.9) == float(np.quantile(finite, 0.9))


def test_a_share_of_early_stopping_futures_improve_no_more() -> None:
    """stall_share: a validation series still falling slowly may have reached its best; that share of
    the samples improve no more, so the interval's low end reaches the rule's own floor (patience
    evaluations without improvement from now), which a forecast of decreasing curves alone misses."""
    steps = np.arange(1, 81) * 50.0
    values = 1.0 + 2.0 / (1.0 + steps / 400.0) + np.random.default_rng(3).normal(0.0, 0.002, steps.size)
    es = EarlyStopping(patience=10)
    rule = StoppingRule(early_stopping=es)
    _, wait, fired = rule_state(values, es)
    assert fired < 0
    floor = (es.patience - wait) * 50.0  # no improvement from now: the rule fires after its remaining patience
    ends = {share: predict_end(steps, values, steps / 10.0, rule, CONV,
                               forecast=dataclasses.replace(RAW, stall_share=share)) for share in (0.0, 0.2)}
    assert ends[0.0].steps_low > 4 * floor  # every sample keeps improving
    # near the floor: a stalled sample's noise may still dip below the best once and restart the
    # patience (seeds 0-7 put the low end at 1.2-1.7 x the floor, 7.3-8.9 x without the stall)
    assert ends[0.2].steps_low <= 2 * floor
    assert ends[0.2].steps_low <= ends[0.2].remaining_steps <= ends[0.2].steps_high
    # a target alone is not affected: only early stopping's forecast stalls
    target = StoppingRule(target=1.2)
    assert predict_end(steps, values, steps / 10.0, target, CONV, forecast=dataclasses.replace(RAW, stall_share=0.2)) \
        == predict_end(steps, values, steps / 10.0, target, CONV, forecast=dataclasses.replace(RAW, stall_share=0.0))
    with pytest.raises(ValueError, match="stall_share"):
        ForecastSettings(stall_share=1.0)


def test_recent_part_keeps_the_last_share_of_the_span_and_a_floor_of_points() -> None:
    steps = np.arange(0.0, 1000.0, 100.0)  # 0..900
    ks, kv = recent_part(steps, -steps, 0.6, 3)
    assert ks.tolist() == [400.0, 500.0, 600.0, 700.0, 800.0, 900.0] and kv.tolist() == (-ks).tolist()
    assert recent_part(steps, steps, 0.1, 3)[0].tolist() == [700.0, 800.0, 900.0]  # 800..900 has 2: floor 3
    assert recent_part(steps[:2], steps[:2], 0.5, 5)[0].tolist() == [0.0, 100.0]  # fewer than the floor: all
    with pytest.raises(ValueError, match="stopping_recent_share"):
        ForecastSettings(stopping_recent_share=0.0)


def test_early_stopping_reads_the_flattened_recent_part_not_the_early_drop() -> None:
    """A validation series that fell fast and then flattened (seen its best 3 evaluations ago, 7
    left under patience 10): fitted to the whole series, the families carry the early drop's
    promise on; fitted to its recent 60 % (the default, 90 %, keeps most of the drop here), the
    samples follow the flat part and end sooner, nearer the truth (700 steps)."""
    rule = EarlyStopping(patience=10)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        k = np.arange(80.0)
        values = 0.2 + 2.0 / (1.0 + np.minimum(k, 25.0) / 2.0) + rng.normal(0.0, 0.003, k.size)
        steps = (k + 1.0) * 100.0
        fired = rule_state(values, rule)[2]
        n = fired - 6
        assert rule_state(values[:n], rule)[1] == 3
        truth = steps[fired] - steps[n - 1]
        whole, recent = (predict_end(steps[:n], values[:n], steps[:n] / 10.0, StoppingRule(early_stopping=rule), CONV,
                                     forecast=dataclasses.replace(RAW, stopping_recent_share=share))
                         for share in (1.0, 0.6))
        assert truth <= recent.remaining_steps < whole.remaining_steps

