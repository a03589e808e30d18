"""The elastic optimizer on the real control plane: a Kubeflow PyTorchJob (a minimal CRD installed
through apiextensions) with an elasticPolicy and pods annotated flowsched.io/elastic: "1-8", on
two fake 4-GPU nodes scheduled by the real kube-scheduler through the session's extender.

No Kubeflow training operator runs here, so the test plays its part (`reconcile`): it keeps one
1-GPU worker pod per Worker replica, creating pods up to the count and deleting the highest
indices above it, as the operator does. Other work arrives and finishes; the PyTorchJob's Worker
replicas must follow the optimizer's plan: 2 -> 8 (alone), -> 4 (a 4-pod non-elastic job waits),
-> 8 (it finished), with FlowschedScaled Events on the PyTorchJob and the plan annotation.
"""

from __future__ import annotations

import contextlib
import json
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

KF_LABEL = "training.kubeflow.org/job-name"
TOKEN = "e2e-elastic-progress-token"
PLAN = "flowsched.io/elastic-plan"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"group": "kubeflow.org", "scope": "Namespaced",
             "names": {"plural": "pytorchjobs", "singular": "pytorchjob", "kind": "PyTorchJob",
                       "listKind": "PyTorchJobList"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@pytest.fixture(scope="module")
def elastic_flowsched(control_plane: ControlPlane, deploy_rbac: None, kube: Kube) -> Iterator[FlowschedService]:
    with contextlib.suppress(KubeError):
        kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)

    def established() -> bool:
        try:
            crd = kube.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org")
            kube.get("/apis/kubeflow.org/v1/pytorchjobs")
        except KubeError:
            return False
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

    wait_until(established, 30, interval_s=0.2, what="the PyTorchJob CRD established")
    workdir = control_plane.workdir / "flowsched-elastic"
    workdir.mkdir(exist_ok=True)
    (workdir / "tokens").write_text(f"{TOKEN} *\n")
    cfg = acting_loop_config(workdir, "elastic",
                             {"interval_s": 0.5, "max_per_interval": 4, "max_per_hour": 100, "cooldown_s": 2.0,
                              "min_gain": 0.1},  # the batch change below gains ~10-30 %: under the default 0.30
                             {"progress_auth": "static", "static_tokens_file": str(workdir / "tokens")})
    svc = FlowschedService(workdir, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(cfg)])
    svc.start()
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def es(kube: Kube, emulator: KubeletEmulator, elastic_flowsched: FlowschedService,
       scheduler: Any) -> Iterator[Scenario]:
    s = Scenario(kube, emulator, elastic_flowsched)
    try:
        yield s
    finally:
        with contextlib.suppress(KubeError):
            kube.delete(f"/apis/kubeflow.org/v1/namespaces/{s.ns}/pytorchjobs/pt")
        s.cleanup()


def pytorchjob_path(ns: str, name: str = "") -> str:
    return f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs" + (f"/{name}" if name else "")


def create_pytorchjob(s: Scenario, workers: int = 2) -> None:
    """PyTorchJob "pt": 1-GPU workers, elastic 1-8 (the operator's part is `reconcile`)."""
    s.kube.create(pytorchjob_path(s.ns), {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
        "spec": {"elasticPolicy": {"minReplicas": 1, "maxReplicas": 8, "rdzvBackend": "c10d"},
                 "pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": {"spec": {"containers": [
                     {"name": "pytorch", "image": "registry.invalid/e2e/train:0",
                      "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}},
    })


def workers(s: Scenario) -> int:
    return int(s.kube.get(pytorchjob_path(s.ns, "pt"))["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])


def reconcile(s: Scenario) -> None:
    """The training operator's part: one worker pod per Worker replica."""
    n = workers(s)
    pods = s.kube.get(pods_path(s.ns), labelSelector=f"{KF_LABEL}=pt")["items"]
    have = {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
    for i in range(n):
        name = f"pt-worker-{i}"
        if name not in have:
            with contextlib.suppress(KubeError):  # 409: still terminating from a scale-down
                s.kube.create(pods_path(s.ns), gpu_pod(name, gpus=1, annotations={"flowsched.io/elastic": "1-8"},
                                                       labels={KF_LABEL: "pt"}))
    for name in have:
        if int(name.rsplit("-", 1)[1]) >= n:
            s.kube.delete(pod_path(s.ns, name), grace_period_s=0)


def running(s: Scenario, selector: str) -> int:
    pods = s.kube.get(pods_path(s.ns), labelSelector=selector)["items"]
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp"))


def follow(s: Scenario, want: int, timeout_s: float, what: str) -> None:
    """Reconcile until the Worker replicas are `want` and that many workers run."""
    def ok() -> bool:
        reconcile(s)
        return workers(s) == want and running(s, f"{KF_LABEL}=pt") == want

    wait_until(ok, timeout_s, interval_s=0.3, what=what)


def scaled_events(s: Scenario) -> list[JSON]:
    evs = s.kube.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
    return [e for e in evs if e.get("reason") == "FlowschedScaled" and e["involvedObject"].get("kind") == "PyTorchJob"]


def test_pytorchjob_replicas_follow_the_plan_as_jobs_arrive_and_finish(es: Scenario) -> None:
    s = es
    s.add_nodes("el-n1", gpus=4)
    s.add_nodes("el-n2", gpus=4)
    create_pytorchjob(s)
    # Alone on 8 GPUs: scaled out to all of them.
    follow(s, 8, 120, "the PyTorchJob scaled out to 8 workers")  # a loaded CI machine took > 60 s once
    job = s.kube.get(pytorchjob_path(s.ns, "pt"))
    plan = json.loads(job["metadata"]["annotations"][PLAN])
    assert plan["gpus"] == 8 and plan["replicas"] == 8
    worker0 = s.pod("pt-worker-0")
    assert json.loads(worker0["metadata"]["annotations"][PLAN])["gpus"] == 8

    # A non-elastic 4-pod job arrives and cannot be placed: the plan makes room for it.
    for i in range(4):
        s.create_pod(f"other-{i}", gpus=1, labels={"flowsched.io/job": "other"})
    follow(s, 4, 60, "the PyTorchJob scaled in to 4 workers for the waiting job")
    wait_until(lambda: running(s, "flowsched.io/job=other") == 4, 30, interval_s=0.3,
               what="the other job's 4 pods running")

    # It finishes: the elastic job takes the GPUs back.
    for i in range(4):
        s.emulator.finish(s.ns, f"other-{i}")
    follow(s, 8, 60, "the PyTorchJob scaled out again to 8 workers")
    msgs = [e["message"] for e in scaled_events(s)]
    assert any("Worker replicas -> 8" in m for m in msgs) and any("Worker replicas -> 4" in m for m in msgs), msgs
    metrics = s.flowsched.http.get("/metrics").text
    assert 'flowsched_elastic_plans_total{outcome="scaled"}' in metrics


def test_the_planned_batch_follows_the_reported_gradient_noise(es: Scenario) -> None:
    """The job reports its batch range and gradient noise with its progress; the plan it reads
    back (reply and annotation) carries a batch size that grows when the noise grows."""
    s = es
    s.add_nodes("bt-n1", gpus=4)
    create_pytorchjob(s)
    follow_pods(s)
    step = [0]

    def post(grad_var: float, batch: int) -> dict[str, Any]:
        points = [{"step": step[0] + k, "loss": 5.0 / (1 + 0.01 * (step[0] + k))} for k in range(20)]
        step[0] += 20
        r = s.flowsched.http.post("/v1/progress", headers={"Authorization": f"Bearer {TOKEN}"}, json={
            "namespace": s.ns, "job": "pt", "points": points,
            "training": {"batch_size": batch, "batch_min": 64, "batch_max": 4096, "grad_sqr": 1.0,
                         "grad_var": grad_var}})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def planned_batch() -> int | None:
        ann = (s.kube.get(pytorchjob_path(s.ns, "pt"))["metadata"].get("annotations") or {}).get(PLAN)
        b = json.loads(ann).get("batch_size") if ann else None
        return int(b) if b else None

    post(0.001, 256)  # little gradient noise: large batches waste samples
    wait_until(lambda: (reconcile(s), planned_batch())[1] is not None, 30, interval_s=0.3,
               what="a plan with a batch size for the quiet job")
    quiet = planned_batch()
    assert quiet is not None and quiet < 256
    reply = post(0.001, quiet)
    assert reply["plan"] is not None and reply["plan"]["batch_size"] == quiet  # the job reads it back
    post(1000.0, quiet)  # much noisier gradients: larger batches are as efficient and run faster
    wait_until(lambda: (reconcile(s), (planned_batch() or 0) > quiet)[1], 30, interval_s=0.3,
               what="the planned batch growing with the reported gradient noise")
    noisy = planned_batch()
    assert noisy is not None and noisy > 256
    job = s.flowsched.http.get(f"/v1/jobs/{s.ns}/pt", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert job["training"]["grad_var"] == 1000.0 and job["plan"]["batch_size"] == noisy
    print(f"planned batch: {quiet} with grad_var 0.001, {noisy} with grad_var 1000 (reported at batch 64-4096)")


def follow_pods(s: Scenario) -> None:
    def ok() -> bool:
        reconcile(s)
        return running(s, f"{KF_LABEL}=pt") == workers(s)

    wait_until(ok, 30, interval_s=0.3, what="the PyTorchJob's workers running")
