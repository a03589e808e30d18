"""Progress from a loss gauge the job already exports: flowsched.io/loss-metric, read from Prometheus.

For every job with a pod annotated flowsched.io/progress=prometheus, once per interval one
instant query `<selector>[<window>]` (a range selector, so every raw sample comes back with
its own timestamp) reads the samples newer than what the store has; they are stored as the
job's points. A gauge has no step: the step is the milliseconds since the job's first stored
sample, so the estimator's curve is over time and its step rate is 1000 a second (remaining
steps are remaining milliseconds; remaining seconds mean what they mean for any source).
A gauge cannot show a restart from checkpoint as a step going back; the loss jumping up is
seen as the job getting worse, which is not growth.

If the selector matches several series (say every rank of a data-parallel job exports it),
the one with the smallest label set in sort order is used and the count is shown in status();
narrow the selector (e.g. `{rank="0"}`) to choose. Same HTTP shell, limits and auth as the
telemetry's Prometheus source (extender/prometheus/client.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from extender.periodic import PeriodicRunner
from extender.progress.store import ProgressPoint, ProgressStore, QuotaDrops, QuotaExceeded
from extender.prometheus.client import TelemetryError, auth_headers, bounded_get, make_client
from extender.prometheus.config import TelemetryConfig
from extender.prometheus.response import parse_query_answer
from extender.snapshot.objects import PodInfo

log = logging.getLogger("flowsched.progress.prometheus")

Series = tuple[tuple[tuple[str, str], ...], list[tuple[float, float]]]  # (sorted labels, [(ts, value)])


@dataclass(frozen=True)
class PromSourceSettings:
    interval_s: float = 15.0
    lookback_s: float = 600.0
    max_jobs: int = 1000


@dataclass(frozen=True)
class PromTarget:
    namespace: str
    job: str  # the job's name within its namespace
    selector: str


def pick_prom_targets(pods: Iterable[PodInfo]) -> dict[str, PromTarget]:
    """job key -> what to query (the selector of the job's first pod by name)."""
    chosen: dict[str, PodInfo] = {}
    for p in pods:
        spec = p.progress
        if spec is None or spec.source != "prometheus" or spec.problem or p.terminating:
            continue
        cur = chosen.get(p.job)
        if cur is None or p.name < cur.name:
            chosen[p.job] = p
    out = {}
    for job, p in chosen.items():
        assert p.progress is not None and p.progress.loss_metric is not None
        out[job] = PromTarget(p.namespace, job.split("/", 1)[1], p.progress.loss_metric)
    return out


def range_query(selector: str, window_s: float) -> str:
    """`selector[Ns]`: PromQL allows a range only on a plain series selector (an expression such
    as a sum() is refused by Prometheus, with its parse error shown in status())."""
    return f"{selector.strip()}[{max(1, math.ceil(window_s))}s]"


def parse_loss_series(status: int, body: bytes) -> list[Series]:
    """The matrix of an /api/v1/query answer; raises TelemetryError when the answer is unusable.
    Non-finite or malformed samples are dropped (NaN is no progress)."""
    answer = parse_query_answer(status, body, expect=("matrix",),
                                hint="is loss-metric an instant-vector selector?")
    out: list[Series] = [(tuple(sorted(s.labels.items())), list(s.finite_samples)) for s in answer.series]
    out.sort(key=lambda s: s[0])
    return out


def points_from(samples: list[tuple[float, float]], after_ts: float | None, first_ts: float | None
                ) -> list[ProgressPoint]:
    """Samples newer than after_ts as points; step = milliseconds since the job's first sample
    (Prometheus' own timestamp resolution, so sub-second scrape intervals keep distinct steps)."""
    fresh = [(ts, v) for ts, v in samples if after_ts is None or ts > after_ts]
    if not fresh:
        return []
    t0 = first_ts if first_ts is not None else fresh[0][0]
    return [ProgressPoint(step=max(0, round((ts - t0) * 1000)), value=v, timestamp=ts) for ts, v in fresh]


@dataclass
class PromJobStatus:
    selector: str
    reads: int = 0
    points: int = 0
    series: int = 0
    errors: int = 0
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class PrometheusProgress:
    """One thread; one query per job per interval, at most max_jobs jobs per round."""

    def __init__(self, pods: Callable[[], Iterable[PodInfo]], store: ProgressStore, cfg: TelemetryConfig,
                 settings: PromSourceSettings, clock: Callable[[], float],
                 is_leader: Callable[[], bool] = lambda: True) -> None:
        if not cfg.prometheus_url:
            raise ValueError("the prometheus progress source needs a Prometheus URL")
        self.pods, self.store, self.cfg, self.settings = pods, store, cfg, settings
        self.clock, self.is_leader = clock, is_leader
        self._client = make_client(cfg)
        self.statuses: dict[str, PromJobStatus] = {}
        self.quota_drops = QuotaDrops(log)
        # A failed round (e.g. the store failed) is logged; the next round retries.
        self._runner = PeriodicRunner("prometheus-progress", self.read_once, settings.interval_s, logger=log)

    def _stored(self) -> dict[tuple[str, str], tuple[float, float]]:
        return {(s.namespace, s.job): (s.first_ts, s.last_ts) for s in self.store.jobs()}

    def read_once(self) -> int:
        """One round; returns the number of points stored."""
        if not self.is_leader():
            return 0
        targets = pick_prom_targets(self.pods())
        self.statuses = {k: self.statuses.get(k) or PromJobStatus(t.selector) for k, t in targets.items()}
        stored = self._stored()
        total = 0
        for key, target in sorted(targets.items())[: self.settings.max_jobs]:
            st = self.statuses[key]
            if st.selector != target.selector:
                st = self.statuses[key] = PromJobStatus(target.selector)
            first_ts, last_ts = stored.get((target.namespace, target.job), (None, None))
            now = self.clock()
            window = self.settings.lookback_s if last_ts is None else min(self.settings.lookback_s, now - last_ts + 1)
            try:
                total += self._read(target, st, now, window, first_ts, last_ts)
            except TelemetryError as e:
                st.errors += 1
                st.last_error = str(e)
                log.info("loss-metric of %s: %s", key, e)
        return total

    def _read(self, target: PromTarget, st: PromJobStatus, now: float, window: float,
              first_ts: float | None, last_ts: float | None) -> int:
        url = self.cfg.prometheus_url.rstrip("/") + "/api/v1/query"
        params = {"query": range_query(target.selector, window), "time": f"{now:.3f}",
                  "timeout": f"{max(1, round(self.cfg.query_timeout_s * 1000))}ms"}
        status, body = bounded_get(self._client, url, params=params, headers=auth_headers(self.cfg),
                                   limit=self.cfg.max_response_bytes)
        series = parse_loss_series(status, body)
        st.reads += 1
        st.series = len(series)
        st.last_error = None
        if not series:
            return 0
        points = points_from(series[0][1], last_ts, first_ts)
        if points:
            try:  # held to the namespace's quotas, as the progress API is (issue 33, finding 7)
                self.store.admit(target.namespace, target.job, points)
            except QuotaExceeded as e:
                self.quota_drops.note(e, len(points), time.monotonic())
                return 0
            self.store.add_points(target.namespace, target.job, points)
            st.points += len(points)
        return len(points)

    def status(self) -> dict[str, Any]:
        return {k: {"selector": s.selector, "reads": s.reads, "points": s.points, "series": s.series,
                    "errors": s.errors, "last_error": s.last_error} for k, s in self.statuses.items()}

    def start(self) -> PrometheusProgress:
        self._runner.start()
        return self

    def stop(self) -> None:
        self._runner.stop()
        self._client.close()
