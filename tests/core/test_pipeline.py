"""scoring/pipeline.py: the one filter-and-score composition, on plain arrays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import scoring.pipeline as pipeline
from scoring.fragment_term import pod_kind
from scoring.fragmentation import DemandMix, PodKind, mix_from_counts
from scoring.nodes import IntArray, NodeArrays, nodes_from_columns
from scoring.pipeline import (
    CandidateNodes,
    SharedGpus,
    Stages,
    explanation,
    filter_and_score,
    needs_demand_mix,
)
from scoring.placement import PlacementSettings, PodDemand, Reject, filter_nodes, score_nodes
from scoring.workload import WorkloadClass

S = PlacementSettings()
TRAIN, INFER = WorkloadClass.TRAINING, WorkloadClass.INFERENCE
NAN = np.nan


def _nodes() -> NodeArrays:
    # 0: 4 GPUs, 1 used, idle; 1: full; 2: 8 GPUs, 2 used, busy; 3: 8 GPUs, 6 used, no telemetry
    return nodes_from_columns(
        [4, 4, 8, 8], [1, 4, 2, 6], cpu_alloc=[32000] * 4, cpu_used=[1000, 4000, 2000, 6000],
        gpu_util=[[5, 10, NAN, NAN], [50, 50, 50, 50], [95, 99, 96, 97], [NAN] * 4],
        fb_free_mib=np.full((4, 4), NAN), completing_gpus=[NAN, 4, 1, NAN])


def _mix(*gpus: int) -> DemandMix:
    return mix_from_counts({PodKind(1000, g, 1000): 1 for g in gpus}, 1.0)


def test_filter_and_score_is_placements_filter_and_score_on_plain_nodes() -> None:
    nodes, demand = _nodes(), PodDemand(gpus=2, cpu=2000)
    origin = np.array([False, False, True, False])
    both = filter_and_score(CandidateNodes(nodes, origin=origin), demand, TRAIN, S)
    assert both.reason is not None and both.terms is not None and both.scored is None
    assert both.reason.tolist() == filter_nodes(nodes, demand, S).reason.tolist()
    assert both.reason.tolist() == [Reject.OK, Reject.INSUFFICIENT_GPU, Reject.GPU_SATURATED, Reject.OK]
    plain = score_nodes(nodes, demand, S, origin)
    assert both.terms.score.tolist() == plain.score.tolist()
    assert both.terms.penalty.tolist() == [0.0, 0.0, S.origin_penalty, 0.0]
    only_filter = filter_and_score(CandidateNodes(nodes), demand, TRAIN, S, Stages.FILTER)
    assert only_filter.terms is None and only_filter.reason is not None
    assert only_filter.reason.tolist() == both.reason.tolist()
    only_score = filter_and_score(CandidateNodes(nodes, origin=origin), demand, TRAIN, S, Stages.SCORE)
    assert only_score.reason is None and only_score.terms is not None
    assert only_score.terms.score.tolist() == both.terms.score.tolist()


def test_rank_scores_only_the_passing_rows_with_the_same_scores() -> None:
    nodes, demand = _nodes(), PodDemand(gpus=2)
    gathered: list[list[int]] = []

    def gather(rows: IntArray) -> NodeArrays:
        gathered.append(rows.tolist())
        return nodes.take(rows)

    origin = np.array([True, False, False, False])
    both = filter_and_score(CandidateNodes(nodes, origin=origin), demand, TRAIN, S)
    rank = filter_and_score(CandidateNodes(nodes, origin=origin, gather=gather), demand, TRAIN, S, Stages.RANK)
    assert rank.scored is not None and rank.terms is not None and both.terms is not None
    assert rank.scored.tolist() == [0, 3] and gathered == [[0, 3]]
    assert rank.terms.score.tolist() == both.terms.score[[0, 3]].tolist()
    assert rank.terms.penalty.tolist() == [S.origin_penalty, 0.0]


def test_workload_class_changes_the_settings_inference_spreads_and_keeps_off_busy_gpus() -> None:
    nodes = nodes_from_columns([8, 8], [6, 0], gpu_util=[[10] * 8, [70] * 8])
    demand = PodDemand(gpus=1)
    settings = replace(S, weight_utilisation=0.0, weight_convergence=0.0)
    train = filter_and_score(CandidateNodes(nodes), demand, TRAIN, settings)
    infer = filter_and_score(CandidateNodes(nodes), demand, INFER, settings)
    assert train.reason is not None and infer.reason is not None and train.terms and infer.terms
    assert train.reason.tolist() == [Reject.OK, Reject.OK]  # 70 % is below the training bound (90)
    assert infer.reason.tolist() == [Reject.OK, Reject.GPU_SATURATED]  # above inference's 60
    assert train.terms.score[0] > train.terms.score[1]  # best fit
    assert infer.terms.score[1] > infer.terms.score[0]  # spread


def _shared_nodes() -> tuple[NodeArrays, SharedGpus]:
    # rows 0 and 1: 2 physical GPUs as 8 replicas; row 2 exclusive. Replica columns 2.. have no
    # telemetry: read as replicas they look usable, read as physical GPUs they are not there.
    nodes = nodes_from_columns([8, 8, 8], [6, 1, 0], gpu_util=[[95, 97] + [NAN] * 6, [3, 2] + [NAN] * 6,
                                                               [95, 97] + [NAN] * 6])
    return nodes, SharedGpus(np.array([0, 1]), np.array([2.0, 2.0]), np.array([4, 4]))


def test_shared_rows_are_judged_by_their_physical_gpus() -> None:
    nodes, shared = _shared_nodes()
    demand = PodDemand(gpus=1)
    v = filter_and_score(CandidateNodes(nodes, shared=shared), demand, TRAIN, S)
    plain = filter_and_score(CandidateNodes(nodes), demand, TRAIN, S)
    assert v.reason is not None and plain.reason is not None and v.terms is not None and plain.terms is not None
    assert plain.reason.tolist() == [Reject.OK, Reject.OK, Reject.OK]
    assert v.reason.tolist() == [Reject.GPU_SATURATED, Reject.OK, Reject.OK]
    assert v.terms.utilisation[1] == pytest.approx(1 - 0.025)  # the physical GPUs' idle share
    assert v.terms.utilisation[2] == plain.terms.utilisation[2]  # the exclusive row is unchanged
    rank = filter_and_score(CandidateNodes(nodes, shared=shared), demand, TRAIN, S, Stages.RANK)
    assert rank.scored is not None and rank.terms is not None
    assert rank.terms.score.tolist() == v.terms.score[rank.scored].tolist()


def test_rank_with_shared_rows_and_no_passing_row_answers() -> None:
    # Every row too full: nothing is scored, and mapping the shared rows into no rows is no error
    # (it raised IndexError in the verbs, a 500 for kube-scheduler).
    nodes, shared = _shared_nodes()
    v = filter_and_score(CandidateNodes(nodes, shared=shared), PodDemand(gpus=16), TRAIN, S, Stages.RANK)
    assert v.reason is not None and v.scored is not None and v.terms is not None
    assert (v.reason == Reject.INSUFFICIENT_GPU).all() and v.scored.size == 0 and v.terms.score.size == 0


def test_fragmentation_term_sends_a_small_pod_where_it_leaves_room_for_the_mix() -> None:
    # x has 4 GPUs free, y 5: best fit picks x, which then cannot host a 4-GPU pod.
    nodes = nodes_from_columns([8, 8], [4, 3], cpu_alloc=[64000, 64000], cpu_used=[0, 0])
    demand = PodDemand(gpus=1, cpu=1000)
    frag = replace(S, fragment=True)
    assert needs_demand_mix(frag, TRAIN, demand)
    assert not needs_demand_mix(frag, INFER, demand) and not needs_demand_mix(S, TRAIN, demand)
    assert not needs_demand_mix(frag, TRAIN, PodDemand(gpus=0, cpu=1000))
    on = filter_and_score(CandidateNodes(nodes, mix=_mix(4)), demand, TRAIN, frag, Stages.SCORE)
    off = filter_and_score(CandidateNodes(nodes, mix=_mix(4)), demand, TRAIN, S, Stages.SCORE)
    assert on.terms is not None and off.terms is not None
    assert on.terms.score[1] > on.terms.score[0] and off.terms.score[0] > off.terms.score[1]
    # A row the term does not model (0 replicas: MIG, HAMi) keeps its plain best-fit headroom.
    mig = SharedGpus(np.array([0]), np.array([NAN]), np.array([0]))
    part = filter_and_score(CandidateNodes(nodes, shared=mig, mix=_mix(4)), demand, TRAIN, frag, Stages.SCORE)
    assert part.terms is not None
    assert part.terms.headroom[0] == off.terms.headroom[0] and part.terms.headroom[1] != off.terms.headroom[1]


def test_a_failing_fragmentation_term_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> tuple[IntArray, IntArray]:
        raise ValueError("bad mix")

    monkeypatch.setattr(pipeline, "fragment_headroom", broken)
    nodes, demand = _nodes(), PodDemand(gpus=1)
    v = filter_and_score(CandidateNodes(nodes, mix=_mix(4)), demand, TRAIN, replace(S, fragment=True))
    plain = filter_and_score(CandidateNodes(nodes), demand, TRAIN, replace(S, fragment=True))
    assert v.fragment_error == "bad mix" and plain.fragment_error is None
    assert v.terms is not None and plain.terms is not None
    assert v.terms.score.tolist() == plain.terms.score.tolist()


def test_explanation_is_the_same_call_row_by_row() -> None:
    nodes, demand = _nodes(), PodDemand(gpus=2)
    v = filter_and_score(CandidateNodes(nodes), demand, TRAIN, S)
    rows = explanation(v)
    assert v.reason is not None and v.terms is not None
    assert [r.reason for r in rows] == v.reason.tolist()
    assert [r.score for r in rows] == v.terms.score.tolist()
    assert [r.headroom for r in rows] == v.terms.headroom.tolist()
    assert all(isinstance(r.score, int) and isinstance(r.penalty, float) for r in rows)
    with pytest.raises(ValueError):
        explanation(filter_and_score(CandidateNodes(nodes), demand, TRAIN, S, Stages.RANK))


def test_pod_kind_is_the_share_of_one_physical_gpu() -> None:
    assert pod_kind(1, 2000, 4) == PodKind(2000, 1, 250)
    assert pod_kind(6, 0, 4) == PodKind(0, 2, 1000)
    assert pod_kind(0, 500, 1) is None and pod_kind(0, 500, 1, cpu_only=True) == PodKind(500, 0, 0)
