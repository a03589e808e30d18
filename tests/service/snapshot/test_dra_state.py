"""DRA GPUs in ClusterState's node columns (beside device-plugin GPUs), through the watch events."""

from __future__ import annotations

from typing import Any

from extender.kube import requests
from extender.snapshot.objects import GPU_PRODUCT, parse_node, parse_pod
from extender.snapshot.state import ClusterState
from extender.snapshot.watcher import apply_event
from tests.cluster import dra_objects as d
from tests.k8s_factories import node, pod

GPU = "nvidia.com/gpu"


def _event(kind: str, obj: dict[str, Any], etype: str = "ADDED") -> dict[str, Any]:
    return {"type": etype, "object": obj}


def _dra_cluster(state: ClusterState, nodes: tuple[str, ...] = ("d1", "d2")) -> None:
    for name in nodes:
        state.upsert_node(parse_node(node(name, gpus=0)))  # no device plugin: 0 nvidia.com/gpu
    apply_event(state, "deviceclasses", _event("deviceclasses", d.device_class()), GPU)
    for name in nodes:
        apply_event(state, "resourceslices", _event("resourceslices", d.gpu_slice(name)), GPU)


def test_dra_gpus_fill_the_columns_of_device_plugin_less_nodes() -> None:
    state = ClusterState()
    _dra_cluster(state)
    row = state.read().node_row("d1")
    assert row is not None and (row.gpu_alloc, row.gpu_used) == (4.0, 0.0)
    claim = d.allocated(d.resource_claim("c", count=2), "d1", ["gpu-0", "gpu-1"], (("p", "uid-p"),))
    apply_event(state, "resourceclaims", _event("resourceclaims", claim), GPU)
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_used == 2.0
    apply_event(state, "resourceclaims", _event("resourceclaims", claim, "DELETED"), GPU)
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_used == 0.0
    apply_event(state, "resourceslices", _event("resourceslices", d.gpu_slice("d1"), "DELETED"), GPU)
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_alloc == 0.0


def test_slices_before_their_node_and_a_node_recreated() -> None:
    state = ClusterState()
    apply_event(state, "resourceslices", _event("resourceslices", d.gpu_slice("d1")), GPU)
    claim = d.allocated(d.resource_claim("c"), "d1", ["gpu-0"])
    apply_event(state, "resourceclaims", _event("resourceclaims", claim), GPU)
    state.upsert_node(parse_node(node("d1", gpus=0)))
    row = state.read().node_row("d1")
    assert row is not None and (row.gpu_alloc, row.gpu_used) == (4.0, 1.0)
    state.delete_node("d1")
    state.upsert_node(parse_node(node("d1", gpus=0)))
    row = state.read().node_row("d1")
    assert row is not None and (row.gpu_alloc, row.gpu_used) == (4.0, 1.0)


def test_cordoned_dra_node_offers_nothing_and_uncordoned_again() -> None:
    state = ClusterState()
    _dra_cluster(state, ("d1",))
    state.upsert_node(parse_node(node("d1", gpus=0, unschedulable=True)))
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_alloc == 0.0
    apply_event(state, "resourceslices", _event("resourceslices", d.gpu_slice("d1", gpus=2), "MODIFIED"), GPU)
    state.upsert_node(parse_node(node("d1", gpus=0)))
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_alloc == 2.0


def test_mixed_cluster_adds_both_kinds() -> None:
    state = ClusterState()
    state.upsert_node(parse_node(node("dp", gpus=8)))
    state.upsert_pod(parse_pod(pod("a", gpus=3, node_name="dp", phase="Running")))
    _dra_cluster(state, ("d1",))
    dp, dra = state.read().node_row("dp"), state.read().node_row("d1")
    assert dp is not None and (dp.gpu_alloc, dp.gpu_used) == (8.0, 3.0)
    assert dra is not None and (dra.gpu_alloc, dra.gpu_used) == (4.0, 0.0)
    assert state.read().dra_node("dp") is None


def test_a_mapped_extended_resource_pod_counts_once() -> None:
    # KEP-5004: the pod asks nvidia.com/gpu, kube-scheduler allocates a claim for it on a DRA node.
    state = ClusterState()
    state.upsert_node(parse_node(node("d1", gpus=0)))
    apply_event(state, "deviceclasses", _event("deviceclasses", d.device_class(extended_resource=GPU)), GPU)
    apply_event(state, "resourceslices", _event("resourceslices", d.gpu_slice("d1")), GPU)
    state.upsert_pod(parse_pod(pod("p", gpus=1, node_name="d1", phase="Running")))
    claim = d.allocated(d.resource_claim("p-gpu"), "d1", ["gpu-0"], (("p", "uid-default-p"),), extended=True)
    apply_event(state, "resourceclaims", _event("resourceclaims", claim), GPU)
    row = state.read().node_row("d1")
    assert row is not None and (row.gpu_alloc, row.gpu_used) == (4.0, 1.0)


def test_relist_replaces_dra_objects_and_is_not_readiness() -> None:
    state = ClusterState()
    _dra_cluster(state)
    state.replace_all("resourceslices", [])
    assert state.read().dra_nodes() == {}
    row = state.read().node_row("d2")
    assert row is not None and row.gpu_alloc == 0.0
    assert not state.read().ready  # nodes and pods were never listed: DRA kinds alone do not make it ready
    assert state.read().describe(0.0, 60.0)["synced"]["resourceslices"] is True


def test_claim_deletion_keys_by_namespace() -> None:
    state = ClusterState()
    _dra_cluster(state, ("d1",))
    claim = d.allocated(d.resource_claim("c", "team-a"), "d1", ["gpu-0"])
    apply_event(state, "resourceclaims", _event("resourceclaims", claim), GPU)
    assert state.read().claim("team-a", "c") is not None
    apply_event(state, "resourceclaims", {"type": "DELETED", "object": {"metadata": {
        "name": "c", "namespace": "team-a"}}}, GPU)
    assert state.read().claim("team-a", "c") is None


def test_malformed_dra_objects_are_skipped() -> None:
    state = ClusterState()
    rv = apply_event(state, "resourceslices", {"type": "ADDED", "object": {
        "metadata": {"name": "s", "resourceVersion": "7"}, "spec": {"driver": "gpu.nvidia.com", "devices": 3}}}, GPU)
    assert rv == "7" and state.read().dra_nodes() == {}


def test_dra_kinds_list_and_watch_paths() -> None:
    assert requests.list_objects("resourceslices", limit=500).path == "/apis/resource.k8s.io/v1/resourceslices"
    assert requests.watch_objects("resourceclaims", "5", 60).path == "/apis/resource.k8s.io/v1/resourceclaims"
    assert requests.list_objects("deviceclasses").path == "/apis/resource.k8s.io/v1/deviceclasses"


def test_dra_watcher_on_an_apiserver_without_resource_k8s_io() -> None:
    """404: nothing to watch; what the kind held goes, and it looks again every backoff_max_s."""
    import orjson

    from extender.kube.responses import Response
    from extender.metrics import build_metrics
    from extender.snapshot.watcher import Watcher

    state = ClusterState()
    _dra_cluster(state, ("d1",))
    served = {"ok": False}

    def fetch(req: requests.Request, _timeout: float) -> Response:
        assert req.path == "/apis/resource.k8s.io/v1/resourceslices"
        if not served["ok"]:
            return Response(404, b'{"kind":"Status","code":404}')
        return Response(200, orjson.dumps({"items": [d.gpu_slice("d1", 2)], "metadata": {"resourceVersion": "9"}}))

    def no_watch(*_a: object) -> object:
        raise ConnectionError("the test lists only")

    w = Watcher("resourceslices", fetch, no_watch, state, build_metrics(), gpu_resource=GPU, resync_s=60,
                watch_timeout_s=10, backoff_max_s=30, clock=lambda: 0.0)
    w._session()
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_alloc == 0.0
    assert w.status.extra == {"absent": True} and w._retry_in == 30 and w.status.errors == 0
    served["ok"] = True  # the cluster was upgraded
    w._session()
    row = state.read().node_row("d1")
    assert row is not None and row.gpu_alloc == 2.0 and "absent" not in w.status.extra


def test_a_dra_only_node_takes_its_gpu_product_from_its_devices_and_a_label_wins() -> None:
    """The control view's node type (docs/gpu-types.md): nvidia.com/gpu.product, else the most
    common productName of the node's whole GPU devices."""
    state = ClusterState()

    def add(kind: str, obj: dict[str, Any]) -> None:
        apply_event(state, kind, {"type": "ADDED", "object": obj}, "nvidia.com/gpu")

    add("deviceclasses", d.device_class())
    state.upsert_node(parse_node(node("d", gpus=0)))
    state.upsert_node(parse_node(node("labelled", gpus=0, labels={GPU_PRODUCT: "Tesla-V100-SXM2-16GB"})))
    state.upsert_node(parse_node(node("plain", gpus=4)))
    odd = d.gpu_slice("d", 3, product="NVIDIA H100 80GB HBM3")
    odd["spec"]["devices"].append(d.gpu_device("d", 3, product="NVIDIA A100-SXM4-80GB"))
    add("resourceslices", odd)
    add("resourceslices", d.gpu_slice("labelled", 2, product="NVIDIA A100-SXM4-80GB"))
    state.mark_synced()
    _, nodes, _ = state.read().control_view()
    assert {n.name: n.gpu_product for n in nodes} == {
        "d": "NVIDIA H100 80GB HBM3", "labelled": "Tesla-V100-SXM2-16GB", "plain": ""}
