"""filter and prioritize on DRA nodes: a pod's GPUs from its claims and from mapped extended
resources (KEP-5004), node capacity from ResourceSlices."""

from __future__ import annotations

from typing import Any

from extender.http.verbs import Policy, decide_filter, decide_prioritize
from extender.http.wire import ExtenderArgs
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from extender.snapshot.watcher import apply_event
from scoring.placement import PlacementSettings
from tests.cluster import dra_objects as d
from tests.k8s_factories import node, pod

GPU = "nvidia.com/gpu"
POLICY = Policy(placement=PlacementSettings(), stale_after_s=60.0)


def _add(state: ClusterState, kind: str, obj: dict[str, Any]) -> None:
    apply_event(state, kind, {"type": "ADDED", "object": obj}, GPU)


def _dra_state(nodes: tuple[str, ...] = ("d1", "d2"), classes: tuple[dict[str, Any], ...] = (d.device_class(),)
               ) -> ClusterState:
    state = ClusterState()
    for c in classes:
        _add(state, "deviceclasses", c)
    for name in nodes:
        state.upsert_node(parse_node(node(name, gpus=0)))
        _add(state, "resourceslices", d.gpu_slice(name))
    state.mark_synced()
    return state


def _claim_pod(name: str, claims: dict[str, str]) -> dict[str, Any]:
    """A pod whose claims come from templates, as the resourceclaim controller leaves it."""
    p = pod(name, gpus=0)
    p["spec"]["resourceClaims"] = [{"name": k, "resourceClaimTemplateName": "t"} for k in claims]
    p["status"]["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    return p


def test_mapped_extended_resource_pod_passes_dra_only_nodes() -> None:
    # KEP-5004: before, every DRA node had 0 nvidia.com/gpu and every node was rejected.
    state = _dra_state(classes=(d.device_class(extended_resource=GPU),))
    ans = decide_filter(state, ExtenderArgs(pod(name="p", gpus=1), ["d1", "d2"], None), POLICY, 0.0)
    assert ans.passed == ["d1", "d2"] and not ans.failed


def test_claim_pod_is_a_gpu_pod_and_fits_only_where_gpus_are_free() -> None:
    state = _dra_state()
    # d1: three GPUs held by another claim
    _add(state, "resourceclaims", d.allocated(d.resource_claim("busy", count=3), "d1", ["gpu-0", "gpu-1", "gpu-2"]))
    _add(state, "resourceclaims", d.resource_claim("p-gpus-x", count=2))
    ans = decide_filter(state, ExtenderArgs(_claim_pod("p", {"gpus": "p-gpus-x"}), ["d1", "d2"], None), POLICY, 0.0)
    assert ans.passed == ["d2"] and set(ans.failed) == {"d1"}


def test_implicit_extended_resource_name_counts() -> None:
    state = _dra_state()
    p = pod("p", gpus=0)
    p["spec"]["containers"][0]["resources"]["limits"]["deviceclass.resource.kubernetes.io/gpu.nvidia.com"] = "5"
    ans = decide_filter(state, ExtenderArgs(p, ["d1"], None), POLICY, 0.0)
    assert ans.passed == [] and set(ans.failed) == {"d1"}


def test_prioritize_prefers_the_idle_dra_node() -> None:
    state = _dra_state()
    state.set_node_telemetry("d1", [90.0] * 4, [1000.0] * 4, 0.0)
    state.set_node_telemetry("d2", [5.0] * 4, [70000.0] * 4, 0.0)
    _add(state, "resourceclaims", d.resource_claim("p-gpus-x", count=2))
    ans = decide_prioritize(state, ExtenderArgs(_claim_pod("p", {"gpus": "p-gpus-x"}), ["d1", "d2"], None),
                            POLICY, 0.0)
    assert ans.scores[1] > ans.scores[0]


def test_device_plugin_pods_and_nodes_unchanged_beside_dra() -> None:
    state = _dra_state(("d1",))
    state.upsert_node(parse_node(node("dp", gpus=8)))
    state.upsert_pod(parse_pod(pod("a", gpus=6, node_name="dp", phase="Running")))
    ans = decide_filter(state, ExtenderArgs(pod("p", gpus=3), ["dp", "d1"], None), POLICY, 0.0)
    assert ans.passed == ["d1"] and set(ans.failed) == {"dp"}


def test_explain_reads_a_claim_pod_as_the_verbs_do() -> None:
    from extender.http.verbs import explain

    state = _dra_state()
    _add(state, "resourceclaims", d.allocated(d.resource_claim("busy", count=3), "d1", ["gpu-0", "gpu-1", "gpu-2"]))
    _add(state, "resourceclaims", d.resource_claim("p-gpus-x", count=2))
    state.upsert_pod(parse_pod(_claim_pod("p", {"gpus": "p-gpus-x"})))
    (pod,) = [p for p in state.read().pods() if p.name == "p"]
    rows = {r["node"]: r["filter"] for r in explain(state, pod, ["d1", "d2"], POLICY, 0.0)}
    assert rows["d2"] == "pass" and rows["d1"] != "pass"


def test_preemption_keeps_only_nodes_whose_victims_free_a_dra_gpu() -> None:
    from extender.http.verbs import decide_preempt
    from extender.http.wire import PreemptionArgs, Victims

    state = _dra_state()
    # d1: one claim of 4 GPUs shared by a and b; d2: one claim of 4 held by c alone.
    _add(state, "resourceclaims", d.allocated(d.resource_claim("shared", count=4), "d1",
                                              ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
                                              (("a", "uid-default-a"), ("b", "uid-default-b"))))
    _add(state, "resourceclaims", d.allocated(d.resource_claim("own", count=4), "d2",
                                              ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], (("c", "uid-default-c"),)))
    for name, claim, node_name in (("a", "shared", "d1"), ("b", "shared", "d1"), ("c", "own", "d2")):
        p = pod(name, gpus=0, node_name=node_name, phase="Running")
        p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
        state.upsert_pod(parse_pod(p))
    _add(state, "resourceclaims", d.resource_claim("p-gpus-x", count=2))
    preemptor = _claim_pod("p", {"gpus": "p-gpus-x"})

    def args(victims: dict[str, list[str]]) -> PreemptionArgs:
        return PreemptionArgs(preemptor, {n: Victims([f"uid-default-{u}" for u in us], [], 0)
                                          for n, us in victims.items()}, True)

    # Evicting a alone frees nothing on d1 (b still reserves the claim): only d2 stays.
    assert set(decide_preempt(state, args({"d1": ["a"], "d2": ["c"]}))) == {"d2"}
    assert set(decide_preempt(state, args({"d1": ["a"]}))) == set()  # no eviction would help
    assert set(decide_preempt(state, args({"d1": ["a", "b"]}))) == {"d1"}
    # A victim the snapshot does not hold: kept (the snapshot may lag).
    assert set(decide_preempt(state, args({"d1": ["a", "ghost"]}))) == {"d1"}
    # A device-plugin preemptor: every candidate, as before.
    plain = PreemptionArgs(pod("q", gpus=1), {"d1": Victims(["uid-default-a"], [], 0)}, True)
    assert set(decide_preempt(state, plain)) == {"d1"}
