"""Live telemetry end to end: emulated dcgm-exporters -> real Prometheus -> `flowsched serve`
(a real process, telemetry source prometheus) -> the real kube-scheduler binds the pod.

The session's flowsched runs without a telemetry source, so this module starts its own,
configured through `--config` (an existing FlowschedService hook: extra_args), points
kube-scheduler at it for the module, and points it back at the session's flowsched after.
No telemetry is injected: everything flowsched knows about GPU load it read from Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService, own_flowsched
from tests.cluster.kubeapi import Kube
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.scenario import Scenario
from tests.prometheus_harness import PrometheusServer, scraping

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

BUSY, IDLE = "tel-busy", "tel-idle"
GPUS = 8  # fake_nodes.gpu_node's default
STALE_S = 10.0


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, DcgmExporterEmulator]]:
    # One emulated exporter per fake node; Hostname = node name, as the Helm chart's NODE_NAME gives.
    ems = {n: DcgmExporterEmulator(n, gpus=GPUS).serve() for n in (BUSY, IDLE)}
    yield ems
    for em in ems.values():
        em.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, exporters: dict[str, DcgmExporterEmulator]
               ) -> Iterator[PrometheusServer]:
    with scraping(tmp_path_factory.mktemp("prom"), [em.address for em in exporters.values()]) as server:
        yield server


@pytest.fixture(scope="module")
def telemetry_flowsched(control_plane: ControlPlane, deploy_rbac: None, flowsched: FlowschedService,
                        scheduler: Path, prometheus: PrometheusServer) -> Iterator[FlowschedService]:
    workdir = control_plane.workdir / "flowsched-telemetry"
    workdir.mkdir(exist_ok=True)
    cfg = workdir / "flowsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "telemetry_stale_s": STALE_S,
        "progress_db": str(workdir / "progress.sqlite"),
        "telemetry": {"source": "prometheus", "prometheus_url": prometheus.url, "node_label": "Hostname",
                      "refresh_s": 0.5, "range_s": 3.0, "query_timeout_s": 1.0},
    }))
    with own_flowsched(control_plane, cfg, back_to=flowsched) as svc:
        yield svc


@pytest.fixture
def tscenario(kube: Kube, emulator: KubeletEmulator, telemetry_flowsched: FlowschedService) -> Iterator[Scenario]:
    with Scenario(kube, emulator, telemetry_flowsched) as s:
        yield s


def _fresh(snap: dict[str, object], expect: dict[str, list[float]]) -> bool:
    nodes = snap["nodes"]
    assert isinstance(nodes, dict)
    return all(n in nodes and nodes[n]["telemetry"] == "fresh" and nodes[n]["gpu_util"] == v
               for n, v in expect.items())


def _pin_cpu_hog(s: Scenario, node: str, cpu: str = "16") -> None:
    """A CPU-only pod bound straight to `node`, so kube-scheduler's own scores prefer the other node."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"hog-{node}"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/hog:0",
                                                      "resources": {"requests": {"cpu": cpu}}}]}}
    s.kube.create(f"/api/v1/namespaces/{s.ns}/pods", pod)
    s.wait_running(pod["metadata"]["name"])


def test_pod_goes_to_the_node_whose_gpus_telemetry_shows_idle(tscenario: Scenario,
                                                               exporters: dict[str, DcgmExporterEmulator]) -> None:
    s = tscenario
    s.add_nodes(BUSY, IDLE)  # otherwise equal: same GPUs, CPU, memory, labels
    # Busy per telemetry only (85 %: under the 90 % saturation filter, so it is the score that
    # decides): pods of another scheduler, invisible to kube-scheduler's own accounting.
    for g in range(GPUS):
        exporters[BUSY].set_gpu(g, 85, 60000)
    _pin_cpu_hog(s, IDLE)  # kube-scheduler alone would now prefer the busy node
    s.wait_snapshot(lambda snap: _fresh(snap, {BUSY: [85.0] * GPUS, IDLE: [0.0] * GPUS}),
                    "telemetry from Prometheus for both nodes", timeout_s=30)

    s.create_pod("train-0", gpus=1)
    bound = s.wait_bound("train-0")
    r = s.flowsched.verbs_http.post("/prioritize", json={"Pod": s.pod("train-0"), "Nodes": None,
                                                   "NodeNames": [BUSY, IDLE]})
    scores = {h["Host"]: h["Score"] for h in r.json()}
    assert bound == IDLE, f"bound to {bound}; flowsched scores {scores}"
    assert scores[IDLE] > scores[BUSY]

    # The pod now runs on the idle node; its exporter shows the load, and flowsched follows.
    s.wait_running("train-0")
    exporters[IDLE].run_pod(s.ns, "train-0", gpus=1, util_pct=92, fb_used_mib=30000)
    # The refresher stores the node's samples, then the pod attribution of the same read: wait for both.
    snap = s.wait_snapshot(lambda snap: _fresh(snap, {IDLE: [92.0] + [0.0] * (GPUS - 1)})
                           and snap["status"]["telemetry"]["pods_attributed"] >= 1,
                           "the new pod's GPU load, attributed to it", timeout_s=30)
    assert snap["status"]["telemetry"]["source"] == "prometheus"
    assert snap["status"]["telemetry"]["pods_attributed"] >= 1
    exporters[IDLE].stop_pod(s.ns, "train-0")
