"""The resizer against the real control plane: progress in through /v1/progress (TokenReview of a
real ServiceAccount token), phases from the tracker, resizes through pods/resize, acknowledged
(or held back) by the KubeletEmulator, Events read back from the apiserver."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService, acting_loop_config
from tests.cluster.kubeapi import JSON, Kube
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario, gpu_pod

pytestmark = pytest.mark.cluster

INFEASIBLE = "e2e.flowsched.io/kubelet-says-infeasible"
OPT = {"flowsched.io/resizable": "true"}


@pytest.fixture(scope="module")
def resizer_flowsched(control_plane: ControlPlane, deploy_rbac: None) -> Iterator[FlowschedService]:
    workdir = control_plane.workdir / "flowsched-resizer"
    # beta 8: a plateaued pod keeps at least 1/16 of the pool; cooldown 2 s so that a pending
    # resize would be retried within the test if the resizer did not hold it back.
    cfg = acting_loop_config(workdir, "resizer", {"interval_s": 1.0, "max_per_interval": 4, "max_per_hour": 100,
                                                  "beta": 8.0, "cooldown_s": 2.0})
    svc = FlowschedService(workdir, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(cfg)])
    svc.start()
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def rs(kube: Kube, emulator: KubeletEmulator, resizer_flowsched: FlowschedService) -> Iterator[Scenario]:
    s = Scenario(kube, emulator, resizer_flowsched)
    old = emulator.resize_verdict

    def verdict(pod: JSON) -> tuple[str, str] | None:
        if (pod["metadata"].get("annotations") or {}).get(INFEASIBLE) == "true":
            return "Infeasible", "Node didn't have enough capacity: cpu, requested: 12000, capacity: 10000"
        return None

    emulator.resize_verdict = verdict
    try:
        yield s
    finally:
        emulator.resize_verdict = old
        s.cleanup()


def sa_token(s: Scenario, name: str = "trainer") -> str:
    s.kube.create(f"/api/v1/namespaces/{s.ns}/serviceaccounts",
                  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    tr = s.kube.create(f"/api/v1/namespaces/{s.ns}/serviceaccounts/{name}/token",
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}})
    token: str = tr["status"]["token"]
    return token


def post_progress(s: Scenario, token: str, job: str, losses: list[float]) -> None:
    now = time.time()
    points = [{"step": (i + 1) * 100, "loss": v, "timestamp": now - (len(losses) - 1 - i) * 15.0}
              for i, v in enumerate(losses)]
    r = httpx.post(f"{s.flowsched.url}/v1/progress", headers={"Authorization": f"Bearer {token}"},
                   json={"namespace": s.ns, "job": job, "points": points}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == len(losses)


GROWING = [3.0 - 0.12 * i for i in range(20)]  # steady improvement through the last window
PLATEAU = [1.0, 0.5, 0.3, 0.2, 0.12, 0.1] + [0.1] * 14  # flat for the last several windows


def cpu_of(pod: JSON) -> tuple[str, str | None]:
    """(spec request, status request) of the first container."""
    spec = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    st = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return spec, ((st[0].get("resources") or {}).get("requests") or {}).get("cpu")


def make_pod(s: Scenario, name: str, node: str, cpu: str, annotations: dict[str, str]) -> None:
    p = gpu_pod(name, gpus=1, cpu=cpu, annotations=annotations, labels={"flowsched.io/job": name})
    p["spec"]["nodeName"] = node  # bound directly: this test is about the resizer, not placement
    p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cpu  # limit = request
    s.kube.create(f"/api/v1/namespaces/{s.ns}/pods", p)
    s.wait_running(name)


def resize_events(s: Scenario, name: str, reason: str) -> list[JSON]:
    return [e for e in s.events(name) if e.get("reason") == reason]


def test_plateaued_job_gives_cpu_to_the_fast_one_untouched_without_opt_in(rs: Scenario) -> None:
    s = rs
    s.add_nodes("gpu-r1", cpu="64")
    make_pod(s, "fast", "gpu-r1", "8", {**OPT, "flowsched.io/cpu-max": "20"})
    make_pod(s, "flat", "gpu-r1", "8", {**OPT, "flowsched.io/cpu-shrink": "true", "flowsched.io/cpu-min": "4"})
    make_pod(s, "plain", "gpu-r1", "8", {})  # reports progress, never opted in
    token = sa_token(s)
    post_progress(s, token, "fast", GROWING)
    post_progress(s, token, "flat", PLATEAU)
    post_progress(s, token, "plain", GROWING)

    def resized() -> bool:
        return cpu_of(s.pod("fast")) == ("20", "20") and cpu_of(s.pod("flat")) == ("4", "4")

    try:
        wait_until(resized, 30, interval_s=0.2, what="fast raised to its cpu-max and flat lowered to its cpu-min")
    except TimeoutError as e:
        debug = s.flowsched.http.get("/debug/resizes").json()
        raise AssertionError(f"{e}; fast {cpu_of(s.pod('fast'))}, flat {cpu_of(s.pod('flat'))}; "
                             f"/debug/resizes: {debug}") from e
    up = s.wait_event("fast", "FlowschedResized", "cpu 8000m -> 20000m")
    down = s.wait_event("flat", "FlowschedResized", "cpu 8000m -> 4000m")
    assert "growing" in up["message"] and "completing" in down["message"]
    assert up["reportingComponent"] == "flowsched"
    # The limit followed the request (limit = request before: Guaranteed QoS kept).
    assert s.pod("fast")["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "20"
    assert s.pod("fast")["metadata"]["annotations"]["flowsched.io/cpu-original"] == "8000m"
    # Stable afterwards (bounds reached, hysteresis), and the pod without opt-in never touched.
    time.sleep(4)
    assert len(resize_events(s, "fast", "FlowschedResized")) == 1
    assert len(resize_events(s, "flat", "FlowschedResized")) == 1
    plain = s.pod("plain")
    assert cpu_of(plain) == ("8", "8") and plain["metadata"].get("generation", 1) == 1
    assert not [e for e in s.events("plain") if str(e.get("reason", "")).startswith("Flowsched")]
    assert "flowsched.io/cpu-original" not in (plain["metadata"].get("annotations") or {})


def test_a_resize_the_node_cannot_hold_is_reported_once_not_retried(rs: Scenario) -> None:
    s = rs
    s.add_nodes("gpu-r2", cpu="64")
    make_pod(s, "big", "gpu-r2", "4", {**OPT, "flowsched.io/cpu-max": "12", INFEASIBLE: "true"})
    token = sa_token(s)
    post_progress(s, token, "big", GROWING)
    s.wait_event("big", "FlowschedResized", "cpu 4000m -> 12000m", timeout_s=30)
    ev = s.wait_event("big", "FlowschedResizeInfeasible", timeout_s=15)
    assert ev["type"] == "Warning" and "enough capacity" in ev["message"]
    spec, status = cpu_of(s.pod("big"))
    assert (spec, status) == ("12", "4")  # desired in spec, the kubelet kept the old allocation
    # Several intervals and cooldowns later: still one resize and one report.
    time.sleep(6)
    assert len(resize_events(s, "big", "FlowschedResized")) == 1
    assert len(resize_events(s, "big", "FlowschedResizeInfeasible")) == 1
    metrics = s.flowsched.http.get("/metrics").text
    assert 'flowsched_resize_pending_total{reason="Infeasible"} 1.0' in metrics
    debug: dict[str, Any] = s.flowsched.http.get("/debug/resizes").json()
    row = debug["controller"]["last_plan"]["nodes"]["gpu-r2"]["pods"][f"{s.ns}/big"]
    assert row["pending"][0] == "Infeasible" and row["why"] == "NO_EVIDENCE"
