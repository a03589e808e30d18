"""A job's stopping rule and the end it leads to, as plain values (DESIGN.md §11).

Kept apart from the predictor (scoring/job_end.py) so that ConvergenceEstimate, the World and
the wire can carry a JobEnd without importing the fitting code. Pure: dataclasses only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class EndReason(StrEnum):
    PLANNED_END = "planned_end"  # max_steps reached
    TARGET = "target"  # the reported value crosses target_metric
    EARLY_STOPPING = "early_stopping"  # no improvement > min_delta for `patience` evaluations
    PLATEAU = "plateau"  # no rule: the end of improvement, judged on the curve's recent scale


@dataclass(frozen=True)
class EarlyStopping:
    """Lightning's EarlyStopping(monitor, min_delta, patience, mode), Keras' EarlyStopping,
    Hugging Face's EarlyStoppingCallback: each reported point of the monitored series is one
    evaluation; the job stops at the evaluation where `patience` evaluations in a row brought no
    improvement greater than min_delta over the best so far."""

    patience: int
    min_delta: float = 0.0
    metric: str | None = None  # None: the point's loss; else the point's metrics[metric]
    higher_is_better: bool | None = None  # None: the job's direction (its higher_is_better)

    def __post_init__(self) -> None:
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError(f"early_stopping.patience must be an integer >= 1, not {self.patience!r}")
        if not (math.isfinite(self.min_delta) and self.min_delta >= 0):
            raise ValueError(f"early_stopping.min_delta must be a finite number >= 0, not {self.min_delta!r}")
        if self.metric is not None and not self.metric:
            raise ValueError("early_stopping.metric must be a non-empty name or null")


@dataclass(frozen=True)
class StoppingRule:
    """What ends the job, as it declared: the first of its planned end, its target and its early
    stopping to fire. Nothing declared: it ends when a person stops it (the plateau estimate)."""

    max_steps: float = math.nan  # NaN: no planned end
    target: float = math.nan  # in the reported value's units; NaN: none
    higher_is_better: bool = False  # direction of the reported value (and of target)
    early_stopping: EarlyStopping | None = None

    @property
    def declared(self) -> bool:
        return self.planned or math.isfinite(self.target) or self.early_stopping is not None

    @property
    def planned(self) -> bool:
        return math.isfinite(self.max_steps) and self.max_steps > 0


@dataclass(frozen=True)
class JobEnd:
    """When the job frees its GPUs: steps and seconds left to its end, with an 80 % interval
    that always contains the point (NaN throughout when unknown), why it ends, and how much a
    decision may lean on it (scoring.remaining.evidence_weight of the steps' interval)."""

    remaining_steps: float
    steps_low: float
    steps_high: float
    remaining_seconds: float
    seconds_low: float
    seconds_high: float
    reason: EndReason | None  # None: unknown
    evidence: float  # in [0, 1]; 0 when unknown

    @staticmethod
    def unknown(reason: EndReason | None = None) -> JobEnd:
        nan = math.nan
        return JobEnd(nan, nan, nan, nan, nan, nan, reason, 0.0)

    @property
    def known(self) -> bool:
        return math.isfinite(self.remaining_steps)
