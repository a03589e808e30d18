"""Report training progress to flowsched from inside a training loop: one line, no deps.

    from extender.report_client import report
    report(step, loss)                  # buffered; sent every flush_every points or flush_s

Defaults come from the pod: FLOWSCHED_URL, FLOWSCHED_JOB (else the pod's hostname), the
namespace and token of the mounted service account. Failures are logged and the points
dropped from a bounded buffer: reporting never raises into, nor blocks for long, the
training loop. Framework callbacks import their framework only when built.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("flowsched.report")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@dataclass
class ReporterConfig:
    url: str | None = None  # e.g. http://flowsched.flowsched-system:8888
    job: str | None = None
    namespace: str | None = None
    token: str | None = None
    token_file: Path = SA_DIR / "token"  # re-read on every send: projected tokens rotate
    higher_is_better: bool | None = None
    flush_every: int = 50
    flush_s: float = 30.0
    max_buffer: int = 10_000  # oldest points are dropped beyond this
    timeout_s: float = 2.0

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


Sender = Callable[[str, bytes, dict[str, str], float], int]


def urllib_send(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@dataclass
class Reporter:
    config: ReporterConfig
    send: Sender = urllib_send
    clock: Callable[[], float] = time.time
    _buffer: deque[dict[str, Any]] = field(default_factory=deque)
    _last_flush: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    dropped: int = 0

    def __post_init__(self) -> None:
        self._last_flush = self.clock()

    def report(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        """Buffer one point; flush when due. Never raises."""
        try:
            point: dict[str, Any] = {"step": int(step), "loss": _finite(loss), "timestamp": self.clock()}
            if metrics:
                point["metrics"] = {str(k): _finite(v) for k, v in metrics.items()}
            with self._lock:
                self._buffer.append(point)
                while len(self._buffer) > self.config.max_buffer:
                    self._buffer.popleft()
                    self.dropped += 1
                due = len(self._buffer) >= self.config.flush_every or \
                    self.clock() - self._last_flush >= self.config.flush_s
            if due:
                self.flush()
        except Exception:  # reporting must never stop training
            log.exception("flowsched: could not record progress point")

    def flush(self) -> bool:
        """Send what is buffered; True when the server took it. Never raises."""
        c = self.config
        with self._lock:
            batch = list(self._buffer)
            self._buffer.clear()
            self._last_flush = self.clock()
        if not batch:
            return True
        token = c.token or _read(c.token_file)
        if not (c.url and c.job and c.namespace and token):
            log.warning("flowsched: progress not sent (set FLOWSCHED_URL/FLOWSCHED_JOB; needs a namespace "
                        "and token); dropped %d points", len(batch))
            self.dropped += len(batch)
            return False
        body: dict[str, Any] = {"namespace": c.namespace, "job": c.job, "points": batch}
        if c.higher_is_better is not None:
            body["higher_is_better"] = c.higher_is_better
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        try:
            status = self.send(c.url.rstrip("/") + "/v1/progress", json.dumps(body).encode(), headers, c.timeout_s)
        except Exception as e:
            status = 0
            log.warning("flowsched: progress not sent: %s", e)
        if status == 200:
            return True
        if status in (0, 429, 502, 503, 504):  # transient: put the points back, bounded
            with self._lock:
                self._buffer.extendleft(reversed(batch))
                while len(self._buffer) > c.max_buffer:
                    self._buffer.popleft()
                    self.dropped += 1
        else:
            log.warning("flowsched: progress refused with HTTP %d; dropped %d points", status, len(batch))
            self.dropped += len(batch)
        return False


def _finite(x: float) -> float | None:
    # JSON has no NaN: a non-finite loss goes as null, which the server counts as rejected.
    v = float(x)
    return v if math.isfinite(v) else None


_default: list[Reporter] = []  # created on first use, so importing reads no environment


def report(
    step: int,
    loss: float,
    *,
    metrics: Mapping[str, float] | None = None,
    job: str | None = None,
    namespace: str | None = None,
    url: str | None = None,
    token: str | None = None,
) -> None:
    """Record one point with the process-wide reporter (configured from the environment)."""
    if not _default:
        cfg = ReporterConfig.from_env()
        _default.append(Reporter(cfg))
    r = _default[0]
    for name, value in (("job", job), ("namespace", namespace), ("url", url), ("token", token)):
        if value is not None:
            setattr(r.config, name, value)
    r.report(step, loss, metrics)


# ---- framework callbacks: each imports its framework only when built ----

def lightning_callback(reporter: Reporter, loss_key: str = "train_loss") -> Any:
    """PyTorch Lightning Callback reporting trainer.callback_metrics[loss_key] each batch."""
    import lightning.pytorch as pl  # type: ignore[import-not-found]

    class FlowschedCallback(pl.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            value = trainer.callback_metrics.get(loss_key)
            if value is not None:
                reporter.report(trainer.global_step, float(value))

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            reporter.flush()

    return FlowschedCallback()


def keras_callback(reporter: Reporter, loss_key: str = "loss") -> Any:
    """Keras Callback reporting logs[loss_key] after each batch."""
    import keras  # type: ignore[import-not-found]

    class FlowschedCallback(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.step = 0

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.step += 1
            if logs and loss_key in logs:
                reporter.report(self.step, float(logs[loss_key]))

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            reporter.flush()

    return FlowschedCallback()


def hf_trainer_callback(reporter: Reporter, loss_key: str = "loss") -> Any:
    """Hugging Face transformers TrainerCallback reporting the logged loss."""
    import transformers  # type: ignore[import-not-found]

    class FlowschedCallback(transformers.TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and loss_key in logs:
                reporter.report(state.global_step, float(logs[loss_key]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            reporter.flush()

    return FlowschedCallback()
