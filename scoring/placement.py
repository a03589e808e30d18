"""Node feasibility and node scores for one pod: the filter and prioritize policies.

Everything is vectorised over the candidate nodes. Terms are in [0, 1]; an unknown input
gives the neutral value, so missing telemetry or progress data never decides a placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from scoring.nodes import BoolArray, FloatArray, IntArray, NodeArrays

MAX_SCORE = 10  # kube-scheduler's extenderv1.MaxExtenderPriority


class Reject(IntEnum):
    """Why a node fails the filter (0 = passes)."""

    OK = 0
    INSUFFICIENT_GPU = 1
    GPU_SATURATED = 2
    INSUFFICIENT_GPU_MEMORY = 3


REJECT_TEXT = {
    Reject.INSUFFICIENT_GPU: "flowsched: insufficient nvidia.com/gpu",
    Reject.GPU_SATURATED: "flowsched: GPUs saturated",
    Reject.INSUFFICIENT_GPU_MEMORY: "flowsched: insufficient free GPU memory",
}

# A node that cannot give a pod its GPUs now cannot be fixed by preempting... unless pods go
# away, which is exactly what preemption does; saturation from pods kube-scheduler cannot
# see (other schedulers, processes outside Kubernetes) cannot be fixed by preemption.
UNRESOLVABLE = frozenset({Reject.GPU_SATURATED})


@dataclass(frozen=True)
class PlacementSettings:
    saturation_util_pct: float = 90.0  # a GPU busier than this (per telemetry) cannot take a pod
    min_fb_free_mib: float = 0.0  # per GPU; 0 disables the GPU-memory check
    weight_headroom: float = 1.0
    weight_utilisation: float = 1.0
    weight_convergence: float = 0.5
    pack_gpus: bool = True  # best fit on GPUs (less fragmentation for multi-GPU jobs)
    origin_penalty: float = 3.0  # score points off the node a migrated job just left
    neutral: float = 0.5
    # an inference pod never goes where a GPU it may get is busier than this (scoring/workload.py)
    inference_util_pct: float = 60.0
    # Fragmentation-aware headroom for GPU pods (scoring/fragmentation.py, docs/sharing.md): the
    # demand mix is learnt from the pods seen, each counted with gpus ** exponent (0: one per
    # pod, as FGD), CPU-only pods on GPU nodes too when fragment_cpu_only (as FGD's artifact),
    # keeping the most frequent kinds that cover `popularity` of them, rebuilt every
    # `refresh_every` new pods; the fragment term is cut to `levels` levels and best fit orders
    # each level. Chosen on openb seeds 0..9 (docs/sharing.md), not on the reported 42..51.
    # Off by default: it made every verb call several times slower (docs/sharing.md, "What it
    # costs"), which the hot path (docs/hot-path.md) cannot afford. Clusters that share GPUs turn it on.
    fragment: bool = False
    fragment_popularity: float = 1.0
    fragment_weight_exponent: float = 0.0
    fragment_cpu_only: bool = True
    fragment_refresh_every: int = 64
    fragment_levels: int = 50

    def __post_init__(self) -> None:
        if not 0.0 < self.fragment_popularity <= 1.0:
            raise ValueError(f"fragment_popularity must be in (0, 1], got {self.fragment_popularity!r}")
        if not 0.0 <= self.fragment_weight_exponent <= 2.0:
            raise ValueError(f"fragment_weight_exponent must be in [0, 2], got {self.fragment_weight_exponent!r}")
        if self.fragment_refresh_every < 1 or self.fragment_levels < 1:
            raise ValueError("fragment_refresh_every and fragment_levels must be >= 1")


@dataclass(frozen=True)
class PodDemand:
    gpus: float
    cpu: float = 0.0  # millicores
    mem: float = 0.0  # bytes


@dataclass(frozen=True)
class FilterVerdict:
    reason: IntArray  # Reject per node

    @property
    def passed(self) -> BoolArray:
        ok: BoolArray = self.reason == Reject.OK
        return ok


@dataclass(frozen=True)
class ScoreTerms:
    score: IntArray  # 0..MAX_SCORE
    headroom: FloatArray
    utilisation: FloatArray
    convergence: FloatArray
    penalty: FloatArray


def _lowest_k(matrix: FloatArray, k: int) -> FloatArray:
    """The k smallest known values of each row, NaN-padded (NaN sorts last)."""
    if k <= 0 or matrix.shape[1] == 0:
        return np.empty((matrix.shape[0], 0))
    k = min(k, matrix.shape[1])
    return np.sort(matrix, axis=1)[:, :k]


def _gpus_wanted(demand: PodDemand) -> int:
    return int(np.ceil(demand.gpus)) if demand.gpus > 0 else 0


def filter_nodes(nodes: NodeArrays, demand: PodDemand, settings: PlacementSettings,
                 telemetry: bool = True) -> FilterVerdict:
    """telemetry=False: the caller knows gpu_util and fb_free_mib hold no finite value (no node
    has a fresh sample), so the saturation and memory checks cannot reject any node and are
    skipped (the same verdict, a dozen numpy calls fewer)."""
    n = nodes.count
    reason = np.zeros(n, dtype=np.int64)
    if demand.gpus <= 0:
        return FilterVerdict(reason)
    free = nodes.gpu_alloc - nodes.gpu_used
    reason[free + 1e-9 < demand.gpus] = Reject.INSUFFICIENT_GPU
    if not telemetry:
        return FilterVerdict(reason)

    k = _gpus_wanted(demand)
    util = nodes.gpu_util
    # Saturated when fewer than k GPUs can take work. A GPU slot with no sample, within the
    # node's GPU count, might be idle and counts as usable; a node with no samples at all is
    # unknown and never saturated.
    in_node = np.arange(util.shape[1])[None, :] < nodes.gpu_alloc[:, None]
    with np.errstate(invalid="ignore"):
        usable = (util <= settings.saturation_util_pct) | (np.isnan(util) & in_node)
    any_known = np.isfinite(util).any(axis=1)
    saturated = any_known & (usable.sum(axis=1) < k)
    reason[(reason == Reject.OK) & saturated] = Reject.GPU_SATURATED
    if settings.min_fb_free_mib > 0:
        most_free = -_lowest_k(-nodes.fb_free_mib, k)
        if most_free.shape[1] == k:
            with np.errstate(invalid="ignore"):
                short = np.any(most_free < settings.min_fb_free_mib, axis=1)
            reason[(reason == Reject.OK) & short] = Reject.INSUFFICIENT_GPU_MEMORY
    return FilterVerdict(reason)


def score_nodes(
    nodes: NodeArrays,
    demand: PodDemand,
    settings: PlacementSettings,
    origin: BoolArray | None = None,
    telemetry: bool = True,
) -> ScoreTerms:
    """Score each node 0..10. origin marks nodes the pod's job was migrated away from.
    telemetry=False: gpu_util holds no finite value (see filter_nodes); same scores."""
    n = nodes.count
    neutral = settings.neutral
    k = _gpus_wanted(demand)

    # Headroom: GPUs when the pod wants GPUs, else CPU. Best fit (pack) or spread.
    if k > 0:
        cap, used, want = nodes.gpu_alloc, nodes.gpu_used, demand.gpus
    else:
        cap, used, want = nodes.cpu_alloc, nodes.cpu_used, demand.cpu
    with np.errstate(divide="ignore", invalid="ignore"):
        free_after = np.clip((cap - used - want) / cap, 0.0, 1.0)
    free_after = np.where(np.isfinite(free_after), free_after, neutral)
    headroom = 1.0 - free_after if (settings.pack_gpus and k > 0) else free_after

    # Utilisation: mean of the k least busy GPUs (the ones the pod will likely get).
    if k > 0:
        if telemetry:
            least_busy = _lowest_k(nodes.gpu_util, k)
            filled = np.where(np.isfinite(least_busy), least_busy, 100.0 * (1.0 - neutral))
        else:  # every value unknown: the same (n, k) matrix of the neutral fill, built at once
            width = min(k, nodes.gpu_util.shape[1])
            filled = np.full((n, width), 100.0 * (1.0 - neutral))
        # add.reduce / count is exactly what mean() computes, without its Python-level wrapper
        util = (np.clip(1.0 - np.add.reduce(filled, axis=1) / filled.shape[1] / 100.0, 0.0, 1.0)
                if filled.shape[1] else np.full(n, neutral))
    else:
        util = np.full(n, neutral)

    # Convergence: share of the node's GPUs held by jobs that finish soon.
    with np.errstate(divide="ignore", invalid="ignore"):
        conv = nodes.completing_gpus / nodes.gpu_used
    conv = np.where(np.isfinite(conv), np.clip(conv, 0.0, 1.0), neutral)

    penalty = np.zeros(n) if origin is None else np.where(origin, settings.origin_penalty, 0.0)
    score = combine_terms(headroom, util, conv, None if origin is None else penalty, settings)
    return ScoreTerms(score=score, headroom=headroom, utilisation=util, convergence=conv, penalty=penalty)


def combined_score(headroom: FloatArray, util: FloatArray, conv: FloatArray, penalty: FloatArray | None,
                   settings: PlacementSettings) -> FloatArray:
    """The score before it is rounded to kube-scheduler's integer 0..MAX_SCORE (the openb replay
    compares this, where the wire's rounding would tie placements kube-scheduler then picks
    among at random). penalty None: no penalty (x - 0.0 is x, bit for bit, so it is skipped).
    The weights are plain floats: the same products and the same left-to-right sum as numpy's
    for three of them, without building an array each call."""
    w0, w1, w2 = settings.weight_headroom, settings.weight_utilisation, settings.weight_convergence
    total_w = float((w0 + w1) + w2) or 1.0
    out: FloatArray = (w0 * headroom + w1 * util + w2 * conv) / total_w * MAX_SCORE
    return out if penalty is None else out - penalty


def combine_terms(headroom: FloatArray, util: FloatArray, conv: FloatArray, penalty: FloatArray | None,
                  settings: PlacementSettings) -> IntArray:
    """The 0..MAX_SCORE score from its terms (also used when a term is replaced, scoring/sharing.py)."""
    combined = combined_score(headroom, util, conv, penalty, settings)
    score: IntArray = np.clip(np.rint(combined), 0, MAX_SCORE).astype(np.int64)
    return score


def with_headroom(terms: ScoreTerms, rows: IntArray, headroom: FloatArray, settings: PlacementSettings) -> ScoreTerms:
    """terms with the headroom term of `rows` replaced (the fragmentation term of GPU pods,
    scoring/fragmentation.py) and their scores recombined."""
    head = terms.headroom.copy()
    head[rows] = headroom
    score = terms.score.copy()
    score[rows] = combine_terms(head[rows], terms.utilisation[rows], terms.convergence[rows], terms.penalty[rows],
                                settings)
    return ScoreTerms(score=score, headroom=head, utilisation=terms.utilisation, convergence=terms.convergence,
                      penalty=terms.penalty)
