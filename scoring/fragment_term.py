"""The fragmentation-aware headroom term of GPU pods, on node totals (scoring/fragmentation.py).

kube-scheduler and flowsched see a node's GPU totals, not which GPU or replica a pod got: a
candidate node's GPUs are rebuilt from its totals (packed_gpu_free: the used share packed onto
its first physical GPUs); the score of a node is the best of its GPUs for a fractional pod (the
device plugin, not flowsched, picks the GPU). Rows whose GPUs are shared as replicas
(time-slicing, MPS) are judged in physical GPUs; the caller marks the rows the term does not
model (MIG slices and HAMi vGPUs do not map to shares of one GPU the way replicas do) with 0
replicas, and they keep the plain best-fit headroom. Pure: numpy, no clock.
"""

from __future__ import annotations

import math

import numpy as np

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

WIDTH = 16  # GPUs per node considered; wider nodes are cut to this
# A fixed random projection (a constant, not state): the fingerprint of a node's GPU state.
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


def fragment_headroom(nodes: NodeArrays, replicas: IntArray | None, mix: DemandMix, gpus: float, cpu_m: float,
                      levels: int) -> tuple[IntArray, FloatArray]:
    """(rows, headroom): the rows of `nodes` the term applies to and their fragmentation score
    in [0, 1]; empty when the mix is empty or the pod asks no GPU. replicas: per row, replicas
    per physical GPU (1 exclusive, 0 where the term does not apply); None: every row exclusive.
    levels: the fragment term's levels (PlacementSettings.fragment_levels)."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
    if mix.empty or gpus <= 0:
        return empty
    reps = np.ones(nodes.count, dtype=np.int64) if replicas is None else replicas
    mass = group_mass(mix)
    rows_all: list[IntArray] = []
    vals_all: list[FloatArray] = []
    for r in np.unique(reps[reps > 0]).tolist():
        kind = pod_kind(gpus, cpu_m, int(r))
        if kind is None:
            continue
        rows = np.flatnonzero(reps == r)
        physical = np.floor(nodes.gpu_alloc[rows] / r + 1e-9)
        used = np.clip(nodes.gpu_used[rows] / r, 0.0, physical) * MILLI
        width = int(min(WIDTH, max(1.0, float(physical.max()) if physical.size else 1.0)))
        free_all = packed_gpu_free(physical, used, width)
        cpu_all = np.maximum(nodes.cpu_alloc[rows] - nodes.cpu_used[rows], 0.0)
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
        score = candidate_scores(free, cpu_left, kind, cands.delta, cands.valid, levels)
        node_score = (score.max(axis=1) if score.ndim == 2 else score)[inverse.reshape(-1)]
        ok = node_score >= 0.0  # a node the pod does not fit keeps its plain term (the filter decides)
        rows_all.append(rows[ok])
        vals_all.append(node_score[ok])
    if not rows_all:
        return empty
    return np.concatenate(rows_all), np.concatenate(vals_all)
