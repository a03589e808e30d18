"""The 80 % interval of a job's end, calibrated per stopping rule (DESIGN.md §11).

The raw intervals of scoring.job_end come from models: the step rate's spread (planned end), the
sampled forecasts' 10th..90th percentiles (early stopping, target), the curve families' spread
(nothing declared). None of those spreads is the error's own spread: on the real runs the
forecast samples were too wide under early stopping (93-100 % coverage) and too narrow for a
target. So each side of the interval is rescaled in log space around the point,

    low' = point * (low / point) ** scale.low,   high' = point * (high / point) ** scale.high,

with one (low, high) pair per rule, the smallest scales under which the interval misses the
truth on at most 10 % of the asks on each side over the tuning families' runs (98: the short and
the long set's, the early-stopping runs of the fifth campaign among them): split conformal
calibration of each tail (python -m benchmarks.job_end_calibrate prints them; the defaults below
are its output). A scale below 1 narrows, above 1 widens; the point never leaves its interval.

Pure: dataclasses and math only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scoring.stopping import StoppingRule

RuleGroup = Literal["planned", "early_stopping", "target", "none"]
RULE_GROUPS: tuple[RuleGroup, ...] = ("planned", "early_stopping", "target", "none")


@dataclass(frozen=True)
class IntervalScale:
    """Exponents of the interval's two sides in log space around the point (1, 1: unchanged)."""

    low: float = 1.0
    high: float = 1.0

    def __post_init__(self) -> None:
        for side in (self.low, self.high):
            if not (isinstance(side, int | float) and math.isfinite(side) and side > 0):
                raise ValueError(f"interval scales must be finite numbers > 0, not {side!r}")


@dataclass(frozen=True)
class EndIntervalSettings:
    """Per declared rule: how the raw 80 % interval is rescaled. Defaults printed by
    `python -m benchmarks.job_end_calibrate` (tuning families of benchmarks.job_end_eval, CPU clock)."""

    planned: IntervalScale = IntervalScale(0.81, 1.10)
    early_stopping: IntervalScale = IntervalScale(0.77, 0.79)
    target: IntervalScale = IntervalScale(1.12, 2.25)
    none: IntervalScale = IntervalScale(2.32, 0.77)

    def for_rule(self, rule: StoppingRule) -> IntervalScale:
        scale: IntervalScale = getattr(self, rule_group(rule))
        return scale


UNSCALED = EndIntervalSettings(*(IntervalScale(),) * len(RULE_GROUPS))  # the models' raw intervals


def rule_group(rule: StoppingRule) -> RuleGroup:
    """The rule a job is calibrated under: early stopping before a target before a planned end
    alone (a cap beside early stopping or a target is the common case, not a rule of its own)."""
    if rule.early_stopping is not None:
        return "early_stopping"
    if math.isfinite(rule.target):
        return "target"
    return "planned" if rule.planned else "none"


def rescale(point: float, low: float, high: float, scale: IntervalScale) -> tuple[float, float]:
    """(low, high) rescaled in log space around point; low <= point <= high always. A zero or
    non-finite point, or a side at 0, keeps that side (nothing to scale a ratio by)."""
    low, high = min(low, point), max(high, point)
    if not (math.isfinite(point) and point > 0):
        return low, high
    if low > 0 and math.isfinite(low):
        low = point * (low / point) ** scale.low
    if math.isfinite(high):
        high = point * (high / point) ** scale.high
    return min(low, point), max(high, point)
