"""Gradient statistics for the elastic optimizer (Pollux's grad_sqr / grad_var), standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


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
