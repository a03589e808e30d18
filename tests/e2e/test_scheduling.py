"""The real kube-scheduler consulting flowsched: scores decide, filters exclude, reasons surface.

Telemetry comes from the test-only injection endpoint (the service runs with
--debug-telemetry-injection); everything else is the real control plane.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster.kubeapi import JSON, pod_path
from tests.cluster.scenario import Scenario

pytestmark = pytest.mark.cluster

IDLE = [0.0] * 8
BUSY = [85.0] * 8  # busy but under the 90 % saturation threshold: feasible, scored low
SATURATED = [100.0] * 8
FB = [40000.0] * 8


def _inject(s: Scenario, node: str, util: list[float]) -> None:
    s.flowsched.inject_telemetry(node, util, FB)


def _pin_cpu_hog(s: Scenario, node: str, cpu: str = "16") -> None:
    """A CPU-only pod placed directly on `node` (spec.nodeName; no scheduler involved).

    It makes kube-scheduler's own scores (LeastAllocated, BalancedAllocation) prefer the
    *other* nodes, so a pod landing on `node` shows flowsched's score outweighing them.
    """
    pod: JSON = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"hog-{node}"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/hog:0",
                                                      "resources": {"requests": {"cpu": cpu}}}]}}
    s.kube.create(f"/api/v1/namespaces/{s.ns}/pods", pod)
    s.wait_running(pod["metadata"]["name"])


def _flowsched_scores(s: Scenario, pod_name: str, nodes: list[str]) -> dict[str, int]:
    """Ask flowsched's /prioritize directly, with the body kube-scheduler sends in names mode."""
    body = {"Pod": s.pod(pod_name), "Nodes": None, "NodeNames": nodes}
    r = s.flowsched.verbs_http.post("/prioritize", json=body)
    r.raise_for_status()
    return {h["Host"]: int(h["Score"]) for h in r.json()}


def test_pod_is_bound_to_the_node_flowsched_scores_highest(scenario: Scenario) -> None:
    s = scenario
    nodes = s.add_nodes("gpu-busy-1", "gpu-idle", "gpu-busy-2")
    s.wait_snapshot(lambda snap: set(nodes) <= set(snap["nodes"]), "nodes listed")
    _pin_cpu_hog(s, "gpu-idle")
    for n in nodes:
        _inject(s, n, IDLE if n == "gpu-idle" else BUSY)

    s.create_pod("train-0", gpus=1)
    bound = s.wait_bound("train-0")

    scores = _flowsched_scores(s, "train-0", nodes)
    best = max(scores.values())
    assert [n for n, v in scores.items() if v == best] == ["gpu-idle"], scores
    assert bound == "gpu-idle", f"bound to {bound}; flowsched scores {scores}"
    # /debug/explain tells the same story as the scores and the placement (whichever verbs
    # deploy/base/scheduler-config.yaml configures: filter-ranked passed only this node).
    ex = s.flowsched.http.get("/debug/explain", params={"pod": f"{s.ns}/train-0"}).json()
    mine = [e for e in ex["nodes"] if e["node"] in nodes]
    assert {e["node"]: e["score"] for e in mine} == scores
    assert mine[0]["node"] == bound and mine[0]["filter"] == "pass", mine


def test_node_flowsched_filters_out_never_receives_a_pod(scenario: Scenario) -> None:
    s = scenario
    s.add_nodes("gpu-hot", "gpu-ok")
    s.wait_snapshot(lambda snap: {"gpu-hot", "gpu-ok"} <= set(snap["nodes"]), "nodes listed")
    _inject(s, "gpu-hot", SATURATED)
    _inject(s, "gpu-ok", [20.0] * 8)

    # Enough pods that kube-scheduler's spreading alone would put some on the emptier node.
    names = [f"w-{i}" for i in range(5)]
    for n in names:
        s.create_pod(n, gpus=1, cpu="4")
    placed = {n: s.wait_bound(n) for n in names}
    assert set(placed.values()) == {"gpu-ok"}, placed
    for n in names:
        s.wait_running(n)
    hot_pods = s.kube.get("/api/v1/pods", fieldSelector="spec.nodeName=gpu-hot")["items"]
    assert hot_pods == []


def test_pod_that_fits_nowhere_stays_pending_with_flowsched_reason(scenario: Scenario) -> None:
    s = scenario
    s.add_nodes("gpu-sat-a", "gpu-sat-b")
    s.wait_snapshot(lambda snap: {"gpu-sat-a", "gpu-sat-b"} <= set(snap["nodes"]), "nodes listed")
    _inject(s, "gpu-sat-a", SATURATED)
    _inject(s, "gpu-sat-b", SATURATED)

    s.create_pod("stuck", gpus=1)
    ev = s.wait_event("stuck", "FailedScheduling", contains="flowsched: GPUs saturated")
    assert "0/2 nodes are available" in ev["message"], ev["message"]

    # Still Pending and unbound a while later (kube-scheduler retried meanwhile).
    time.sleep(2)
    pod = s.kube.get(pod_path(s.ns, "stuck"))
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    cond = {c["type"]: c for c in pod["status"].get("conditions", [])}
    assert cond["PodScheduled"]["status"] == "False" and cond["PodScheduled"]["reason"] == "Unschedulable"
    assert "flowsched: GPUs saturated" in cond["PodScheduled"]["message"]
