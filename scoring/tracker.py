"""One convergence tracker for both shells: loss series in, cached estimates out.

A fit costs milliseconds (tens at thousands of points), and a job's estimate only changes when
it reports new points, so each job's estimate is kept with the signature of the series it came
from (point count and last timestamp) and recomputed only when that changes. Pure: the caller
brings the series; no clock, no I/O. Not thread-safe: one owner (the service's tracker thread,
or the simulator) updates it; readers take `snapshot()`, an immutable copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import numpy.typing as npt

from scoring.convergence import ConvergenceEstimate, estimate
from scoring.settings import TrackerSettings

Signature = tuple[int, float]  # (points, last timestamp)


class ConvergenceTracker:
    def __init__(self, settings: TrackerSettings) -> None:
        self.settings = settings
        self._estimates: dict[str, ConvergenceEstimate] = {}
        self._seen: dict[str, tuple[Signature, float | None, float | None]] = {}
        self.computed = 0
        self.skipped = 0

    def unchanged(self, key: str, signature: Signature, max_steps: float | None = None,
                  target: float | None = None) -> bool:
        """Same series, same planned end and same target as the kept estimate."""
        return self._seen.get(key) == (signature, max_steps, target) and key in self._estimates

    def update(self, key: str, steps: npt.ArrayLike, values: npt.ArrayLike, timestamps: npt.ArrayLike | None,
               *, higher_is_better: bool, signature: Signature,
               max_steps: float | None = None, target: float | None = None) -> ConvergenceEstimate | None:
        """The job's estimate after this series; None (and nothing kept) below min_points. max_steps, target:
        the planned end and the metric value the job stops at, if it reported them (a change re-estimates,
        as new points do)."""
        if self.unchanged(key, signature, max_steps, target):
            self.skipped += 1
            return self._estimates[key]
        if signature[0] < self.settings.min_points:
            return None
        s = dataclasses.replace(self.settings, higher_is_better=higher_is_better)
        est = estimate(steps, values, timestamps, s, max_steps=max_steps, target=target)
        self._estimates[key] = est
        self._seen[key] = (signature, max_steps, target)
        self.computed += 1
        return est

    def get(self, key: str) -> ConvergenceEstimate | None:
        return self._estimates.get(key)

    def forget(self, key: str) -> None:
        self._estimates.pop(key, None)
        self._seen.pop(key, None)

    def snapshot(self) -> Mapping[str, ConvergenceEstimate]:
        return MappingProxyType(dict(self._estimates))
