"""Bottleneck diagnosis end to end: emulated cAdvisor and dcgm-exporters -> real Prometheus ->
`flowsched serve` (a real process, diagnosis enabled) watching a real kube-apiserver -> Events.

A PS/worker job's pods run on fake nodes (bound directly, marked Running by the kubelet
emulator). Its emulated telemetry first shows the workers at their CPU limit with idle GPUs
(input-bound), then free CPU and a saturated parameter server (communication-bound); flowsched
records a FlowschedBottleneck Event in the apiserver for each and reports the diagnosis in
GET /v1/jobs/{ns}/{job}.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from extender.telemetry.cadvisor_emulator import CadvisorEmulator
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from scoring.bottleneck import BottleneckSettings
from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import Kube, pods_path
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.scenario import Scenario, gpu_pod
from tests.prometheus_harness import PrometheusServer, scraping, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

NODES = ("bn-a", "bn-b")
TOKEN = "e2e-bottleneck-token"
LINK = BottleneckSettings().link_bytes_s


@pytest.fixture(scope="module")
def exporters() -> Iterator[tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]]:
    cadv = {n: CadvisorEmulator(n).serve() for n in NODES}
    dcgm = {n: DcgmExporterEmulator(n, gpus=8).serve() for n in NODES}
    yield cadv, dcgm
    for e in (*cadv.values(), *dcgm.values()):
        e.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory,
               exporters: tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]
               ) -> Iterator[PrometheusServer]:
    cadv, dcgm = exporters
    with scraping(tmp_path_factory.mktemp("prom"), [e.address for e in (*cadv.values(), *dcgm.values())]) as server:
        yield server


@pytest.fixture(scope="module")
def diagnosing_flowsched(control_plane: ControlPlane, deploy_rbac: None, prometheus: PrometheusServer
                         ) -> Iterator[FlowschedService]:
    workdir = control_plane.workdir / "flowsched-bottleneck"
    workdir.mkdir(exist_ok=True)
    tokens = workdir / "tokens"
    tokens.write_text(f"{TOKEN} *\n")
    cfg = workdir / "flowsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "progress_db": str(workdir / "progress.sqlite"),
        "progress_auth": "static", "static_tokens_file": str(tokens),
        "telemetry": {"prometheus_url": prometheus.url, "query_timeout_s": 2.0},
        "diagnosis": {"enabled": True, "interval_s": 1.0, "window_s": 4.0},
        # The loops the diagnosis steers, acting, on a Lease of their own.
        "controllers": ["elastic", "resizer"],
        "control": {"dry_run": False, "identity": "e2e-bottleneck", "lease_name": "flowsched-e2e-bottleneck",
                    "lease_duration_s": 6, "renew_deadline_s": 4, "retry_period_s": 1},
        "convergence": {"interval_s": 0.5, "window_s": 30.0},
        "elastic": {"interval_s": 1.0, "cooldown_s": 1.0},
        "resizer": {"interval_s": 1.0, "cooldown_s": 1.0},
    }))
    svc = FlowschedService(workdir, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(cfg)])
    svc.start()
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def bscenario(kube: Kube, emulator: KubeletEmulator, diagnosing_flowsched: FlowschedService) -> Iterator[Scenario]:
    with Scenario(kube, emulator, diagnosing_flowsched) as s:
        yield s


def _run_on(s: Scenario, name: str, node: str, gpus: int, role: str) -> None:
    pod = gpu_pod(name, gpus=gpus, labels={"flowsched.io/job": "tf", "training.kubeflow.org/replica-type": role})
    pod["spec"]["nodeName"] = node  # bound directly: this test is about diagnosis, not placement
    s.kube.create(pods_path(s.ns), pod)
    s.wait_running(name)


def test_diagnosis_changes_are_events_and_in_the_jobs_api(
        bscenario: Scenario, exporters: tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]) -> None:
    s = bscenario
    cadv, dcgm = exporters
    s.add_nodes(*NODES)
    for k, node in enumerate(NODES):
        _run_on(s, f"tf-worker-{k}", node, 2, "Worker")
        cadv[node].run_pod(s.ns, f"tf-worker-{k}", cpu_cores=3.95, cpu_limit_cores=4.0, rx_bytes_s=1e6,
                           tx_bytes_s=1e6)
        dcgm[node].run_pod(s.ns, f"tf-worker-{k}", gpus=2, util_pct=20)
    _run_on(s, "tf-ps-0", NODES[1], 0, "PS")
    cadv[NODES[1]].run_pod(s.ns, "tf-ps-0", cpu_cores=0.5, cpu_limit_cores=4.0, rx_bytes_s=1e6, tx_bytes_s=1e6)

    ev = s.wait_event("tf-ps-0", "FlowschedBottleneck", "input-bound", timeout_s=60)
    assert "CPU at" in ev["message"] and ev["type"] == "Normal"

    for k, node in enumerate(NODES):
        cadv[node].set_pod(s.ns, f"tf-worker-{k}", cpu_cores=1.0)
    cadv[NODES[1]].set_pod(s.ns, "tf-ps-0", rx_bytes_s=0.5 * LINK, tx_bytes_s=0.45 * LINK)
    ev = s.wait_event("tf-ps-0", "FlowschedBottleneck", "communication-bound", timeout_s=60)
    assert " at ps;" in ev["message"]

    # GET /v1/jobs needs the job's progress; report some, then read the diagnosis back.
    http = s.flowsched.http
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = http.post("/v1/progress", headers=auth, json={"namespace": s.ns, "job": "tf",
                                                      "points": [{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)]})
    assert r.status_code == 200, r.text

    def reported() -> bool:
        body = http.get(f"/v1/jobs/{s.ns}/tf", headers=auth).json()
        return bool(body.get("bottleneck")) and body["bottleneck"]["bottleneck"] == "communication-bound"
    wait_for(reported, 30, "communication-bound in GET /v1/jobs", interval_s=0.5)
    for k, node in enumerate(NODES):
        cadv[node].stop_pod(s.ns, f"tf-worker-{k}")
        dcgm[node].stop_pod(s.ns, f"tf-worker-{k}")
    cadv[NODES[1]].stop_pod(s.ns, "tf-ps-0")


def _loop(s: Scenario, name: str) -> dict[str, Any]:
    r = s.flowsched.http.get(f"/debug/{name}")
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def test_the_resizer_not_the_optimizer_acts_on_an_input_bound_job_and_nothing_grows_a_network_bound_one(
        bscenario: Scenario, exporters: tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]) -> None:
    s = bscenario
    cadv, dcgm = exporters
    s.add_nodes(*NODES)
    ann = {"flowsched.io/elastic": "1-8", "flowsched.io/resizable": "true", "flowsched.io/cpu-max": "8"}
    for k, node in enumerate(NODES):
        pod = gpu_pod(f"in-worker-{k}", gpus=2, labels={"flowsched.io/job": "inp",
                                                       "training.kubeflow.org/replica-type": "Worker"},
                      annotations=ann)
        pod["spec"]["nodeName"] = node
        s.kube.create(pods_path(s.ns), pod)
        s.wait_running(f"in-worker-{k}")
        cadv[node].run_pod(s.ns, f"in-worker-{k}", cpu_cores=3.95, cpu_limit_cores=4.0, rx_bytes_s=1e6,
                           tx_bytes_s=1e6)
        dcgm[node].run_pod(s.ns, f"in-worker-{k}", gpus=2, util_pct=20)
    http, auth, job = s.flowsched.http, {"Authorization": f"Bearer {TOKEN}"}, f"{s.ns}/inp"
    r = http.post("/v1/progress", headers=auth, json={"namespace": s.ns, "job": "inp", "points": [
        {"step": 10 * i, "loss": 5.0 - 0.05 * i, "timestamp": time.time() - 300 + 10 * i} for i in range(30)]})
    assert r.status_code == 200, r.text

    def refusal() -> str:
        return str(_loop(s, "elastic")["controller"]["last_plan"].get("refused", {}).get(job, ""))

    def plans() -> int:  # the optimizer's plans for the job, as Events (its pods' controller is not played here)
        return len([e for e in s.events("in-worker-0") if e.get("reason") == "FlowschedElasticPlan"])

    # Input-bound: the optimizer stops growing it and says why; the resizer gives it CPU.
    s.wait_event("in-worker-0", "FlowschedBottleneck", "input-bound", timeout_s=60)
    wait_for(lambda: "input-bound" in refusal(), 30, "the optimizer refusing to grow the input-bound job",
             interval_s=0.5)
    assert "not grown" in refusal()
    before = plans()
    time.sleep(4.0)  # four intervals of both loops
    assert plans() == before, "the optimizer planned more GPUs for an input-bound job"
    resized = s.wait_event("in-worker-0", "FlowschedResized", "cpu 1000m ->", timeout_s=30)
    print(f"input-bound: resizer {resized['message'][:60]}...; optimizer: {refusal()[:80]}...")

    # Network-bound: no growth either, for a different reason.
    for k, node in enumerate(NODES):
        cadv[node].set_pod(s.ns, f"in-worker-{k}", cpu_cores=1.0, rx_bytes_s=0.5 * LINK, tx_bytes_s=0.45 * LINK)
    wait_for(lambda: "communication-bound" in refusal(), 60, "the optimizer refusing to grow the network-bound job",
             interval_s=0.5)
    before = plans()
    time.sleep(4.0)
    assert plans() == before, "the optimizer planned more GPUs for a network-bound job"
    s.wait_event("in-worker-0", "FlowschedBottleneck", "communication-bound", timeout_s=30)
    for k, node in enumerate(NODES):
        cadv[node].stop_pod(s.ns, f"in-worker-{k}")
        dcgm[node].stop_pod(s.ns, f"in-worker-{k}")
