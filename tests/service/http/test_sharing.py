"""extender/snapshot/sharing.py (modes from real label sets, pod demand in physical GPUs, DCGM samples
per physical GPU) and scoring/sharing.py (filter/score by the physical GPUs' live use)."""

from __future__ import annotations

import numpy as np

from extender.snapshot.objects import parse_node
from extender.snapshot.sharing import (
    GPU_SHARED,
    Mode,
    node_sharing,
    parse_node_sharing,
    per_physical_gpu,
    physical_key,
    pod_demand,
)
from scoring.fragmentation import PodKind
from scoring.sharing import shared_gpu_terms

# GPU feature discovery on a T4 node with time-slicing, replicas 4, renameByDefault=false.
TIME_SLICED_LABELS = {
    "nvidia.com/gpu.count": "2",
    "nvidia.com/gpu.product": "Tesla-T4",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.family": "turing",
}
TIME_SLICED_ALLOC = {"cpu": "15890m", "memory": "57Gi", "nvidia.com/gpu": "8", "pods": "110"}

# renameByDefault=true: the replicas are nvidia.com/gpu.shared and the product is suffixed.
RENAMED_LABELS = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-A10G-SHARED",
                  "nvidia.com/gpu.replicas": "10", "nvidia.com/gpu.sharing-strategy": "mps"}
RENAMED_ALLOC = {"cpu": "8", "nvidia.com/gpu.shared": "10"}

# MIG mixed strategy on an A100-40GB: instances of two profiles.
MIG_MIXED_LABELS = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "1",
                    "nvidia.com/gpu.product": "A100-SXM4-40GB", "nvidia.com/mig-1g.5gb.count": "2",
                    "nvidia.com/mig-3g.20gb.count": "1", "nvidia.com/gpu.memory": "40960"}
MIG_MIXED_ALLOC = {"nvidia.com/mig-1g.5gb": "2", "nvidia.com/mig-3g.20gb": "1", "cpu": "32"}

# MIG single strategy: 7 x 1g.5gb exposed as nvidia.com/gpu.
MIG_SINGLE_LABELS = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "7",
                     "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"}
MIG_SINGLE_ALLOC = {"nvidia.com/gpu": "7"}

# HAMi: 4 physical GPUs, split 10 ways, memory and cores advertised.
HAMI_LABELS = {"gpu": "on", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "24576"}
HAMI_ALLOC = {"nvidia.com/gpu": "40", "nvidia.com/gpumem": "98304", "nvidia.com/gpucores": "400"}


def test_time_slicing_maps_replicas_to_physical_gpus() -> None:
    s = parse_node_sharing(TIME_SLICED_LABELS, TIME_SLICED_ALLOC)
    assert (s.mode, s.physical_gpus, s.replicas_per_gpu, s.resource) == (Mode.TIME_SLICING, 2, 4, "nvidia.com/gpu")
    assert s.device_plugin_picks
    assert pod_demand({"nvidia.com/gpu": "1"}, s).physical_gpus == 0.25
    assert pod_demand({"nvidia.com/gpu": "4", "cpu": "2"}, s).physical_gpus == 1.0


def test_renamed_mps_resource() -> None:
    s = parse_node_sharing(RENAMED_LABELS, RENAMED_ALLOC)
    assert (s.mode, s.physical_gpus, s.replicas_per_gpu, s.resource) == (Mode.MPS, 1, 10, GPU_SHARED)
    assert pod_demand({GPU_SHARED: "2"}, s).physical_gpus == 0.2


def test_time_slicing_without_count_label_derives_physical_and_says_so() -> None:
    labels = {k: v for k, v in TIME_SLICED_LABELS.items() if k != "nvidia.com/gpu.count"}
    s = parse_node_sharing(labels, TIME_SLICED_ALLOC)
    assert s.physical_gpus == 2
    assert any("nvidia.com/gpu.count missing" in n for n in s.notes)


def test_mig_mixed_slices_and_demand() -> None:
    s = parse_node_sharing(MIG_MIXED_LABELS, MIG_MIXED_ALLOC)
    assert s.mode == Mode.MIG_MIXED and dict(s.mig_slices) == {"1g.5gb": 2, "3g.20gb": 1}
    d = pod_demand({"nvidia.com/mig-3g.20gb": "1"}, s)
    assert abs(d.physical_gpus - 3 / 7) < 1e-9 and d.fb_mib == 20 * 1024


def test_mig_single_estimates_physical_gpus() -> None:
    s = parse_node_sharing(MIG_SINGLE_LABELS, MIG_SINGLE_ALLOC)
    assert s.mode == Mode.MIG_SINGLE and s.physical_gpus == 1 and dict(s.mig_slices) == {"1g.5gb": 7}
    assert abs(pod_demand({"nvidia.com/gpu": "1"}, s).physical_gpus - 1 / 7) < 1e-9


def test_hami_vgpu_demand_from_cores_or_memory() -> None:
    s = parse_node_sharing(HAMI_LABELS, HAMI_ALLOC)
    assert s.mode == Mode.HAMI and s.physical_gpus == 4 and s.gpu_memory_mib == 24576
    assert pod_demand({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, s).physical_gpus == 0.3
    d = pod_demand({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144"}, s)
    assert d.physical_gpus == 0.25 and d.fb_mib == 6144
    d2 = pod_demand({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, s)
    assert d2.physical_gpus == 0.5 and d2.fb_mib == 12288


def test_exclusive_and_malformed_labels_fall_back_with_notes() -> None:
    s = parse_node_sharing({"nvidia.com/gpu.count": "eight", "nvidia.com/gpu.replicas": "-1"},
                           {"nvidia.com/gpu": "8", "cpu": "lots"})
    assert s.mode == Mode.EXCLUSIVE and s.physical_gpus == 8
    assert len(s.notes) == 3  # count, replicas, cpu


def test_dcgm_samples_per_physical_gpu() -> None:
    samples = [
        ({"gpu": "0", "UUID": "GPU-a", "Hostname": "n1"}, 80.0),
        ({"gpu": "1", "UUID": "GPU-b", "GPU_I_ID": "1", "GPU_I_PROFILE": "3g.20gb"}, 60.0),
        ({"gpu": "1", "UUID": "GPU-b", "GPU_I_ID": "2", "GPU_I_PROFILE": "1g.5gb"}, 20.0),
        ({"gpu": "x"}, 50.0),
        ({"gpu": "2"}, float("nan")),
    ]
    assert per_physical_gpu(samples) == {0: 80.0, 1: 60.0}
    k = physical_key({"gpu": "1", "UUID": "GPU-b", "GPU_I_ID": "2"})
    assert k is not None and (k.gpu, k.uuid, k.instance) == (1, "GPU-b", 2)


def test_shared_terms_prefer_the_node_idle_in_fact() -> None:
    # node 0: both physical GPUs busy; node 1: idle; node 2: no telemetry (neutral)
    util = np.array([[85.0, 90.0], [5.0, 10.0], [np.nan, np.nan]])
    fb = np.array([[2000.0, 1000.0], [14000.0, 15000.0], [np.nan, np.nan]])
    t = shared_gpu_terms(util, fb, np.array([2.0, 2.0, np.nan]), fb_need_mib=4000, bound_pct=95)
    assert t.idle[1] > t.idle[2] > t.idle[0]
    assert t.no_memory.tolist() == [True, False, False]
    assert t.saturated.tolist() == [False, False, False]


def test_strict_mode_rejects_a_node_with_any_busy_gpu() -> None:
    util = np.array([[95.0, 5.0], [40.0, 50.0]])
    fb = np.full((2, 2), np.nan)
    lax = shared_gpu_terms(util, fb, np.array([2.0, 2.0]), None, bound_pct=60)
    strict = shared_gpu_terms(util, fb, np.array([2.0, 2.0]), None, bound_pct=60, strict=True)
    assert lax.saturated.tolist() == [False, False]
    assert strict.saturated.tolist() == [True, False]


def test_columns_beyond_the_physical_count_are_ignored() -> None:
    util = np.array([[10.0, 99.0]])  # a stale second column on a 1-GPU node
    t = shared_gpu_terms(util, np.full((1, 2), np.nan), np.array([1.0]), None, bound_pct=50, strict=True)
    assert not t.saturated[0] and abs(t.idle[0] - 0.9) < 1e-9


def test_parsed_node_carries_what_the_sharing_parser_needs() -> None:
    node = parse_node({"metadata": {"name": "ts-1", "labels": TIME_SLICED_LABELS},
                       "status": {"allocatable": TIME_SLICED_ALLOC, "conditions": []}})
    assert node.allocatable.gpus == 8  # kube-scheduler's view: replicas
    s = node_sharing(node)
    assert s.mode == Mode.TIME_SLICING and s.physical_gpus == 2


# ---- the extender's verbs on time-sliced nodes (filter/prioritize read the physical GPUs) ----

def _ts_node(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": TIME_SLICED_LABELS},
            "status": {"allocatable": TIME_SLICED_ALLOC,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _ts_state(busy_util: list[float], idle_util: list[float]) -> object:
    from extender.snapshot.objects import parse_pod
    from extender.snapshot.state import ClusterState
    from tests.k8s_factories import pod

    s = ClusterState()
    s.upsert_node(parse_node(_ts_node("a")))
    s.upsert_node(parse_node(_ts_node("b")))
    # allocation counts favour "a" for packing (6 of 8 replicas used) ...
    s.upsert_pod(parse_pod(pod("a-pods", gpus=6, node_name="a", phase="Running")))
    s.upsert_pod(parse_pod(pod("b-pod", gpus=1, node_name="b", phase="Running")))
    # ... but its two physical GPUs are busy in fact, and b's are idle
    s.set_node_telemetry("a", busy_util, [np.nan, np.nan], sampled_at=100.0)
    s.set_node_telemetry("b", idle_util, [np.nan, np.nan], sampled_at=100.0)
    return s


def test_shared_pod_goes_where_physical_gpus_are_idle_in_fact() -> None:
    from extender.http.verbs import Policy, decide_prioritize
    from extender.http.wire import ExtenderArgs
    from extender.snapshot.state import ClusterState
    from scoring.placement import PlacementSettings
    from tests.k8s_factories import pod

    s = _ts_state([85.0, 88.0], [3.0, 2.0])
    assert isinstance(s, ClusterState) and set(s.read().shared()) == {"a", "b"}
    policy = Policy(placement=PlacementSettings(), stale_after_s=60.0)
    args = ExtenderArgs(pod=pod("p", gpus=1, owner=("PyTorchJob", "t")), node_names=["a", "b"], nodes=None)
    ans = decide_prioritize(s, args, policy, now=101.0)
    assert ans.scores[1] > ans.scores[0]


def test_saturated_physical_gpus_reject_a_time_sliced_node() -> None:
    from extender.http.verbs import Policy, decide_filter
    from extender.http.wire import ExtenderArgs
    from extender.snapshot.state import ClusterState
    from scoring.placement import PlacementSettings
    from tests.k8s_factories import pod

    s = _ts_state([95.0, 97.0], [3.0, 2.0])
    assert isinstance(s, ClusterState)
    policy = Policy(placement=PlacementSettings(), stale_after_s=60.0)
    args = ExtenderArgs(pod=pod("p", gpus=1), node_names=["a", "b"], nodes=None)
    ans = decide_filter(s, args, policy, now=101.0)
    assert ans.passed == ["b"] and "a" in ans.unresolvable
    # Without the sharing labels the same columns look like 2 busy GPUs of 8, the 6 others
    # unknown and usable: the node passes. That is what reading physical GPUs changes.
    plain = ClusterState()
    plain.upsert_node(parse_node({"metadata": {"name": "a"}, "status": {
        "allocatable": TIME_SLICED_ALLOC, "conditions": [{"type": "Ready", "status": "True"}]}}))
    plain.set_node_telemetry("a", [95.0, 97.0], [np.nan, np.nan], sampled_at=100.0)
    assert not plain.read().shared()
    assert decide_filter(plain, ExtenderArgs(pod=pod("p", gpus=1), node_names=["a"], nodes=None), policy,
                         now=101.0).passed == ["a"]


def test_filter_ranked_mode_ranks_shared_nodes_by_their_physical_gpus() -> None:
    from extender.http.verbs import Policy, decide_filter_ranked
    from extender.http.wire import ExtenderArgs
    from extender.snapshot.state import ClusterState
    from scoring.placement import PlacementSettings
    from tests.k8s_factories import pod

    s = _ts_state([85.0, 88.0], [3.0, 2.0])
    assert isinstance(s, ClusterState)
    policy = Policy(placement=PlacementSettings(), stale_after_s=60.0, rank_margin=0)
    args = ExtenderArgs(pod=pod("p", gpus=1, owner=("PyTorchJob", "t")), node_names=["a", "b"], nodes=None)
    assert decide_filter_ranked(s, args, policy, now=101.0).passed == ["b"]


def test_filter_ranked_mode_answers_when_no_known_shared_node_fits() -> None:
    # Only the unknown candidate passes: nothing is scored, and the shared rows have nothing to
    # map into (this raised IndexError, a 500 for kube-scheduler).
    from extender.http.verbs import Policy, decide_filter_ranked
    from extender.http.wire import ExtenderArgs
    from extender.snapshot.state import ClusterState
    from scoring.placement import PlacementSettings
    from tests.k8s_factories import pod

    s = _ts_state([3.0, 2.0], [3.0, 2.0])
    assert isinstance(s, ClusterState)
    policy = Policy(placement=PlacementSettings(), stale_after_s=60.0)
    args = ExtenderArgs(pod=pod("p", gpus=8), node_names=["a", "b", "ghost"], nodes=None)
    ans = decide_filter_ranked(s, args, policy, now=101.0)
    assert ans.passed == ["ghost"] and ans.unknown == 1


def test_gpu_pod_headroom_is_the_fragmentation_term_learnt_from_the_pods_seen() -> None:
    """Two 8-GPU nodes, x with 4 GPUs free and y with 5. Best fit puts a 1-GPU pod on x; with
    4-GPU pods in the mix that leaves x unable to host one (3 GPUs of fragment) while y keeps 4:
    the fragmentation term sends it to y."""
    from dataclasses import replace

    from extender.http.verbs import Policy, decide_prioritize
    from extender.http.wire import ExtenderArgs
    from extender.snapshot.objects import parse_pod
    from extender.snapshot.state import ClusterState
    from scoring.placement import PlacementSettings
    from tests.k8s_factories import node, pod

    s = ClusterState()
    for name in ("x", "y"):
        s.upsert_node(parse_node(node(name, gpus=8, cpu="64")))
    s.upsert_pod(parse_pod(pod("on-x", gpus=4, node_name="x", phase="Running")))
    s.upsert_pod(parse_pod(pod("on-y", gpus=3, node_name="y", phase="Running")))
    for i in range(6):  # the mix: mostly 4-GPU pods
        s.upsert_pod(parse_pod(pod(f"w{i}", gpus=4)))
    assert not s.read().demand_mix().empty
    args = ExtenderArgs(pod=pod("p", gpus=1, owner=("PyTorchJob", "t")), node_names=["x", "y"], nodes=None)
    frag = decide_prioritize(s, args, Policy(placement=replace(PlacementSettings(), fragment=True),
                                             stale_after_s=60.0), now=1.0)
    plain = decide_prioritize(s, args, Policy(placement=PlacementSettings(), stale_after_s=60.0), now=1.0)
    assert not PlacementSettings().fragment  # off by default (the hot path's cost, docs/sharing.md)
    assert frag.scores[1] > frag.scores[0], frag.scores
    assert plain.scores[0] > plain.scores[1], plain.scores  # best fit alone would fragment x


def test_fragment_kind_of_a_replica_is_its_share_of_one_physical_gpu() -> None:
    from scoring.fragment_term import pod_kind

    assert pod_kind(1, 2000, 4) == PodKind(2000, 1, 250)
    assert pod_kind(6, 0, 4) == PodKind(0, 2, 1000)
    assert pod_kind(2, 500, 1) == PodKind(500, 2, 1000)
    assert pod_kind(0, 500, 1) is None and pod_kind(float("nan"), 0, 1) is None and pod_kind(1, 0, 0) is None


def test_state_learns_gpu_pods_when_seen_and_cpu_only_pods_once_bound_to_a_gpu_node() -> None:
    from extender.snapshot.objects import parse_pod
    from extender.snapshot.state import ClusterState
    from tests.k8s_factories import node, pod

    s = ClusterState()
    s.upsert_node(parse_node(node("gpu", gpus=8, cpu="64")))
    s.upsert_node(parse_node(node("cpu-only", gpus=0, cpu="64")))
    s.upsert_pod(parse_pod(pod("g", gpus=2, cpu="4")))  # pending GPU pod: counted at once
    s.upsert_pod(parse_pod(pod("c", gpus=0, cpu="2")))  # pending CPU-only pod: node unknown yet
    s.upsert_pod(parse_pod(pod("elsewhere", gpus=0, cpu="2", node_name="cpu-only", phase="Running")))
    assert s.read().demand_counts() == {PodKind(4000, 2, 1000): 1.0}
    s.upsert_pod(parse_pod(pod("c", gpus=0, cpu="2", node_name="gpu", phase="Running")))  # now bound
    s.upsert_pod(parse_pod(pod("c", gpus=0, cpu="2", node_name="gpu", phase="Running")))  # counted once
    s.upsert_pod(parse_pod(pod("g", gpus=2, cpu="4", node_name="gpu", phase="Running")))
    assert s.read().demand_counts() == {PodKind(4000, 2, 1000): 1.0, PodKind(2000, 0, 0): 1.0}
