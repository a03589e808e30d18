"""Bottleneck diagnosis from a real Prometheus scraping an emulated cAdvisor and dcgm-exporter.

The per-pod readers (extender.telemetry.pod_usage) and the service's diagnoser
(extender.control.bottleneck) against the real server: a job whose pods saturate their CPU limit
with idle GPUs is input-bound; when its CPU frees and its network saturates it turns
communication-bound; each change is an Event and moves the gauge. Progress goes through the
real SQLite store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.control.bottleneck import BottleneckDiagnoser, job_signals, role_of, running_jobs
from extender.control.events import LogRecorder
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings
from extender.prometheus.config import DiagnosisConfig, TelemetryConfig
from extender.service import build_service
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from extender.telemetry.cadvisor_emulator import CadvisorEmulator
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from extender.telemetry.pod_usage import PodUsageReader
from scoring.bottleneck import PS, WORKER, Bottleneck, BottleneckSettings, diagnose
from tests.k8s_factories import node, pod
from tests.prometheus_harness import PrometheusServer, running_prometheus, wait_for

WINDOW_S = 4.0
LINK = BottleneckSettings().link_bytes_s
NODES = ("gpu-a", "gpu-b")


@pytest.fixture
def exporters() -> Iterator[tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]]:
    cadv = {n: CadvisorEmulator(n).serve() for n in NODES}
    dcgm = {n: DcgmExporterEmulator(n, gpus=4).serve() for n in NODES}
    yield cadv, dcgm
    for e in (*cadv.values(), *dcgm.values()):
        e.stop()


@pytest.fixture
def prom(tmp_path: Path, exporters: tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]
         ) -> Iterator[PrometheusServer]:
    cadv, dcgm = exporters
    targets = [(e.address, {}) for e in (*cadv.values(), *dcgm.values())]
    with running_prometheus(tmp_path / "prom", targets) as server:
        yield server


def _window_full(prom: PrometheusServer, pod_name: str) -> bool:
    """rate() over a window that began before the series did underestimates; wait until it is full."""
    rows = prom.query(f'count_over_time(container_cpu_usage_seconds_total{{pod="{pod_name}"}}[{WINDOW_S + 2:.0f}s])')
    return bool(rows) and float(rows[0]["value"][1]) >= WINDOW_S + 1  # type: ignore[index]


def _reader(prom: PrometheusServer) -> PodUsageReader:
    return PodUsageReader(TelemetryConfig(prometheus_url=prom.url, query_timeout_s=2.0), WINDOW_S)


def test_pod_usage_from_real_prometheus(prom: PrometheusServer,
                                        exporters: tuple[dict[str, CadvisorEmulator],
                                                         dict[str, DcgmExporterEmulator]]) -> None:
    cadv, dcgm = exporters
    cadv["gpu-a"].run_pod("ml", "w0", cpu_cores=3.6, cpu_limit_cores=4.0, rx_bytes_s=2e6, tx_bytes_s=1e6)
    cadv["gpu-b"].run_pod("ml", "nolimit", cpu_cores=1.0, cpu_limit_cores=None)
    dcgm["gpu-a"].run_pod("ml", "w0", gpus=2, util_pct=30)
    reader = _reader(prom)
    try:
        def ready() -> bool:
            usage, errors = reader.read()
            u = usage.get("ml/w0")
            return (not errors and u is not None and "ml/nolimit" in usage
                    and all(math.isfinite(x) for x in (u.cpu_cores, u.cpu_limit_cores, u.net_bytes_s, u.gpu_util)))
        wait_for(ready, 30, "pod usage for ml/w0 from Prometheus", interval_s=0.5)
        wait_for(lambda: _window_full(prom, "w0"), 30, "a full rate() window of samples", interval_s=0.5)
        usage, _ = reader.read()
        w0 = usage["ml/w0"]
        assert w0.cpu_cores == pytest.approx(3.6, rel=0.15)
        assert w0.cpu_limit_cores == pytest.approx(4.0)
        assert w0.net_bytes_s == pytest.approx(3e6, rel=0.15)
        assert w0.gpu_util == pytest.approx(0.30)
        nolimit = usage["ml/nolimit"]
        assert math.isinf(nolimit.cpu_limit_cores)  # no quota series: not CPU-limited
        assert math.isnan(nolimit.gpu_util)  # no GPU series: unknown, not idle
        assert "ml/ghost" not in usage
    finally:
        reader.close()


def test_unreachable_prometheus_is_unknown_with_errors() -> None:
    reader = PodUsageReader(TelemetryConfig(prometheus_url="http://127.0.0.1:9", query_timeout_s=0.5), WINDOW_S)
    try:
        usage, errors = reader.read()
    finally:
        reader.close()
    assert usage == {}
    assert set(errors) == {"cpu", "limit", "containers", "limited", "net", "gpu"}


def _state() -> ClusterState:
    state = ClusterState()
    for n in NODES:
        state.upsert_node(parse_node(node(n, gpus=4)))
    labels = {"flowsched.io/job": "tf"}
    for k, n in enumerate(NODES):
        state.upsert_pod(parse_pod(pod(f"tf-worker-{k}", gpus=2, node_name=n, namespace="ml", phase="Running",
                                       labels={**labels, "training.kubeflow.org/replica-type": "worker"})))
    state.upsert_pod(parse_pod(pod("tf-ps-0", gpus=0, node_name="gpu-b", namespace="ml", phase="Running",
                                   labels={**labels, "training.kubeflow.org/replica-type": "ps"})))
    return state


def test_roles_and_running_jobs_from_the_snapshot() -> None:
    pods, _, _ = _state().read().control_view()
    jobs = running_jobs(pods)
    assert set(jobs) == {"ml/tf"}
    assert sorted(role_of(p) for p in jobs["ml/tf"]) == [PS, WORKER, WORKER]
    sig = job_signals("ml/tf", jobs["ml/tf"], {}, None, time.time(), WINDOW_S)
    assert sig.shape.ps == 1 and sig.shape.nodes == 2
    assert math.isnan(sig.step_rate) and all(math.isnan(x) for x in sig.gpu_util)


def test_diagnosis_follows_the_telemetry_with_events_and_gauge(
        tmp_path: Path, prom: PrometheusServer,
        exporters: tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]) -> None:
    cadv, dcgm = exporters
    for k, n in enumerate(NODES):  # input-bound: workers at their CPU limit, GPUs mostly idle
        cadv[n].run_pod("ml", f"tf-worker-{k}", cpu_cores=3.9, cpu_limit_cores=4.0, rx_bytes_s=1e6, tx_bytes_s=1e6)
        dcgm[n].run_pod("ml", f"tf-worker-{k}", gpus=2, util_pct=25)
    cadv["gpu-b"].run_pod("ml", "tf-ps-0", cpu_cores=0.5, cpu_limit_cores=4.0, rx_bytes_s=1e6, tx_bytes_s=1e6)
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "progress.sqlite")))
    t0 = time.time() - 3 * WINDOW_S
    store.add_points("ml", "tf", [ProgressPoint(step=10 * i, value=1.0 / (i + 1), timestamp=t0 + 0.5 * i)
                                  for i in range(int(6 * WINDOW_S) + 1)], False)
    registry = CollectorRegistry()
    recorder = LogRecorder()
    diag = BottleneckDiagnoser(_state(), store, _reader(prom), BottleneckSettings(),
                               DiagnosisConfig(enabled=True, interval_s=1.0, window_s=WINDOW_S), recorder, registry,
                               clock=lambda: t0 + 3 * WINDOW_S)
    try:
        for k in range(len(NODES)):
            wait_for(lambda k=k: _window_full(prom, f"tf-worker-{k}"), 40, "full rate() windows", interval_s=0.5)
        wait_for(lambda: diag.refresh_once()["ml/tf"].kind == Bottleneck.INPUT, 30, "input-bound", interval_s=0.5)
        d = diag.get("ml/tf")
        assert d is not None and d.confident(BottleneckSettings())
        assert d.shape.workers == 2 and d.shape.ps == 1
        assert registry.get_sample_value("flowsched_job_bottleneck",
                                         {"namespace": "ml", "job": "tf", "bottleneck": "input-bound"}) == \
            pytest.approx(d.confidence)
        reasons = [(ref.name, reason, msg) for ref, reason, msg in recorder.events]
        assert len(reasons) == 1 and reasons[0][0] == "tf-ps-0" and reasons[0][1] == "FlowschedBottleneck"
        assert "input-bound" in reasons[0][2] and "CPU at" in reasons[0][2]

        # The input pipeline is fixed; the parameter server's link saturates.
        for k, n in enumerate(NODES):
            cadv[n].set_pod("ml", f"tf-worker-{k}", cpu_cores=1.0)
        cadv["gpu-b"].set_pod("ml", "tf-ps-0", rx_bytes_s=0.5 * LINK, tx_bytes_s=0.45 * LINK)
        wait_for(lambda: diag.refresh_once()["ml/tf"].kind == Bottleneck.COMMUNICATION, 30, "communication-bound",
                 interval_s=0.5)
        d = diag.get("ml/tf")
        assert d is not None and d.where == PS
        assert registry.get_sample_value("flowsched_job_bottleneck",
                                         {"namespace": "ml", "job": "tf", "bottleneck": "input-bound"}) is None
        assert registry.get_sample_value("flowsched_job_bottleneck",
                                         {"namespace": "ml", "job": "tf", "bottleneck": "communication-bound"}) > 0
        changes = [msg for _, reason, msg in recorder.events if reason == "FlowschedBottleneck"]
        # Between the two, while the rate() windows blend, it may pass through unknown; each change is an Event.
        assert changes[0].startswith("job ml/tf: input-bound")
        assert changes[-1].startswith("job ml/tf: communication-bound") and " at ps;" in changes[-1]
        assert all(" was " in m for m in changes[1:])
        assert diag.describe()["jobs"]["ml/tf"]["bottleneck"] == "communication-bound"
    finally:
        diag.reader.close()  # type: ignore[attr-defined]
        store.close()


def test_the_service_reports_the_diagnosis_in_the_jobs_api(
        tmp_path: Path, prom: PrometheusServer,
        exporters: tuple[dict[str, CadvisorEmulator], dict[str, DcgmExporterEmulator]]) -> None:
    cadv, dcgm = exporters
    for k, n in enumerate(NODES):
        cadv[n].run_pod("ml", f"tf-worker-{k}", cpu_cores=3.95, cpu_limit_cores=4.0, rx_bytes_s=1e6, tx_bytes_s=1e6)
        dcgm[n].run_pod("ml", f"tf-worker-{k}", gpus=2, util_pct=20)
    cadv["gpu-b"].run_pod("ml", "tf-ps-0", cpu_cores=0.5, cpu_limit_cores=4.0, rx_bytes_s=1e6, tx_bytes_s=1e6)
    tokens = tmp_path / "tokens"
    tokens.write_text("ml-token ml\n")
    settings = Settings(kube=False, progress_db=str(tmp_path / "progress.sqlite"), progress_auth="static",
                        static_tokens_file=str(tokens),
                        telemetry=TelemetryConfig(prometheus_url=prom.url, query_timeout_s=2.0),
                        diagnosis=DiagnosisConfig(enabled=True, interval_s=0.5, window_s=WINDOW_S))
    svc = build_service(settings)
    assert svc.diagnoser is not None
    for p in _state().read().control_view()[0]:
        svc.state.upsert_pod(p)
    auth = {"Authorization": "Bearer ml-token"}
    # A loopback peer: /debug/* answers only there (debug_access="loopback").
    with TestClient(svc.app, client=("127.0.0.1", 50000)) as client:  # runs the lifespan: the diagnoser thread starts
        now = time.time()
        points = [{"step": 20 * i, "loss": 1.0 / (i + 1), "timestamp": now - 2 * WINDOW_S + 0.5 * i}
                  for i in range(int(4 * WINDOW_S) + 1)]
        r = client.post("/v1/progress", json={"namespace": "ml", "job": "tf", "points": points}, headers=auth)
        assert r.status_code == 200, r.text

        def bottleneck() -> str | None:
            body = client.get("/v1/jobs/ml/tf", headers=auth).json()
            return (body.get("bottleneck") or {}).get("bottleneck")
        # rate() over a window that began before the series did reads low: start from full windows,
        # so the diagnosis does not flip while the test reads it from two endpoints.
        for k in range(len(NODES)):
            wait_for(lambda k=k: _window_full(prom, f"tf-worker-{k}"), 40, "full rate() windows", interval_s=0.5)
        wait_for(lambda: bottleneck() == "input-bound", 40, "input-bound in GET /v1/jobs/ml/tf", interval_s=0.5)
        body = client.get("/v1/jobs/ml/tf", headers=auth).json()["bottleneck"]
        assert body["shape"] == {"workers": 2, "ps": 1, "nodes": 2} and body["confidence"] >= 0.6
        assert any("CPU at" in e for e in body["evidence"])
        assert "flowsched_job_bottleneck{" in client.get("/metrics").text
        explained = client.get("/debug/explain", params={"pod": "ml/tf-worker-0"}).json()
        assert explained["bottleneck"]["bottleneck"] == "input-bound"


def test_per_pod_progress_finds_the_slow_replica(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "progress.sqlite")))
    try:
        now = 1000.0
        rates = {"tf-worker-0": 2.0, "tf-worker-1": 0.5, "tf-worker-2": 2.1}  # async workers report their own
        for name, rate in rates.items():
            store.add_points("ml", "tf", [ProgressPoint(step=int(rate * t), value=1.0, timestamp=now - 20 + t,
                                                        pod=name) for t in range(0, 21, 2)], False)
        store.add_points("ml", "tf", [ProgressPoint(step=5, value=1.0, timestamp=now - 1)], False)  # no pod: skipped
        state = _state()
        state.upsert_pod(parse_pod(pod("tf-worker-2", gpus=2, node_name="gpu-a", namespace="ml", phase="Running",
                                       labels={"flowsched.io/job": "tf",
                                               "training.kubeflow.org/replica-type": "worker"})))
        its = running_jobs(state.read().control_view()[0])["ml/tf"]
        steps = store.pod_steps("ml", "tf", now - 2 * WINDOW_S)
        assert set(steps) == set(rates)
        sig = job_signals("ml/tf", its, {}, store.history("ml", "tf"), now, WINDOW_S, steps)
        by_pod = dict(zip(sig.pods, sig.pod_step_rate.tolist(), strict=True))
        assert by_pod["tf-worker-0"] == pytest.approx(2.0) and by_pod["tf-worker-1"] == pytest.approx(0.5)
        assert math.isnan(by_pod["tf-ps-0"])
        d = diagnose(sig, BottleneckSettings())
        assert d.kind == Bottleneck.STRAGGLER and d.slow_pods == ("tf-worker-1",) and d.where == "gpu-b"
    finally:
        store.close()
