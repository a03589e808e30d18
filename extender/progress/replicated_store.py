"""Progress history shared by every replica through Prometheus (HA; DESIGN.md §1 "Scaling out").

Writes: every point from every source (SDK posts, logs, gauges) is remote-written before it is
acknowledged: `add_points` returns only once the receiver answered 2xx, so a 200 from
/v1/progress means the point is in Prometheus, whichever replica took it and whatever happens
to that replica next. The local SQLite file is written too (a per-replica copy for debugging;
nothing reads it in this mode).
Reads: `jobs()` and `history()` query Prometheus, so every replica's tracker and /v1/jobs see
the same history.

Series, one sample per point at the point's time (ms), labels namespace and flowsched_job:
    flowsched_progress_loss   the loss (or metric) value
    flowsched_progress_step   the step
    flowsched_progress_ts     the point's time in seconds, as a value, so first/last times and
                              counts come from min/max/count_over_time without a subquery
and label higher_is_better="true|false" on all three.

Limits of this mode: Prometheus refuses samples older than a series' newest one ("out of
order"), so points older than the job's newest one written by this replica are not stored (the
API counts them not_stored), and after a fail-over, a batch Prometheus refuses as out of order is
not stored as a whole (0 accepted); two points of one job in the same millisecond get
consecutive milliseconds. History is what Prometheus keeps (its retention), not thinned.
Errors: a receiver that cannot be reached (or answers 5xx/429) raises ProgressBackendError, a
sqlite3.OperationalError, so /v1/progress answers 503 (retry later) and GET /v1/jobs 503, as
they do for the SQLite store.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.progress.remote_write import RemoteWriteError, RemoteWriter, Series
from extender.progress.store import (
    EncodedPoints,
    JobHistory,
    JobSummary,
    ProgressPoint,
    ProgressStore,
    ProgressStoreSettings,
    Row,
    encode_points,
    point_bytes,
)
from extender.prometheus.client import TelemetryError, auth_headers, bounded_get, make_client
from extender.prometheus.config import TelemetryConfig
from extender.prometheus.response import ResultType, parse_query_answer
from extender.prometheus.response import Series as PromSeries

log = logging.getLogger("flowsched.progress.replicated")

LOSS, STEP, TS = "flowsched_progress_loss", "flowsched_progress_step", "flowsched_progress_ts"


class ProgressBackendError(sqlite3.OperationalError):
    """Prometheus (write or read) unavailable. A sqlite3 error on purpose: the progress API and
    the tracker already turn a store failure into 503 / a skipped round."""


@dataclass(frozen=True)
class ReplicatedStoreSettings:
    prometheus_url: str  # read: /api/v1/query
    remote_write_url: str  # write: e.g. <prometheus>/api/v1/write
    history_window_s: float = 7 * 86400.0  # how far back jobs() and history() look
    write_timeout_s: float = 5.0


def _q(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _duration(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


class ReplicatedProgressStore(ProgressStore):
    def __init__(self, local: ProgressStoreSettings, settings: ReplicatedStoreSettings,
                 read_cfg: TelemetryConfig | None = None) -> None:
        super().__init__(local)
        self.rs = settings
        self.writer = RemoteWriter(settings.remote_write_url, settings.write_timeout_s)
        self.read_cfg = read_cfg or TelemetryConfig(prometheus_url=settings.prometheus_url)
        self._client = make_client(self.read_cfg)
        self._hib: dict[tuple[str, str], bool] = {}
        self._last_ms: dict[tuple[str, str], int] = {}
        self._wlock = threading.Lock()

    # ---- writes ----
    def add_points(self, namespace: str, job: str, points: Iterable[ProgressPoint] | EncodedPoints,
                   higher_is_better: bool | None = None) -> int:
        batch = points if isinstance(points, EncodedPoints) else encode_points(job, points)[0]
        if not batch.rows:
            return 0
        key = (namespace, job)
        with self._wlock:  # one job's samples go out in time order, ms apart
            hib = self._hib.get(key, False) if higher_is_better is None else higher_is_better
            last = self._last_ms.get(key, -1)
            samples: list[tuple[int, Row]] = []
            for row in sorted(batch.rows, key=lambda r: r[2]):
                ms = int(row[2] * 1000)
                if ms == last:
                    ms = last + 1  # several points in one millisecond: kept, 1 ms apart
                elif ms < last:
                    continue  # older than the job's newest: Prometheus would refuse it (not stored)
                samples.append((ms, row))
                last = ms
            if not samples:
                log.warning("%d points of %s/%s are older than its newest; not stored", len(batch.rows), namespace,
                            job)
                return 0
            labels = {"namespace": namespace, "flowsched_job": job, "higher_is_better": str(hib).lower()}
            series: list[Series] = [
                ({"__name__": LOSS, **labels}, [(ms, r[1]) for ms, r in samples]),
                ({"__name__": STEP, **labels}, [(ms, float(r[0])) for ms, r in samples]),
                ({"__name__": TS, **labels}, [(ms, r[2]) for ms, r in samples]),
            ]
            try:
                self.writer.write(series)
            except RemoteWriteError as e:
                if e.retryable:
                    raise ProgressBackendError(f"remote write: {e}") from e
                log.warning("remote write refused %d points of %s/%s: %s", len(batch.rows), namespace, job, e)
                return 0
            self._hib[key], self._last_ms[key] = hib, last
        kept = tuple(r for _, r in samples)
        size = sum(point_bytes(job, r[3], r[4]) for r in kept)
        super().add_points(namespace, job, EncodedPoints(kept, size, batch.names), higher_is_better)
        return len(kept)

    # ---- reads ----
    def _query(self, promql: str, expect: ResultType) -> tuple[PromSeries, ...]:
        url = self.rs.prometheus_url.rstrip("/") + "/api/v1/query"
        try:
            status, body = bounded_get(self._client, url, params={"query": promql},
                                       headers=auth_headers(self.read_cfg), limit=self.read_cfg.max_response_bytes)
            return parse_query_answer(status, body, expect=(expect,)).series
        except TelemetryError as e:
            raise ProgressBackendError(f"prometheus read: {e}") from e

    def jobs(self) -> list[JobSummary]:
        w = _duration(self.rs.history_window_s)
        rows: dict[tuple[str, str, str], dict[str, float]] = {}
        for fn in ("count", "min", "max"):
            for row in self._query(f"{fn}_over_time({TS}[{w}])", "vector"):
                m = row.labels
                for _, v in row.samples:
                    key = (m.get("namespace", ""), m.get("flowsched_job", ""), m.get("higher_is_better", ""))
                    rows.setdefault(key, {})[fn] = v
        out: dict[tuple[str, str], JobSummary] = {}
        for (ns, job, hib), agg in rows.items():
            if len(agg) != 3 or not ns or not job:
                continue
            prev = out.get((ns, job))
            s = JobSummary(ns, job, int(agg["count"]), agg["min"], agg["max"], hib == "true")
            if prev is not None:  # the job changed higher_is_better: two series sets, one job
                s = JobSummary(ns, job, prev.points + s.points, min(prev.first_ts, s.first_ts),
                               max(prev.last_ts, s.last_ts), s.higher_is_better if s.last_ts > prev.last_ts
                               else prev.higher_is_better)
            out[(ns, job)] = s
        return [out[k] for k in sorted(out)]

    def history(self, namespace: str, job: str) -> JobHistory | None:
        sel = f'namespace="{_q(namespace)}",flowsched_job="{_q(job)}"'
        w = _duration(self.rs.history_window_s)
        by_ts: dict[float, dict[str, float]] = {}
        hib = False
        newest = -math.inf
        for row in self._query(f'{{__name__=~"{LOSS}|{STEP}",{sel}}}[{w}]', "matrix"):
            name = row.labels.get("__name__", "")
            for ts, v in row.samples:
                by_ts.setdefault(ts, {})[name] = v
                if ts > newest:
                    newest, hib = ts, row.labels.get("higher_is_better") == "true"
        pts = sorted((ts, d[STEP], d[LOSS]) for ts, d in by_ts.items() if LOSS in d and STEP in d)
        if not pts:
            return None
        arr = np.array(pts, dtype=np.float64)
        return JobHistory(namespace=namespace, job=job, steps=arr[:, 1].astype(np.int64), values=arr[:, 2].copy(),
                          timestamps=arr[:, 0].copy(), higher_is_better=hib)

    def metric_series(self, namespace: str, job: str, name: str
                      ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
        """Side metrics are not replicated (remote write carries the loss and the step): None, so
        early stopping on a named metric is unknown here (neutral), not read from a stale local file."""
        return None

    def prune(self, now: float) -> int:
        """Prometheus' retention drops old series; only the local copy is pruned here."""
        return super().prune(now)

    def close(self) -> None:
        self.writer.close()
        self._client.close()
        super().close()
