"""Progress from container logs: follows `pods/log` through the apiserver and feeds the store.

For every job with a pod annotated flowsched.io/progress=logs, one pod's container log is
followed (the job's first running pod by name: in data-parallel training every rank prints
the same loss, rank 0 first). Only the Lease holder follows (a replica that loses the Lease
closes its streams), so N replicas do not open N streams per job.

Bounds, so a cluster of chatty jobs cannot overload the apiserver or this process:
- at most `max_streams` streams at once (the rest wait, counted in `waiting`);
- new connections through a token bucket of `connects_per_s`; a stream that fails reconnects
  after a back-off doubling up to `reconnect_max_s`;
- at most one point per `min_point_interval_s` of log time per stream (the newest in each
  window is kept), written to the store in batches every `flush_s`;
- a stream idle for `read_timeout_s` is closed and reopened (this also bounds how long stop()
  can take).

Restarts: `timestamps=true` prefixes every line with its time; a stream that ends while the
container keeps its restartCount (the apiserver closed it, a network error) is reopened with
`sinceTime` = the last line's second, and lines at or before the last seen time are dropped.
When restartCount grows (a new container instance) a new stream with a fresh parser reads the
new container from its start: steps going back are then a restart from checkpoint, as the
store and the estimator already understand. Lines the old container wrote after our last read
and before it died are not read (`previous=true` is not consulted).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.kube import requests
from extender.kube.client import open_stream
from extender.kube.errors import ApiError
from extender.periodic import PeriodicRunner
from extender.progress.store import ProgressPoint, ProgressStore, QuotaDrops, QuotaExceeded
from extender.snapshot.objects import PodInfo
from scoring.log_progress import LogProgressParser, LossRegexError, ParsedPoint, compile_loss_regex

log = logging.getLogger("flowsched.progress.logs")

_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)\s?")


@dataclass(frozen=True)
class LogSourceSettings:
    max_streams: int = 100
    connects_per_s: float = 5.0
    min_point_interval_s: float = 1.0
    flush_s: float = 2.0
    read_timeout_s: float = 60.0
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 60.0
    reconcile_s: float = 5.0


def split_timestamp(line: str) -> tuple[float | None, str]:
    """'2026-11-22T20:50:00.123456789Z text' -> (unix seconds, 'text'); (None, line) without one."""
    m = _TS.match(line)
    if m is None:
        return None, line
    frac = (m[2] or "0")[:6].ljust(6, "0")
    tz = "+00:00" if m[3] == "Z" else m[3]
    try:
        ts = datetime.fromisoformat(f"{m[1]}.{frac}{tz}").timestamp()
    except ValueError:
        return None, line
    return ts, line[m.end():]


def since_time(ts: float) -> str:
    """RFC 3339 at whole seconds (what the API accepts for sinceTime), rounded down."""
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LogReadError(Exception):
    """The apiserver refused the log request (4xx/5xx); the stream is retried after a back-off."""


class LogOpener(Protocol):
    def __call__(self, namespace: str, pod: str, container: str, since: str | None,
                 read_timeout_s: float) -> Iterator[bytes]:
        """Lines of the container's log, followed, each prefixed with its timestamp. Ends when the
        stream ends; raises on errors (any exception: the stream is retried after a back-off)."""
        ...


def stream_lines(resp: Any) -> Iterator[bytes]:
    """Lines of a urllib3 response as they arrive. Not resp.stream(n): on a response that is not
    chunked it blocks until n bytes, and a follow on a quiet log would hold lines back for minutes."""
    chunks: Iterator[bytes]
    if getattr(resp, "chunked", False) and resp.supports_chunked_reads():
        chunks = resp.read_chunked(65536, decode_content=True)
    else:
        chunks = iter(lambda: bytes(resp.read1(65536)), b"")
    buf = b""
    for chunk in chunks:
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line
    if buf:
        yield buf


def kube_log_opener(api_client: Any) -> LogOpener:
    """GET /api/v1/namespaces/{ns}/pods/{pod}/log?follow=true&timestamps=true through the
    ApiClient's connection pool (requests.follow_pod_log: with sinceTime, which the generated
    client's read_namespaced_pod_log lacks)."""
    def open_log(namespace: str, pod: str, container: str, since: str | None,
                 read_timeout_s: float) -> Iterator[bytes]:
        try:
            resp = open_stream(api_client, requests.follow_pod_log(namespace, pod, container, since),
                               connect_timeout_s=10.0, read_timeout_s=read_timeout_s)
        except ApiError as e:
            raise LogReadError(f"GET pods/{pod}/log -> {e.status}: {e.body[:300]}") from e
        try:
            yield from stream_lines(resp)
        finally:
            resp.release_conn()

    return open_log


@dataclass
class TokenBucket:
    rate_per_s: float
    burst: float
    tokens: float = 0.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s) if self.at else self.burst
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True)
class Target:
    """One followed container instance."""

    namespace: str
    pod: str
    uid: str
    job: str  # the job's name within its namespace (the store's key)
    container: str
    restarts: int
    loss_regex: str | None


def pick_targets(pods: Iterable[PodInfo]) -> tuple[dict[str, Target], dict[str, str]]:
    """job key -> the Target to follow; and pod key -> problem for annotated pods that cannot be read."""
    chosen: dict[str, PodInfo] = {}
    problems: dict[str, str] = {}
    for p in pods:
        spec = p.progress
        if spec is None or spec.source != "logs":
            continue
        if spec.problem:
            problems[p.key] = spec.problem
            continue
        if not p.node or p.phase != "Running" or p.terminating or not spec.running:
            continue
        cur = chosen.get(p.job)
        if cur is None or p.name < cur.name:
            chosen[p.job] = p
    out: dict[str, Target] = {}
    for job, p in chosen.items():
        assert p.progress is not None
        out[job] = Target(namespace=p.namespace, pod=p.name, uid=p.uid, job=job.split("/", 1)[1],
                          container=p.progress.container, restarts=p.progress.restarts,
                          loss_regex=p.progress.loss_regex)
    return out, problems


@dataclass
class StreamStatus:
    target: Target
    opened: int = 0
    lines: int = 0
    points: int = 0
    errors: int = 0
    last_error: str | None = None
    last_ts: float | None = None  # time of the last line read (or of the last stored point)
    at_last_ts: int = 0  # lines read with exactly last_ts (lines of one write share a timestamp)
    retry_at: float = 0.0
    backoff_s: float = 0.0
    ended: int = 0  # times the stream ended by itself (container exit, apiserver closing it)
    patterns: dict[str, int] = field(default_factory=dict)


class _Stream:
    """One thread following one container instance; points go to `sink` in batches."""

    def __init__(self, target: Target, opener: LogOpener, sink: Callable[[Target, list[ProgressPoint]], None],
                 settings: LogSourceSettings, status: StreamStatus) -> None:
        self.target, self.opener, self.sink, self.settings, self.status = target, opener, sink, settings, status
        custom = None
        if target.loss_regex:
            try:
                custom = compile_loss_regex(target.loss_regex)
            except LossRegexError as e:
                # Neutral fallback: the built-in formats still apply; the problem is shown.
                log.warning("%s/%s: %s; using the built-in formats", target.namespace, target.pod, e)
                status.last_error = str(e)
        self.parser = LogProgressParser(custom)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"logs-{target.namespace}/{target.pod}")
        self._lock = threading.Lock()  # the stream's thread reads lines, the follower's thread ticks
        self._batch: list[ProgressPoint] = []
        self._pending: ProgressPoint | None = None  # newest point of the current thinning window
        self._window_start: float | None = None  # log time of the window's first point
        self._window_opened = 0.0  # monotonic time the window opened
        self._flushed_at = time.monotonic()
        self._skip_ts: float | None = None
        self._skip_equal = 0

    def start(self) -> None:
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def _run(self) -> None:
        st, t = self.status, self.target
        since = since_time(st.last_ts) if st.last_ts is not None else None
        st.opened += 1
        lines_before = st.lines
        # sinceTime re-sends lines we have: those before last_ts, and as many at last_ts as were read.
        self._skip_ts, self._skip_equal = st.last_ts, st.at_last_ts
        ended = False
        try:
            for raw in self.opener(t.namespace, t.pod, t.container, since, self.settings.read_timeout_s):
                if self.stop_event.is_set():
                    break
                self._line(raw.decode("utf-8", "replace"))
            else:
                # The stream ended by itself: the container exited (then the pod's status soon says
                # so and the follower lets it go), or the apiserver closed it. Reopen after a pause
                # that doubles while reopening brings nothing new.
                ended = True
                fresh = st.lines > lines_before
                st.backoff_s = self.settings.reconnect_min_s if fresh else min(
                    self.settings.reconnect_max_s, max(self.settings.reconnect_min_s, 2 * st.backoff_s))
                st.retry_at = time.monotonic() + st.backoff_s
        except Exception as e:  # any transport/API failure: retried by the follower after a back-off
            st.errors += 1
            st.last_error = f"{type(e).__name__}: {str(e)[:200]}"
            st.backoff_s = min(self.settings.reconnect_max_s, max(self.settings.reconnect_min_s, 2 * st.backoff_s))
            st.retry_at = time.monotonic() + st.backoff_s
            if _is_timeout(e):  # an idle follow: reopen at once, it is not the server's fault
                st.errors -= 1
                st.last_error = None
                st.backoff_s, st.retry_at = 0.0, 0.0
            else:
                log.info("log stream %s/%s/%s: %s (retry in %.0fs)", t.namespace, t.pod, t.container,
                         st.last_error, st.backoff_s)
        finally:
            with self._lock:
                if st.last_ts is not None:
                    self._take(self.parser.flush(), st.last_ts)  # the step held for its last redraw
                self._close_window()
                self._flush()
                if ended:  # counted once its last points are stored (a reader may wait for it)
                    st.ended += 1

    def tick(self) -> None:
        """Called by the follower every round: a quiet log must not hold its last point back."""
        now = time.monotonic()
        with self._lock:
            if self._pending is not None and now - self._window_opened >= self.settings.min_point_interval_s:
                self._close_window()
            if now - self._flushed_at >= self.settings.flush_s:
                self._flush()

    def _line(self, line: str) -> None:
        with self._lock:
            self._line_locked(line)

    def _line_locked(self, line: str) -> None:
        st = self.status
        ts, text = split_timestamp(line)
        if ts is None:
            ts = time.time()
        elif self._skip_ts is not None and ts <= self._skip_ts:
            # Read before this stream opened (sinceTime has whole-second precision), unless it is one
            # more line with exactly that time than we had read.
            if ts < self._skip_ts or self._skip_equal > 0:
                self._skip_equal -= ts == self._skip_ts
                return
            self._skip_ts = None
        if ts == st.last_ts:
            st.at_last_ts += 1
        else:
            st.last_ts, st.at_last_ts = ts, 1
        st.lines += 1
        self._take(self.parser.feed(text), ts)
        if time.monotonic() - self._flushed_at >= self.settings.flush_s:
            self._flush()

    def _take(self, parsed: list[ParsedPoint], ts: float) -> None:
        for p in parsed:
            point = ProgressPoint(step=p.step, value=p.loss, timestamp=ts, pod=self.target.pod)
            if self._window_start is None or ts - self._window_start >= self.settings.min_point_interval_s:
                self._close_window()
                self._window_start, self._window_opened = ts, time.monotonic()
            self._pending = point
        self.status.patterns = dict(self.parser.matched)

    def _close_window(self) -> None:
        if self._pending is not None:
            self._batch.append(self._pending)
            self._pending = None
        self._window_start = None

    def _flush(self) -> None:
        self._flushed_at = time.monotonic()
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        try:
            self.sink(self.target, batch)
            self.status.points += len(batch)
        except Exception:  # the store failed: these points are lost, the stream goes on
            log.exception("storing %d log points of %s/%s failed", len(batch), self.target.namespace,
                          self.target.job)


def _is_timeout(e: BaseException) -> bool:
    name = type(e).__name__
    return "Timeout" in name or "timed out" in str(e)


class LogFollower:
    """Reconciles the wanted streams (from the cluster snapshot) with the open ones."""

    def __init__(self, pods: Callable[[], Iterable[PodInfo]], store: ProgressStore, opener: LogOpener,
                 settings: LogSourceSettings, is_leader: Callable[[], bool] = lambda: True) -> None:
        self.pods, self.store, self.opener, self.settings, self.is_leader = pods, store, opener, settings, is_leader
        self.bucket = TokenBucket(settings.connects_per_s, burst=max(1.0, settings.connects_per_s))
        self.streams: dict[str, _Stream] = {}  # job key -> stream
        self.statuses: dict[str, StreamStatus] = {}  # job key -> status of its current container
        self.problems: dict[str, str] = {}
        self.waiting = 0
        self._reported: set[str] = set()
        self.quota_drops = QuotaDrops(log)
        # A failed round is logged; the other streams keep being followed and the next round retries.
        self._runner = PeriodicRunner("log-follower", self.reconcile, settings.reconcile_s, logger=log)

    def _stored_last_ts(self, target: Target) -> float | None:
        for summary in self.store.jobs():
            if summary.namespace == target.namespace and summary.job == target.job:
                return summary.last_ts
        return None

    def _sink(self, target: Target, points: list[ProgressPoint]) -> None:
        try:  # held to the namespace's quotas, as the progress API is (issue 33, finding 7)
            self.store.admit(target.namespace, target.job, points)
        except QuotaExceeded as e:
            self.quota_drops.note(e, len(points), time.monotonic())
            return
        self.store.add_points(target.namespace, target.job, points)

    def reconcile(self) -> None:
        if not self.is_leader():
            self._close_all()
            return
        wanted, self.problems = pick_targets(self.pods())
        for key, problem in self.problems.items():
            if key not in self._reported:
                self._reported.add(key)
                log.warning("progress from logs for pod %s cannot be read: %s", key, problem)
        for job in list(self.streams):
            if job not in wanted or wanted[job] != self.streams[job].target:
                self.streams.pop(job).stop_event.set()  # its thread ends at its next line or timeout
        for job in [j for j in self.statuses if j not in wanted]:
            del self.statuses[job]
        now = time.monotonic()
        self.waiting = 0
        for job, target in sorted(wanted.items()):
            stream = self.streams.get(job)
            if stream is not None and stream.alive:
                stream.tick()
                continue
            st = self.statuses.get(job)
            if st is None or st.target != target:
                # A new container instance, or this replica just took over: read from what the store
                # does not have yet (re-reading older lines would look like a restart from checkpoint).
                # (A line with exactly the stored time counts as read: at_last_ts is "all of them".)
                st = self.statuses[job] = StreamStatus(target, last_ts=self._stored_last_ts(target),
                                                       at_last_ts=1 << 30)
            if now < st.retry_at:
                continue
            if sum(s.alive for s in self.streams.values()) >= self.settings.max_streams or not self.bucket.take(now):
                self.waiting += 1
                continue
            stream = _Stream(target, self.opener, self._sink, self.settings, st)
            self.streams[job] = stream
            stream.start()

    def _close_all(self) -> None:
        for s in self.streams.values():
            s.stop_event.set()
        self.streams.clear()
        self.statuses.clear()  # the next holder starts from what the store has; we re-read on return

    def status(self) -> dict[str, Any]:
        return {
            "streams": {job: {"pod": st.target.pod, "container": st.target.container,
                              "restarts": st.target.restarts, "opened": st.opened, "lines": st.lines,
                              "points": st.points, "errors": st.errors, "last_error": st.last_error,
                              "ended": st.ended, "patterns": st.patterns}
                        for job, st in self.statuses.items()},
            "waiting": self.waiting, "problems": dict(self.problems),
        }

    def start(self) -> LogFollower:
        self._runner.start()
        return self

    def stop(self) -> None:
        self._runner.stop()
        self._close_all()
