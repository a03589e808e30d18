"""Progress history of every job in an embedded SQLite database (WAL).

Points keep their arrival order (the row id): a step that goes backwards is a restart from
checkpoint and scoring.convergence needs the order to tell which points it superseded.
Bounded: per job, older points are thinned by halves once a job has more than
max_points_per_job (the recent ones are all kept, so the curve's shape survives at
decreasing density), and jobs with no point for max_idle_s are dropped by prune().
synchronous=NORMAL in WAL mode survives a process crash or restart; only an OS crash or
power loss can take the last transactions.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    job TEXT NOT NULL,
    step INTEGER NOT NULL,
    value REAL NOT NULL,
    ts REAL NOT NULL,
    pod TEXT,
    metrics BLOB
);
CREATE INDEX IF NOT EXISTS points_by_job ON points(namespace, job, id);
CREATE TABLE IF NOT EXISTS jobs (
    namespace TEXT NOT NULL,
    job TEXT NOT NULL,
    higher_is_better INTEGER NOT NULL DEFAULT 0,
    first_ts REAL NOT NULL,
    last_ts REAL NOT NULL,
    PRIMARY KEY (namespace, job)
);
CREATE TABLE IF NOT EXISTS write_probe (id INTEGER PRIMARY KEY, ts REAL NOT NULL);
"""


@dataclass(frozen=True)
class ProgressStoreSettings:
    path: str  # SQLite file; ":memory:" only for tests that need no restart
    max_points_per_job: int = 4000
    keep_recent_points: int = 1000  # never thinned
    max_idle_s: float = 7 * 86400.0  # prune() drops jobs with no point for this long
    # Per-namespace quotas (admit()): one team's token filled 1,075 MiB in 30 s with new jobs and
    # 64 long metric names per point (issue 33, finding 7). Bytes are the points' payload (metrics,
    # pod and job names, ~40 bytes of numbers); the file takes about twice that with its index.
    max_jobs_per_namespace: int = 1000
    max_points_per_namespace: int = 1_000_000
    max_bytes_per_namespace: int = 256 * 1024 * 1024
    max_metric_names_per_namespace: int = 64  # distinct side-metric names since the process started


@dataclass(frozen=True)
class ProgressPoint:
    step: int
    value: float
    timestamp: float  # seconds since the epoch; the API fills it with the receive time
    pod: str | None = None
    metrics: Mapping[str, float] | None = None


def merge_writers(rows: list[Any]) -> list[Any]:
    """(step, value, ts, pod) rows in arrival order -> the same rows ordered by restart epoch,
    then step, then arrival, when more than one writer (pod) reported; as they are otherwise.

    A writer's epoch is how many times its own steps went back so far: a restart from checkpoint
    sends every pod back, each once. In arrival order, 32 data-parallel pods a few steps apart
    looked like 480 restarts (issue 33, finding 12), and the convergence fit (clean_series) kept
    only the points after the last of them. Restarts still show as steps going back, once per
    epoch."""
    if len({r[3] for r in rows}) < 2:
        return rows
    last: dict[Any, int] = {}
    epoch: dict[Any, int] = {}
    keys: list[tuple[int, int, int]] = []
    for i, (step, _value, _ts, pod) in enumerate(rows):
        prev = last.get(pod)
        if prev is not None and step < prev:
            epoch[pod] = epoch.get(pod, 0) + 1
        last[pod] = step
        keys.append((epoch.get(pod, 0), step, i))
    keys.sort()
    return [rows[i] for _epoch, _step, i in keys]


@dataclass(frozen=True)
class JobHistory:
    """One job's points in arrival order (not step order: restarts show as steps going back);
    several writers' points merged by restart epoch, then step (merge_writers)."""

    namespace: str
    job: str
    steps: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    timestamps: npt.NDArray[np.float64]
    higher_is_better: bool

    @property
    def count(self) -> int:
        return int(self.steps.size)


@dataclass(frozen=True)
class JobSummary:
    namespace: str
    job: str
    points: int
    first_ts: float
    last_ts: float
    higher_is_better: bool


class StoreError(Exception):
    """The store cannot be opened; the message names the file and the cause."""


class QuotaExceeded(Exception):
    """A namespace's quota would be passed: the API answers 429 with Retry-After."""

    def __init__(self, namespace: str, what: str, limit: int) -> None:
        super().__init__(f"namespace {namespace}: over its quota of {limit} {what}")
        self.namespace, self.what, self.limit = namespace, what, limit


class QuotaDrops:
    """Points an operator-configured source (log following, Prometheus gauges) read but dropped
    over a namespace's quota: counted, and one warning per namespace every `every_s`."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self.logger, self.every_s = logger, every_s
        self.dropped: dict[str, int] = {}  # namespace -> points dropped
        self._warned: dict[str, float] = {}

    def note(self, e: QuotaExceeded, points: int, now: float) -> None:
        self.dropped[e.namespace] = self.dropped.get(e.namespace, 0) + points
        if now - self._warned.get(e.namespace, -math.inf) >= self.every_s:
            self._warned[e.namespace] = now
            self.logger.warning("%s: dropped %d points read for it (%d so far)", e, points,
                                self.dropped[e.namespace])


ROW_OVERHEAD_BYTES = 40  # step, value, ts, ids: what a point costs beyond its text


def point_bytes(job: str, pod: str | None, metrics: bytes | None) -> int:
    """A point's payload as the namespace's byte quota counts it."""
    return ROW_OVERHEAD_BYTES + len(job) + len(pod or "") + (len(metrics) if metrics else 0)


Row = tuple[int, float, float, str | None, bytes | None]  # step, value, ts, pod, metrics (orjson)


@dataclass(frozen=True)
class EncodedPoints:
    """Points as the store writes them: finite rows in arrival order, their payload bytes and
    side-metric names (for the quotas). The API builds it from reports the front already
    encoded, so the verbs' process spends no time re-encoding metrics (issue 33, finding 7)."""

    rows: tuple[Row, ...]
    size: int
    names: frozenset[str]


def encode_points(job: str, points: Iterable[ProgressPoint]) -> tuple[EncodedPoints, int]:
    """The points' finite rows, and how many were skipped (a non-finite value or timestamp)."""
    rows: list[Row] = []
    skipped = size = 0
    names: set[str] = set()
    for p in points:
        if not (math.isfinite(p.value) and math.isfinite(p.timestamp)):
            skipped += 1
            continue
        metrics = orjson.dumps(dict(p.metrics)) if p.metrics else None
        rows.append((int(p.step), float(p.value), float(p.timestamp), p.pod, metrics))
        size += point_bytes(job, p.pod, metrics)
        if p.metrics:
            names.update(p.metrics)
    return EncodedPoints(tuple(rows), size, frozenset(names)), skipped


@dataclass
class _Usage:
    """One namespace's share of the store, loaded from the file on first use."""

    jobs: set[str]
    points: int
    bytes: int


MEMORY = ":memory:"


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ProgressStore:
    def __init__(self, settings: ProgressStoreSettings) -> None:
        if settings.keep_recent_points < 1 or settings.max_points_per_job <= settings.keep_recent_points:
            raise ValueError("need 1 <= keep_recent_points < max_points_per_job")
        if not settings.path.strip():
            # sqlite3 would open a private temporary database: every acknowledged point lost on restart.
            raise StoreError("progress store path is empty: name a file (or ':memory:' to keep progress "
                             "in memory only, lost on every restart)")
        self._settings = settings
        self.durable = settings.path != MEMORY
        self.reopened = 0  # times the file was found deleted or replaced and opened afresh
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self.write_error: str | None = None  # the last write probe's failure (probe_write)
        self._usage: dict[str, _Usage] = {}  # namespace -> its usage, dropped when rows are deleted
        self._metric_names: dict[str, set[str]] = {}  # namespace -> side-metric names seen
        if not self.durable:
            log.warning("progress store in memory (%s): progress is lost on every restart", MEMORY)
        self._db, self._file = self._open()

    def _open(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        path = self._settings.path
        db: sqlite3.Connection | None = None
        try:
            if self.durable:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(_SCHEMA)
            # Written, not only opened: a read-only file (or one whose -wal/-shm exist but cannot
            # be written) opens and reads fine, then fails every point (finding 8).
            _probe(db)
        except (OSError, sqlite3.Error) as e:
            if db is not None:
                db.close()
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise StoreError(f"cannot open progress store {path}: {why} ({type(e).__name__})") from e
        return db, (_file_id(path) if self.durable else None)

    def _ensure_file(self) -> None:
        """Reopen the file if it was deleted or replaced under us (call with the lock held).

        SQLite keeps writing to a deleted file's inode and says nothing: every point written
        afterwards would be acknowledged and then lost on restart."""
        if not self.durable or _file_id(self._settings.path) == self._file:
            return
        log.error("progress store %s was deleted or replaced while open; the history before now is lost. "
                  "Opening it afresh so new points are kept", self._settings.path)
        self._db.close()
        try:
            self._db, self._file = self._open()
        except StoreError as e:
            self.last_error = str(e)
            raise sqlite3.OperationalError(str(e)) from e
        self.reopened += 1
        self.last_error = None

    def probe_write(self) -> bool:
        """A real write (one row, committed): what /readyz reports, since a full disk or a file
        made read-only after start-up fails only writes. Run periodically off the event loop."""
        with self._lock:
            try:
                self._ensure_file()
                _probe(self._db)
            except sqlite3.Error as e:
                if self.write_error is None:
                    log.error("progress store %s cannot be written: %s", self._settings.path, e)
                self.write_error = str(e)
                return False
        if self.write_error is not None:
            log.warning("progress store %s can be written again", self._settings.path)
        self.write_error = None
        return True

    def admit(self, namespace: str, job: str, points: Iterable[ProgressPoint] | EncodedPoints) -> None:
        """Raises QuotaExceeded if storing `points` would pass a quota of `namespace`. Checked
        before add_points (two concurrent writers may overshoot by one request each)."""
        s = self._settings
        batch = points if isinstance(points, EncodedPoints) else encode_points(job, points)[0]
        with self._lock:
            usage = self._usage_of(namespace)
            seen = self._metric_names.setdefault(namespace, set())
            if job not in usage.jobs and len(usage.jobs) >= s.max_jobs_per_namespace:
                raise QuotaExceeded(namespace, "jobs", s.max_jobs_per_namespace)
            if usage.points + len(batch.rows) > s.max_points_per_namespace:
                raise QuotaExceeded(namespace, "points", s.max_points_per_namespace)
            if usage.bytes + batch.size > s.max_bytes_per_namespace:
                raise QuotaExceeded(namespace, "bytes", s.max_bytes_per_namespace)
            if len(seen | batch.names) > s.max_metric_names_per_namespace:
                raise QuotaExceeded(namespace, "metric names", s.max_metric_names_per_namespace)

    def _usage_of(self, namespace: str) -> _Usage:
        """(With the lock held.) The namespace's usage, from the file when not known."""
        usage = self._usage.get(namespace)
        if usage is None:
            rows = self._db.execute(
                "SELECT job, count(*), sum(coalesce(length(metrics), 0) + coalesce(length(pod), 0) + length(job)) "
                "FROM points WHERE namespace=? GROUP BY job", (namespace,)).fetchall()
            usage = _Usage(jobs={r[0] for r in rows}, points=sum(int(r[1]) for r in rows),
                           bytes=sum(int(r[2] or 0) + ROW_OVERHEAD_BYTES * int(r[1]) for r in rows))
            self._usage[namespace] = usage
        return usage

    def health(self) -> dict[str, object]:
        """For /readyz: ok is False when points cannot be stored durably now (the last write
        probe failed, or the file is gone and cannot be opened again)."""
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._ensure_file()
            ok = self.last_error is None and self.write_error is None
        return {"ok": ok, "durable": self.durable, "reopened": self.reopened,
                **({"error": "progress store cannot be written (see the log)"} if not ok else {})}

    def add_points(
        self, namespace: str, job: str, points: Iterable[ProgressPoint] | EncodedPoints,
        higher_is_better: bool | None = None,
    ) -> int:
        """Append points in the given (arrival) order; returns how many were stored.

        higher_is_better None keeps what the job said before (False for a new job).
        Non-finite values or timestamps are skipped and logged (the API rejects them first)."""
        if isinstance(points, EncodedPoints):
            batch = points
        else:
            batch, skipped = encode_points(job, points)
            if skipped:
                log.warning("progress store: skipped %d non-finite points for %s/%s", skipped, namespace, job)
        if not batch.rows:
            return 0
        rows = [(namespace, job, *r) for r in batch.rows]
        hib = None if higher_is_better is None else int(higher_is_better)
        first_ts = min(r[2] for r in batch.rows)
        last_ts = max(r[2] for r in batch.rows)
        with self._lock:
            self._ensure_file()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO points(namespace, job, step, value, ts, pod, metrics) VALUES (?,?,?,?,?,?,?)",
                    rows,
                )
                self._db.execute(
                    "INSERT INTO jobs(namespace, job, higher_is_better, first_ts, last_ts) "
                    "VALUES (?,?,coalesce(?, 0),?,?) ON CONFLICT(namespace, job) DO UPDATE SET "
                    "higher_is_better=coalesce(?, higher_is_better), "
                    "first_ts=min(first_ts, excluded.first_ts), last_ts=max(last_ts, excluded.last_ts)",
                    (namespace, job, hib, first_ts, last_ts, hib),
                )
                thinned = self._thin(namespace, job)
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (e.g. on a full disk); a second ROLLBACK
                # would raise "no transaction is active" and hide the real cause.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            usage = self._usage.get(namespace)
            if thinned:
                self._usage.pop(namespace, None)  # recounted from the file on the next admit
            elif usage is not None:
                usage.jobs.add(job)
                usage.points += len(rows)
                usage.bytes += batch.size
            if batch.names:
                self._metric_names.setdefault(namespace, set()).update(batch.names)
        return len(rows)

    def _thin(self, namespace: str, job: str) -> bool:
        """Halve the density of the points older than the recent ones, while over the cap;
        True when points were deleted."""
        s = self._settings
        thinned = False
        while True:
            (count,) = self._db.execute(
                "SELECT count(*) FROM points WHERE namespace=? AND job=?", (namespace, job)
            ).fetchone()
            if count <= s.max_points_per_job:
                return thinned
            (boundary,) = self._db.execute(
                "SELECT id FROM points WHERE namespace=? AND job=? ORDER BY id DESC LIMIT 1 OFFSET ?",
                (namespace, job, s.keep_recent_points - 1),
            ).fetchone()
            # Every second old point goes; the first point (the curve's start) always stays.
            deleted = self._db.execute(
                "DELETE FROM points WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) AS rn "
                "FROM points WHERE namespace=? AND job=? AND id < ?) WHERE rn % 2 = 0)",
                (namespace, job, boundary),
            ).rowcount
            if deleted == 0:
                return thinned
            thinned = True

    def history(self, namespace: str, job: str) -> JobHistory | None:
        with self._lock:
            meta = self._db.execute(
                "SELECT higher_is_better FROM jobs WHERE namespace=? AND job=?", (namespace, job)
            ).fetchone()
            if meta is None:
                return None
            rows = self._db.execute(
                "SELECT step, value, ts, pod FROM points WHERE namespace=? AND job=? ORDER BY id", (namespace, job)
            ).fetchall()
        rows = merge_writers(rows)
        arr = np.array([r[:3] for r in rows], dtype=np.float64).reshape(-1, 3)
        return JobHistory(
            namespace=namespace,
            job=job,
            steps=np.array([r[0] for r in rows], dtype=np.int64),
            values=arr[:, 1].copy(),
            timestamps=arr[:, 2].copy(),
            higher_is_better=bool(meta[0]),
        )

    def metric_series(self, namespace: str, job: str, name: str
                      ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
        """(steps, values) of the points carrying metrics[name], in arrival order; None when none
        does. Early stopping on a named metric forecasts this series."""
        with self._lock:
            rows = self._db.execute(
                "SELECT step, metrics FROM points WHERE namespace=? AND job=? AND metrics IS NOT NULL ORDER BY id",
                (namespace, job)).fetchall()
        steps: list[float] = []
        values: list[float] = []
        for step, raw in rows:
            value = orjson.loads(raw).get(name)
            if isinstance(value, (int, float)):
                steps.append(float(step))
                values.append(float(value))
        if not steps:
            return None
        return np.array(steps, dtype=np.float64), np.array(values, dtype=np.float64)

    def pod_steps(self, namespace: str, job: str, since_ts: float
                  ) -> dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
        """Per reporting pod, its (steps, timestamps) at or after since_ts, in arrival order (points
        reported without a pod are left out). Bottleneck diagnosis finds slow replicas with it."""
        with self._lock:
            rows = self._db.execute(
                "SELECT pod, step, ts FROM points WHERE namespace=? AND job=? AND ts>=? AND pod IS NOT NULL "
                "ORDER BY id", (namespace, job, since_ts)).fetchall()
        by_pod: dict[str, tuple[list[int], list[float]]] = {}
        for pod, step, ts in rows:
            steps, stamps = by_pod.setdefault(str(pod), ([], []))
            steps.append(int(step))
            stamps.append(float(ts))
        return {pod: (np.array(s, dtype=np.int64), np.array(ts, dtype=np.float64)) for pod, (s, ts) in by_pod.items()}

    def jobs(self) -> list[JobSummary]:
        with self._lock:
            rows = self._db.execute(
                "SELECT j.namespace, j.job, (SELECT count(*) FROM points p WHERE p.namespace=j.namespace "
                "AND p.job=j.job), j.first_ts, j.last_ts, j.higher_is_better FROM jobs j ORDER BY 1, 2"
            ).fetchall()
        return [JobSummary(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), bool(r[5])) for r in rows]

    def delete_job(self, namespace: str, job: str) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM points WHERE namespace=? AND job=?", (namespace, job))
            gone = self._db.execute("DELETE FROM jobs WHERE namespace=? AND job=?", (namespace, job)).rowcount
            self._db.execute("COMMIT")
            self._usage.pop(namespace, None)
        return gone > 0

    @property
    def max_idle_s(self) -> float:
        """prune() drops jobs whose newest point is older than this (the API rejects such points)."""
        return self._settings.max_idle_s

    def prune(self, now: float) -> int:
        """Drop jobs idle for longer than max_idle_s; returns how many."""
        cutoff = now - self._settings.max_idle_s
        with self._lock:
            stale = self._db.execute("SELECT namespace, job FROM jobs WHERE last_ts < ?", (cutoff,)).fetchall()
        dropped = sum(self.delete_job(ns, job) for ns, job in stale)
        if dropped:
            log.info("progress store: pruned %d idle jobs", dropped)
        return dropped

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _probe(db: sqlite3.Connection) -> None:
    """One committed write to a one-row table: raises sqlite3.Error when the file cannot be written."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("INSERT OR REPLACE INTO write_probe(id, ts) VALUES (1, julianday('now'))")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
