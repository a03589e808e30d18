"""The data and models the real runs train (torch; imported only by train_runs.py).

Every dataset ships with a package or is made here from a seed: scikit-learn's bundled
digits / breast_cancer / wine (BSD-3), ``make_classification`` / ``make_friedman1``
(generated), and a character corpus read from CPython's own standard-library source files
(PSF licence) named in CORPUS_FILES.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

# Fixed, sorted so the corpus is the same on every CPython 3.11 install.
CORPUS_FILES = ("argparse.py", "calendar.py", "difflib.py", "heapq.py", "textwrap.py", "typing.py")
SEQ_LEN = 32


@dataclass(frozen=True)
class Task:
    """A batch sampler, an evaluation, and how to build the model."""

    name: str
    build: Callable[[str], nn.Module]  # model kind -> model
    batch: Callable[[torch.Generator, int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module], tuple[float, float]]  # -> (val_loss, val_metric)
    metric: str  # the name of val_metric
    metric_higher_is_better: bool


def _split(x: np.ndarray, y: np.ndarray, seed: int, val_frac: float = 0.3) -> tuple[np.ndarray, ...]:
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = int(len(x) * val_frac)
    va, tr = order[:n_val], order[n_val:]
    mu, sd = x[tr].mean(0), x[tr].std(0)
    sd[sd < 1e-6] = 1.0  # constant pixels in the train split (digits' border) stay as they are
    return (x[tr] - mu) / sd, y[tr], (x[va] - mu) / sd, y[va]


def _table_task(name: str, x: np.ndarray, y: np.ndarray, seed: int, regression: bool, device: str = "cpu") -> Task:
    xt, yt, xv, yv = _split(x.astype(np.float32), y, seed)
    Xt, Xv = torch.tensor(xt, device=device), torch.tensor(xv, device=device)
    ydt = torch.float32 if regression else torch.long
    Yt, Yv = torch.tensor(yt, dtype=ydt, device=device), torch.tensor(yv, dtype=ydt, device=device)
    n_in, n_out = Xt.shape[1], 1 if regression else int(y.max()) + 1

    def build(kind: str) -> nn.Module:
        if kind == "logreg":
            return nn.Linear(n_in, n_out)
        if kind == "mlp":
            return nn.Sequential(nn.Linear(n_in, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, n_out))
        if kind == "cnn":
            return nn.Sequential(
                nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, n_out),
            )
        if kind == "mlp_wide":  # the long campaign's bigger model (train_runs.py --matrix long)
            return nn.Sequential(
                nn.Linear(n_in, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, n_out),
            )
        if kind == "mlp_huge":  # the GPU campaign's (train_runs.py --matrix gpu): a step worth a GPU
            return nn.Sequential(
                nn.Linear(n_in, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, n_out),
            )
        raise ValueError(f"{name}: no model kind {kind!r}")

    def batch(gen: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, len(Xt), (size,), generator=gen).to(device)  # drawn on the CPU: same on any device
        return Xt[idx], Yt[idx]

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if regression:
            return nn.functional.mse_loss(out.squeeze(-1), target)
        return nn.functional.cross_entropy(out, target)

    def evaluate(model: nn.Module) -> tuple[float, float]:
        with torch.no_grad():
            out = model(Xv)
            val_loss = float(loss(out, Yv))
            if regression:
                return val_loss, val_loss
            return val_loss, float((out.argmax(-1) == Yv).float().mean())

    metric = "val_mse" if regression else "val_acc"
    return Task(name, build, batch, loss, evaluate, metric, not regression)


def corpus_text(max_chars: int = 400_000) -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "".join((stdlib / f).read_text(encoding="utf-8") for f in CORPUS_FILES)[:max_chars]


class CharRNN(nn.Module):  # type: ignore[misc]  # torch is untyped here (ignore_missing_imports)
    def __init__(self, vocab: int, cell: str, width: int = 64, layers: int = 1) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.rnn = (nn.GRU if cell == "gru" else nn.LSTM)(32, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(self.rnn(self.emb(x))[0])


class CharTransformer(nn.Module):  # type: ignore[misc]
    def __init__(self, vocab: int, d: int = 32, heads: int = 2, layers: int = 2, seq_len: int = SEQ_LEN) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, x: torch.Tensor) -> Any:
        n = x.shape[1]
        return self.head(self.body(self.emb(x) + self.pos[:n], mask=self.mask[:n, :n], is_causal=True))


# The GPU campaign's text models (kind -> seq_len): sized so that a step is a GPU's work, not a launch.
GPU_TEXT_SEQ = {"gpt": 128, "lstm_big": 128}


def _text_task(seed: int, device: str = "cpu", seq_len: int = SEQ_LEN) -> Task:
    text = corpus_text()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    train, val = ids[:cut].to(device), ids[cut:].to(device)
    vocab = len(chars)
    val_starts = torch.arange(0, len(val) - seq_len - 1, seq_len)[:128]

    def windows(src: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = (starts[:, None] + torch.arange(seq_len + 1)[None, :]).to(device)
        w = src[rows]
        return w[:, :-1], w[:, 1:]

    def build(kind: str) -> nn.Module:
        if kind == "transformer":
            return CharTransformer(vocab)
        if kind == "gpt":
            return CharTransformer(vocab, d=256, heads=4, layers=4, seq_len=seq_len)
        if kind == "lstm_big":
            return CharRNN(vocab, "lstm", width=256, layers=2)
        return CharRNN(vocab, kind)

    def batch(gen: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(train, torch.randint(0, len(train) - seq_len - 1, (size,), generator=gen))

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))

    vx, vy = windows(val, val_starts)

    def evaluate(model: nn.Module) -> tuple[float, float]:
        with torch.no_grad():
            v = float(loss(model(vx), vy))
        return v, v

    return Task("stdlib_chars", build, batch, loss, evaluate, "val_loss", False)


def make_task(dataset: str, seed: int, device: str = "cpu", seq_len: int = SEQ_LEN) -> Task:
    """The dataset, split with the run's seed (the split is part of what varies between runs), its
    tensors on `device`; seq_len: the text task's window."""
    from sklearn import datasets  # type: ignore[import-not-found]  # a script-only extra, like torch

    if dataset == "digits":
        d = datasets.load_digits()
        return _table_task(dataset, d.data, d.target, seed, regression=False, device=device)
    if dataset == "breast_cancer":
        d = datasets.load_breast_cancer()
        return _table_task(dataset, d.data, d.target, seed, regression=False, device=device)
    if dataset == "wine":
        d = datasets.load_wine()
        return _table_task(dataset, d.data, d.target, seed, regression=False, device=device)
    if dataset == "synth_cls":
        x, y = datasets.make_classification(
            n_samples=3000, n_features=40, n_informative=12, n_classes=4, flip_y=0.08, random_state=seed
        )
        return _table_task(dataset, x, y, seed, regression=False, device=device)
    if dataset == "synth_reg":
        x, y = datasets.make_friedman1(n_samples=3000, n_features=12, noise=1.0, random_state=seed)
        return _table_task(dataset, x, y, seed, regression=True, device=device)
    if dataset == "synth_cls_big":  # the long campaign's: more data, so a wide model learns for minutes
        x, y = datasets.make_classification(
            n_samples=20000, n_features=40, n_informative=20, n_classes=4, flip_y=0.08, random_state=seed
        )
        return _table_task(dataset, x, y, seed, regression=False, device=device)
    if dataset == "synth_reg_big":
        x, y = datasets.make_friedman1(n_samples=20000, n_features=12, noise=1.0, random_state=seed)
        return _table_task(dataset, x, y, seed, regression=True, device=device)
    if dataset == "stdlib_chars":
        return _text_task(seed, device, seq_len)
    raise ValueError(f"no dataset {dataset!r}")
