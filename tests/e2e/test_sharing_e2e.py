"""Shared GPUs, workload classes and idle GPUs on the real control plane.

Real kube-apiserver and kube-scheduler (deploy/base/scheduler-config.yaml, filter-ranked), a real
Prometheus scraping emulated dcgm-exporters (one per fake node, per *physical* GPU, with the
pod mapping dcgm-exporter adds), and a `flowsched serve` process of this module reading that
Prometheus and running the idle loop for real (`controllers: [idle]`, not dry run, its own
Lease). Nodes are fake (no kubelet; tests/cluster/kubelet_emulator.py plays the pods' phases,
and force-deletes a pod once it is evicted). No kube-controller-manager runs, so the test plays
the controllers' part: it creates the Deployment/ReplicaSet and StatefulSet objects and the
pods they own, as those controllers would.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService, acting_loop_config, own_flowsched
from tests.cluster.kubeapi import JSON, Kube, pods_path
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario, gpu_pod
from tests.prometheus_harness import PrometheusServer, scraping

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

TS_A, TS_B, NB = "ts-busy", "ts-idle", "nb-node"
PHYSICAL = {TS_A: 2, TS_B: 2, NB: 2}  # physical GPUs per emulated exporter
REPLICAS = 4
TIME_SLICED = {"nvidia.com/gpu.replicas": str(REPLICAS), "nvidia.com/gpu.count": "2",
               "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
RECLAIM = "flowsched.io/reclaim-idle"
IDLE = {"interval_s": 0.5, "threshold_pct": 5.0, "window_s": 2.0, "warning_s": 2.0,
        "max_per_interval": 1, "max_per_hour": 100}


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, DcgmExporterEmulator]]:
    ems = {n: DcgmExporterEmulator(n, gpus=g).serve() for n, g in PHYSICAL.items()}
    yield ems
    for em in ems.values():
        em.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, exporters: dict[str, DcgmExporterEmulator]
               ) -> Iterator[PrometheusServer]:
    with scraping(tmp_path_factory.mktemp("prom-sharing"), [em.address for em in exporters.values()]) as server:
        yield server


@pytest.fixture(scope="module")
def sharing_flowsched(control_plane: ControlPlane, deploy_rbac: None, flowsched: FlowschedService,
                      scheduler: Path, prometheus: PrometheusServer) -> Iterator[FlowschedService]:
    workdir = control_plane.workdir / "flowsched-sharing"
    cfg = acting_loop_config(workdir, "idle", IDLE, extra={
        "telemetry_stale_s": 10.0,
        "telemetry": {"source": "prometheus", "prometheus_url": prometheus.url, "node_label": "Hostname",
                      "refresh_s": 0.5, "range_s": 3.0, "query_timeout_s": 1.0},
    })
    with own_flowsched(control_plane, cfg, back_to=flowsched) as svc:
        yield svc


@pytest.fixture
def sscenario(kube: Kube, emulator: KubeletEmulator, sharing_flowsched: FlowschedService,
              exporters: dict[str, DcgmExporterEmulator]) -> Iterator[Scenario]:
    s = Scenario(kube, emulator, sharing_flowsched)
    try:
        yield s
    finally:
        for em in exporters.values():
            for g in em.gpus:
                if g.pod is not None:
                    em.stop_pod(*g.pod[:2])
                em.set_gpu(g.index, 0.0, 0.0)
        s.cleanup()


def _util_is(snap: dict[str, Any], expect: dict[str, list[float]]) -> bool:
    nodes = snap["nodes"]
    return all(n in nodes and nodes[n]["telemetry"] == "fresh" and nodes[n]["gpu_util"][:len(v)] == v
               for n, v in expect.items())


def _bound_pod(s: Scenario, name: str, node: str, *, gpus: int = 0, cpu: str = "1") -> None:
    """A pod placed straight on `node` (spec.nodeName), as if scheduled earlier."""
    pod = gpu_pod(name, gpus=gpus, cpu=cpu)
    pod["spec"]["nodeName"] = node
    s.kube.create(pods_path(s.ns), pod)
    s.wait_running(name)


def _owned_pod(name: str, owner: JSON, labels: dict[str, str] | None = None, gpus: int = 1) -> JSON:
    pod = gpu_pod(name, gpus=gpus, labels=labels)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                           "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                           "controller": True, "blockOwnerDeletion": True}]
    return pod


def _template(app: str) -> JSON:
    return {"metadata": {"labels": {"app": app}},
            "spec": {"schedulerName": "flowsched",
                     "containers": [{"name": "main", "image": "registry.invalid/e2e/serve:0",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def _metric(svc: FlowschedService, name: str) -> float:
    text = svc.http.get("/metrics").text
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def test_shared_pod_goes_where_the_physical_gpus_are_idle_in_fact(sscenario: Scenario,
                                                                  exporters: dict[str, DcgmExporterEmulator]) -> None:
    s = sscenario
    s.add_nodes(TS_A, TS_B, gpus=2 * REPLICAS, labels=TIME_SLICED)  # 2 physical GPUs x 4 replicas each
    # Allocation counts favour TS_A for packing (6 of 8 replicas taken, against 1 of 8) ...
    _bound_pod(s, "tenants-a", TS_A, gpus=6)
    _bound_pod(s, "tenant-b", TS_B, gpus=1)
    # ... and kube-scheduler's own scores prefer it too (CPU taken on TS_B) ...
    _bound_pod(s, "cpu-hog-b", TS_B, cpu="16")
    # ... but its two physical GPUs are busy in fact (85 %: under the saturation filter, so the
    # score decides), while TS_B's sit idle.
    for g in range(PHYSICAL[TS_A]):
        exporters[TS_A].set_gpu(g, 85.0, 60000)
    snap = s.wait_snapshot(lambda sn: _util_is(sn, {TS_A: [85.0, 85.0], TS_B: [0.0, 0.0]}),
                           "per-physical-GPU telemetry of both time-sliced nodes", timeout_s=30)
    assert snap["nodes"][TS_A]["gpu_used"] == 6 and snap["nodes"][TS_B]["gpu_used"] == 1

    s.create_pod("shared-0", gpus=1)
    bound = s.wait_bound("shared-0")
    r = s.flowsched.verbs_http.post("/prioritize", json={"Pod": s.pod("shared-0"), "Nodes": None,
                                                   "NodeNames": [TS_A, TS_B]})
    scores = {h["Host"]: h["Score"] for h in r.json()}
    assert bound == TS_B, f"bound to {bound}; flowsched scores {scores}"
    assert scores[TS_B] > scores[TS_A]


def test_inference_deployment_pods_land_on_different_nodes(sscenario: Scenario) -> None:
    s = sscenario
    nodes = s.add_nodes("inf-1", "inf-2", "inf-3", gpus=2)
    # kube-scheduler alone would put every pod on inf-1: CPU is taken on the two others.
    _bound_pod(s, "cpu-hog-2", "inf-2", cpu="16")
    _bound_pod(s, "cpu-hog-3", "inf-3", cpu="16")
    s.wait_snapshot(lambda sn: all(n in sn["nodes"] for n in nodes), "the three nodes", timeout_s=10)
    dep = s.kube.create(f"/apis/apps/v1/namespaces/{s.ns}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serve"}}, "template": _template("serve")}})
    rs = s.kube.create(f"/apis/apps/v1/namespaces/{s.ns}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "serve-7d4b9", "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "serve", "uid": dep["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serve"}}, "template": _template("serve")}})
    placed = []
    for i in range(3):  # the ReplicaSet controller's part: one pod after another
        name = f"serve-7d4b9-{i}"
        s.kube.create(pods_path(s.ns), _owned_pod(name, rs, {"app": "serve"}))
        placed.append(s.wait_running(name))
    assert sorted(placed) == sorted(nodes), f"inference pods placed on {placed}"


def test_idle_notebook_gets_its_event_and_is_reclaimed_only_while_a_gpu_pod_waits(
        sscenario: Scenario, exporters: dict[str, DcgmExporterEmulator]) -> None:
    s = sscenario
    s.add_nodes(NB, gpus=PHYSICAL[NB])
    sts = s.kube.create(f"/apis/apps/v1/namespaces/{s.ns}/statefulsets", {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "lab"},
        "spec": {"replicas": 2, "serviceName": "lab", "selector": {"matchLabels": {"app": "lab"}},
                 "template": _template("lab")}})
    # Two notebooks (StatefulSet pods: workload class notebook), one opted in to reclamation.
    s.kube.create(pods_path(s.ns), _owned_pod("lab-0", sts, {"app": "lab", RECLAIM: "3s"}))
    s.kube.create(pods_path(s.ns), _owned_pod("lab-1", sts, {"app": "lab"}))
    assert s.wait_running("lab-0") == NB and s.wait_running("lab-1") == NB
    # Their GPUs, as dcgm-exporter maps them to the pods: idle.
    exporters[NB].run_pod(s.ns, "lab-0", gpus=1, util_pct=1.0, fb_used_mib=2000)
    exporters[NB].run_pod(s.ns, "lab-1", gpus=1, util_pct=0.0, fb_used_mib=2000)

    idle0 = s.wait_event("lab-0", "FlowschedIdleGPU", "under 5 % utilisation", timeout_s=30)
    s.wait_event("lab-1", "FlowschedIdleGPU", timeout_s=10)
    wait_until(lambda: _metric(s.flowsched, "flowsched_idle_gpu_pods") >= 2, 10, interval_s=0.2,
               what="flowsched_idle_gpu_pods counting both notebooks")
    assert _metric(s.flowsched, "flowsched_idle_gpus") >= 2
    warn = s.wait_event("lab-0", "FlowschedIdleGPUReclaim", timeout_s=15)
    assert warn["type"] == "Warning"
    assert not _reclaim_events(s, "lab-1")  # not opted in: reported, never warned

    # No GPU pod waits: past the warning period the notebook is left alone.
    time.sleep(IDLE["warning_s"] + 6 * IDLE["interval_s"] + 1.0)
    assert s.pod_exists("lab-0") and not s.pod("lab-0")["metadata"].get("deletionTimestamp")
    plan = s.flowsched.http.get("/debug/idle").json()["controller"]["last_plan"]
    assert plan["waiting_gpu_pods"] == 0 and plan["evict"] == [], plan

    # A GPU pod now waits (the node's two GPUs are taken): the opted-in notebook is evicted,
    # the other one stays, and the waiting pod gets the GPU.
    s.create_pod("train-waiting", gpus=1)
    evicted = s.wait_event("lab-0", "FlowschedIdleGPUReclaimed", "waiting pods", timeout_s=20)
    wait_until(lambda: not s.pod_exists("lab-0"), 10, what="the evicted notebook gone")
    assert s.pod_exists("lab-1")
    assert s.wait_bound("train-waiting", timeout_s=20) == NB
    # the warning came first, at least warning_s before the eviction, and after the idle report
    assert _at(idle0) <= _at(warn) and _at(evicted) - _at(warn) >= IDLE["warning_s"] - 0.1
    assert not _reclaim_events(s, "lab-1")


def _reclaim_events(s: Scenario, name: str) -> list[JSON]:
    return [e for e in s.events(name) if str(e.get("reason", "")).startswith("FlowschedIdleGPUReclaim")]


def _at(event: JSON) -> float:
    return datetime.strptime(event["eventTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
