"""flowsched's list+watch against the real apiserver: changes show within a second; 410 relists.

This module restarts kube-apiserver in its last test, so it is named to run last.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.kubeapi import node_path, pod_path, pods_path
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario, gpu_pod

pytestmark = pytest.mark.cluster

WITHIN_S = 1.0
UNSCHEDULED = "e2e-no-such-scheduler"  # no scheduler serves it: the test binds the pod itself


def _timed(s: Scenario, pred: Any, what: str, lags: dict[str, float]) -> dict[str, Any]:
    t0 = time.monotonic()
    snap = s.wait_snapshot(pred, what, timeout_s=WITHIN_S)
    lags[what] = time.monotonic() - t0
    return snap


def test_snapshot_follows_the_apiserver_within_a_second(scenario: Scenario) -> None:
    s = scenario
    key = f"{s.ns}/solo"
    lags: dict[str, float] = {}

    s.add_nodes("gpu-w1", gpus=4)
    _timed(s, lambda snap: snap["nodes"].get("gpu-w1", {}).get("gpu_alloc") == 4, "node created", lags)

    s.kube.create(pods_path(s.ns), gpu_pod("solo", gpus=2, scheduler=UNSCHEDULED))
    _timed(s, lambda snap: key in snap["pods"] and snap["pods"][key]["node"] is None, "pod created", lags)

    s.kube.create(pod_path(s.ns, "solo") + "/binding",
                  {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "solo"},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-w1"}})
    _timed(s, lambda snap: snap["pods"].get(key, {}).get("node") == "gpu-w1"
           and snap["nodes"]["gpu-w1"]["gpu_used"] == 2, "pod bound", lags)

    s.kube.merge_patch(pod_path(s.ns, "solo"), {"metadata": {"labels": {"flowsched.io/job": "resnet"}}})
    _timed(s, lambda snap: snap["pods"].get(key, {}).get("job") == f"{s.ns}/resnet", "pod relabelled", lags)

    s.kube.merge_patch(node_path("gpu-w1"), {"spec": {"unschedulable": True}})
    _timed(s, lambda snap: snap["nodes"]["gpu-w1"]["gpu_alloc"] == 0, "node cordoned", lags)

    s.kube.delete(pod_path(s.ns, "solo"), grace_period_s=0)
    _timed(s, lambda snap: key not in snap["pods"] and snap["nodes"]["gpu-w1"]["gpu_used"] == 0, "pod deleted", lags)

    s.kube.delete(node_path("gpu-w1"))
    _timed(s, lambda snap: "gpu-w1" not in snap["nodes"], "node deleted", lags)
    print("snapshot lag (s):", {k: round(v, 3) for k, v in lags.items()})


def test_node_relabel_shows_in_the_snapshot(scenario: Scenario) -> None:
    s = scenario
    s.add_nodes("gpu-l1")
    s.wait_snapshot(lambda snap: "gpu-l1" in snap["nodes"], "node listed")
    assert "labels" in s.flowsched.snapshot()["nodes"]["gpu-l1"], \
        "/debug/snapshot shows no node labels (extender/snapshot/state.py ClusterState.describe)"
    s.kube.merge_patch(node_path("gpu-l1"), {"metadata": {"labels": {"e2e.flowsched.io/pool": "a100"}}})
    s.wait_snapshot(lambda snap: snap["nodes"]["gpu-l1"]["labels"].get("e2e.flowsched.io/pool") == "a100",
                    "node relabelled", WITHIN_S)
    s.kube.merge_patch(node_path("gpu-l1"), {"metadata": {"labels": {"e2e.flowsched.io/pool": None}}})
    s.wait_snapshot(lambda snap: "e2e.flowsched.io/pool" not in snap["nodes"]["gpu-l1"]["labels"],
                    "node label removed", WITHIN_S)


def _expired(s: Scenario) -> dict[str, float]:
    out = {"nodes": 0.0, "pods": 0.0}
    for line in s.flowsched.http.get("/metrics").text.splitlines():
        if line.startswith("flowsched_watch_restarts_total{") and 'why="expired"' in line:
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = out.get(kind, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_expired_watch_is_recovered_by_relisting(scenario: Scenario, control_plane: ControlPlane) -> None:
    """Force 410 Gone deterministically, then check flowsched relisted and still follows changes.

    While kube-apiserver is down, etcd's revision is advanced past everything flowsched has
    seen and compacted. The restarted apiserver's watch cache starts at the new revision, so
    flowsched's reconnecting watches (from their old resourceVersions) get 410 Gone.
    """
    s = scenario
    s.add_nodes("gpu-old")
    s.wait_snapshot(lambda snap: "gpu-old" in snap["nodes"], "node listed")
    watch0 = s.flowsched.snapshot()["status"]["watch"]
    expired0 = _expired(s)

    compacted: list[int] = []
    t0 = time.monotonic()
    control_plane.restart_apiserver(between=lambda: compacted.append(control_plane.etcd_bump_and_compact()))
    assert compacted

    def relisted() -> bool:
        w = s.flowsched.snapshot()["status"]["watch"]
        return all(w[k]["relists"] > watch0[k]["relists"] for k in ("nodes", "pods"))

    t1 = time.monotonic()
    wait_until(relisted, 60, interval_s=0.1, what="flowsched to relist nodes and pods")
    print(f"apiserver restart {t1 - t0:.1f}s, flowsched relisted {time.monotonic() - t1:.1f}s later")
    expired = _expired(s)
    assert all(expired[k] > expired0[k] for k in ("nodes", "pods")), (expired0, expired)

    # The new watch is live: changes still arrive within a second.
    s.add_nodes("gpu-new")
    s.wait_snapshot(lambda snap: {"gpu-old", "gpu-new"} <= set(snap["nodes"]), "node after relist", WITHIN_S)
    # kube-scheduler went through the same restart (and 410) and still schedules. (Its informers
    # may lag behind flowsched's here: it once bound a pod to a node deleted a moment earlier, so
    # no node is deleted before this check.)
    s.create_pod("post-restart", gpus=1)
    assert s.wait_bound("post-restart", timeout_s=30) in ("gpu-old", "gpu-new")
    s.wait_running("post-restart")
    s.kube.delete(pod_path(s.ns, "post-restart"), grace_period_s=0)
    s.kube.delete(node_path("gpu-old"))
    s.wait_snapshot(lambda snap: "gpu-old" not in snap["nodes"] and f"{s.ns}/post-restart" not in snap["pods"],
                    "pod and node deleted after relist", WITHIN_S)
