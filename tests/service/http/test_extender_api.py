"""The extender's HTTP verbs against kube-scheduler's extender/v1 shapes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.http.app import build_app
from extender.metrics import build_metrics
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from tests.k8s_factories import node, pod

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
NOW = 1_000_000.0
LOOPBACK = ("127.0.0.1", 50000)


@pytest.fixture
def state() -> ClusterState:
    s = ClusterState()
    for name, gpus in [("n0", 4), ("n1", 4), ("n2", 8), ("n3", 2)]:
        s.upsert_node(parse_node(node(name, gpus=gpus)))
    s.upsert_pod(parse_pod(pod("busy", gpus=3, node_name="n1", phase="Running")))
    s.upsert_pod(parse_pod(pod("full", gpus=2, node_name="n3", phase="Running")))
    s.mark_synced()
    return s


@pytest.fixture
def client(state: ClusterState) -> TestClient:
    settings = Settings(kube=False, max_body_bytes=64 * 1024, debug_telemetry_injection=True)
    # A loopback peer: /debug/* answers only there (debug_access="loopback").
    return TestClient(build_app(settings, state, build_metrics(), clock=lambda: NOW), client=LOOPBACK)


def args_names(p: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def args_full(p: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def check_filter_shape(reply: dict[str, Any], sent: list[str]) -> list[str]:
    assert set(reply) == FILTER_KEYS
    assert reply["Error"] == ""
    if reply["NodeNames"] is not None:
        assert reply["Nodes"] is None
        names = reply["NodeNames"]
    else:
        names = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
    assert set(names) <= set(sent)
    assert not set(names) & set(reply["FailedNodes"]) and not set(names) & set(reply["FailedAndUnresolvableNodes"])
    return list(names)


def test_filter_names_mode(client: TestClient) -> None:
    sent = ["n0", "n1", "n2", "n3"]
    r = client.post("/filter", json=args_names(pod("p", gpus=2), sent))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    passed = check_filter_shape(r.json(), sent)
    assert passed == ["n0", "n2"]
    assert r.json()["FailedNodes"] == {n: "flowsched: insufficient nvidia.com/gpu" for n in ("n1", "n3")}


def test_nominated_node_counts_its_terminating_victims_gpus_as_free(client: TestClient, state: ClusterState) -> None:
    """After preempting on n3, kube-scheduler retries the pod as soon as its cache drops the
    victim, often before flowsched's watch has; the victim, terminating in flowsched's view, no
    longer holds n3's GPUs for the pod nominated there, and for no other pod."""
    victim = pod("full", gpus=2, node_name="n3", phase="Running")
    victim["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state.upsert_pod(parse_pod(victim))
    for path in ("/filter", "/filter-ranked"):
        urgent = pod("urgent", gpus=2)
        r = client.post(path, json=args_names(urgent, ["n1", "n3"]))
        assert r.json()["NodeNames"] in (None, []) and "n3" in r.json()["FailedNodes"]  # not nominated: still held
        urgent["status"]["nominatedNodeName"] = "n3"
        r = client.post(path, json=args_names(urgent, ["n1", "n3"]))
        assert r.json()["NodeNames"] == ["n3"], (path, r.json())
        failed = {"n1": "flowsched: insufficient nvidia.com/gpu"} if path == "/filter" else {}
        assert r.json()["FailedNodes"] == failed
        urgent["status"]["nominatedNodeName"] = "n1"  # n1's pod is not terminating: nothing released
        r = client.post(path, json=args_names(urgent, ["n1", "n3"]))
        assert r.json()["NodeNames"] in (None, [])


def test_filter_full_node_mode_returns_the_sent_objects(client: TestClient) -> None:
    objs = [node(n) for n in ("n0", "n1", "n2")]
    objs[0]["metadata"]["annotations"] = {"kept": "verbatim"}
    r = client.post("/filter", json=args_full(pod("p", gpus=2), objs))
    body = r.json()
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["n0", "n2"]
    assert body["Nodes"]["items"][0] == objs[0]
    check_filter_shape(body, ["n0", "n1", "n2"])


def test_any_casing_accepted(client: TestClient) -> None:
    r = client.post("/filter", json={"pod": pod("p", gpus=1), "nodenames": ["n0", "n3"]})
    assert r.json()["NodeNames"] == ["n0"]


def test_empty_and_single_node_and_no_gpu(client: TestClient) -> None:
    r = client.post("/filter", json=args_names(pod("p"), []))
    assert check_filter_shape(r.json(), []) == []
    r = client.post("/prioritize", json=args_names(pod("p"), []))
    assert r.json() == []
    r = client.post("/filter", json=args_names(pod("p", gpus=1), ["n2"]))
    assert r.json()["NodeNames"] == ["n2"]
    r = client.post("/filter", json=args_names(pod("cpu-only", gpus=0), ["n1", "n3"]))
    assert r.json()["NodeNames"] == ["n1", "n3"]  # no GPU request: GPU rules do not apply
    r = client.post("/prioritize", json=args_names(pod("cpu-only", gpus=0), ["n1", "n3"]))
    assert all(0 <= h["Score"] <= 10 for h in r.json())


def test_prioritize_shape_and_packing(client: TestClient, state: ClusterState) -> None:
    sent = ["n0", "n1", "n2", "n3", "ghost"]
    r = client.post("/prioritize", json=args_names(pod("p", gpus=1), sent))
    body = r.json()
    assert [h["Host"] for h in body] == sent
    assert all(set(h) == {"Host", "Score"} and isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in body)
    scores = {h["Host"]: h["Score"] for h in body}
    assert scores["ghost"] == 5  # unknown node: neutral
    assert scores["n1"] > scores["n0"]  # best fit: the node with 1 GPU left is the tightest fit


def test_idle_gpus_beat_busy_ones(client: TestClient) -> None:
    client.post("/debug/telemetry", json={"node": "n0", "gpu_util": [99, 97, 98, 99]})
    client.post("/debug/telemetry", json={"node": "n2", "gpu_util": [3, 1, 0, 2, 5, 4, 0, 1]})
    r = client.post("/prioritize", json=args_names(pod("p", gpus=1), ["n0", "n2"]))
    scores = {h["Host"]: h["Score"] for h in r.json()}
    assert scores["n2"] > scores["n0"]
    f = client.post("/filter", json=args_names(pod("p", gpus=1), ["n0", "n2"])).json()
    assert f["NodeNames"] == ["n2"]
    assert f["FailedAndUnresolvableNodes"] == {"n0": "flowsched: GPUs saturated"}


@pytest.mark.parametrize("payload", [
    b'{"node": "n0", "gpu_util": ["abc"]}',
    b'{"node": "n0", "gpu_util": ["inf", "inf", "inf", "inf"]}',
    b'{"node": "n0", "gpu_util": [[1]]}',
    b'{"node": "n0", "gpu_util": [true]}',
    b'{"node": "n0", "gpu_util": [1], "fb_free_mib": "abc"}',
    b'{"node": "n0", "gpu_util": [1], "fb_free_mib": ["abc"]}',
    b'{"node": "n0", "gpu_util": [1], "fb_free_mib": [-1]}',
    b'{"node": "n0", "gpu_util": [-500, 1]}',
    b'{"node": "n0", "gpu_util": [1e308]}',
    b'{"node": "n0", "gpu_util": [100.5]}',
    b'{"node": "n0", "gpu_util": [1e400, 1e400, 1e400, 1e400]}',
    b'{"node": "n0", "gpu_util": [Infinity, 1, 1, 1]}',
    b'{"node": "n0", "gpu_util": [NaN, 1, 1, 1]}',
    b'{"node": "n0", "gpu_util": [100000000000000000000000000000000000000000000000000' + b"0" * 400 + b"]}",
])
def test_debug_telemetry_rejects_anything_but_finite_in_range_numbers_or_null(
        client: TestClient, payload: bytes) -> None:
    # Strings and nested lists were a 500 (float(v)); inf was stored and read as "no sample", so a
    # node injected as [inf]*4 passed a filter that [95]*4 fails as saturated.
    r = client.post("/debug/telemetry", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(("gpu_util", "fb_free_mib", "malformed")), r.text
    f = client.post("/filter", json=args_names(pod("p", gpus=1), ["n0"])).json()
    assert f["NodeNames"] == ["n0"]  # nothing was stored
    ok = client.post("/debug/telemetry", json={"node": "n0", "gpu_util": [None, 0, 100, 50.5],
                                               "fb_free_mib": [None, 0, 1e6, 10]})
    assert ok.status_code == 200, ok.text


def test_one_idle_gpu_among_saturated_ones_takes_a_one_gpu_pod(client: TestClient) -> None:
    client.post("/debug/telemetry", json={"node": "n0", "gpu_util": [99, 99, 99, 2]})
    f = client.post("/filter", json=args_names(pod("p", gpus=1), ["n0"])).json()
    assert f["NodeNames"] == ["n0"]
    f = client.post("/filter", json=args_names(pod("p", gpus=2), ["n0"])).json()
    assert f["NodeNames"] == []


def victims_meta(uids: list[str], pdb: int = 0) -> dict[str, Any]:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}


def test_preempt_prefers_checkpointable_victims(client: TestClient, state: ClusterState) -> None:
    state.upsert_pod(parse_pod(pod("ck", gpus=4, node_name="n0", phase="Running", uid="u-ck",
                                   annotations={"flowsched.io/checkpointable": "true"})))
    state.upsert_pod(parse_pod(pod("hard", gpus=8, node_name="n2", phase="Running", uid="u-hard")))
    body = {"Pod": pod("vip", gpus=4, priority=1000),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {"n0": victims_meta(["u-ck"]), "n2": victims_meta(["u-hard"])}}
    r = client.post("/preempt", json=body)
    assert r.status_code == 200
    assert r.json() == {"NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "u-ck"}], "NumPDBViolations": 0}}}


def test_preempt_full_form_and_pdb(client: TestClient, state: ClusterState) -> None:
    state.upsert_pod(parse_pod(pod("a", gpus=4, node_name="n0", phase="Running", uid="u-a",
                                   annotations={"flowsched.io/checkpointable": "true"})))
    state.upsert_pod(parse_pod(pod("b", gpus=4, node_name="n2", phase="Running", uid="u-b",
                                   annotations={"flowsched.io/checkpointable": "true"})))
    full = {"n0": {"Pods": [pod("a", uid="u-a")], "NumPDBViolations": 1},
            "n2": {"Pods": [pod("b", uid="u-b")], "NumPDBViolations": 0}}
    r = client.post("/preempt", json={"Pod": pod("vip", gpus=4), "NodeNameToVictims": full})
    reply = r.json()["NodeNameToMetaVictims"]
    assert reply == {"n2": {"Pods": [{"UID": "u-b"}], "NumPDBViolations": 0}}  # the PDB-violating node dropped


def test_preempt_never_adds_victims(client: TestClient) -> None:
    offered = {"n0": victims_meta(["x1", "x2"]), "n1": victims_meta(["y1"], pdb=2), "zz": victims_meta([])}
    reply = client.post("/preempt", json={"Pod": pod("vip"), "NodeNameToMetaVictims": offered}).json()
    for n, v in reply["NodeNameToMetaVictims"].items():
        assert n in offered
        assert {p["UID"] for p in v["Pods"]} <= {p["UID"] for p in offered[n]["Pods"]}
    assert reply["NodeNameToMetaVictims"]  # something is always kept
    empty = client.post("/preempt", json={"Pod": pod("vip"), "NodeNameToMetaVictims": {}}).json()
    assert empty == {"NodeNameToMetaVictims": {}}


@pytest.mark.parametrize(("payload", "field"), [
    (b"{not json", "malformed JSON"),
    (b"[]", "ExtenderArgs"),
    (orjson.dumps({"NodeNames": ["n0"]}), "Pod"),
    (orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": []}), "Pod.metadata.name"),
    (orjson.dumps({"Pod": pod("p"), "NodeNames": "n0"}), "NodeNames"),
    (orjson.dumps({"Pod": pod("p"), "Nodes": {"items": [{"metadata": {}}]}}), "Nodes.items[0].metadata.name"),
])
def test_bad_input_is_400_naming_the_field(client: TestClient, payload: bytes, field: str) -> None:
    for verb in ("/filter", "/prioritize"):
        r = client.post(verb, content=payload, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert field in r.json()["error"]


def test_bad_quantity_in_pod_is_400(client: TestClient) -> None:
    p = pod("p")
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "lots"
    r = client.post("/filter", json=args_names(p, ["n0"]))
    assert r.status_code == 400 and "Pod" in r.json()["error"]


@pytest.mark.parametrize(("resource", "value"), [("nvidia.com/gpu", "-4"), ("cpu", "-1000"), ("memory", "-1Gi")])
def test_negative_quantity_in_pod_is_400(client: TestClient, resource: str, value: str) -> None:
    # A "-4" GPU limit skipped the GPU filter (as for a CPU-only pod): n3, with no free GPU, passed.
    p = pod("p", gpus=4)
    res = p["spec"]["containers"][0]["resources"]
    res["limits"][resource] = value
    if resource in res["requests"]:  # a request, when there is one, is what counts
        res["requests"][resource] = value
    for verb in ("/filter", "/prioritize"):
        r = client.post(verb, json=args_names(p, ["n0", "n1", "n3"]))
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith("Pod: negative quantity"), r.text


def test_bad_preempt_input_is_400(client: TestClient) -> None:
    r = client.post("/preempt", json={"Pod": pod("p"), "NodeNameToMetaVictims": {"n0": {"Pods": [{"uid": 5}]}}})
    assert r.status_code == 400 and "NodeNameToMetaVictims[n0].Pods[0].UID" in r.json()["error"]


def test_wrong_typed_labels_are_400_not_a_fail_open_fallback(client: TestClient) -> None:
    # Labels were read outside ask_of's checks: AttributeError, answered as flowsched's own bug
    # (traceback, code="fallback"), and /filter failed open: an 8-GPU pod passed n3 (2 GPUs, in use).
    for meta in ({"name": "x", "labels": ["a"]}, {"name": "x", "labels": "a"}, {"name": "x", "annotations": ["a"]}):
        p = {**pod("x", gpus=8), "metadata": meta}
        for verb in ("/filter", "/prioritize"):
            r = client.post(verb, json=args_names(p, ["n0", "n3"]))
            assert r.status_code == 400, (verb, meta, r.text)
            assert r.json()["error"].startswith("Pod:") and "labels" in r.json()["error"]
    fallbacks = [line for line in client.get("/metrics").text.splitlines()
                 if 'code="fallback"' in line and not line.startswith("#")]
    assert all(line.endswith(" 0.0") for line in fallbacks), fallbacks  # not counted as our own bug


@pytest.mark.parametrize("pdb", [2**63, -1])
def test_preempt_pdb_count_beyond_int64_or_negative_is_400(client: TestClient, pdb: int) -> None:
    r = client.post("/preempt", json={"Pod": pod("p"), "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "uid-default-busy"}], "NumPDBViolations": pdb}}})
    assert r.status_code == 400, r.text
    assert "NodeNameToMetaVictims[n1].NumPDBViolations" in r.json()["error"]
    ok = client.post("/preempt", json={"Pod": pod("p"), "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "uid-default-busy"}], "NumPDBViolations": 2**63 - 1}}})
    assert ok.status_code == 200, ok.text


def test_job_key_ignores_junk_owner_references() -> None:
    from extender.snapshot.objects import job_key

    for refs in (["x"], {"controller": True}, [None, 3], "abc", 3, True):
        assert job_key({"name": "p", "namespace": "a", "ownerReferences": refs}) == "a/p"


def test_a_number_for_owner_references_is_no_fallback(client: TestClient, state: ClusterState) -> None:
    # controller_kind iterated it (TypeError: a flowsched bug, so /filter failed open and passed
    # an 8-GPU pod on a full node); it is ignored like any other junk there.
    p = pod("p", gpus=8)
    p["metadata"]["ownerReferences"] = 3
    r = client.post("/filter", content=orjson.dumps(args_names(p, ["n0"])),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200
    body = r.json()
    assert body["NodeNames"] == [] and "n0" in body["FailedNodes"]


def test_oversized_body_is_413(client: TestClient) -> None:
    big = orjson.dumps(args_names(pod("p"), [f"node-{i:06d}" for i in range(20000)]))
    r = client.post("/filter", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_health_ready_metrics_debug(client: TestClient, state: ClusterState) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    state.mark_synced(("pods",), synced=False)
    assert client.get("/readyz").status_code == 503
    client.post("/filter", json=args_names(pod("p", gpus=1), ["n0", "ghost"]))
    text = client.get("/metrics").text
    assert 'flowsched_unknown_nodes_total{verb="filter"} 1.0' in text
    snap = client.get("/debug/snapshot").json()
    assert snap["nodes"]["n1"]["gpu_used"] == 3 and snap["nodes"]["n1"]["telemetry"] == "unknown"
    state.upsert_pod(parse_pod(pod("waiting", gpus=2)))
    ex = client.get("/debug/explain", params={"pod": "default/waiting"}).json()
    verdicts = {d["node"]: d["filter"] for d in ex["nodes"]}
    assert verdicts["n0"] == "pass" and verdicts["n3"] == "flowsched: insufficient nvidia.com/gpu"
    assert client.get("/debug/explain", params={"pod": "nope"}).status_code == 400
    assert client.get("/debug/explain", params={"pod": "default/missing"}).status_code == 404


def test_url_prefix(state: ClusterState) -> None:
    app = build_app(Settings(kube=False, url_prefix="scheduler/"), state, build_metrics(), clock=lambda: NOW)
    c = TestClient(app)
    assert c.post("/scheduler/filter", json=args_names(pod("p"), ["n0"])).status_code == 200
    assert c.post("/filter", json=args_names(pod("p"), ["n0"])).status_code == 404
