"""Adapter from a simulated job's emitted validation series to scoring.convergence.

The engine records, per job, one (time, epoch, metric) point per finished epoch (with noise),
as a training pod would post them to /v1/progress. With the adapter switched on
(`--convergence`), engine.completing_gpus() asks scoring.convergence.estimate for each running
job's phase and counts the GPUs of COMPLETING jobs per node; switched off, every node's
completing_gpus is NaN (neutral), which is what the extender sees without progress data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.engine import SimJob
from benchmarks.sim.jobmodel import ProfileSet
from scoring.convergence import ConvergenceSettings, Phase, estimate


@dataclass
class ConvergenceAdapter:
    profiles: ProfileSet
    window_points: int = 3  # epochs per FlowCon window (epochs are the series' natural unit)
    alpha: float = 0.05
    min_points: int = 6
    _cache: dict[int, tuple[int, bool | None]] = field(default_factory=dict)

    def __call__(self, job: SimJob) -> bool | None:
        n = len(job.series)
        if n < self.min_points:
            return None
        hit = self._cache.get(job.idx)
        if hit is not None and hit[0] == n:
            return hit[1]
        app = self.profiles.apps[job.spec.app]
        pts = np.array(job.series, dtype=np.float64)
        settings = ConvergenceSettings(
            window_s=0.0,
            window_points=self.window_points,
            alpha=self.alpha,
            higher_is_better=app.metric_increases,
        )
        est = estimate(pts[:, 1], pts[:, 2], pts[:, 0], settings)
        verdict = None if est.phase == Phase.UNKNOWN else est.phase == Phase.COMPLETING
        self._cache[job.idx] = (n, verdict)
        return verdict
