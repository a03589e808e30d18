"""The placement policies FGD's paper compares, written from its description, and flowsched's.

Each policy sees one arriving pod and the nodes that can host it (CPU, memory, GPU model and
GPU share already checked), and returns a node and the GPU columns the pod takes. Scores are
what kube-scheduler would compare: the baselines use the integer 0..100 node scores of the
artifact's score plugins (kube-scheduler then picks at random among the top-scoring nodes),
and their ties go, as in the artifact (its vendored kube-scheduler's selectHost is changed
"for reproducibility" to keep the lexicographically smallest node name among equal scores),
to the first node by name. Random picks with its own random stream.

- Random: any feasible node, any GPU that fits.
- BestFit: least weighted free CPU and GPU after placement (weights 0.5/0.5 of the largest
  node's CPU and GPU), min-max normalised as the plugin does.
- Packing (GPU packing): first a GPU already shared, then free GPUs of an already used node,
  then an idle node; fewer GPUs used first.
- Clustering (GPU clustering): nodes already running pods of the same GPU demand, then idle
  nodes, then nodes with other demands; fuller nodes first within a tier.
- DotProd (Tetris): the dot product of the node's free (CPU, GPU) and the pod's demand,
  normalised by the largest node; the artifact prefers the *smaller* product.
- FGD: the change of the node's expected fragment under the demand mix ("typical pods" from
  the whole pod list, CPU-only pods included, as the artifact configures it), scored
  100 * sigmoid(-change / 1000) as an integer; a fractional pod goes to the GPU that scores best.
- flowsched: the service's score (scoring.fragmentation.candidate_scores inside
  scoring.placement.combined_score, replay_placement(): the service's placement defaults with
  the fragmentation term on, the one override run_fgd prints): the same fragment measure with
  the demand mix learnt from the pods seen so far (not the whole list), cut to 50 levels, best
  fit inside a level (fullest GPU, then fullest node), then the first node by name. In the
  replay there is no telemetry or progress, so the utilisation and convergence terms are
  neutral and do not move the choice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from benchmarks.fgd.cluster import Cluster, best_fit_gpu, random_gpu, whole_gpus
from benchmarks.fgd.workload import Pods
from scoring.fragmentation import (
    MILLI,
    DemandMix,
    DemandMixLearner,
    PodKind,
    access_matrix,
    candidate_scores,
    group_mass,
    mix_from_counts,
    node_fragment,
    node_groups,
    placement_deltas,
)
from scoring.placement import PlacementSettings, combined_score
from scoring.settings import CoreSettings

IntArray = npt.NDArray[np.int64]
MAX_SCORE = 100
MAX_SPEC_CPU = 128000.0  # the artifact's normalisers (largest openb node)
MAX_SPEC_GPU = 8000.0


def _top(scores: npt.NDArray[np.int64], cand: IntArray, name_rank: IntArray) -> int:
    """The top-scoring candidate; among equals the smallest node name (the artifact's rule)."""
    best = np.flatnonzero(scores == scores.max())
    if best.size == 1:
        return int(cand[best[0]])
    return int(cand[best[np.argmin(name_rank[cand[best]])]])


def _gpus_for(cluster: Cluster, node: int, gpus: int, milli: int) -> list[int]:
    if gpus == 0:
        return []
    row = cluster.gpu_free[node]
    if gpus == 1 and milli < MILLI:
        return [best_fit_gpu(row, milli)]
    return whole_gpus(row, gpus)


class Policy:
    name = "base"

    def __init__(self, cluster: Cluster, pods: Pods, rng: np.random.Generator):
        self.cluster = cluster
        self.pods = pods
        self.rng = rng
        names = cluster.nodes.names
        self.name_rank: IntArray = np.argsort(np.argsort(np.array(names), kind="stable")).astype(np.int64)

    def arrived(self, i: int) -> None:
        """Pod i arrived (whether or not it can be placed)."""

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        raise NotImplementedError

    def placed(self, i: int, node: int) -> None:
        """Pod i was placed on node (after the cluster arrays changed)."""


class RandomPolicy(Policy):
    name = "Random"

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        node = int(self.rng.choice(cand))
        g, m = int(self.pods.gpus[i]), int(self.pods.gpu_milli[i])
        if g == 1 and m < MILLI:
            return node, [random_gpu(self.cluster.gpu_free[node], m, self.rng)]
        return node, _gpus_for(self.cluster, node, g, m)


class BestFitPolicy(Policy):
    name = "BestFit"

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        c = self.cluster
        req_gpu = float(self.pods.total_milli[i])
        free_gpu = c.gpu_free[cand].sum(axis=1)
        left = ((c.cpu_left[cand] - self.pods.cpu_milli[i]) / MAX_SPEC_CPU * 0.5
                + (free_gpu - req_gpu) / MAX_SPEC_GPU * 0.5)
        raw = ((1.0 - left) * MAX_SCORE).astype(np.int64)  # Go's int64(): truncation
        lo, hi = int(raw.min()), int(raw.max())
        norm = np.zeros_like(raw) if hi == lo else (raw - lo) * MAX_SCORE // (hi - lo)
        node = _top(norm, cand, self.name_rank)
        return node, _gpus_for(c, node, int(self.pods.gpus[i]), int(self.pods.gpu_milli[i]))


class PackingPolicy(Policy):
    name = "Packing"

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        c = self.cluster
        g, m = int(self.pods.gpus[i]), int(self.pods.gpu_milli[i])
        if g == 0:
            scores = np.zeros(cand.size, dtype=np.int64)
        else:
            free = c.gpu_free[cand]
            count = c.nodes.gpus[cand]
            full = c.full_gpus[cand]
            idle = full == count
            idle_score = np.maximum(MAX_SCORE // 3 - full, full)
            if g == 1 and m < MILLI:
                # best-fit GPU on each node: a used one (case 1) when any fits, else a free one
                part = np.where((free >= m) & (free < MILLI), free, np.inf).min(axis=1)
                shared = np.isfinite(part)
                pct = np.where(shared, part, 0).astype(np.int64) * 100 // MILLI
                used_score = np.where(shared, np.maximum(MAX_SCORE - pct // 10, MAX_SCORE // 2),
                                      np.maximum(MAX_SCORE // 2 - 1, MAX_SCORE // 3))
            else:  # whole GPUs are always fully free ones: case 2 on a used node
                used_score = np.full(cand.size, max(MAX_SCORE // 2 - g, MAX_SCORE // 3))
            scores = np.where(idle, idle_score, used_score).astype(np.int64)
        node = _top(scores, cand, self.name_rank)
        return node, _gpus_for(c, node, g, m)


class ClusteringPolicy(Policy):
    name = "Clustering"

    def __init__(self, cluster: Cluster, pods: Pods, rng: np.random.Generator):
        super().__init__(cluster, pods, rng)
        # The artifact's affinity tag: "share" for every fractional pod, else the GPU count.
        tags = {self._tag_of(int(g), int(m)) for g, m in zip(pods.gpus, pods.gpu_milli, strict=True) if g > 0}
        self.tag_index = {t: j for j, t in enumerate(sorted(tags))}
        self.tags = np.zeros((cluster.nodes.count, len(self.tag_index)), dtype=np.int64)

    @staticmethod
    def _tag_of(g: int, m: int) -> int:
        return 0 if m < MILLI else g

    def _tag(self, i: int) -> int:
        g = int(self.pods.gpus[i])
        return self.tag_index.get(self._tag_of(g, int(self.pods.gpu_milli[i])), -1) if g > 0 else -1

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        c = self.cluster
        g, m = int(self.pods.gpus[i]), int(self.pods.gpu_milli[i])
        if g == 0:
            scores = np.zeros(cand.size, dtype=np.int64)
        else:
            t = self.tags[cand]
            kinds = (t > 0).sum(axis=1)
            same = t[:, self._tag(i)] > 0
            left = c.gpu_free[cand].sum(axis=1).astype(np.int64)
            fill = (MAX_SCORE // 4) * (int(MAX_SPEC_GPU) - left) // int(MAX_SPEC_GPU)
            tier = np.where(same, np.where(kinds == 1, 3, 2), np.where(kinds == 0, 1, 0))
            scores = fill + tier * (MAX_SCORE // 4)
        node = _top(scores, cand, self.name_rank)
        return node, _gpus_for(c, node, g, m)

    def placed(self, i: int, node: int) -> None:
        t = self._tag(i)
        if t >= 0:
            self.tags[node, t] += 1


class DotProdPolicy(Policy):
    name = "DotProd"

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        c = self.cluster
        dot = (c.cpu_left[cand] / MAX_SPEC_CPU * (self.pods.cpu_milli[i] / MAX_SPEC_CPU)
               + c.gpu_free[cand].sum(axis=1) / MAX_SPEC_GPU * (float(self.pods.total_milli[i]) / MAX_SPEC_GPU))
        scores = (MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)
        node = _top(scores, cand, self.name_rank)
        return node, _gpus_for(c, node, int(self.pods.gpus[i]), int(self.pods.gpu_milli[i]))


class _FragmentPolicy(Policy):
    """Shared state of the fragment-based policies: the mix, the access matrix, each node's
    expected fragment now."""

    def __init__(self, cluster: Cluster, pods: Pods, rng: np.random.Generator):
        super().__init__(cluster, pods, rng)
        models = sorted(set(cluster.nodes.models))
        self.model_id = np.array([models.index(m) for m in cluster.nodes.models], dtype=np.float64)
        self._proj = np.random.default_rng(12345).uniform(1.0, 2.0, cluster.gpu_free.shape[1] + 2)
        self.mix: DemandMix = mix_from_counts({})
        self._refresh(self.mix)

    def _refresh(self, mix: DemandMix) -> None:
        c = self.cluster
        self.mix = mix
        self.mass = group_mass(mix)
        self.access = access_matrix(list(c.nodes.models), mix)
        self.stats = node_groups(c.gpu_free, mix)
        self.frag = node_fragment(c.gpu_free, c.cpu_left, self.access, mix, self.mass, self.stats)

    def deltas(self, i: int, cand: IntArray) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Fragment change per candidate, computed once per distinct node state (nodes of one model
        with the same free CPU and GPU shares are interchangeable; most are, early in a replay)."""
        c = self.cluster
        # A node state's fingerprint: a random projection of (model, CPU, GPU shares); equal
        # states collide by construction, different ones with negligible probability.
        p = self._proj
        key = c.gpu_free[cand] @ p[:-2] + c.cpu_left[cand] * p[-2] + self.model_id[cand] * p[-1]
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        res = placement_deltas(c.gpu_free, c.cpu_left, self.access, cand[first], self.frag, self.pods.kind(i),
                               self.mix, self.mass, self.stats)
        inv = inverse.reshape(-1)
        return res.delta[inv], res.valid[inv]

    def placed(self, i: int, node: int) -> None:
        c = self.cluster
        sl = slice(node, node + 1)
        row = node_groups(c.gpu_free[sl], self.mix)
        self.stats.update(node, row)
        self.frag[node] = node_fragment(c.gpu_free[sl], c.cpu_left[sl], self.access[sl], self.mix, self.mass, row)[0]


class FGDPolicy(_FragmentPolicy):
    name = "FGD"

    def __init__(self, cluster: Cluster, pods: Pods, rng: np.random.Generator, typical: Pods):
        super().__init__(cluster, pods, rng)
        counts: Counter[PodKind] = Counter(typical.kind(j) for j in range(typical.count))
        self._refresh(mix_from_counts(counts, 0.95, cpu_only_as_fragment=True))

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        g, m = int(self.pods.gpus[i]), int(self.pods.gpu_milli[i])
        delta, valid = self.deltas(i, cand)
        score = (MAX_SCORE / (1.0 + np.exp(np.clip(delta / MILLI, -50, 50)))).astype(np.int64)
        if g == 1 and m < MILLI:
            score = np.where(valid, score, -1)
            node_score = score.max(axis=1)
            node = _top(node_score, cand, self.name_rank)
            row = int(np.flatnonzero(cand == node)[0])
            return node, [int(np.argmax(score[row]))]  # first best GPU
        node = _top(score, cand, self.name_rank)
        return node, _gpus_for(self.cluster, node, g, m)


def replay_placement() -> PlacementSettings:
    """The service's placement defaults with the one override every table prints: the
    fragmentation term on (the service's default is off, docs/sharing.md)."""
    return replace(CoreSettings().placement, fragment=True)


class FlowschedPolicy(_FragmentPolicy):
    """flowsched's placement, as the service scores it: the demand mix learnt from the pods seen
    (scoring.fragmentation.DemandMixLearner), the fragmentation score as the headroom term
    (scoring.fragmentation.candidate_scores) and the service's combined score
    (scoring.placement.combined_score) with replay_placement()'s settings, the utilisation and
    convergence terms neutral (the replay has no telemetry and no progress). The best combined
    score wins, unrounded; ties go to the first node by name, as for the other policies."""

    name = "flowsched"

    def __init__(self, cluster: Cluster, pods: Pods, rng: np.random.Generator,
                 settings: PlacementSettings | None = None):
        super().__init__(cluster, pods, rng)
        self.settings = settings or replay_placement()
        s = self.settings
        if not s.fragment:
            raise ValueError("the replay models flowsched's placement with its fragmentation term on "
                             "(placement.fragment=True)")
        self.learner = DemandMixLearner(s.fragment_popularity, s.fragment_refresh_every, s.fragment_weight_exponent,
                                        s.fragment_cpu_only)

    def arrived(self, i: int) -> None:
        self.learner.observe(self.pods.kind(i))
        mix = self.learner.mix()
        if mix is not self.mix:
            self._refresh(mix)

    def choose(self, i: int, cand: IntArray) -> tuple[int, list[int]]:
        c, s = self.cluster, self.settings
        g, m = int(self.pods.gpus[i]), int(self.pods.gpu_milli[i])
        delta, valid = self.deltas(i, cand)
        head = candidate_scores(c.gpu_free[cand], c.cpu_left[cand], self.pods.kind(i), delta, valid,
                                s.fragment_levels)
        neutral = np.full(head.shape, s.neutral)
        score = np.where(valid, combined_score(head, neutral, neutral, np.zeros(head.shape), s), -np.inf)
        if g == 1 and m < MILLI:
            node_score = score.max(axis=1)
            order = np.lexsort((self.name_rank[cand], -node_score))
            row = int(order[0])
            return int(cand[row]), [int(np.argmax(score[row]))]
        node = int(cand[np.lexsort((self.name_rank[cand], -score))[0]])
        return node, _gpus_for(c, node, g, m)


BASELINES: tuple[type[Policy], ...] = (RandomPolicy, DotProdPolicy, ClusteringPolicy, PackingPolicy, BestFitPolicy)
POLICY_NAMES = (*(p.name for p in BASELINES), "FGD", "flowsched")
