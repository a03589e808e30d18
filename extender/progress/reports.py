"""What training jobs report about themselves beyond loss points, for the elastic optimizer and the prediction.

The progress API's optional `training` object: the global batch size the job runs at, the
range it accepts and the largest batch one GPU holds, its gradient statistics at that batch
(Pollux's grad_sqr / grad_var), its
planned end (max_steps), the metric value it stops at (target_metric) and its early stopping. Only the latest
report per job is kept, in memory: the SDK sends it with every post, so a restarted replica has
it again within one flush interval, and until then the optimizer treats the job as one that
reports nothing (its own batch, a prior throughput).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from scoring.elastic import GradientNoise
from scoring.stopping import EarlyStopping


@dataclass(frozen=True)
class JobReport:
    """What a job reported about its batch beyond loss points (the progress API's optional fields)."""

    batch_size: int = 0
    batch_range: tuple[int, int] | None = None
    noise: GradientNoise | None = None
    planned_steps: float = math.nan  # max_steps, the planned end; NaN: not reported
    batch_live: bool = False  # adopts a planned batch while it runs (training.batch_live)
    batch_local_max: int = 0  # the largest batch one GPU holds (training.batch_local_max); 0: not reported


@dataclass(frozen=True)
class TrainingReport:
    batch_size: int | None = None
    batch_min: int | None = None
    batch_max: int | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    max_steps: int | None = None
    at: float = math.nan
    batch_live: bool | None = None
    target_metric: float | None = None  # in the reported metric's own units and direction
    early_stopping: EarlyStopping | None = None  # training.early_stopping (DESIGN.md §11)
    batch_local_max: int | None = None

    def as_job_report(self) -> JobReport:
        b = self.batch_size or 0
        rng = None
        if self.batch_min and self.batch_max and self.batch_min <= self.batch_max:
            rng = (self.batch_min, self.batch_max)
        noise = None
        if b > 0 and self.grad_sqr is not None and self.grad_var is not None:
            # Pollux measures efficiency against the smallest batch the job accepts: the variance
            # measured at batch b is b / base times the variance of a base-sized batch's gradient.
            base = rng[0] if rng is not None else b
            noise = GradientNoise(self.grad_sqr, self.grad_var * b / base, base)
        return JobReport(batch_size=b, batch_range=rng, noise=noise,
                         planned_steps=float(self.max_steps) if self.max_steps else math.nan,
                         batch_live=bool(self.batch_live), batch_local_max=self.batch_local_max or 0)

    def as_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "batch_min": self.batch_min, "batch_max": self.batch_max,
                "grad_sqr": self.grad_sqr, "grad_var": self.grad_var, "max_steps": self.max_steps,
                "batch_live": self.batch_live, "target_metric": self.target_metric,
                "early_stopping": None if self.early_stopping is None else {
                    "patience": self.early_stopping.patience, "min_delta": self.early_stopping.min_delta,
                    "metric": self.early_stopping.metric, "higher_is_better": self.early_stopping.higher_is_better},
                "batch_local_max": self.batch_local_max,
                "at": self.at if math.isfinite(self.at) else None}


class JobReportBook:
    def __init__(self, max_jobs: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._reports: dict[str, TrainingReport] = {}
        self.max_jobs = max_jobs

    def put(self, job: str, report: TrainingReport) -> None:
        with self._lock:
            if job not in self._reports and len(self._reports) >= self.max_jobs:
                oldest = min(self._reports, key=lambda k: self._reports[k].at)
                del self._reports[oldest]  # bounded: the longest-silent job goes first
            prev = self._reports.get(job)
            if prev is not None:  # fields a post leaves out keep their last value
                report = replace(report, **{k: getattr(prev, k) for k in _FIELDS if getattr(report, k) is None})
            self._reports[job] = report

    def get(self, job: str) -> TrainingReport | None:
        return self._reports.get(job)

    def job_reports(self) -> Mapping[str, JobReport]:
        with self._lock:
            items = list(self._reports.items())
        return MappingProxyType({k: v.as_job_report() for k, v in items})

    def forget(self, job: str) -> None:
        with self._lock:
            self._reports.pop(job, None)


_FIELDS = ("batch_size", "batch_min", "batch_max", "grad_sqr", "grad_var", "max_steps", "batch_live", "target_metric",
           "early_stopping", "batch_local_max")
