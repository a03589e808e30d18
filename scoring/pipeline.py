"""One pod's placement on its candidate nodes: the filter and the score, composed in one place.

Every caller that places a pod the way flowsched does goes through filter_and_score: the
extender's verbs (/filter in both modes, /prioritize and the ScoreMemo that filter fills,
/debug/explain) and the simulator's kube-scheduler emulation. It composes, for the pod's
workload class (scoring/workload.py):

- fit and live telemetry: scoring/placement.py's filter_nodes and score_nodes;
- convergence: the completing_gpus column, read by score_nodes;
- the migration origin penalty (CandidateNodes.origin);
- sharing: on nodes that share GPUs, saturation, memory and the utilisation term come from
  the physical GPUs (scoring/sharing.py);
- fragmentation: for GPU pods placed by best fit, the headroom term from the demand mix
  (scoring/fragment_term.py).

Inputs are plain arrays and dataclasses the caller gathers first (the extender from its
ClusterState, the simulator from its cluster): no state, no clock, no I/O. A failure of the
fragmentation term is not raised but reported in the Verdict (the plain best fit stays), so
the caller decides how to log it; a verb must never fail over that term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from scoring.fragment_term import fragment_headroom
from scoring.fragmentation import DemandMix
from scoring.nodes import BoolArray, FloatArray, IntArray, NodeArrays
from scoring.placement import (
    PlacementSettings,
    PodDemand,
    Reject,
    ScoreTerms,
    filter_nodes,
    score_nodes,
    with_headroom,
)
from scoring.sharing import SharedTerms, shared_gpu_terms, with_shared_utilisation
from scoring.workload import WorkloadClass, placement_for


class Stages(Enum):
    """What one call computes (each verb pays only for what it answers)."""

    FILTER = "filter"  # the reasons only (/filter without a ScoreMemo)
    SCORE = "score"  # the scores of every row, no filter (/prioritize)
    BOTH = "both"  # reasons and the scores of every row (/filter filling the ScoreMemo, /debug/explain)
    RANK = "rank"  # reasons, and the scores of the passing rows only (filter-only mode, the simulator)


@dataclass(frozen=True)
class SharedGpus:
    """The candidate rows whose node shares its GPUs (time-slicing, MPS, MIG, HAMi)."""

    rows: IntArray  # ascending rows of CandidateNodes.nodes
    physical: FloatArray  # their physical GPU count; NaN where unknown
    replicas: IntArray  # their replicas per physical GPU for the fragmentation term; 0: the term does not apply


@dataclass(frozen=True)
class CandidateNodes:
    """What the pipeline reads of the candidate nodes, as plain data (row i is one node)."""

    nodes: NodeArrays
    telemetry: bool = True  # False: no row has a finite gpu_util / fb_free_mib (the checks are skipped)
    origin: BoolArray | None = None  # rows the pod's job was migrated away from
    shared: SharedGpus | None = None  # None: no candidate shares GPUs
    mix: DemandMix | None = None  # the demand mix of the fragmentation term; None: not gathered
    # Rows of nodes, gathered faster than nodes.take when the caller holds them as one matrix
    # (the extender's NodeView.take); None: nodes.take.
    gather: Callable[[IntArray], NodeArrays] | None = None


@dataclass(frozen=True)
class Verdict:
    reason: IntArray | None  # Reject per row; None for Stages.SCORE
    terms: ScoreTerms | None  # the scores and their terms; None for Stages.FILTER
    scored: IntArray | None = None  # Stages.RANK: the rows `terms` covers, ascending; None: every row
    fragment_error: str | None = None  # why the fragmentation term was left out, if it failed


@dataclass(frozen=True)
class RowExplanation:
    """One row's filter verdict and score with its terms (the /debug/explain view)."""

    reason: Reject
    score: int
    headroom: float
    utilisation: float
    convergence: float
    penalty: float


def needs_demand_mix(settings: PlacementSettings, cls: WorkloadClass, demand: PodDemand) -> bool:
    """Whether the score of this pod reads CandidateNodes.mix (the fragmentation term is on and
    the pod asks GPUs placed by best fit): the caller gathers the mix only then."""
    placement = placement_for(settings, cls)
    return placement.fragment and placement.pack_gpus and demand.gpus > 0


def filter_and_score(c: CandidateNodes, demand: PodDemand, cls: WorkloadClass, settings: PlacementSettings,
                     stages: Stages = Stages.BOTH) -> Verdict:
    """The pod's verdict on every candidate row, composed of every term (module docstring);
    settings are the policy's, adjusted here for the workload class."""
    placement = placement_for(settings, cls)
    shared = _shared_terms(c, demand, cls, placement)
    reason = None
    if stages != Stages.SCORE:
        reason = _shared_reasons(filter_nodes(c.nodes, demand, placement, c.telemetry).reason, c.shared, shared)
    if stages == Stages.FILTER:
        return Verdict(reason, None)
    rows = np.flatnonzero(reason == Reject.OK) if stages == Stages.RANK else None
    nodes = c.nodes if rows is None else (c.gather or c.nodes.take)(rows)
    origin = c.origin if rows is None or c.origin is None else c.origin[rows]
    terms = score_nodes(nodes, demand, placement, origin, c.telemetry)
    terms, error = _with_fragment(terms, nodes, c, demand, placement, rows)
    return Verdict(reason, _with_shared(terms, c.shared, shared, placement, rows), rows, error)


def explanation(v: Verdict) -> list[RowExplanation]:
    """Per row, in row order: the verdict of a Stages.BOTH call, term by term."""
    if v.reason is None or v.terms is None or v.scored is not None:
        raise ValueError("explanation needs the reasons and scores of every row (Stages.BOTH)")
    t = v.terms
    return [RowExplanation(Reject(code), score, head, util, conv, pen) for code, score, head, util, conv, pen in zip(
        v.reason.tolist(), t.score.tolist(), t.headroom.tolist(), t.utilisation.tolist(), t.convergence.tolist(),
        t.penalty.tolist(), strict=True)]


def _shared_terms(c: CandidateNodes, demand: PodDemand, cls: WorkloadClass,
                  placement: PlacementSettings) -> SharedTerms | None:
    """The physical-GPU terms of the rows that share GPUs (None when none does, at no cost on
    clusters without sharing). Inference is strict: any GPU it may land on counts."""
    sh = c.shared
    if sh is None or sh.rows.size == 0 or demand.gpus <= 0:
        return None
    fb_need = placement.min_fb_free_mib if placement.min_fb_free_mib > 0 else None
    return shared_gpu_terms(c.nodes.gpu_util[sh.rows], c.nodes.fb_free_mib[sh.rows], sh.physical, fb_need,
                            placement.saturation_util_pct, strict=cls == WorkloadClass.INFERENCE,
                            neutral=placement.neutral)


def _shared_reasons(reason: IntArray, sh: SharedGpus | None, terms: SharedTerms | None) -> IntArray:
    """On shared nodes the saturation and memory checks are the physical GPUs' (the generic ones
    read replica columns that have no telemetry); the replica count check stays."""
    if sh is None or terms is None:
        return reason
    reason = reason.copy()
    sub = reason[sh.rows]
    sub[(sub == Reject.GPU_SATURATED) | (sub == Reject.INSUFFICIENT_GPU_MEMORY)] = Reject.OK
    sub[(sub == Reject.OK) & terms.saturated] = Reject.GPU_SATURATED
    sub[(sub == Reject.OK) & terms.no_memory] = Reject.INSUFFICIENT_GPU_MEMORY
    reason[sh.rows] = sub
    return reason


def _with_fragment(terms: ScoreTerms, nodes: NodeArrays, c: CandidateNodes, demand: PodDemand,
                   placement: PlacementSettings, rows: IntArray | None) -> tuple[ScoreTerms, str | None]:
    """terms with the headroom of GPU pods placed by best fit (not inference, which spreads)
    from the fragmentation term; nodes: the rows `rows` (None: all) of c.nodes."""
    if not (placement.fragment and placement.pack_gpus) or demand.gpus <= 0 or c.mix is None or c.mix.empty:
        return terms, None
    replicas = None
    if c.shared is not None:
        replicas = np.ones(c.nodes.count, dtype=np.int64)
        replicas[c.shared.rows] = c.shared.replicas
        if rows is not None:
            replicas = replicas[rows]
    try:
        hit, head = fragment_headroom(nodes, replicas, c.mix, demand.gpus, demand.cpu, placement.fragment_levels)
    except (ValueError, FloatingPointError, IndexError) as e:  # never fail a placement over this term
        return terms, str(e)
    if hit.shape[0] == 0:
        return terms, None
    return with_headroom(terms, hit, head, placement), None


def _with_shared(terms: ScoreTerms, sh: SharedGpus | None, shared: SharedTerms | None,
                 placement: PlacementSettings, rows: IntArray | None) -> ScoreTerms:
    """terms with the shared rows' utilisation term from their physical GPUs; rows: the
    ascending rows terms were computed for (None: all of them)."""
    if sh is None or shared is None:
        return terms
    if rows is None:
        return with_shared_utilisation(terms, sh.rows, shared.idle, placement)
    if rows.size == 0:  # nothing scored (no row passed): nothing to replace
        return terms
    pos = np.searchsorted(rows, sh.rows)
    hit = (pos < rows.shape[0]) & (rows[np.minimum(pos, rows.shape[0] - 1)] == sh.rows)
    return with_shared_utilisation(terms, pos[hit], shared.idle[hit], placement)
