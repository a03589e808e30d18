"""Step and loss from training log lines, with no change to the training code.

Pure: text in, (step, loss) points out. One `LogProgressParser` per container instance
(a restarted container starts a fresh parser, so a step going back after a restart shows as
a restart from checkpoint, as with SDK posts). The parser is stateful only where a library's
output needs it: Keras prints the epoch on one line and the batch on the next, Hugging Face's
Trainer prints the loss without the step (the step is in its progress bar).

Built-in formats (each tested on output captured from the library itself, tests/data/logs/):
- PyTorch Lightning's TQDM bar: ``Epoch 2:  40%|████ | 4/10 [00:01<00:02, v_num=0, train_loss=0.512]``
  step = epoch × batches per epoch + batch; the loss is the first logged key named ``loss``,
  ``train_loss`` or ``*loss_step``. The bar reaches batch n before its postfix shows batch n's
  loss, so each step's last redraw is kept (held until the step moves on, or `flush()`).
  Its Rich bar (the default when `rich` is installed) ``Epoch 2/2 ━━━ 10/10 0:00:01 • … train_loss: 0.603``
  is read the same way, but off a terminal Rich draws it only once, when training ends.
- Hugging Face Trainer: ``{'loss': 0.6931, 'grad_norm': …, 'learning_rate': …, 'epoch': 0.5}``
  step = the bar's last ``n/N`` counter, else the count of loss lines so far.
- Keras ``fit``: ``Epoch 3/5`` then ``32/32 ━━━━ 0s 3ms/step - loss: 0.6931``
  step = (epoch − 1) × steps per epoch + batch.
- Plain ``step=120 loss=0.83`` (also ``step: 120, loss: 0.83``; ``iter``/``iteration`` for step).
A custom regex (the pod annotation flowsched.io/loss-regex) needs a named group ``loss`` and may
have ``step``; without ``step`` the count of matching lines is the step.

Progress bars redraw with carriage returns, so a log "line" is split on ``\\r`` as well, and
ANSI colour/cursor sequences and backspaces (Keras writes them even when not on a terminal) are
removed first; a
redraw that repeats the last step is not a new point. Lines are cut at MAX_LINE_CHARS before any
regex runs, so a pathological line costs bounded time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_LINE_CHARS = 4096

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x08")  # colours and cursor moves (Keras, rich), backspaces
_FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"

_LIGHTNING = re.compile(r"Epoch (?P<epoch>\d+):.*?\|\s*(?P<batch>\d+)/(?P<total>\d+|\?)\s*\[(?P<extra>[^\]]*)\]")
_LIGHTNING_RICH = re.compile(
    r"^\s*Epoch (?P<epoch>\d+)/\d+\s.*?\s(?P<batch>\d+)/(?P<total>\d+)\s(?P<extra>.*)$")
_LIGHTNING_KEY = re.compile(rf"(?:^|[\s,])(?P<key>[A-Za-z_][\w/]*)(?:=|: )(?P<val>{_FLOAT})(?=$|[\s,\]])")
# transformers >= 5 prints the values as strings ('0.5616'), older versions as numbers.
_HF_DICT = re.compile(rf"^\s*\{{'loss': '?(?P<loss>{_FLOAT})'?,.*'epoch': '?(?P<epoch>{_FLOAT})'?\}}\s*$")
_TQDM_COUNTER = re.compile(r"\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[")
_KERAS_EPOCH = re.compile(r"^\s*Epoch (?P<epoch>\d+)/(?P<epochs>\d+)\s*$")
_KERAS_BATCH = re.compile(rf"^\s*(?P<batch>\d+)/(?P<total>\d+)\s.*?\s-\sloss: (?P<loss>{_FLOAT})")
_PLAIN = re.compile(
    rf"\b(?:global_step|step|iteration|iter)\s*[=:]\s*(?P<step>\d+)\b.*?\b(?:train_loss|loss)\s*[=:]\s*(?P<loss>{_FLOAT})",
    re.IGNORECASE,
)

PATTERNS = ("lightning", "huggingface", "keras", "plain")


class LossRegexError(ValueError):
    """The custom regex does not compile or has no group named `loss`."""


def compile_loss_regex(text: str) -> re.Pattern[str]:
    try:
        rx = re.compile(text)
    except re.error as e:
        raise LossRegexError(f"flowsched.io/loss-regex does not compile: {e}") from e
    if "loss" not in rx.groupindex:
        raise LossRegexError("flowsched.io/loss-regex needs a named group (?P<loss>...)")
    return rx


@dataclass(frozen=True)
class ParsedPoint:
    step: int
    loss: float
    pattern: str  # which format matched: one of PATTERNS, or "custom"


def _float(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _lightning_loss(extra: str) -> float | None:
    """The loss among the bar's postfix keys: `loss`, `train_loss`, else the first key ending
    in `loss_step` or `loss` (v_num and other metrics are skipped)."""
    found: dict[str, str] = {m["key"]: m["val"] for m in _LIGHTNING_KEY.finditer(extra)}
    for key in ("loss", "train_loss", "train_loss_step", "loss_step"):
        if key in found:
            return _float(found[key])
    for key, val in found.items():
        if key.endswith("loss_step") or (key.endswith("loss") and not key.startswith("val")):
            return _float(val)
    return None


class LogProgressParser:
    """Feed it lines of one container instance's log, in order; it returns the new points.

    A point is returned only when the step moves (a bar redraw at the same step is skipped);
    a line that matches nothing, or whose loss is NaN/inf, yields nothing (NaN is not progress).
    """

    def __init__(self, custom: re.Pattern[str] | None = None) -> None:
        self.custom = custom
        self._last_step: int | None = None
        self._held: ParsedPoint | None = None
        self._keras_epoch = 0
        self._tqdm_n: int | None = None
        self._counted = 0  # lines matched by a format without a step (HF without a bar, custom)
        self.matched: dict[str, int] = {}

    def feed(self, line: str) -> list[ParsedPoint]:
        out: list[ParsedPoint] = []
        for part in line[:MAX_LINE_CHARS].split("\r"):
            p = self._parse(part)
            if p is None:
                continue
            if p.pattern == "lightning":
                # Lightning's bar moves to batch n before its postfix shows batch n's loss, so the
                # last redraw of a step holds its loss: keep it until the step moves on.
                if self._held is not None and self._held.step != p.step:
                    self._emit(self._held, out)
                self._held = p
                continue
            self._emit(p, out)
        return out

    def flush(self) -> list[ParsedPoint]:
        """The point held back for its step's last redraw (call when the log ends)."""
        out: list[ParsedPoint] = []
        if self._held is not None:
            self._emit(self._held, out)
            self._held = None
        return out

    def _emit(self, p: ParsedPoint, out: list[ParsedPoint]) -> None:
        if p.step == self._last_step:
            return  # a redraw at the same step is not a new point
        self._last_step = p.step
        self.matched[p.pattern] = self.matched.get(p.pattern, 0) + 1
        out.append(p)

    def _point(self, step: int, loss_text: str, pattern: str) -> ParsedPoint | None:
        loss = _float(loss_text)
        return None if loss is None else ParsedPoint(step, loss, pattern)

    def _parse(self, text: str) -> ParsedPoint | None:
        text = _ANSI.sub("", text)
        if not text.strip():
            return None
        if self.custom is not None:
            return self._parse_custom(text)
        m = _LIGHTNING.search(text) or _LIGHTNING_RICH.match(text)
        if m is not None:
            loss = _lightning_loss(m["extra"])
            if loss is None or m["total"] == "?" or m["batch"] == "0":
                return None  # batch 0: the bar was reset for a new epoch and shows the old loss
            return ParsedPoint(int(m["epoch"]) * int(m["total"]) + int(m["batch"]), loss, "lightning")
        m = _HF_DICT.match(text)
        if m is not None:
            self._counted += 1
            step = self._tqdm_n if self._tqdm_n is not None else self._counted
            return self._point(step, m["loss"], "huggingface")
        m = _KERAS_EPOCH.match(text)
        if m is not None:
            self._keras_epoch = int(m["epoch"])
            return None
        m = _KERAS_BATCH.match(text)
        if m is not None:
            epoch = max(self._keras_epoch, 1)
            return self._point((epoch - 1) * int(m["total"]) + int(m["batch"]), m["loss"], "keras")
        m = _PLAIN.search(text)
        if m is not None:
            return self._point(int(m["step"]), m["loss"], "plain")
        m = _TQDM_COUNTER.search(text)
        if m is not None:  # a bare bar (HF Trainer's): remember where it is for the next loss line
            self._tqdm_n = int(m["n"])
        return None

    def _parse_custom(self, text: str) -> ParsedPoint | None:
        assert self.custom is not None
        m = self.custom.search(text)
        if m is None:
            return None
        step_text = m.groupdict().get("step")
        if step_text is not None and step_text.isdigit():
            step = int(step_text)
        else:
            self._counted += 1
            step = self._counted
        return self._point(step, m["loss"], "custom")
