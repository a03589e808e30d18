"""The admission loop on the real control plane: pods created with the scheduling gate
flowsched.io/admission are invisible to the real kube-scheduler until a `flowsched serve
--controllers admission --act` removes the gate; it releases a job's pods together, only when all
of them fit (on a cluster of two GPU types, on the nodes of the type the job may bind to), in
least-attained-service order, and keeps nothing about a job that is deleted.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService, acting_loop_config
from tests.cluster.kubeapi import JSON, Kube, KubeError, pod_path, pods_path
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario, gpu_pod

pytestmark = pytest.mark.cluster

GATE = "flowsched.io/admission"
JOB = "flowsched.io/job"


@pytest.fixture(scope="module")
def admission_flowsched(control_plane: ControlPlane, deploy_rbac: None) -> Iterator[FlowschedService]:
    workdir = control_plane.workdir / "flowsched-admission"
    cfg = acting_loop_config(workdir, "admission", {"interval_s": 0.5})
    svc = FlowschedService(workdir, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(cfg)])
    svc.start()
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def ad(kube: Kube, emulator: KubeletEmulator, admission_flowsched: FlowschedService,
       scheduler: Any) -> Iterator[Scenario]:
    with Scenario(kube, emulator, admission_flowsched) as s:
        yield s


def gated_pod(s: Scenario, name: str, job: str, gpus: int = 1, annotations: dict[str, str] | None = None) -> JSON:
    body = gpu_pod(name, gpus=gpus, labels={JOB: job}, annotations=annotations)
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    return s.kube.create(pods_path(s.ns), body)


def gates(s: Scenario, name: str) -> list[str]:
    return [g["name"] for g in s.pod(name)["spec"].get("schedulingGates") or []]


def admission_view(s: Scenario) -> dict[str, Any]:
    r = s.flowsched.http.get("/debug/admission")
    r.raise_for_status()
    out: dict[str, Any] = r.json()["controller"]["last_plan"]
    return out


def blocker(s: Scenario, name: str, node: str, gpus: int) -> None:
    body = gpu_pod(name, gpus=gpus, labels={JOB: name})
    body["spec"]["nodeName"] = node
    s.kube.create(pods_path(s.ns), body)
    s.wait_running(name)


def test_a_gated_gang_is_released_only_when_all_its_pods_fit(ad: Scenario) -> None:
    s = ad
    s.add_nodes("ad-a1", gpus=4)
    s.add_nodes("ad-a2", gpus=2)
    blocker(s, "blocker", "ad-a1", 4)
    for i in range(4):
        gated_pod(s, f"gang-{i}", "gang")
    job = f"{s.ns}/gang"
    wait_until(lambda: any(q["job"] == job for q in admission_view(s).get("queue", [])), 15, interval_s=0.2,
               what="the admission loop seeing the gated gang")
    time.sleep(2.0)  # four intervals: 2 GPUs free, 4 needed -> still gated, nothing bound
    assert all(gates(s, f"gang-{i}") == [GATE] and s.node_of(f"gang-{i}") is None for i in range(4))
    decision = next(q["decision"] for q in admission_view(s)["queue"] if q["job"] == job)
    assert decision.startswith("waits"), decision
    s.emulator.finish(s.ns, "blocker")  # 4 GPUs on ad-a1 free up
    nodes = [s.wait_bound(f"gang-{i}", 30) for i in range(4)]
    assert set(nodes) <= {"ad-a1", "ad-a2"}
    events = [e for e in s.events("gang-0") if e.get("reason") == "FlowschedAdmitted"]
    assert events and "all 4 pod(s)" in events[0]["message"]


def test_the_job_with_less_attained_service_goes_first(ad: Scenario) -> None:
    s = ad
    s.add_nodes("ad-b1", gpus=4)
    blocker(s, "blocker", "ad-b1", 4)
    # "long" ran before (its eviction mark says 20 GPU-hours attained) and waits longer than "short".
    mark = json.dumps({"from": "elsewhere", "at": time.time() - 3600, "count": 1, "attained": 20 * 3600.0})
    gated_pod(s, "long-0", "long", gpus=4, annotations={"flowsched.io/migration": mark})
    time.sleep(1.0)
    gated_pod(s, "short-0", "short", gpus=4)
    wait_until(lambda: len(admission_view(s).get("queue", [])) >= 2, 15, interval_s=0.2,
               what="both jobs in the admission queue")
    order = [q["job"] for q in admission_view(s)["queue"]]
    assert order.index(f"{s.ns}/short") < order.index(f"{s.ns}/long"), order
    s.emulator.finish(s.ns, "blocker")
    assert s.wait_bound("short-0", 30) == "ad-b1"
    time.sleep(1.5)
    assert gates(s, "long-0") == [GATE] and s.node_of("long-0") is None  # the served job waits its turn


def test_a_deleted_gated_job_leaves_no_state(ad: Scenario) -> None:
    s = ad
    s.add_nodes("ad-c1", gpus=1)
    blocker(s, "blocker", "ad-c1", 1)
    gated_pod(s, "gone-0", "gone", gpus=1)
    job = f"{s.ns}/gone"
    wait_until(lambda: any(q["job"] == job for q in admission_view(s).get("queue", [])), 15, interval_s=0.2,
               what="the gated job queued")
    with contextlib.suppress(KubeError):
        s.kube.delete(pod_path(s.ns, "gone-0"), grace_period_s=0)
    wait_until(lambda: not any(q["job"] == job for q in admission_view(s).get("queue", [])), 15, interval_s=0.2,
               what="the deleted job gone from the admission queue")
    snap = s.flowsched.snapshot()
    assert job not in snap["jobs"] and f"{s.ns}/gone-0" not in snap["pods"]
    control = s.flowsched.http.get("/debug/admission").json()
    assert job not in json.dumps(control.get("backoff", {}))


def test_on_two_gpu_types_a_gang_is_released_only_where_its_type_has_room(ad: Scenario) -> None:
    """A vision gang waits gated while only a K80 is free (0.15 of its V100 speed: the extender's
    filter would keep it off it, so released by count it would wait in kube-scheduler's queue);
    a recommendation job, fastest on the K80, is released there meanwhile; the vision gang goes
    once the V100 frees."""
    s = ad
    product = "nvidia.com/gpu.product"
    s.add_nodes("ad-v1", gpus=4, labels={product: "Tesla-V100-SXM2-16GB"})
    s.add_nodes("ad-k1", gpus=4, labels={product: "Tesla-K80"})
    blocker(s, "blocker", "ad-v1", 4)
    gated_pod(s, "vis-0", "vis", gpus=4, annotations={"flowsched.io/model-class": "vision"})
    job = f"{s.ns}/vis"
    wait_until(lambda: any(q["job"] == job for q in admission_view(s).get("queue", [])), 15, interval_s=0.2,
               what="the admission loop seeing the gated vision gang")
    time.sleep(2.0)  # four intervals: 4 GPUs free by count, none of its type
    assert gates(s, "vis-0") == [GATE] and s.node_of("vis-0") is None
    decision = next(q["decision"] for q in admission_view(s)["queue"] if q["job"] == job)
    assert decision.startswith("waits"), decision
    gated_pod(s, "rec-0", "rec", gpus=4, annotations={"flowsched.io/model-class": "recommendation"})
    assert s.wait_bound("rec-0", 30) == "ad-k1"
    assert gates(s, "vis-0") == [GATE]
    s.emulator.finish(s.ns, "blocker")  # the V100 frees
    assert s.wait_bound("vis-0", 30) == "ad-v1"
