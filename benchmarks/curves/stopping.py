"""The stopping rules a run obeys, as pure functions over its evaluations (no torch).

The training script stops on these and the data test replays them, so the shipped ends are
checked against the same definition: Lightning's ``EarlyStopping`` (an evaluation improves
when it beats the best by more than ``min_delta``; the run stops once ``patience``
evaluations in a row have not improved) and a target reached on the monitored series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class EarlyStopping:
    """Lightning's EarlyStopping(monitor, min_delta, patience, mode) stepped one evaluation at a time."""

    patience: int
    min_delta: float
    higher_is_better: bool
    best: float = math.inf
    wait: int = 0

    def __post_init__(self) -> None:
        if self.patience < 1 or self.min_delta < 0:
            raise ValueError(f"patience must be >= 1 and min_delta >= 0, got {self.patience}, {self.min_delta}")

    def should_stop(self, value: float) -> bool:
        signed = -value if self.higher_is_better else value  # compare in "lower is better" terms
        if signed < self.best - self.min_delta:
            self.best, self.wait = signed, 0
            return False
        self.wait += 1
        return self.wait >= self.patience


def early_stop_index(values: Sequence[float], patience: int, min_delta: float, higher_is_better: bool) -> int | None:
    """Index of the evaluation at which the rule fires, or None if it never does."""
    rule = EarlyStopping(patience, min_delta, higher_is_better)
    for i, v in enumerate(values):
        if rule.should_stop(v):
            return i
    return None


def reached(value: float, target: float, higher_is_better: bool) -> bool:
    return value >= target if higher_is_better else value <= target


def target_index(values: Sequence[float], target: float, higher_is_better: bool) -> int | None:
    """Index of the first evaluation that reaches the target, or None."""
    for i, v in enumerate(values):
        if reached(v, target, higher_is_better):
            return i
    return None
