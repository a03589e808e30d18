from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring import remaining_params
from scoring.convergence import (
    ConvergenceSettings,
    clean_series,
    curve_evidence,
    estimate,
    normalise,
    remaining_model_for,
)
from scoring.curve_fit import fit_families
from scoring.remaining import (
    FEATURES,
    QUANTILES,
    SHAPE_FEATURES,
    CurveEvidence,
    RemainingDistribution,
    RemainingModel,
    Trees,
    evidence_weight,
    feature_vector,
    predict,
    prefix_shape,
)


def evidence(**kw: object) -> CurveEvidence:
    base = CurveEvidence(span=100.0, unit=2.0, family_left=(50.0, 80.0, 300.0), family_gap=(0.3, 0.4, 0.6),
                         best_rmse=0.01, recent_gain=(0.2, 0.08), horizon=20.0, last_value=0.05,
                         recent_value=0.06)
    return replace(base, **kw)  # type: ignore[arg-type]


def const(v: float) -> Trees:
    """One stump that never splits: the value is v whatever the features."""
    return Trees(base=v, depth=1, feature=(0,), threshold=(1e300,), leaf=(0.0, 0.0))


def constant_model(q10: float, q50: float, q90: float, logit: float, **kw: object) -> RemainingModel:
    """A model whose answer ignores the features."""
    return RemainingModel(quantiles=QUANTILES, quantile_trees=(const(q10), const(q50), const(q90)),
                          plateau_trees=const(logit), **kw)  # type: ignore[arg-type]


# ---- features, the steps left and the plateau ----

def test_features_are_finite_whatever_is_unknown() -> None:
    ev = evidence(family_left=(math.nan, math.inf, -3.0), family_gap=(math.nan, 2.0, -1.0), best_rmse=math.nan,
                  recent_gain=(math.nan, math.nan), last_value=math.nan, recent_value=math.nan)
    x = feature_vector(ev)
    assert x.shape == (FEATURES,) and np.isfinite(x).all()


def test_steps_are_the_quantile_model_and_the_plateau_a_separate_answer() -> None:
    ev = evidence()
    # log((left + unit) / (span + unit)) = 0 -> left = span
    growing = predict(ev, constant_model(-1.0, 0.0, 1.0, logit=-20.0))
    assert growing.median == pytest.approx(100.0)
    assert growing.low < growing.median < growing.high
    assert growing.low == pytest.approx(math.exp(-1.0) * 102.0 - 2.0)
    assert growing.high == pytest.approx(math.exp(1.0) * 102.0 - 2.0)
    assert growing.plateau_probability < 1e-6 and not growing.plateaued
    # at the plateau: the flag says so; the steps stay "what is left if it is not" (no 0 at 100 % error)
    plateaued = predict(ev, constant_model(-1.0, 0.0, 1.0, logit=20.0))
    assert plateaued.plateaued and plateaued.plateau_probability > 1 - 1e-6
    assert (plateaued.low, plateaued.median, plateaued.high) == (growing.low, growing.median, growing.high)


def test_the_plateau_flag_follows_the_threshold() -> None:
    below = predict(evidence(), constant_model(-1.0, 0.0, 1.0, logit=math.log(0.59 / 0.41), plateau_threshold=0.6))
    above = predict(evidence(), constant_model(-1.0, 0.0, 1.0, logit=math.log(0.61 / 0.39), plateau_threshold=0.6))
    assert below.plateau_probability == pytest.approx(0.59) and not below.plateaued
    assert above.plateau_probability == pytest.approx(0.61) and above.plateaued


def test_crossing_quantiles_are_reordered() -> None:
    d = predict(evidence(), constant_model(1.0, 0.0, -1.0, logit=-20.0))
    assert d.low < d.median < d.high


def test_spread_widens_the_interval_around_the_same_median() -> None:
    narrow = predict(evidence(), constant_model(-0.5, 0.0, 0.5, logit=-20.0))
    wide = predict(evidence(), constant_model(-0.5, 0.0, 0.5, logit=-20.0, spread=2.0))
    assert wide.median == pytest.approx(narrow.median)
    assert wide.low < narrow.low and wide.high > narrow.high


def test_planned_end_and_target_cap_the_prediction() -> None:
    model = constant_model(0.0, 1.0, 2.0, logit=-20.0)
    free = predict(evidence(), model)
    assert free.high > 300.0
    capped = predict(evidence(planned_left=150.0), model)
    assert capped.high == 150.0 and capped.median <= 150.0
    target = predict(evidence(target_left=40.0), model)
    assert target.median == 40.0 and target.high == 40.0
    reached = predict(evidence(target_left=0.0), model)
    assert (reached.median, reached.plateau_probability, reached.plateaued) == (0.0, 1.0, True)
    never = predict(evidence(target_left=math.inf), model)
    assert never.median == pytest.approx(free.median)


def test_model_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        RemainingModel(quantiles=QUANTILES, quantile_trees=(const(0.0),), plateau_trees=const(0.0))
    with pytest.raises(ValueError, match="quantiles"):
        RemainingModel(quantiles=(0.2, 0.5, 0.8), quantile_trees=(const(0.0),) * 3, plateau_trees=const(0.0))
    with pytest.raises(ValueError, match="trees shape"):
        Trees(base=0.0, depth=2, feature=(0, 1), threshold=(0.0, 0.0, 0.0), leaf=(0.0,) * 4)
    beyond = Trees(base=0.0, depth=1, feature=(FEATURES,), threshold=(0.0,), leaf=(0.0, 1.0))
    with pytest.raises(ValueError, match="features"):
        RemainingModel(quantiles=QUANTILES, quantile_trees=(const(0.0),) * 3, plateau_trees=beyond)


def test_trees_follow_their_splits() -> None:
    # depth 2, one tree: root splits feature 1 at 0.5; left child feature 2 at 0; right child feature 1 at 2
    t = Trees(base=10.0, depth=2, feature=(1, 2, 1), threshold=(0.5, 0.0, 2.0), leaf=(1.0, 2.0, 3.0, 4.0))
    assert t.value(np.array([0.0, 0.5, -1.0])) == 11.0  # <= 0.5, <= 0: leaf 0
    assert t.value(np.array([0.0, 0.0, 1.0])) == 12.0  # <= 0.5, > 0: leaf 1
    assert t.value(np.array([0.0, 1.0, 9.0])) == 13.0  # > 0.5, <= 2: leaf 2
    assert t.value(np.array([0.0, 3.0, 9.0])) == 14.0  # > 0.5, > 2: leaf 3
    two = Trees(base=0.0, depth=1, feature=(0, 0), threshold=(0.0, 1.0), leaf=(1.0, 2.0, 10.0, 20.0))
    assert two.value(np.array([0.5])) == 2.0 + 10.0  # the trees add up


def test_ensembles_of_different_depths_are_evaluated_together_as_one_by_one() -> None:
    rng = np.random.default_rng(5)

    def random_trees(depth: int, trees: int) -> Trees:
        inner, leaves = 2 ** depth - 1, 2 ** depth
        return Trees(base=float(rng.normal()), depth=depth,
                     feature=tuple(int(v) for v in rng.integers(0, 6, trees * inner)),
                     threshold=tuple(float(v) for v in rng.normal(0.0, 1.0, trees * inner)),
                     leaf=tuple(float(v) for v in rng.normal(0.0, 1.0, trees * leaves)))

    model = RemainingModel(quantiles=QUANTILES, quantile_trees=(random_trees(1, 3), random_trees(3, 5),
                                                                random_trees(2, 1)),
                           plateau_trees=random_trees(4, 7))
    for _ in range(50):
        x = rng.normal(0.0, 1.0, FEATURES)
        one_by_one = [t.value(x) for t in (*model.quantile_trees, model.plateau_trees)]
        assert model.values(x) == pytest.approx(one_by_one, rel=1e-12, abs=1e-12)
    for shipped in (remaining_params.OPEN_END, remaining_params.PLANNED_END):
        x = rng.normal(0.0, 1.0, FEATURES)
        assert shipped.values(x) == pytest.approx([t.value(x) for t in (*shipped.quantile_trees,
                                                                         shipped.plateau_trees)])


def test_shipped_parameters_fit_the_features() -> None:
    for model in (remaining_params.OPEN_END, remaining_params.PLANNED_END):
        assert all(t.features_used <= FEATURES for t in (*model.quantile_trees, model.plateau_trees))
        assert 0.5 <= model.spread <= 4.0 and 0.5 <= model.plateau_threshold < 1.0  # fit_remaining's ranges


# ---- the prefix's shape ----

def test_prefix_shape_is_scale_free_finite_and_knows_the_planned_end() -> None:
    k = np.arange(1.0, 41.0)
    norm = np.exp(-0.1 * (k - 1))
    norm = (norm - norm.min()) / (norm.max() - norm.min())
    shape = prefix_shape(k, norm)
    assert len(shape) == SHAPE_FEATURES and all(math.isfinite(v) for v in shape)
    assert prefix_shape(k * 1000.0 + 7.0, norm) == pytest.approx(shape)  # steps' unit and origin do not matter
    assert shape[-2:] == (0.0, 0.0)  # no planned end
    planned = prefix_shape(k, norm, planned_left=39.0)
    assert planned[-1] == pytest.approx(0.5) and planned[:-2] == shape[:-2]  # half the planned run is done
    gains = shape[:5]
    assert list(gains) == sorted(gains) and gains[0] >= 0.0 and gains[-1] <= 1.0  # more span, more gain
    assert prefix_shape(k[:1], norm[:1]) == () and prefix_shape(np.full(3, 5.0), norm[:3]) == ()


def test_a_flat_tail_reads_as_long_since_the_running_best_moved() -> None:
    k = np.arange(1.0, 101.0)
    early = np.minimum(1.0, np.maximum(0.0, 1.0 - (k - 1) / 20.0))  # all the gain in the first fifth
    late = 1.0 - (k - 1) / 99.0  # steady all along
    near = len((0.05, 0.1, 0.2, 0.35, 0.5))  # index of "since within 50 %"
    assert prefix_shape(k, early)[near + 3] > 0.75  # within 5 % for more than three quarters of the span
    assert prefix_shape(k, late)[near + 3] < 0.1


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=SHAPE_FEATURES,
                max_size=SHAPE_FEATURES))
def test_feature_vector_is_finite_whatever_the_shape_says(shape: list[float]) -> None:
    x = feature_vector(evidence(shape=tuple(shape)))
    assert x.shape == (FEATURES,) and np.isfinite(x).all()
    assert feature_vector(evidence(shape=())).shape == (FEATURES,)  # unknown shape: neutral values


@settings(max_examples=200, deadline=None)
@given(st.floats(-8, 3), st.floats(0, 3), st.floats(0, 3), st.floats(-60, 60), st.floats(1.0, 3.0),
       st.floats(0.5, 0.95), st.one_of(st.none(), st.floats(0, 1e5)))
def test_predict_is_ordered_and_bounded_for_any_model(
    q50: float, down: float, up: float, logit: float, spread: float, threshold: float, planned: float | None
) -> None:
    model = constant_model(q50 - down, q50, q50 + up, logit, spread=spread, plateau_threshold=threshold)
    d = predict(evidence(planned_left=math.nan if planned is None else planned), model)
    assert 0.0 <= d.plateau_probability <= 1.0
    assert 0.0 <= d.low <= d.median <= d.high and math.isfinite(d.high)
    assert d.plateaued == (d.plateau_probability >= threshold)
    if planned is not None:
        assert d.high <= planned


def test_shipped_model_prediction_costs_well_under_a_millisecond() -> None:
    k = np.arange(1.0, 2001.0) * 10.0
    rng = np.random.default_rng(3)
    loss = 1.0 / (0.001 * k + 0.5) + 0.3 + rng.normal(0.0, 0.005, k.size)
    s = ConvergenceSettings()
    clean = clean_series(k, loss, None)
    norm = normalise(clean.values, False, s.median_points)
    assert norm is not None
    fits = fit_families(clean.steps, norm, s.fit_grid, s.fit_families, s.fit_max_points)
    model = remaining_model_for(None)
    ev = curve_evidence(clean.steps, norm, fits, s)
    assert ev is not None
    predict(ev, model)  # warm the trees' arrays
    best = math.inf
    for _ in range(5):  # the best of 5 rounds: a busy shared machine slows single calls
        t0 = time.perf_counter()
        for _ in range(20):
            predict(curve_evidence(clean.steps, norm, fits, s), model)  # type: ignore[arg-type]
        best = min(best, (time.perf_counter() - t0) / 20)
    assert best < 2e-3  # benchmarks/remaining_cost measures it properly; the issue asks <= 1 ms


# ---- the documented rule: a wide interval is weak evidence ----

def test_evidence_weight_rule() -> None:
    assert evidence_weight(RemainingDistribution(10.0, 10.0, 10.0, 0.0)) == 1.0
    assert evidence_weight(RemainingDistribution(10.0, 1.0, 7.0, 0.0)) == pytest.approx(1.0 / 3.0)  # 2x..8x
    assert evidence_weight(RemainingDistribution.unknown()) == 0.0
    assert evidence_weight(RemainingDistribution(5.0, 9.0, 3.0, 0.0)) == 0.0  # inverted: not evidence


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1.0, 100.0))
def test_wider_interval_never_weighs_more(lo: float, width: float, factor: float) -> None:
    tight = evidence_weight(RemainingDistribution(lo, lo, lo + width, 0.0))
    wide = evidence_weight(RemainingDistribution(lo, lo, lo + width * factor, 0.0))
    assert 0.0 < wide <= tight <= 1.0


# ---- through estimate() ----

def curve(n: int, rate: float = 0.02, noise: float = 0.003, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(1.0, n + 1.0)
    rng = np.random.default_rng(seed)
    return k, 0.3 + np.exp(-rate * k) + rng.normal(0.0, noise, n)


def test_estimate_carries_the_distribution_and_the_seconds() -> None:
    k, loss = curve(40)
    e = estimate(k, loss, k * 4.0, ConvergenceSettings(window_s=0.0))  # 0.25 steps/s
    assert e.remaining_steps_low <= e.learned_remaining_steps <= e.remaining_steps_high
    assert 0.0 <= e.plateau_probability <= 1.0
    assert e.remaining_seconds_high == pytest.approx(e.remaining_steps_high * 4.0)
    assert e.remaining_distribution().median == e.learned_remaining_steps
    assert e.remaining_steps == e.ensemble_remaining_steps  # the default point estimate is unchanged


def test_remaining_seconds_use_the_recent_rate() -> None:
    k, loss = curve(40)
    t = np.concatenate([k[:30] * 4.0, k[29] * 4.0 + (k[30:] - k[29]) * 1.0])  # 0.25 steps/s, then 1 step/s
    e = estimate(k, loss, t, ConvergenceSettings(window_s=0.0))
    assert e.remaining_rate == pytest.approx(1.0)  # the last 4 points' rate
    assert e.step_rate < 0.7  # the last 20 points still mix in the slow part
    assert e.remaining_seconds_high == pytest.approx(e.remaining_steps_high / e.remaining_rate)
    assert e.remaining_seconds == pytest.approx(e.remaining_steps / e.remaining_rate)
    same_time = t.copy()
    same_time[-4:] = same_time[-4]  # no time passed over the last points: the longer rate stands in
    f = estimate(k, loss, same_time, ConvergenceSettings(window_s=0.0))
    assert f.remaining_rate == f.step_rate


def test_a_loss_rising_after_its_first_points_has_evidence_and_reads_as_plateaued() -> None:
    # no curve family decreases over this prefix (no fit at all); before, such prefixes had no
    # evidence and could never be called plateaued (LCBench's overfitting cross-entropy curves)
    k = np.arange(1.0, 41.0)
    loss = np.where(k <= 3, 1.0 - 0.1 * k, 0.7 + 0.01 * (k - 3))
    s = ConvergenceSettings()
    clean = clean_series(k, loss, None)
    norm = normalise(clean.values, False, s.median_points)
    assert norm is not None and fit_families(clean.steps, norm) == []
    ev = curve_evidence(clean.steps, norm, [], s)
    assert ev is not None and all(math.isnan(v) for v in ev.family_left) and math.isnan(ev.best_rmse)
    assert np.isfinite(feature_vector(ev)).all()
    e = estimate(k, loss, k * 2.0, s)
    assert e.plateaued and e.plateau_probability > 0.9
    assert math.isnan(e.ensemble_remaining_steps)  # the families still have nothing to say


def test_early_prefix_is_growing_and_a_long_flat_tail_is_plateaued() -> None:
    k, loss = curve(400)
    s = ConvergenceSettings(window_s=0.0)
    early = estimate(k[:30], loss[:30], None, s)
    late = estimate(k, loss, None, s)
    assert early.plateau_probability < 0.5 and not early.plateaued and early.learned_remaining_steps > 0
    assert late.plateaued and late.plateau_probability > 0.9


def test_learned_setting_reports_the_learned_median() -> None:
    k, loss = curve(40)
    ens = estimate(k, loss, None, ConvergenceSettings())
    learned = estimate(k, loss, None, ConvergenceSettings(remaining_model="learned"))
    assert learned.remaining_steps == ens.learned_remaining_steps
    assert learned.remaining_steps_low == ens.remaining_steps_low  # the interval is the same either way
    with pytest.raises(ValueError, match="remaining_model"):
        ConvergenceSettings(remaining_model="oracle")


def test_auto_uses_the_learned_median_only_with_a_planned_end() -> None:
    k, loss = curve(40, rate=0.01)
    s = ConvergenceSettings()
    assert s.remaining_model == "auto"
    open_end = estimate(k, loss, None, s)
    planned = estimate(k, loss, None, s, max_steps=200.0)
    assert open_end.remaining_steps == open_end.ensemble_remaining_steps
    assert planned.remaining_steps == planned.learned_remaining_steps != planned.ensemble_remaining_steps
    forced = estimate(k, loss, None, ConvergenceSettings(remaining_model="ensemble"), max_steps=200.0)
    assert forced.remaining_steps == forced.ensemble_remaining_steps


def test_planned_end_and_target_reach_the_estimate() -> None:
    k, loss = curve(40, rate=0.01)
    s = ConvergenceSettings()
    assert estimate(k, loss, None, s, max_steps=50.0).remaining_steps_high <= 10.0
    # a target the last points already beat is reached: nothing left
    done = estimate(k, loss, None, s, target=float(loss[-3:].mean()) + 0.05)
    assert done.learned_remaining_steps == 0.0 and done.plateau_probability == 1.0
    near = estimate(k, loss, None, s, target=0.3 + math.exp(-0.01 * 60))  # reached near step 60
    assert 0.0 < near.remaining_steps_high <= 40.0
    # the point estimate without a planned end (the families' mean) stops at the target too
    assert done.remaining_steps == 0.0 and done.remaining_seconds == 0.0
    free = estimate(k, loss, None, s)
    assert 0.0 < near.remaining_steps <= 40.0 < free.remaining_steps


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=0, max_size=40),
       st.one_of(st.none(), st.floats(0, 1e6)), st.one_of(st.none(), st.floats(-1e6, 1e6)))
def test_distribution_is_ordered_and_non_negative_for_any_input(
    values: list[float], max_steps: float | None, target: float | None
) -> None:
    steps = np.arange(len(values)) * 3.0
    e = estimate(steps, values, steps, ConvergenceSettings(window_s=0.0), max_steps=max_steps, target=target)
    lo, mid, hi, p = e.remaining_steps_low, e.learned_remaining_steps, e.remaining_steps_high, e.plateau_probability
    if math.isnan(p):
        assert math.isnan(lo) and math.isnan(hi)
        return
    assert 0.0 <= p <= 1.0
    assert 0.0 <= lo <= mid <= hi and math.isfinite(hi)


def test_non_finite_points_do_not_reach_the_model() -> None:
    k, loss = curve(60)
    dirty = loss.copy()
    dirty[::7] = math.nan
    dirty[3] = math.inf
    e = estimate(k, dirty, k * 2.0, ConvergenceSettings(window_s=0.0), max_steps=120.0)
    assert e.rejected == {"value_nan": 9, "value_inf": 1}
    lo, mid, hi, p = e.remaining_steps_low, e.learned_remaining_steps, e.remaining_steps_high, e.plateau_probability
    assert 0.0 <= lo <= mid <= hi <= 120.0 - 60.0 and 0.0 <= p <= 1.0
    assert e.remaining_steps == mid  # "auto" with a planned end: the learnt median
