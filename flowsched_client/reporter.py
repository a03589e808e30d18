"""The reporter: report() costs the training loop a deque append; a background thread does the rest.

A framework tensor (anything with `.detach()`) is kept as it is, not converted: `.item()` or
`float()` on a GPU value waits for the device, at every step. The background thread converts a
flush's tensors together (one `torch.stack(...).tolist()`: one device sync per flush) and sends
them; a server that is away costs the loop nothing (the queue is bounded; the oldest points go
first, counted in `dropped`). close() (also at interpreter exit) sends what is left.

Standard library only: torch is used only through the tensors the caller passes (it is already
imported then), never imported here.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("flowsched.report")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# deploy/'s Service: the progress API listens on api_port (8889); 8888 serves kube-scheduler alone.
IN_CLUSTER_URL = "http://flowsched.flowsched.svc:8889"
_TRANSIENT = (0, 429, 502, 503, 504)  # put the points back and retry later
_TRAINING_FIELDS = ("batch_size", "batch_min", "batch_max", "grad_sqr", "grad_var", "max_steps", "batch_live",
                    "target_metric", "early_stopping", "batch_local_max")
_COUNTS = ("batch_size", "batch_min", "batch_max", "max_steps", "batch_local_max")  # integers >= 1 on the wire


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@dataclass
class ReporterConfig:
    url: str | None = None  # e.g. IN_CLUSTER_URL: the API port (api_port), not the verbs'
    job: str | None = None
    namespace: str | None = None
    token: str | None = None
    token_file: Path = SA_DIR / "token"  # re-read on every send: projected tokens rotate
    higher_is_better: bool | None = None
    # The background thread sends once this many points wait, or flush_s after its last send: a
    # post costs ~1 ms of CPU however few points it carries (benchmarks/client_cost.py), and the
    # server re-estimates a job every 10 s anyway.
    flush_every: int = 2000
    flush_s: float = 10.0
    max_buffer: int = 10_000  # points kept while the server is away; the oldest go first
    timeout_s: float = 2.0
    max_points_per_post: int = 5_000  # the server takes at most 10,000 per request
    # Loss points without metrics are averaged to at most this many per second of their time
    # (on the background thread, at the last step's number and time): a loop reporting every
    # step at 1,000 steps/s would otherwise spend most of the client's time encoding points the
    # server thins away (it keeps 4,000 per job). 0: every point as reported.
    max_points_per_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, sa_dir: Path = SA_DIR) -> ReporterConfig:
        e = os.environ if env is None else env
        return cls(
            url=e.get("FLOWSCHED_URL"),
            job=e.get("FLOWSCHED_JOB") or e.get("HOSTNAME"),
            namespace=e.get("FLOWSCHED_NAMESPACE") or _read(sa_dir / "namespace"),
            token=e.get("FLOWSCHED_TOKEN"),
            token_file=sa_dir / "token",
        )


# A sender returns the HTTP status, or (status, reply body) so the reporter can read the plan.
Sender = Callable[[str, bytes, dict[str, str], float], "int | tuple[int, bytes]"]


def urllib_send(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as e:
        return int(e.code), b""


def _number(v: float) -> str:
    # JSON has no NaN: a non-finite loss goes as null, which the server counts as rejected.
    return repr(v) if math.isfinite(v) else "null"


def _scalar(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def to_floats(values: Sequence[Any]) -> list[float]:
    """Plain floats of numbers and one-element framework tensors; the torch tensors among them
    in one stack (one device sync), anything unreadable as NaN."""
    out = [math.nan] * len(values)
    tensors = [i for i, v in enumerate(values) if hasattr(v, "detach")]
    torch = sys.modules.get("torch")  # the caller's torch, already imported; never imported here
    if tensors and torch is not None:
        try:  # one op over all of them (scalars of one dtype and device), then one copy to the host
            with torch.no_grad():
                stacked = torch.stack([values[i] for i in tensors]).reshape(len(tensors)).float().tolist()
            for i, v in zip(tensors, stacked, strict=True):
                out[i] = float(v)
            done = set(tensors)
        except Exception:  # mixed devices, a non-scalar: one at a time
            done = set()
    else:
        done = set()
    for i, v in enumerate(values):
        if i not in done:
            out[i] = _scalar(v.detach() if hasattr(v, "detach") else v)
    return out


Point = tuple[int, Any, float, Mapping[str, Any] | None]  # (step, loss, timestamp, metrics), unconverted


class Reporter:
    """report() from the training loop; a daemon thread converts and sends (see the module doc)."""

    def __init__(self, config: ReporterConfig, send: Sender = urllib_send,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.send, self.clock = config, send, clock
        self._queue: deque[Point] = deque()
        self._lock = threading.Lock()  # the queue's length check and the counters
        self._wake = threading.Event()
        self._woken = False  # a wake for a full queue is pending (report() sets it once)
        self._done = threading.Condition()
        self._asked = self._answered = 0  # flush() generations
        self._last_ok = True
        self._closed = False
        self._warned = False
        self.dropped = 0  # points lost: queue full while the server was away, refused, or no configuration
        self.sent = 0
        self.failed_posts = 0  # posts the server did not take (away, too slow, or refusing)
        self.busy_s = 0.0  # CPU seconds the background thread spent converting and sending
        self.training_info: dict[str, Any] = {}  # sent with every post
        self.plan: dict[str, Any] | None = None  # the elastic optimizer's latest plan, from the last reply
        self._thread = threading.Thread(target=self._run, name="flowsched-report", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ---- the training thread's side: no conversion, no I/O ----

    def report(self, step: int, loss: Any, metrics: Mapping[str, Any] | None = None) -> None:
        """Queue one point (loss and metrics: numbers or framework tensors, unconverted). Never
        raises, never waits for the server."""
        try:
            # detach (no sync): a kept tensor must not hold its step's autograd graph
            if hasattr(loss, "detach"):
                loss = loss.detach()
            if metrics:
                metrics = {k: v.detach() if hasattr(v, "detach") else v for k, v in metrics.items()}
            point: Point = (int(step), loss, self.clock(), dict(metrics) if metrics else None)
            q = self._queue
            if len(q) >= self.config.max_buffer:  # the server is away: the oldest goes
                with self._lock:
                    while len(q) >= self.config.max_buffer:
                        q.popleft()
                        self.dropped += 1
            q.append(point)  # atomic: the background thread pops from the other end
            if not self._woken and len(q) >= self.config.flush_every:
                self._woken = True  # one wake per send cycle, not one per point
                self._wake.set()
        except Exception:  # reporting must never stop training
            log.exception("flowsched: could not record progress point")

    def training(self, *, batch_size: int | None = None, batch_min: int | None = None,
                 batch_max: int | None = None, grad_sqr: float | None = None, grad_var: float | None = None,
                 max_steps: int | None = None, batch_live: bool | None = None,
                 target_metric: float | None = None, early_stopping: Mapping[str, Any] | None = None,
                 batch_local_max: int | None = None) -> None:
        """What the job tells the elastic optimizer and the prediction; fields left None keep their
        last value. batch_live=True: the script adopts planned_batch_size() while it runs
        (docs/elastic.md). target_metric: the loss value the job stops at. early_stopping:
        {"patience": int, "min_delta": float, "metric": None | name, "higher_is_better": None | bool}
        (docs/progress-api.md). batch_local_max: the largest batch one GPU holds (a larger share of
        the global batch accumulates micro-batches; docs/elastic.md)."""
        given = {"batch_size": batch_size, "batch_min": batch_min, "batch_max": batch_max, "grad_sqr": grad_sqr,
                 "grad_var": grad_var, "max_steps": max_steps, "batch_live": batch_live,
                 "target_metric": target_metric, "early_stopping": dict(early_stopping) if early_stopping else None,
                 "batch_local_max": batch_local_max}
        with self._lock:
            for k, v in given.items():
                if v is None:
                    continue
                if isinstance(v, float) and not math.isfinite(v):
                    log.warning("flowsched: %s is not finite; not sent", k)
                    continue
                if k in _COUNTS and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    # the server refuses the whole post for it, and the points with it
                    log.warning("flowsched: %s must be a whole number >= 1, not %r; not sent", k, v)
                    continue
                self.training_info[k] = v

    def planned_batch_size(self) -> int | None:
        """The batch size flowsched planned for this job (None: keep yours). A script honours it
        when it next starts from its checkpoint, or, having said batch_live=True, at its next step
        (docs/elastic.md)."""
        b = (self.plan or {}).get("batch_size")
        return int(b) if isinstance(b, int) and b > 0 else None

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the background thread has tried to send everything queued so far; True when
        the server took it. For the end of training and tests; the loop itself never needs it."""
        if self._closed or not self._thread.is_alive():
            return self._send_queued()
        with self._done:
            self._asked += 1
            want = self._asked
            self._wake.set()
            if not self._done.wait_for(lambda: self._answered >= want,
                                       timeout_s if timeout_s is not None else 4 * self.config.timeout_s + 5):
                return False
            return self._last_ok

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued, retrying a server that answers "later" (or not in time) until
        timeout_s (default 5 send timeouts), then stop the thread; what could not be sent is
        counted in `dropped`. Idempotent; registered with atexit."""
        if self._closed:
            return
        limit = timeout_s if timeout_s is not None else 5 * self.config.timeout_s
        deadline = time.monotonic() + limit
        while not self.flush(max(0.0, deadline - time.monotonic())):
            with self._lock:
                if not self._queue or time.monotonic() >= deadline:
                    break
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        self._closed = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()) + self.config.timeout_s)
        with self._lock:
            if self._queue:
                log.warning("flowsched: %d progress points not sent at close", len(self._queue))
                self.dropped += len(self._queue)
                self._queue.clear()
        atexit.unregister(self.close)

    # ---- the background thread ----

    def _run(self) -> None:
        backoff = 0.0
        while not self._closed:
            self._wake.wait(backoff or self.config.flush_s)
            self._wake.clear()
            self._woken = False
            if self._closed:
                break
            with self._done:
                asked = self._asked
            cpu = time.thread_time()
            ok = self._send_queued()
            self.busy_s += time.thread_time() - cpu
            backoff = 0.0 if ok else min(max(2 * backoff, 0.5), self.config.flush_s)
            with self._done:
                self._answered, self._last_ok = max(self._answered, asked), ok
                self._done.notify_all()

    def _send_queued(self) -> bool:
        ok = True
        while True:
            with self._lock:
                n = min(len(self._queue), self.config.max_points_per_post)
                batch = [self._queue.popleft() for _ in range(n)]
            if not batch:
                return ok
            try:
                ok = self._post(batch)
            except Exception:  # a bug here must not kill the thread or lose the queue silently
                log.exception("flowsched: sending progress failed")
                ok = False
                with self._lock:
                    self.dropped += len(batch)
            if not ok:
                return False

    def _encode(self, batch: list[Point]) -> str:
        """The points as a JSON array, written directly (json.dumps of a dict per point costs
        twice as much, on the thread that shares the interpreter with the loop); consecutive
        points without metrics averaged per 1 / max_points_per_s of their time (merge_window)."""
        values: list[Any] = []
        for _, loss, _, metrics in batch:
            values.append(loss)
            if metrics:
                values.extend(metrics.values())
        floats = iter(to_floats(values))
        window = self._merge_window()
        parts: list[str] = []
        run: list[tuple[int, float, float]] = []  # (step, loss, timestamp) of the open window

        def close_run() -> None:
            finite = [v for _, v, _ in run if math.isfinite(v)]
            mean = sum(finite) / len(finite) if finite else math.nan
            step, _, ts = run[-1]
            parts.append(f'{{"step":{step},"loss":{_number(mean)},"timestamp":{_number(ts)}}}')
            run.clear()

        for step, _, ts, metrics in batch:
            loss = next(floats)
            if metrics or window <= 0:
                if run:
                    close_run()
                text = f'{{"step":{step},"loss":{_number(loss)},"timestamp":{_number(ts)}'
                if metrics:
                    text += ',"metrics":{' + ",".join(f"{json.dumps(str(k))}:{_number(next(floats))}"
                                                      for k in metrics) + "}"
                parts.append(text + "}")
                continue
            if run and ts - run[0][2] >= window:  # a new window: the last one goes as one point
                close_run()
            run.append((step, loss, ts))
        if run:
            close_run()
        return "[" + ",".join(parts) + "]"

    def _merge_window(self) -> float:
        """Seconds over which loss points are averaged into one; 0 (every point as it is) when the
        job's early stopping watches the loss itself, where each point is one evaluation."""
        es = self.training_info.get("early_stopping")
        if self.config.max_points_per_s <= 0 or (isinstance(es, Mapping) and es.get("metric") is None):
            return 0.0
        return 1.0 / self.config.max_points_per_s

    def _post(self, batch: list[Point]) -> bool:
        c = self.config
        token = c.token or _read(c.token_file)
        if not (c.url and c.job and c.namespace and token):
            if not self._warned:
                log.warning("flowsched: progress not sent (set FLOWSCHED_URL/FLOWSCHED_JOB; needs a namespace "
                            "and token); dropping points")
                self._warned = True
            with self._lock:
                self.dropped += len(batch)
            return False
        head: dict[str, Any] = {"namespace": c.namespace, "job": c.job}
        if c.higher_is_better is not None:
            head["higher_is_better"] = c.higher_is_better
        with self._lock:
            if self.training_info:
                head["training"] = dict(self.training_info)
        body = json.dumps(head)[:-1] + ',"points":' + self._encode(batch) + "}"
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        try:
            sent = self.send(c.url.rstrip("/") + "/v1/progress", body.encode(), headers, c.timeout_s)
        except Exception as e:
            sent = 0
            log.debug("flowsched: progress not sent: %s", e)
        status, reply = sent if isinstance(sent, tuple) else (sent, b"")
        if status == 200:
            self.sent += len(batch)
            self._read_plan(reply)
            return True
        self.failed_posts += 1
        with self._lock:
            if status in _TRANSIENT:  # back at the front, in order, bounded (the oldest go first)
                self._queue.extendleft(reversed(batch))
                while len(self._queue) > c.max_buffer:
                    self._queue.popleft()
                    self.dropped += 1
            else:
                log.warning("flowsched: progress refused with HTTP %d; dropped %d points", status, len(batch))
                self.dropped += len(batch)
        return False

    def _read_plan(self, reply: bytes) -> None:
        if not reply:
            return
        try:
            plan = json.loads(reply).get("plan")
        except (ValueError, AttributeError):
            return
        if plan is None or isinstance(plan, dict):
            self.plan = plan


_default: list[Reporter] = []  # created on first use, so importing reads no environment


def report(step: int, loss: Any, *, metrics: Mapping[str, Any] | None = None, job: str | None = None,
           namespace: str | None = None, url: str | None = None, token: str | None = None) -> None:
    """Record one point with the process-wide reporter (configured from the environment)."""
    if not _default:
        _default.append(Reporter(ReporterConfig.from_env()))
    r = _default[0]
    for name, value in (("job", job), ("namespace", namespace), ("url", url), ("token", token)):
        if value is not None:
            setattr(r.config, name, value)
    r.report(step, loss, metrics)
