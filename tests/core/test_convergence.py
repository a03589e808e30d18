from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.convergence import (
    ConvergenceEstimate,
    ConvergenceSettings,
    Phase,
    advance_phase,
    clean_series,
    estimate,
    replay_phase,
)
from scoring.curve_fit import fit_family, fit_inverse_curve

POINT_WINDOWS = ConvergenceSettings(window_s=0.0, window_points=5)


def optimus_curve(n: int, noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = np.arange(1, n + 1) * 10.0
    rng = np.random.default_rng(seed)
    loss = 1.0 / (0.01 * k + 0.5) + 0.3 + rng.normal(0.0, noise, n)
    return k, loss, k * 0.5  # 2 steps/s


def true_plateau_step() -> float:
    # gap 1/(0.01k + 0.5) falls to 5 % of its value at the first point (k = 10)
    first_gap = 1.0 / (0.01 * 10 + 0.5)
    return (1.0 / (0.05 * first_gap) - 0.5) / 0.01


# ---- cleaning ----

def test_non_finite_points_are_rejected_with_reasons() -> None:
    c = clean_series([1, 2, 3, 4, 5], [1.0, math.nan, math.inf, -math.inf, 0.5], [0, 1, 2, math.nan, 4])
    assert c.rejected == {"value_nan": 1, "value_inf": 2}  # the NaN-timestamp point is already out
    assert c.steps.tolist() == [1.0, 5.0]
    c = clean_series([1, 2, 3], [1.0, 0.9, 0.8], [0, math.inf, 2])
    assert c.rejected == {"timestamp_not_finite": 1}


def test_restart_supersedes_rolled_back_points_without_rejecting_them() -> None:
    # ran steps 1..5, crashed, resumed from the checkpoint at step 3
    c = clean_series([1, 2, 3, 4, 5, 3, 4, 6], [9, 8, 7, 6, 5, 7.1, 6.1, 4], [0, 1, 2, 3, 4, 10, 11, 12])
    assert c.rejected == {}
    assert c.restarts == 1 and c.superseded == 3
    assert c.steps.tolist() == [1, 2, 3, 4, 6]
    assert c.values.tolist() == [9, 8, 7.1, 6.1, 4]  # the re-run's values win
    assert c.run_start == 2  # steps 3, 4, 6 belong to the current run


def test_mismatched_lengths_raise() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        clean_series([1, 2], [1.0], None)


# ---- state machine ----

def test_flowcon_state_machine() -> None:
    phase, low = advance_phase(Phase.GROWING, 0, 0.01, 0.05)
    assert (phase, low) == (Phase.WATCHING, 1)
    phase, low = advance_phase(phase, low, 0.01, 0.05)
    assert (phase, low) == (Phase.COMPLETING, 2)
    assert advance_phase(phase, low, 0.2, 0.05) == (Phase.GROWING, 0)
    assert advance_phase(Phase.WATCHING, 1, math.nan, 0.05) == (Phase.WATCHING, 1)


@given(st.lists(st.floats(0.0, 0.2), max_size=30))
def test_replay_equals_stepping(gs: list[float]) -> None:
    phase, low = Phase.UNKNOWN, 0
    for g in gs:
        phase, low = advance_phase(phase, low, g, 0.05)
    assert replay_phase(np.array(gs), 0.05) == (phase, low)


def test_step_mode_advances_once_from_previous_phase() -> None:
    k, loss, t = optimus_curve(200)
    stateless = estimate(k, loss, t, ConvergenceSettings())
    assert stateless.phase == Phase.COMPLETING
    stepped = estimate(k, loss, t, ConvergenceSettings(), previous_phase=Phase.GROWING, previous_low_count=0)
    assert (stepped.phase, stepped.low_count) == (Phase.WATCHING, 1)


# ---- progress, growth, phase ----

def test_phase_moves_from_growing_to_completing_along_a_curve() -> None:
    k, loss, t = optimus_curve(400, noise=0.005)
    s = ConvergenceSettings(window_s=0.0, window_points=10)
    early = estimate(k[:30], loss[:30], t[:30], s)
    late = estimate(k, loss, t, s)
    assert early.phase == Phase.GROWING and early.progress >= s.alpha
    # One noisy window may reset the two-strike rule; what matters is that it is not GROWING.
    assert late.phase in (Phase.WATCHING, Phase.COMPLETING) and late.progress < s.alpha


def test_steady_learner_keeps_growing_however_long_it_runs() -> None:
    s = ConvergenceSettings(window_s=0.0, window_points=5)
    for n in (50, 500, 5000):
        steps = np.arange(n, dtype=float)
        loss = 10.0 - 0.001 * steps  # a slow but steady learner never plateaus
        e = estimate(steps, loss, None, s)
        assert e.phase == Phase.GROWING and e.progress == pytest.approx(1.0, rel=0.05)


def test_growth_efficiency_divides_progress_by_share() -> None:
    k, loss, t = optimus_curve(60)
    full = estimate(k, loss, t, POINT_WINDOWS, resource_share=1.0)
    half = estimate(k, loss, t, POINT_WINDOWS, resource_share=0.5)
    unknown = estimate(k, loss, t, POINT_WINDOWS)
    assert half.growth_efficiency == pytest.approx(2 * full.growth_efficiency)
    assert math.isnan(unknown.growth_efficiency) and unknown.progress == full.progress


def test_constant_series_is_completing_and_at_plateau() -> None:
    e = estimate(np.arange(30), np.full(30, 2.5), None, POINT_WINDOWS)
    assert e.phase == Phase.COMPLETING and e.progress == 0.0 and e.remaining_steps == 0.0


def test_too_little_data_is_unknown_not_zero() -> None:
    e = estimate([1, 2, 3], [3.0, 2.0, 1.0], [0, 1, 2], ConvergenceSettings())
    assert e.phase == Phase.UNKNOWN
    assert math.isnan(e.progress) and math.isnan(e.remaining_steps) and math.isnan(e.growth_efficiency)


def test_accuracy_oriented_like_loss() -> None:
    k, loss, t = optimus_curve(80, noise=0.01)
    as_loss = estimate(k, loss, t, POINT_WINDOWS)
    as_acc = estimate(k, 1.0 - loss, t, ConvergenceSettings(window_s=0.0, window_points=5, higher_is_better=True))
    assert as_acc.phase == as_loss.phase
    assert as_acc.progress == pytest.approx(as_loss.progress)
    assert as_acc.remaining_steps == pytest.approx(as_loss.remaining_steps, rel=1e-6)


# ---- curve fit and remaining time ----

def test_fit_recovers_an_exact_inverse_curve() -> None:
    k = np.linspace(0.0, 100.0, 50)
    norm = 1.0 / (3.0 * k / 100.0 + 1.0) - 0.25 + 0.25  # a=3, b=1, c=0 in x units
    fit = fit_inverse_curve(k, (norm - norm.min()) / (norm.max() - norm.min()), grid=200)
    assert fit is not None
    assert fit.rmse < 5e-3


@pytest.mark.parametrize("frac", [0.25, 0.5, 0.75])
def test_remaining_time_prediction_on_noisy_curve(frac: float) -> None:
    k, loss, t = optimus_curve(200, noise=0.005)
    plateau = true_plateau_step()
    n = int(plateau * frac / 10)
    e = estimate(k[:n], loss[:n], t[:n], ConvergenceSettings())
    truth_steps = plateau - k[n - 1]
    assert e.remaining_steps == pytest.approx(truth_steps, rel=0.35)
    assert e.step_rate == pytest.approx(2.0)
    assert e.remaining_seconds == pytest.approx(e.remaining_steps / 2.0)


def test_restart_is_not_corruption() -> None:
    k, loss, t = optimus_curve(60)
    # resume from step 300 after step 400: the points 300..400 are re-run with the same loss
    rerun = (k >= 300) & (k <= 400)
    steps = np.concatenate([k[k <= 400], k[rerun], k[k > 400]])
    old = np.where(rerun, loss + 0.5, loss)[k <= 400]  # the rolled-back run's values differ
    vals = np.concatenate([old, loss[rerun], loss[k > 400]])
    times = np.concatenate([t[k <= 400], t[rerun] + 100, t[k > 400] + 100])
    e = estimate(steps, vals, times, POINT_WINDOWS)
    ref = estimate(k, loss, t, POINT_WINDOWS)
    assert e.restarts == 1 and e.rejected == {}
    assert e.points_used == ref.points_used
    assert e.remaining_steps == pytest.approx(ref.remaining_steps)
    assert e.step_rate == pytest.approx(2.0)  # measured on the current run only


def test_real_lcbench_curve_grows_then_completes() -> None:
    # benchmarks/data/lcbench/curves.csv, task 3945, curve 0, epochs 1-52, val_accuracy
    acc = [
        42.55614, 54.21244, 65.43585, 71.17723, 74.70529, 77.0022, 78.63018, 79.83644, 80.6839, 81.31827,
        81.84108, 82.26333, 82.65086, 83.0193, 83.33692, 83.62224, 83.87015, 84.09056, 84.28357, 84.46574,
        84.6396, 84.79989, 84.94623, 85.09899, 85.24358, 85.38189, 85.51292, 85.64743, 85.78476, 85.90789,
        86.01611, 86.11624, 86.21057, 86.29777, 86.3801, 86.45197, 86.51994, 86.57407, 86.62198, 86.66693,
        86.70926, 86.74863, 86.78503, 86.81848, 86.84929, 86.87778, 86.89833, 86.91425, 86.92983, 86.94376,
        86.95437, 86.96233,
    ]
    s = ConvergenceSettings(window_s=0.0, window_points=3, higher_is_better=True)
    early = estimate(range(1, 10), acc[:9], None, s)
    late = estimate(range(1, 53), acc, None, s)
    assert early.phase == Phase.GROWING and early.remaining_steps > 0
    assert late.phase == Phase.COMPLETING and late.remaining_steps == 0.0


# ---- properties ----

finite = st.floats(allow_nan=False, allow_infinity=False)


def assert_sane(e: ConvergenceEstimate) -> None:
    for name in ("progress", "growth_efficiency", "remaining_steps", "remaining_seconds", "step_rate"):
        v = getattr(e, name)
        assert not math.isinf(v), name
        assert math.isnan(v) or v >= 0, name
    assert e.phase in Phase
    if e.phase != Phase.UNKNOWN:
        assert math.isfinite(e.progress)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_finite_input_gives_sane_output(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 40))
    steps = data.draw(st.lists(st.integers(0, 2**53), min_size=n, max_size=n))
    values = data.draw(st.lists(finite, min_size=n, max_size=n))
    ts = data.draw(st.one_of(st.none(), st.lists(finite, min_size=n, max_size=n)))
    share = data.draw(st.one_of(st.none(), finite))
    hib = data.draw(st.booleans())
    s = ConvergenceSettings(window_s=data.draw(st.sampled_from([0.0, 1.0, 30.0])), higher_is_better=hib)
    assert_sane(estimate(steps, values, ts, s, resource_share=share))


def same(a: ConvergenceEstimate, b: ConvergenceEstimate) -> bool:
    fields = ("phase", "low_count", "progress", "growth_efficiency", "remaining_steps",
              "remaining_seconds", "step_rate", "points_used", "last_step")
    return all(
        getattr(a, f) == getattr(b, f) or (math.isnan(getattr(a, f)) and math.isnan(getattr(b, f)))
        for f in fields
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=40),
    st.integers(-20, 20),
    st.floats(1e-3, 1e3),
)
def test_invariant_to_scaling_the_loss(values: list[float], power: int, factor: float) -> None:
    steps = np.arange(len(values)) * 3
    ts = np.arange(len(values)) * 7.0
    s = ConvergenceSettings(window_s=20.0)
    base = estimate(steps, values, ts, s)
    exact = estimate(steps, np.array(values) * 2.0**power, ts, s)  # powers of two scale exactly
    assert same(exact, base)
    approx = estimate(steps, np.array(values) * factor, ts, s)
    if math.isfinite(base.progress) and abs(base.progress - s.alpha) > 1e-6:
        assert approx.phase == base.phase
    assert approx.progress == pytest.approx(base.progress, rel=1e-6, abs=1e-9, nan_ok=True)


# ---- curve families, ensemble and planned end ----

def _x_curve(family: str) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(1.0, 61.0) * 10.0  # steps 10..600
    x = (k - k[0]) / (k[-1] - k[0])
    if family == "exponential":
        loss = 2.0 * np.exp(-x / 0.3) + 0.5
    elif family == "power":
        loss = 2.0 * (x + 10.0 / 590.0) ** -0.7 + 0.5
    else:
        loss = 2.0 / (x + 0.2) + 0.5
    return k, loss


@pytest.mark.parametrize(("family", "theta"), [("exponential", 0.3), ("power", 0.7), ("inverse", 0.2)])
def test_fit_family_recovers_parameters_of_a_clean_curve(family: str, theta: float) -> None:
    k, loss = _x_curve(family)
    norm = (loss - loss.min()) / (loss.max() - loss.min())
    fit = fit_family(family, k, norm, grid=400)
    assert fit is not None and fit.family == family
    assert fit.b == pytest.approx(theta, rel=0.03)
    assert fit.rmse < 2e-3
    # back in loss units the asymptote is 0.5
    assert fit.c * (loss.max() - loss.min()) + loss.min() == pytest.approx(0.5, abs=0.05)
    assert np.allclose(fit.predict(k), norm, atol=1e-2)


@pytest.mark.parametrize("family", ["exponential", "power", "inverse"])
@pytest.mark.parametrize("frac", [0.3, 0.6])
def test_remaining_steps_small_error_on_clean_synthetic_curves(family: str, frac: float) -> None:
    # the truth, as the offline evaluation defines it, from a curve 20x longer than observed
    k_long = np.arange(1.0, 6001.0) * 10.0
    k, _ = _x_curve(family)
    x_long = (k_long - k[0]) / (k[-1] - k[0])
    if family == "exponential":
        full = 2.0 * np.exp(-x_long / 0.3) + 0.5
    elif family == "power":
        full = 2.0 * (x_long + 10.0 / 590.0) ** -0.7 + 0.5
    else:
        full = 2.0 / (x_long + 0.2) + 0.5
    total = full[0] - 0.5
    k_star = float(k_long[np.argmax(full - 0.5 <= 0.05 * total)])
    n = max(8, int(frac * k_star / 10.0))
    rng = np.random.default_rng(1)
    noisy = full[:n] + rng.normal(0.0, 1e-3 * total, n)
    e = estimate(k_long[:n], noisy, k_long[:n] * 0.5, ConvergenceSettings(median_points=1))
    assert e.remaining_steps == pytest.approx(k_star - k_long[n - 1], rel=0.25)


def test_planned_end_caps_and_redefines_the_plateau() -> None:
    k, loss, t = optimus_curve(40)
    free = estimate(k, loss, t, ConvergenceSettings())
    capped = estimate(k, loss, t, ConvergenceSettings(), max_steps=1000.0)
    assert 0 < capped.remaining_steps < free.remaining_steps and capped.remaining_steps <= 1000.0 - k[-1]
    assert estimate(k, loss, t, ConvergenceSettings(), max_steps=float(k[-1])).remaining_steps == 0.0
    assert capped.remaining_seconds == pytest.approx(capped.remaining_steps / 2.0)
