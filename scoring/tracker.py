"""One convergence tracker for both shells: loss series in, cached estimates out.

A fit costs milliseconds (tens at thousands of points), and a job's estimate only changes when
it reports new points, so each job's estimate is kept with the signature of the series it came
from (point count and last timestamp) and recomputed only when that changes. Pure: the caller
brings the series; no clock, no I/O. Not thread-safe: one owner (the service's tracker thread,
or the simulator) updates it; readers take `snapshot()`, an immutable copy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy.typing as npt

from scoring.convergence import ConvergenceEstimate, estimate
from scoring.job_end import Series, predict_end
from scoring.settings import TrackerSettings
from scoring.stopping import EarlyStopping, StoppingRule

Signature = tuple[int, float]  # (points, last timestamp)


class ConvergenceTracker:
    def __init__(self, settings: TrackerSettings, *, job_ends: bool = True) -> None:
        self.settings = settings
        # Whether each estimate carries the job's end under its stopping rule (estimate.end);
        # a fit of its own for early stopping and for jobs without a rule (milliseconds).
        self.job_ends = job_ends
        self._estimates: dict[str, ConvergenceEstimate] = {}
        self._seen: dict[str, tuple[Signature, float | None, float | None, EarlyStopping | None]] = {}
        self._oriented: dict[bool, TrackerSettings] = {}  # the settings for each higher_is_better, made once
        self.computed = 0
        self.skipped = 0

    def unchanged(self, key: str, signature: Signature, max_steps: float | None = None,
                  target: float | None = None, early_stopping: EarlyStopping | None = None) -> bool:
        """Same series, same planned end, target and early stopping as the kept estimate."""
        return self._seen.get(key) == (signature, max_steps, target, early_stopping) and key in self._estimates

    def update(self, key: str, steps: npt.ArrayLike, values: npt.ArrayLike, timestamps: npt.ArrayLike | None,
               *, higher_is_better: bool, signature: Signature,
               max_steps: float | None = None, target: float | None = None,
               early_stopping: EarlyStopping | None = None, monitored: Series | None = None,
               ) -> ConvergenceEstimate | None:
        """The job's estimate after this series; None (and nothing kept) below min_points. max_steps, target,
        early_stopping: the job's stopping rule as it reported it (a change re-estimates, as new points do);
        monitored: the (steps, values) of the series early_stopping names, when not the loss."""
        if self.unchanged(key, signature, max_steps, target, early_stopping):
            self.skipped += 1
            return self._estimates[key]
        if signature[0] < self.settings.min_points:
            return None
        s = self._oriented.get(higher_is_better)
        if s is None:
            s = self._oriented[higher_is_better] = dataclasses.replace(self.settings, higher_is_better=higher_is_better)
        est = estimate(steps, values, timestamps, s, max_steps=max_steps, target=target)
        if self.job_ends:
            rule = StoppingRule(max_steps=max_steps if max_steps is not None else math.nan,
                                target=target if target is not None else math.nan,
                                higher_is_better=higher_is_better, early_stopping=early_stopping)
            est = dataclasses.replace(est, end=predict_end(steps, values, timestamps, rule, s, est=est,
                                                           monitored=monitored, forecast=s.forecast))
        self._estimates[key] = est
        self._seen[key] = (signature, max_steps, target, early_stopping)
        self.computed += 1
        return est

    def get(self, key: str) -> ConvergenceEstimate | None:
        return self._estimates.get(key)

    def forget(self, key: str) -> None:
        self._estimates.pop(key, None)
        self._seen.pop(key, None)

    def snapshot(self) -> Mapping[str, ConvergenceEstimate]:
        return MappingProxyType(dict(self._estimates))
