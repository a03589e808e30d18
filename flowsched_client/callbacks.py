"""Framework callbacks: each imports its framework only when built, reads the job's stopping rule
from the framework (its EarlyStopping and planned length) and reports through Reporter's batched
path (the loss as the framework holds it: no float() of a device value per batch).

The rule readers are plain functions over duck-typed objects, so they are tested without the
frameworks installed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from flowsched_client.reporter import Reporter


def _rule(patience: Any, min_delta: Any, metric: str, higher_is_better: bool | None) -> dict[str, Any] | None:
    """The progress API's early_stopping object. The metric is always named, even when it is the
    training loss: the framework evaluates it once per epoch or validation, not at every reported
    batch, and each point carrying it is one evaluation."""
    try:
        p, d = int(patience), abs(float(min_delta))
    except (TypeError, ValueError):
        return None
    if p < 1 or not math.isfinite(d):
        return None
    return {"patience": p, "min_delta": d, "metric": metric, "higher_is_better": higher_is_better}


def lightning_rule(callbacks: Iterable[Any]) -> dict[str, Any] | None:
    """Lightning's EarlyStopping(monitor, min_delta, patience, mode) among trainer.callbacks.
    Lightning keeps min_delta signed by mode; the rule takes its size."""
    for cb in callbacks:
        if type(cb).__name__ == "EarlyStopping" and hasattr(cb, "patience") and hasattr(cb, "monitor"):
            mode = getattr(cb, "mode", "min")
            return _rule(cb.patience, getattr(cb, "min_delta", 0.0), str(cb.monitor), mode == "max")
    return None


def lightning_max_steps(trainer: Any) -> int | None:
    """The planned end in optimizer steps: max_steps, else what max_epochs comes to
    (trainer.estimated_stepping_batches); None when open-ended."""
    steps = getattr(trainer, "max_steps", -1)
    if isinstance(steps, int) and steps > 0:
        return steps
    try:
        est = float(trainer.estimated_stepping_batches)
    except Exception:
        return None
    return int(est) if math.isfinite(est) and est > 0 else None


def hf_rule(callbacks: Iterable[Any], args: Any) -> dict[str, Any] | None:
    """Hugging Face's EarlyStoppingCallback(early_stopping_patience, early_stopping_threshold) on
    args.metric_for_best_model (named "eval_<name>" in the evaluation's metrics) with
    args.greater_is_better."""
    for cb in callbacks:
        if type(cb).__name__ == "EarlyStoppingCallback" and hasattr(cb, "early_stopping_patience"):
            name = getattr(args, "metric_for_best_model", None) or "loss"
            name = name if name.startswith("eval_") else f"eval_{name}"
            return _rule(cb.early_stopping_patience, getattr(cb, "early_stopping_threshold", 0.0) or 0.0, name,
                         bool(getattr(args, "greater_is_better", False)))
    return None


def keras_rule(early_stopping: Any) -> dict[str, Any] | None:
    """Keras' EarlyStopping(monitor, min_delta, patience, mode); mode "auto" is "max" for
    accuracy-like names, as Keras decides it."""
    if early_stopping is None:
        return None
    monitor = str(getattr(early_stopping, "monitor", "val_loss"))
    mode = getattr(early_stopping, "mode", "auto")
    higher = mode == "max" or (mode == "auto" and ("acc" in monitor or monitor.startswith("fmeasure")))
    return _rule(early_stopping.patience, getattr(early_stopping, "min_delta", 0.0), monitor, higher)


def _declare(reporter: Reporter, max_steps: int | None, rule: dict[str, Any] | None) -> None:
    reporter.training(max_steps=max_steps, early_stopping=rule)


class _Pending:
    """The monitored value of the latest evaluation, sent with the next reported point."""

    def __init__(self) -> None:
        self.metrics: dict[str, Any] | None = None

    def put(self, name: str | None, source: Mapping[str, Any] | None) -> None:
        if name and source is not None and name in source:
            self.metrics = {name: source[name]}

    def take(self) -> dict[str, Any] | None:
        out, self.metrics = self.metrics, None
        return out


def lightning_callback(reporter: Reporter, loss_key: str = "train_loss") -> Any:
    """PyTorch Lightning Callback: trainer.callback_metrics[loss_key] each batch, the EarlyStopping
    monitor after each validation, the rule and planned end at the start."""
    import lightning.pytorch as pl  # type: ignore[import-not-found]

    class FlowschedCallback(pl.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.rule: dict[str, Any] | None = None
            self.pending = _Pending()
            self.last: Any = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.rule = lightning_rule(trainer.callbacks)
            _declare(reporter, lightning_max_steps(trainer), self.rule)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            value = trainer.callback_metrics.get(loss_key)
            if value is not None:
                self.last = value
                reporter.report(trainer.global_step, value, self.pending.take())

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if self.rule is not None:
                self.pending.put(self.rule["metric"], trainer.callback_metrics)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            extra = self.pending.take()
            if extra is not None and self.last is not None:
                reporter.report(trainer.global_step + 1, self.last, extra)
            reporter.flush()

    return FlowschedCallback()


def keras_callback(reporter: Reporter, loss_key: str = "loss", early_stopping: Any = None) -> Any:
    """Keras Callback: logs[loss_key] after each batch, the EarlyStopping monitor after each epoch;
    the planned end is epochs x steps per epoch. Pass the job's keras.callbacks.EarlyStopping
    (a callback does not see its siblings)."""
    import keras  # type: ignore[import-not-found]

    rule = keras_rule(early_stopping)

    class FlowschedCallback(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.pending = _Pending()
            self.last: Any = None

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            params = getattr(self, "params", None) or {}
            epochs, steps = params.get("epochs"), params.get("steps")
            planned = epochs * steps if isinstance(epochs, int) and isinstance(steps, int) and steps > 0 else None
            _declare(reporter, planned, rule)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.step += 1
            if logs and loss_key in logs:
                self.last = logs[loss_key]
                reporter.report(self.step, self.last, self.pending.take())

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if rule is not None:
                self.pending.put(rule["metric"], logs)

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            extra = self.pending.take()
            if extra is not None and self.last is not None:
                reporter.report(self.step + 1, self.last, extra)
            reporter.flush()

    return FlowschedCallback()


def hf_trainer_callback(reporter: Reporter, loss_key: str = "loss", trainer: Any = None) -> Any:
    """Hugging Face transformers TrainerCallback: the logged loss, the EarlyStoppingCallback's
    metric after each evaluation, state.max_steps. Pass the Trainer (or add this callback with
    trainer.add_callback and set .trainer) so the rule is read from its callbacks."""
    import transformers  # type: ignore[import-not-found]

    class FlowschedCallback(transformers.TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.trainer = trainer
            self.rule: dict[str, Any] | None = None
            self.pending = _Pending()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            handler = getattr(self.trainer, "callback_handler", None)
            self.rule = hf_rule(getattr(handler, "callbacks", ()), args)
            steps = getattr(state, "max_steps", 0)
            _declare(reporter, steps if isinstance(steps, int) and steps > 0 else None, self.rule)

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                        **kwargs: Any) -> None:
            if self.rule is not None:
                self.pending.put(self.rule["metric"], metrics)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and loss_key in logs:
                reporter.report(state.global_step, logs[loss_key], self.pending.take())

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            reporter.flush()

    return FlowschedCallback()
