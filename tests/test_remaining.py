from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring import remaining_params
from scoring.convergence import ConvergenceSettings, estimate
from scoring.remaining import (
    FEATURES,
    QUANTILES,
    CurveEvidence,
    RemainingDistribution,
    RemainingModel,
    evidence_weight,
    feature_vector,
    predict,
)


def evidence(**kw: object) -> CurveEvidence:
    base = CurveEvidence(span=100.0, unit=2.0, family_left=(50.0, 80.0, 300.0), family_gap=(0.3, 0.4, 0.6),
                         best_rmse=0.01, recent_gain=(0.2, 0.08), horizon=20.0, last_value=0.05,
                         recent_value=0.06)
    return replace(base, **kw)  # type: ignore[arg-type]


def constant_model(q10: float, q50: float, q90: float, logit: float, **kw: object) -> RemainingModel:
    """A model whose answer ignores the features: intercepts only."""
    def row(v: float) -> tuple[float, ...]:
        return (v,) + (0.0,) * (FEATURES - 1)
    return RemainingModel(quantiles=QUANTILES, coef=(row(q10), row(q50), row(q90)), plateau_coef=row(logit),
                          **kw)  # type: ignore[arg-type]


# ---- features and the mixture ----

def test_features_are_finite_whatever_is_unknown() -> None:
    ev = evidence(family_left=(math.nan, math.inf, -3.0), family_gap=(math.nan, 2.0, -1.0), best_rmse=math.nan,
                  recent_gain=(math.nan, math.nan), last_value=math.nan, recent_value=math.nan)
    x = feature_vector(ev)
    assert x.shape == (FEATURES,) and np.isfinite(x).all()


def test_median_is_the_quantile_model_when_growing_and_zero_when_plateaued() -> None:
    ev = evidence()
    # log((left + unit) / (span + unit)) = 0 -> left = span
    growing = predict(ev, constant_model(-1.0, 0.0, 1.0, logit=-20.0))
    assert growing.median == pytest.approx(100.0)
    assert growing.low < growing.median < growing.high
    assert growing.low == pytest.approx(math.exp(-1.0) * 102.0 - 2.0)
    assert growing.plateau_probability < 1e-6 and not growing.plateaued
    plateaued = predict(ev, constant_model(-1.0, 0.0, 1.0, logit=20.0))
    assert plateaued.median == 0.0 and plateaued.high == 0.0 and plateaued.plateaued


def test_a_middling_plateau_probability_pulls_the_low_end_to_zero_first() -> None:
    d = predict(evidence(), constant_model(-1.0, 0.0, 1.0, logit=math.log(0.2 / 0.8)))  # p = 0.2
    assert d.plateau_probability == pytest.approx(0.2)
    assert d.low == 0.0 and 0.0 < d.median < 100.0 < d.high  # the median is the 37.5th percentile of the rest


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
        RemainingModel(quantiles=QUANTILES, coef=((0.0,),), plateau_coef=(0.0,))
    with pytest.raises(ValueError, match="quantiles"):
        RemainingModel(quantiles=(0.2, 0.5, 0.8), coef=((0.0,),) * 3, plateau_coef=(0.0,))
    short = RemainingModel(quantiles=QUANTILES, coef=((0.0,),) * 3, plateau_coef=(0.0,))
    with pytest.raises(ValueError, match="features"):
        predict(evidence(), short)


def test_shipped_parameters_fit_the_features() -> None:
    for model in (remaining_params.OPEN_END, remaining_params.PLANNED_END):
        assert len(model.plateau_coef) == FEATURES
        assert 1.0 <= model.spread <= 4.0 and 0.5 <= model.plateau_threshold < 1.0


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


def test_early_prefix_is_growing_and_a_long_flat_tail_is_plateaued() -> None:
    k, loss = curve(400)
    s = ConvergenceSettings(window_s=0.0)
    early = estimate(k[:30], loss[:30], None, s)
    late = estimate(k, loss, None, s)
    assert early.plateau_probability < 0.5 and early.learned_remaining_steps > 0
    assert late.plateaued and late.learned_remaining_steps == 0.0 and late.remaining_steps_high == 0.0


def test_learned_setting_reports_the_learned_median() -> None:
    k, loss = curve(40)
    ens = estimate(k, loss, None, ConvergenceSettings())
    learned = estimate(k, loss, None, ConvergenceSettings(remaining_model="learned"))
    assert learned.remaining_steps == ens.learned_remaining_steps
    assert learned.remaining_steps_low == ens.remaining_steps_low  # the interval is the same either way
    with pytest.raises(ValueError, match="remaining_model"):
        ConvergenceSettings(remaining_model="oracle")


def test_planned_end_and_target_reach_the_estimate() -> None:
    k, loss = curve(40, rate=0.01)
    s = ConvergenceSettings()
    assert estimate(k, loss, None, s, max_steps=50.0).remaining_steps_high <= 10.0
    # a target the last points already beat is reached: nothing left
    done = estimate(k, loss, None, s, target=float(loss[-3:].mean()) + 0.05)
    assert done.learned_remaining_steps == 0.0 and done.plateau_probability == 1.0
    near = estimate(k, loss, None, s, target=0.3 + math.exp(-0.01 * 60))  # reached near step 60
    assert 0.0 < near.remaining_steps_high <= 40.0


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
