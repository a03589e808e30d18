"""flowsched started while kube-apiserver is down: it serves, says it is not ready, answers
neutrally, and catches up when the apiserver returns (issue: flowsched's own troubles never
block kube-scheduler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.fake_nodes import create_gpu_nodes
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import Kube, node_path
from tests.cluster.procs import wait_until

pytestmark = pytest.mark.cluster

NODE = "outage-gpu-0"


def _filter_body() -> dict[str, Any]:
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u-outage", "resourceVersion": "1"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    return {"Pod": pod, "Nodes": None, "NodeNames": [NODE]}


def test_starts_and_answers_without_the_apiserver_then_catches_up(
        control_plane: ControlPlane, kube: Kube, deploy_rbac: None, tmp_path: Path) -> None:
    create_gpu_nodes(kube, [NODE], gpus=4)
    svc = FlowschedService(tmp_path, control_plane.kubeconfigs["flowsched"])
    seen: dict[str, Any] = {}

    def while_the_apiserver_is_down() -> None:
        svc.start(ready_timeout_s=30, wait_ready=False)
        seen["readyz"] = svc.http.get("/readyz").status_code
        r = svc.verbs_http.post("/filter", json=_filter_body())
        seen["filter"] = (r.status_code, r.json())
        r = svc.verbs_http.post("/prioritize", json=_filter_body())
        seen["prioritize"] = (r.status_code, r.json())

    try:
        control_plane.restart_apiserver(between=while_the_apiserver_is_down)
        assert seen["readyz"] == 503  # not ready: it has never listed the cluster
        status, reply = seen["filter"]
        assert status == 200 and reply["NodeNames"] == [NODE] and reply["Error"] == ""  # unknown node passes
        assert seen["prioritize"] == (200, [{"Host": NODE, "Score": 5}])  # and is neutral
        wait_until(lambda: svc.http.get("/readyz").status_code == 200, 60, interval_s=0.2,
                   what="flowsched ready once the apiserver is back")
        snap = svc.snapshot()
        assert snap["nodes"][NODE]["gpu_alloc"] == 4
    finally:
        svc.close()
        kube.delete(node_path(NODE))
