"""The job end's interval, calibrated per stopping rule (scoring/end_interval.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scoring.end_interval import UNSCALED, EndIntervalSettings, IntervalScale, rescale, rule_group
from scoring.stopping import EarlyStopping, StoppingRule


def test_rescale_is_a_power_of_each_side_around_the_point() -> None:
    low, high = rescale(10.0, 5.0, 40.0, IntervalScale(0.5, 2.0))
    assert low == pytest.approx(10.0 * 0.5 ** 0.5) and high == pytest.approx(10.0 * 4.0 ** 2.0)
    assert rescale(10.0, 5.0, 40.0, IntervalScale()) == (5.0, 40.0)


def test_rescale_keeps_the_point_inside_whatever_it_is_given() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        point, a, b = (float(x) for x in rng.choice([0.0, 1e-9, 0.3, 7.0, 1e6, math.inf], 3))
        scale = IntervalScale(float(rng.uniform(0.05, 5.0)), float(rng.uniform(0.05, 5.0)))
        low, high = rescale(point, a, b, scale)
        assert low <= point <= high, (point, a, b, scale)


def test_a_zero_point_or_a_zero_low_side_is_left_as_it_is() -> None:
    assert rescale(0.0, 0.0, 3.0, IntervalScale(2.0, 2.0)) == (0.0, 3.0)
    assert rescale(4.0, 0.0, 8.0, IntervalScale(0.5, 1.0)) == (0.0, 8.0)
    low, high = rescale(math.nan, math.nan, math.nan, IntervalScale(0.5, 0.5))
    assert math.isnan(low) and math.isnan(high)


def test_rules_map_to_their_calibration_group() -> None:
    es = EarlyStopping(patience=3)
    assert rule_group(StoppingRule(max_steps=100.0, target=0.1, early_stopping=es)) == "early_stopping"
    assert rule_group(StoppingRule(max_steps=100.0, target=0.1)) == "target"
    assert rule_group(StoppingRule(max_steps=100.0)) == "planned"
    assert rule_group(StoppingRule()) == "none"
    s = EndIntervalSettings()
    assert s.for_rule(StoppingRule(max_steps=100.0)) is s.planned
    assert UNSCALED.for_rule(StoppingRule()) == IntervalScale(1.0, 1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_scales_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="interval scales"):
        IntervalScale(bad, 1.0)
    with pytest.raises(ValueError, match="interval scales"):
        IntervalScale(1.0, bad)
