"""Report training progress to flowsched from inside a training loop: one line, no deps.

    from extender.progress.report_client import report
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("flowsched.report")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# deploy/'s Service: the progress API listens on api_port (8889); 8888 serves kube-scheduler alone.
IN_CLUSTER_URL = "http://flowsched.flowsched.svc:8889"


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


# A sender returns the HTTP status, or (status, reply body) so the reporter can read the plan.
Sender = Callable[[str, bytes, dict[str, str], float], "int | tuple[int, bytes]"]


def urllib_send(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as e:
        return int(e.code), b""


def gradient_noise(samples: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(grad_sqr, grad_var) for the progress API's `training` object, from k >= 2 gradients of
    the same parameters, each computed on an equal share of one global batch (e.g. the
    micro-batches of gradient accumulation, or the data-parallel replicas before all-reduce),
    flattened to plain numbers. grad_var is the variance of the whole batch's gradient (trace),
    grad_sqr the squared norm of its mean, debiased; report them with that batch's size."""
    k = len(samples)
    if k < 2:
        raise ValueError("need at least 2 gradient samples")
    n = len(samples[0])
    if n == 0 or any(len(s) != n for s in samples):
        raise ValueError("gradient samples must be non-empty and of equal length")
    mean = [sum(s[i] for s in samples) / k for i in range(n)]
    spread = sum((s[i] - mean[i]) ** 2 for s in samples for i in range(n)) / (k - 1)  # one share's gradient
    var = spread / k  # the mean of k shares: the whole batch's gradient
    sqr = max(sum(m * m for m in mean) - var, 0.0)
    if not (math.isfinite(var) and math.isfinite(sqr)):
        raise ValueError("gradients are not finite")
    return sqr, var


def torch_gradient_noise(per_share_grads: Sequence[Sequence[Any]]) -> tuple[float, float]:
    """gradient_noise() for PyTorch: per_share_grads[i] is the list of parameter .grad tensors of
    share i (cloned before the next backward). Computed on the tensors' device."""
    import torch  # imported only when called

    flat = torch.stack([torch.cat([g.reshape(-1).float() for g in share]) for share in per_share_grads])
    k = flat.shape[0]
    if k < 2:
        raise ValueError("need at least 2 gradient samples")
    mean = flat.mean(dim=0)
    var = float(((flat - mean) ** 2).sum() / (k - 1) / k)
    sqr = max(float((mean * mean).sum()) - var, 0.0)
    return sqr, var


@dataclass
class Reporter:
    config: ReporterConfig
    send: Sender = urllib_send
    clock: Callable[[], float] = time.time
    _buffer: deque[dict[str, Any]] = field(default_factory=deque)
    _last_flush: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    dropped: int = 0
    training_info: dict[str, Any] = field(default_factory=dict)  # sent with every flush
    plan: dict[str, Any] | None = None  # the elastic optimizer's latest plan, from the last reply

    def training(self, *, batch_size: int | None = None, batch_min: int | None = None,
                 batch_max: int | None = None, grad_sqr: float | None = None, grad_var: float | None = None,
                 max_steps: int | None = None, batch_live: bool | None = None,
                 target_metric: float | None = None) -> None:
        """What the job tells the elastic optimizer and the prediction; fields left None keep their
        last value. batch_live=True: the script adopts planned_batch_size() while it runs
        (docs/elastic.md). target_metric: the loss (or metric) value the job stops at."""
        given = {"batch_size": batch_size, "batch_min": batch_min, "batch_max": batch_max,
                 "grad_sqr": grad_sqr, "grad_var": grad_var, "max_steps": max_steps, "batch_live": batch_live,
                 "target_metric": target_metric}
        with self._lock:
            for k, v in given.items():
                if v is None:
                    continue
                if isinstance(v, float) and not math.isfinite(v):
                    log.warning("flowsched: %s is not finite; not sent", k)
                    continue
                self.training_info[k] = v

    def planned_batch_size(self) -> int | None:
        """The batch size flowsched planned for this job (None: keep yours). A script honours it
        when it next starts from its checkpoint, or, having said batch_live=True, at its next step
        (docs/elastic.md)."""
        b = (self.plan or {}).get("batch_size")
        return int(b) if isinstance(b, int) and b > 0 else None

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
        with self._lock:
            if self.training_info:
                body["training"] = dict(self.training_info)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        try:
            sent = self.send(c.url.rstrip("/") + "/v1/progress", json.dumps(body).encode(), headers, c.timeout_s)
        except Exception as e:
            sent = 0
            log.warning("flowsched: progress not sent: %s", e)
        status, reply = sent if isinstance(sent, tuple) else (sent, b"")
        if status == 200:
            self._read_plan(reply)
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


    def _read_plan(self, reply: bytes) -> None:
        if not reply:
            return
        try:
            plan = json.loads(reply).get("plan")
        except (ValueError, AttributeError):
            return
        if plan is None or isinstance(plan, dict):
            self.plan = plan


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
