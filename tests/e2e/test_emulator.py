"""The harness's own pieces against the real apiserver: fake nodes and the KubeletEmulator."""

from __future__ import annotations

import pytest

from tests.cluster.kubeapi import pod_path
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario, gpu_pod

pytestmark = pytest.mark.cluster
STRATEGIC = "application/strategic-merge-patch+json"


def _pinned(s: Scenario, name: str, node: str) -> None:
    pod = gpu_pod(name, gpus=1, cpu="1", memory="1Gi")
    pod["spec"]["nodeName"] = node  # no scheduler involved: only the emulator acts
    s.kube.create(f"/api/v1/namespaces/{s.ns}/pods", pod)


def test_fake_node_is_ready_untainted_and_offers_gpus(scenario: Scenario) -> None:
    s = scenario
    s.add_nodes("gpu-e0", gpus=4)
    node = s.kube.get("/api/v1/nodes/gpu-e0")
    assert not node["spec"].get("taints")  # TaintNodesByCondition is off, nothing else taints
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_emulator_runs_resizes_finishes_and_deletes_pods(scenario: Scenario) -> None:
    s = scenario
    s.add_nodes("gpu-e1")
    _pinned(s, "p", "gpu-e1")
    s.wait_running("p")
    st = s.pod("p")["status"]
    (cs,) = st["containerStatuses"]
    assert cs["state"]["running"] and cs["ready"] and st["startTime"]
    assert cs["allocatedResources"]["nvidia.com/gpu"] == "1"

    # In-place resize through the resize subresource, as flowsched's resizer will do it.
    s.kube.request("PATCH", pod_path(s.ns, "p") + "/resize",
                   {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}]}},
                   content_type=STRATEGIC)

    def acknowledged() -> bool:
        pod = s.pod("p")
        (c,) = pod["status"]["containerStatuses"]
        conds = {x["type"] for x in pod["status"].get("conditions", [])}
        return (c["resources"]["requests"]["cpu"] == "2" and c["allocatedResources"]["cpu"] == "2"
                and not conds & {"PodResizePending", "PodResizeInProgress"}
                and pod["status"].get("observedGeneration") == pod["metadata"]["generation"])

    wait_until(acknowledged, 10, what="the resize to be acknowledged")
    assert s.pod("p")["metadata"]["generation"] >= 2

    s.emulator.finish(s.ns, "p", succeeded=True)
    done = s.pod("p")["status"]
    assert done["phase"] == "Succeeded"
    assert done["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    _pinned(s, "q", "gpu-e1")
    s.wait_running("q")
    s.kube.delete(pod_path(s.ns, "q"))  # graceful: only a kubelet (here its emulator) completes it
    wait_until(lambda: not s.pod_exists("q"), 10, what="the terminating pod to be force-deleted")
