"""Which of kube-scheduler's preemption candidates to keep.

kube-scheduler proposes, per node, a minimal victim set. flowsched may drop candidate nodes
but never adds a victim, and does not narrow a node's set (a narrower set might not free
enough room, and the pod would just fail again). It keeps the candidates whose victims cost
least to disturb: fewest PodDisruptionBudget violations, then fewest victims that cannot
resume from a checkpoint, then fewest that are still learning fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scoring.nodes import BoolArray, FloatArray, IntArray


@dataclass(frozen=True)
class VictimArrays:
    """One row per victim pod; node is the index of its candidate node."""

    node: IntArray
    checkpointable: BoolArray
    growing: BoolArray  # by the convergence state machine; False when unknown
    priority: FloatArray


def candidate_costs(victims: VictimArrays, pdb_violations: IntArray) -> FloatArray:
    """Lexicographic cost per candidate node, folded into one float (lower is better)."""
    n = pdb_violations.shape[0]
    hard = np.bincount(victims.node, weights=(~victims.checkpointable).astype(np.float64), minlength=n)
    growing = np.bincount(victims.node, weights=victims.growing.astype(np.float64), minlength=n)
    count = np.bincount(victims.node, minlength=n).astype(np.float64)
    # Each tier is bounded well below the next one's unit for any realistic victim count.
    cost: FloatArray = pdb_violations.astype(np.float64) * 1e9 + hard * 1e6 + growing * 1e3 + count
    return cost


def preferred_candidates(victims: VictimArrays, pdb_violations: IntArray) -> BoolArray:
    """Mask of candidate nodes to keep: those of least cost (never empty if any exist)."""
    if pdb_violations.shape[0] == 0:
        return np.zeros(0, dtype=np.bool_)
    cost = candidate_costs(victims, pdb_violations)
    keep: BoolArray = cost <= cost.min()
    return keep
