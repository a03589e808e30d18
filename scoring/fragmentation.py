"""Fragmentation-aware placement for fractional and multi-GPU demands (FGD's idea, ATC'23).

A node's *fragment* with respect to one kind of pod is the GPU capacity it has left that this
kind of pod cannot use: all of it when the pod cannot fit at all (too few GPUs with enough free
share, too little CPU, a GPU model the pod does not accept), otherwise the free share of the
GPUs whose free share is smaller than the pod's per-GPU demand. The node's *expected* fragment
is that amount averaged over the demand mix (the kinds of pods seen, weighted by how often they
come). A good placement is the one that raises the expected fragment least.

Everything is vectorised over nodes (and over each node's GPUs for a fractional pod). GPU
shares are in milli-GPUs (1000 = one whole GPU); a GPU slot a node does not have is free 0,
which no demand can use and which adds nothing to any fragment, so nodes of different sizes
share one (n, g) matrix.

The demand mix is grouped by (GPUs wanted, milli per GPU): the fragment of a group depends
on the GPUs only through that pair, and on CPU and GPU model only through a per-node weight
(the share of the group's pods that pass CPU and model on that node). With J groups the
per-pod cost is O(n * g * J), not O(n * g * kinds).

Pure: numpy and dataclasses; the learner is a plain accumulator the caller owns.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MILLI = 1000


@dataclass(frozen=True)
class PodKind:
    """One kind of pod: what it asks for. models: GPU models it accepts (empty: any)."""

    cpu_milli: int
    gpus: int  # GPUs wanted: 0 for CPU-only, 1 for a fraction
    gpu_milli: int  # per GPU: < 1000 only when gpus == 1
    models: frozenset[str] = frozenset()

    @property
    def total_milli(self) -> int:
        return self.gpus * self.gpu_milli


@dataclass(frozen=True)
class DemandMix:
    """The demand mix as arrays: kinds (k), their frequencies, and their (gpus, milli) groups (j).

    cpu_only_as_fragment: count all free GPU as fragment for CPU-only kinds (FGD's artifact
    does; it changes every candidate by the same amount for a GPU pod, so it only matters
    through the score's scale). flowsched leaves CPU-only kinds out.
    """

    kinds: tuple[PodKind, ...]
    freq: FloatArray  # (k,), sums to 1 over the kinds kept
    kind_cpu: FloatArray  # (k,)
    group_of_kind: IntArray  # (k,) -> j; -1 for CPU-only kinds
    group_gpus: IntArray  # (j,)
    group_milli: IntArray  # (j,)
    cpu_only_weight: float  # frequency mass of CPU-only kinds counted as fragment
    kind_group_freq: FloatArray  # (k, j): kind k's frequency in its group's column

    @property
    def groups(self) -> int:
        return int(self.group_gpus.shape[0])

    @property
    def empty(self) -> bool:
        return len(self.kinds) == 0


def mix_from_counts(
    counts: Counter[PodKind] | dict[PodKind, float] | dict[PodKind, int],
    popularity: float = 0.95,
    cpu_only_as_fragment: bool = False,
) -> DemandMix:
    """The most frequent kinds covering `popularity` of the pods (FGD's "typical pods"),
    frequencies renormalised over the kinds kept."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].gpus, kv[0].gpu_milli, kv[0].cpu_milli))
    total = float(sum(v for _, v in ranked))
    kept: list[tuple[PodKind, float]] = []
    acc = 0.0
    for kind, c in ranked:
        if total <= 0 or acc >= popularity * total:
            break
        kept.append((kind, float(c)))
        acc += c
    if not cpu_only_as_fragment:
        kept = [(k, c) for k, c in kept if k.gpus > 0]
    mass = sum(c for _, c in kept)
    if mass <= 0:
        return DemandMix((), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64),
                         np.zeros(0, np.int64), 0.0, np.zeros((0, 0)))
    groups: dict[tuple[int, int], int] = {}
    gidx = []
    for kind, _ in kept:
        if kind.gpus == 0:
            gidx.append(-1)
            continue
        gidx.append(groups.setdefault((kind.gpus, kind.gpu_milli), len(groups)))
    freq = np.array([c / mass for _, c in kept])
    cpu_only = float(sum(f for f, (k, _) in zip(freq, kept, strict=True) if k.gpus == 0))
    gg = sorted(groups.items(), key=lambda kv: kv[1])
    group_of_kind = np.array(gidx, dtype=np.int64)
    kind_group_freq = np.zeros((len(kept), len(gg)))
    gpu_kinds = np.flatnonzero(group_of_kind >= 0)
    kind_group_freq[gpu_kinds, group_of_kind[gpu_kinds]] = freq[gpu_kinds]
    return DemandMix(
        kinds=tuple(k for k, _ in kept),
        freq=freq,
        kind_cpu=np.array([float(k.cpu_milli) for k, _ in kept]),
        group_of_kind=group_of_kind,
        group_gpus=np.array([g for (g, _), _ in gg], dtype=np.int64),
        group_milli=np.array([m for (_, m), _ in gg], dtype=np.int64),
        cpu_only_weight=cpu_only,
        kind_group_freq=kind_group_freq,
    )


class DemandMixLearner:
    """Learns the demand mix from the pods seen.

    Each pod counts with the GPUs it asks for to the power `weight_exponent`: 0 (the default)
    counts one per pod, as FGD's typical pods do; 0.5 the square root; 1 one per GPU. With
    `cpu_only` (the default, as FGD's artifact configures it) pods that ask no GPU count too and
    their share of the mix is fragment (all free GPU is useless to them); this scales every
    GPU pod's fragment change by the same factor per placement, which matters through the cut
    to levels (placement_scores). Measured on the openb default list, seeds 0..9, with the
    level cut at 50 and best fit in a level (docs/sharing.md): one per pod with CPU-only pods
    95.26 %, without them 94.87 % (the whole list as the mix); the square root 95.07 %.
    `mix()` is rebuilt only after `refresh_every` new pods, so a long stream does not rebuild
    it per pod.
    """

    def __init__(self, popularity: float = 1.0, refresh_every: int = 64, weight_exponent: float = 0.0,
                 cpu_only: bool = True):
        self.counts: dict[PodKind, float] = {}
        self.popularity = popularity
        self.refresh_every = max(1, refresh_every)
        self.weight_exponent = weight_exponent
        self.cpu_only = cpu_only
        self._since = 0
        self._mix: DemandMix | None = None

    def observe(self, kind: PodKind) -> None:
        gpus = kind.total_milli / MILLI
        if gpus <= 0 and not self.cpu_only:
            return
        w = 1.0 if gpus <= 0 or self.weight_exponent == 0.0 else gpus ** self.weight_exponent
        self.counts[kind] = self.counts.get(kind, 0.0) + w
        self._since += 1

    def mix(self) -> DemandMix:
        if self._mix is None or self._since >= self.refresh_every:
            self._mix = mix_from_counts(self.counts, self.popularity, cpu_only_as_fragment=self.cpu_only)
            self._since = 0
        return self._mix


def access_matrix(node_models: list[str], mix: DemandMix) -> BoolArray:
    """(n, k): may kind k run on node i's GPU model."""
    out = np.ones((len(node_models), len(mix.kinds)), dtype=bool)
    for k, kind in enumerate(mix.kinds):
        if kind.models:
            out[:, k] = [m in kind.models for m in node_models]
    return out


@dataclass(frozen=True)
class NodeGroups:
    """Per-node sufficient statistics of the GPU state for every (gpus, milli) group j."""

    free_total: FloatArray  # (n,) milli
    small_free: FloatArray  # (n, j): free milli on GPUs whose free < group milli
    fitting: FloatArray  # (n, j): GPUs whose free >= group milli

    def take(self, idx: IntArray) -> NodeGroups:
        return NodeGroups(self.free_total[idx], self.small_free[idx], self.fitting[idx])

    def update(self, row: int, other: NodeGroups) -> None:
        """Overwrite one node's row with other's only row (the caller's cache after a placement)."""
        self.free_total[row] = other.free_total[0]
        self.small_free[row] = other.small_free[0]
        self.fitting[row] = other.fitting[0]


def node_groups(gpu_free: FloatArray, mix: DemandMix) -> NodeGroups:
    m = mix.group_milli.astype(np.float64)[None, None, :]
    f = gpu_free[:, :, None]
    small = np.where(f < m, f, 0.0).sum(axis=1)
    fits = (f >= m).sum(axis=1).astype(np.float64)
    return NodeGroups(gpu_free.sum(axis=1), small, fits)


def group_weights(cpu_left: FloatArray, access: BoolArray, mix: DemandMix) -> FloatArray:
    """(n, j): frequency of the group's kinds that pass CPU and GPU model on each node."""
    if access.all():
        # Every kind may use every node (the service: kube-scheduler filters models): the kinds
        # passing CPU are those asking at most cpu_left, a prefix of the kinds sorted by CPU.
        order = np.argsort(mix.kind_cpu, kind="stable")
        cum = np.vstack([np.zeros((1, mix.groups)), np.cumsum(mix.kind_group_freq[order], axis=0)])
        fast: FloatArray = cum[np.searchsorted(mix.kind_cpu[order], cpu_left, side="right")]
        return fast
    ok = (cpu_left[:, None] >= mix.kind_cpu[None, :]) & access
    w: FloatArray = ok.astype(np.float64) @ mix.kind_group_freq
    return w


def group_mass(mix: DemandMix) -> FloatArray:
    """(j,): total frequency of each group."""
    out: FloatArray = mix.kind_group_freq.sum(axis=0)
    return out


def expected_fragment(
    free_total: FloatArray, small_free: FloatArray, fitting: FloatArray, weight: FloatArray, mix: DemandMix,
    mass: FloatArray,
) -> FloatArray:
    """Expected fragment (milli) per candidate; all arguments broadcast on their leading axes
    ((..., j) for the group ones). A group whose GPU need cannot be met leaves all free GPU as
    fragment for all its kinds; otherwise the kinds that pass CPU and model see only the small
    GPUs as fragment and the others see everything."""
    gpu_ok = fitting >= mix.group_gpus
    t = free_total[..., None]
    per_group = np.where(gpu_ok, weight * small_free + (mass - weight) * t, mass * t)
    out: FloatArray = per_group.sum(axis=-1) + mix.cpu_only_weight * free_total
    return out


@dataclass(frozen=True)
class Candidates:
    """Placements of one pod: nodes (m,) and, for a fractional pod, the GPU column on each
    node (m, g) with `valid` marking GPUs that can take it."""

    nodes: IntArray
    delta: FloatArray  # (m,) or (m, g): change of the node's expected fragment, milli
    valid: BoolArray  # same shape as delta


def placement_deltas(
    gpu_free: FloatArray,
    cpu_left: FloatArray,
    access: BoolArray,
    nodes: IntArray,
    frag_now: FloatArray,
    pod: PodKind,
    mix: DemandMix,
    mass: FloatArray | None = None,
    stats: NodeGroups | None = None,
) -> Candidates:
    """How placing `pod` on each of `nodes` changes that node's expected fragment.

    gpu_free (n, g) and cpu_left (n,) are the whole cluster; access (n, k) from access_matrix;
    frag_now (n,) the current expected fragment; stats, when given, node_groups() of the whole
    cluster (a caller that keeps it up to date saves recomputing it per pod). Whole-GPU pods
    take fully free GPUs (which ones does not change the fragment); a fractional pod is
    evaluated on every GPU of the node.
    """
    mass = group_mass(mix) if mass is None else mass
    free = gpu_free[nodes]
    cpu_after = cpu_left[nodes] - pod.cpu_milli
    acc = access[nodes]
    m = mix.group_milli.astype(np.float64)
    if pod.gpus == 1 and pod.gpu_milli < MILLI:
        a = free[:, :, None]  # (m, g, 1)
        b = a - pod.gpu_milli
        st = node_groups(free, mix) if stats is None else stats.take(nodes)
        small = st.small_free[:, None, :] - np.where(a < m, a, 0.0) + np.where(b < m, b, 0.0)
        fitting = st.fitting[:, None, :] - (a >= m) + (b >= m)
        total = st.free_total[:, None] - pod.gpu_milli
        w = group_weights(cpu_after, acc, mix)[:, None, :]
        after = expected_fragment(total, small, fitting, w, mix, mass)
        valid = free >= pod.gpu_milli
        return Candidates(nodes, after - frag_now[nodes][:, None], valid)
    st = node_groups(free, mix) if stats is None else stats.take(nodes)
    k = float(pod.gpus) if pod.gpu_milli >= MILLI else 0.0
    fitting = st.fitting - k  # the GPUs taken were full, so they fitted every group
    total = st.free_total - k * MILLI
    w = group_weights(cpu_after, acc, mix)
    after = expected_fragment(total, st.small_free, fitting, w, mix, mass)
    valid = (free >= MILLI).sum(axis=1) >= pod.gpus if pod.gpus > 0 else np.ones(len(nodes), dtype=bool)
    return Candidates(nodes, after - frag_now[nodes], valid)


def node_fragment(gpu_free: FloatArray, cpu_left: FloatArray, access: BoolArray, mix: DemandMix,
                  mass: FloatArray | None = None, stats: NodeGroups | None = None) -> FloatArray:
    """(n,): expected fragment of every node now."""
    mass = group_mass(mix) if mass is None else mass
    s = node_groups(gpu_free, mix) if stats is None else stats
    return expected_fragment(s.free_total, s.small_free, s.fitting, group_weights(cpu_left, access, mix), mix, mass)


def fragment_term(delta: FloatArray, scale_milli: float = MILLI) -> FloatArray:
    """Map a fragment change to [0, 1], 1 = best: a logistic of -delta/scale, as FGD scores it
    (but not rounded, so near-equal placements are still told apart)."""
    out: FloatArray = 1.0 / (1.0 + np.exp(np.clip(delta / scale_milli, -50.0, 50.0)))
    return out


# The tie-break moves a score by at most this share of one level, so it orders placements only
# within a level and never across two.
TIE_SPAN = 0.5


def fit_key(gpu_after: FloatArray, node_free_after: FloatArray, cpu_left_after: FloatArray) -> FloatArray:
    """Best fit as one number, smaller = tighter: the GPU's free share after the placement, then
    the node's free GPU, then its free CPU (lexicographic to within 1 milli-GPU and 1 millicore
    on nodes of up to 100 GPUs and 1,000 cores)."""
    key: FloatArray = (np.clip(gpu_after, 0.0, MILLI) + 1e-5 * np.clip(node_free_after, 0.0, 100.0 * MILLI)
                       + 1e-12 * np.clip(cpu_left_after, 0.0, 1e6))
    return key


def placement_scores(delta: FloatArray, valid: BoolArray, gpu_after: FloatArray, node_free_after: FloatArray,
                     cpu_left_after: FloatArray, levels: int = 100) -> FloatArray:
    """flowsched's fragmentation score of each candidate placement, in [0, 1] (1 = best); -1 where
    the placement is not possible. All arrays broadcast to delta's shape ((m,) nodes, or (m, g)
    node x GPU for a fractional pod).

    The fragment term is FGD's: sigmoid(-delta / 1000) cut to `levels` levels (FGD's integer
    0..100 score at levels=100), stretched so that the candidates' best level is 1 and their
    worst 0. Placements in one level are ordered by best fit (fit_key): the fullest GPU, then
    the fullest node, then the least CPU left; that order moves a score by less than half of
    one level, so it is invisible in kube-scheduler's integers (kube-scheduler's own scores
    then choose among the tied nodes). The service uses it as the
    headroom term of GPU pods (extender/http/verbs.py); the openb replay picks its argmax
    (benchmarks/fgd/policies.py), both through scoring.placement.combined_score.
    """
    if levels < 1:
        raise ValueError(f"levels must be >= 1, got {levels}")
    level = np.floor(levels * fragment_term(delta)) / levels
    ok = valid & np.isfinite(level)
    if ok.any():
        # Stretched over the candidates: the best level becomes 1, the worst 0 (order unchanged,
        # the gap between two levels only grows). kube-scheduler reads an extender's score as an
        # integer 0..10, where one level of the raw term (a fragment change of a few tens of
        # milli-GPU) would vanish.
        lo, hi = float(level[ok].min()), float(level[ok].max())
        if hi > lo:
            level = (level - lo) / (hi - lo)
    fit = 1.0 - fit_key(gpu_after, node_free_after, cpu_left_after) / (MILLI + 1.0)
    score = (level + (TIE_SPAN / levels) * fit) / (1.0 + TIE_SPAN / levels)
    out: FloatArray = np.where(valid, score, -1.0)
    return out


def candidate_scores(gpu_free: FloatArray, cpu_left: FloatArray, pod: PodKind, delta: FloatArray, valid: BoolArray,
                     levels: int) -> FloatArray:
    """placement_scores for candidates whose rows are gpu_free (m, g) and cpu_left (m,), with
    their fragment changes (placement_deltas: (m, g) for a fractional pod, else (m,))."""
    node_free = gpu_free.sum(axis=1)
    cpu_after = cpu_left - pod.cpu_milli
    if pod.gpus == 1 and pod.gpu_milli < MILLI:
        # a share: the fullest GPU, then the fullest node (its CPU left does not order shares)
        return placement_scores(delta, valid, gpu_free - pod.gpu_milli, (node_free - pod.gpu_milli)[:, None],
                                np.zeros((gpu_free.shape[0], 1)), levels)
    return placement_scores(delta, valid, np.zeros_like(node_free), node_free - pod.total_milli, cpu_after, levels)


def packed_gpu_free(physical: FloatArray, used_milli: FloatArray, width: int) -> FloatArray:
    """(n, width) free milli per physical GPU of nodes that report only totals: `physical` GPUs
    (n,) of which `used_milli` (n,) is allocated, assumed packed onto the first GPUs (what a
    best-fit device allocator does; with time-slicing the device plugin picks, and flowsched
    cannot see which replica a pod got). Columns beyond a node's GPUs are free 0."""
    cols = np.arange(width, dtype=np.float64)[None, :]
    used_here = np.clip(used_milli[:, None] - cols * MILLI, 0.0, MILLI)
    free: FloatArray = np.where(cols < physical[:, None], MILLI - used_here, 0.0)
    return free


def idle_term(util_pct: FloatArray, neutral: float = 0.5) -> FloatArray:
    """Map live GPU utilisation (percent, NaN = unknown) to [0, 1], 1 = idle; unknown is neutral."""
    with np.errstate(invalid="ignore"):
        out: FloatArray = np.where(np.isfinite(util_pct), 1.0 - np.clip(util_pct, 0.0, 100.0) / 100.0, neutral)
    return out


def combined_gpu_score(
    delta: FloatArray, util_pct: FloatArray | None, weight_fragment: float = 1.0, weight_utilisation: float = 1.0,
    neutral: float = 0.5,
) -> FloatArray:
    """The score of each candidate GPU (or node): fragmentation term and live-utilisation term,
    weighted. Unknown utilisation is neutral, so without telemetry the fragment alone decides."""
    frag = fragment_term(delta)
    if util_pct is None or weight_utilisation <= 0:
        return frag
    util = idle_term(util_pct, neutral)
    total = weight_fragment + weight_utilisation
    out: FloatArray = (weight_fragment * frag + weight_utilisation * util) / total
    return out
