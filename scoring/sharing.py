"""Filter and score for pods that share a physical GPU, by the physical GPUs' live use.

On a shared node (time-slicing, MPS, MIG, HAMi) the pod asks for replicas, slices or vGPUs,
but what it competes for is the physical GPU it lands on, and that GPU is chosen after
scheduling by the device plugin (or HAMi), not by kube-scheduler or flowsched. So a node is
judged by the physical GPUs the pod may land on:

- idle term: the mean idle share (1 - utilisation) over the node's physical GPUs with telemetry;
  unknown telemetry is neutral.
- saturated: every physical GPU with telemetry is above the bound (nothing to gain there); in
  strict mode (inference) *any* GPU above the bound rejects the node, because the pod may be
  put on exactly that GPU and flowsched cannot prevent it.
- no memory: no physical GPU (strict: not every GPU) has the framebuffer the pod needs free.

Allocation counts stay kube-scheduler's business (it counts replicas); these terms add what
counts cannot see. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scoring.nodes import BoolArray, FloatArray, IntArray
from scoring.placement import PlacementSettings, ScoreTerms, combine_terms


@dataclass(frozen=True)
class SharedTerms:
    saturated: BoolArray  # (n,)
    no_memory: BoolArray  # (n,)
    idle: FloatArray  # (n,) in [0, 1], neutral where unknown
    known: BoolArray  # (n,) the node has telemetry for at least one physical GPU


def shared_gpu_terms(
    util_pct: FloatArray,
    fb_free_mib: FloatArray,
    physical: FloatArray,
    fb_need_mib: float | None,
    bound_pct: float,
    strict: bool = False,
    neutral: float = 0.5,
) -> SharedTerms:
    """util_pct and fb_free_mib are (n, g) per physical GPU (NaN unknown); physical (n,) the
    node's physical GPU count (NaN unknown: every column may be one)."""
    n, g = util_pct.shape
    cols = np.arange(g)[None, :]
    in_node = np.where(np.isfinite(physical)[:, None], cols < physical[:, None], True)
    u = np.where(in_node, util_pct, np.nan)
    known_gpu: BoolArray = np.asarray(np.isfinite(u), dtype=bool)
    known: BoolArray = np.asarray(known_gpu.any(axis=1), dtype=bool)
    with np.errstate(invalid="ignore"):
        over = known_gpu & (u > bound_pct)
    saturated: BoolArray = np.asarray(over.any(axis=1) if strict
                                      else known & (over.sum(axis=1) == known_gpu.sum(axis=1)), dtype=bool)
    idle_each = np.where(known_gpu, 1.0 - np.clip(np.nan_to_num(u), 0.0, 100.0) / 100.0, 0.0)
    cnt = known_gpu.sum(axis=1)
    idle = np.where(known, idle_each.sum(axis=1) / np.maximum(cnt, 1), neutral)
    no_memory: BoolArray = np.zeros(n, dtype=bool)
    if fb_need_mib is not None and fb_need_mib > 0:
        fb = np.where(in_node, fb_free_mib, np.nan)
        fb_known = np.isfinite(fb)
        with np.errstate(invalid="ignore"):
            short = fb_known & (fb < fb_need_mib)
        no_memory = np.asarray(short.any(axis=1) if strict
                               else fb_known.any(axis=1) & (short.sum(axis=1) == fb_known.sum(axis=1)), dtype=bool)
    return SharedTerms(saturated=saturated, no_memory=no_memory, idle=idle, known=known)


def with_shared_utilisation(terms: ScoreTerms, rows: IntArray, idle: FloatArray,
                            settings: PlacementSettings) -> ScoreTerms:
    """terms with the utilisation term of `rows` (shared nodes) replaced by their physical
    GPUs' idle term, and their scores recombined."""
    util = terms.utilisation.copy()
    util[rows] = idle
    score = terms.score.copy()
    score[rows] = combine_terms(terms.headroom[rows], util[rows], terms.convergence[rows], terms.penalty[rows],
                                settings)
    return ScoreTerms(score=score, headroom=terms.headroom, utilisation=util, convergence=terms.convergence,
                      penalty=terms.penalty)
