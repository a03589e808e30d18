"""The fragmentation-aware headroom term of GPU pods in the extender (scoring/fragmentation.py).

The demand mix is learnt from the GPU pods the watch has seen (ClusterState.learn_kind); a
candidate node's GPUs are rebuilt from its totals (scoring.fragmentation.packed_gpu_free: the
used share packed onto its first physical GPUs, since neither kube-scheduler nor flowsched
sees which GPU or replica a pod got); the score of a node is the best of its GPUs for a
fractional pod (the device plugin, not flowsched, picks the GPU). Nodes shared through MIG or
HAMi keep the plain best-fit headroom: their slices and vGPUs do not map to shares of one
GPU the way replicas do. No I/O, no clock: called by the verbs in extender/http/verbs.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from extender.snapshot.sharing import Mode, NodeSharing
from scoring.fragmentation import (
    MILLI,
    DemandMix,
    PodKind,
    candidate_scores,
    group_mass,
    node_fragment,
    node_groups,
    packed_gpu_free,
    placement_deltas,
)
from scoring.nodes import FloatArray, IntArray, NodeArrays
from scoring.placement import PlacementSettings

WIDTH = 16  # GPUs per node considered; wider nodes are cut to this
_PROJ = np.random.default_rng(12345).uniform(1.0, 2.0, WIDTH + 1)


def pod_kind(gpus: float, cpu_m: float, replicas: int, cpu_only: bool = False) -> PodKind | None:
    """A pod's kind in physical GPUs: `gpus` of the resource it asks, `replicas` of which share
    one physical GPU (1 on exclusive nodes). None when it asks no GPU (unless cpu_only: then
    the CPU-only kind) or nothing sensible."""
    if cpu_only and gpus == 0 and math.isfinite(cpu_m):
        return PodKind(max(0, int(cpu_m)), 0, 0)
    if not (gpus > 0 and math.isfinite(gpus) and math.isfinite(cpu_m)) or replicas < 1:
        return None
    physical = gpus / replicas
    if physical < 1.0:
        return PodKind(max(0, int(cpu_m)), 1, max(1, round(physical * MILLI)))
    return PodKind(max(0, int(cpu_m)), math.ceil(physical - 1e-9), MILLI)


def _replicas(sharing: NodeSharing | None) -> int | None:
    """Replicas per physical GPU of a node the term applies to; None for MIG and HAMi nodes."""
    if sharing is None:
        return 1
    if sharing.mode in (Mode.TIME_SLICING, Mode.MPS):
        return max(1, sharing.replicas_per_gpu)
    return None


def fragment_headroom(arrays: NodeArrays, names: list[str], shared: Mapping[str, NodeSharing], mix: DemandMix,
                      gpus: float, cpu_m: float, placement: PlacementSettings) -> tuple[IntArray, FloatArray]:
    """(rows, headroom): the rows of `arrays` the term applies to and their fragmentation score
    in [0, 1]; empty when the mix is empty or the pod asks no GPU. `names` (the rows' node
    names) is read only when some nodes share GPUs (`shared` not empty)."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
    if mix.empty or gpus <= 0:
        return empty
    if shared:
        reps = np.array([r if (r := _replicas(shared.get(n))) is not None else 0 for n in names], dtype=np.int64)
    else:
        reps = np.ones(arrays.count, dtype=np.int64)
    mass = group_mass(mix)
    rows_all: list[IntArray] = []
    vals_all: list[FloatArray] = []
    for r in np.unique(reps[reps > 0]).tolist():
        kind = pod_kind(gpus, cpu_m, int(r))
        if kind is None:
            continue
        rows = np.flatnonzero(reps == r)
        physical = np.floor(arrays.gpu_alloc[rows] / r + 1e-9)
        used = np.clip(arrays.gpu_used[rows] / r, 0.0, physical) * MILLI
        width = int(min(WIDTH, max(1.0, float(physical.max()) if physical.size else 1.0)))
        free_all = packed_gpu_free(physical, used, width)
        cpu_all = np.maximum(arrays.cpu_alloc[rows] - arrays.cpu_used[rows], 0.0)
        # Nodes in the same state (GPU shares and CPU left) score the same: evaluate each state
        # once. A state's fingerprint is a fixed random projection; equal states collide by
        # construction, different ones with negligible probability.
        proj = _PROJ[:width]
        key = free_all @ proj + cpu_all * _PROJ[-1]
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        free, cpu_left = free_all[first], cpu_all[first]
        access = np.ones((first.shape[0], len(mix.kinds)), dtype=bool)
        stats = node_groups(free, mix)
        frag_now = node_fragment(free, cpu_left, access, mix, mass, stats)
        cands = placement_deltas(free, cpu_left, access, np.arange(first.shape[0], dtype=np.int64), frag_now,
                                 kind, mix, mass, stats)
        score = candidate_scores(free, cpu_left, kind, cands.delta, cands.valid, placement.fragment_levels)
        node_score = (score.max(axis=1) if score.ndim == 2 else score)[inverse.reshape(-1)]
        ok = node_score >= 0.0  # a node the pod does not fit keeps its plain term (the filter decides)
        rows_all.append(rows[ok])
        vals_all.append(node_score[ok])
    if not rows_all:
        return empty
    return np.concatenate(rows_all), np.concatenate(vals_all)
