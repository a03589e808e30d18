"""Telemetry through a real Prometheus scraping emulated dcgm-exporters, into the real service.

The service runs in-process (its lifespan starts the refresher thread); nodes are put into its
snapshot directly (no cluster here), and everything else is real: Prometheus' scrapes and
HTTP API, the exporters' HTTP pages, the extender's HTTP verbs and /metrics.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from extender.prometheus.config import TelemetryConfig
from extender.service import Service, build_service
from extender.settings import Settings
from extender.snapshot.objects import parse_node
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from tests.k8s_factories import node, pod
from tests.prometheus_harness import PrometheusServer, running_prometheus, wait_for

pytestmark = pytest.mark.prometheus

STALE_S = 4.0  # Settings.telemetry_stale_s for these tests: short, so an outage shows quickly
REFRESH_S = 0.5
BUSY, IDLE = "gpu-busy", "gpu-idle"


@pytest.fixture
def exporters() -> Iterator[dict[str, DcgmExporterEmulator]]:
    ems = {BUSY: DcgmExporterEmulator(BUSY, gpus=4).serve(), IDLE: DcgmExporterEmulator(IDLE, gpus=4).serve()}
    ems[BUSY].run_pod("ml", "resnet-0", gpus=4, util_pct=97, fb_used_mib=70000)
    yield ems
    for em in ems.values():
        em.stop()


@pytest.fixture
def prom(tmp_path: Path, exporters: dict[str, DcgmExporterEmulator]) -> Iterator[PrometheusServer]:
    # kubernetes_node is what a relabel rule would add; the exporters' own Hostname is there too.
    targets = [(em.address, {"kubernetes_node": name}) for name, em in exporters.items()]
    with running_prometheus(tmp_path / "prom", targets) as server:
        yield server


def _service(tmp_path: Path, prom: PrometheusServer, node_label: str = "Hostname") -> Service:
    settings = Settings(
        kube=False, telemetry_stale_s=STALE_S, progress_db=str(tmp_path / "progress.sqlite"),
        telemetry=TelemetryConfig(source="prometheus", prometheus_url=prom.url, node_label=node_label,
                                  refresh_s=REFRESH_S, range_s=3.0, query_timeout_s=1.0),
    )
    svc = build_service(settings)
    for name in (BUSY, IDLE):
        svc.state.upsert_node(parse_node(node(name, gpus=4)))
    return svc


def _snap(client: TestClient) -> dict[str, Any]:
    r = client.get("/debug/snapshot")
    assert r.status_code == 200
    data: dict[str, Any] = r.json()
    return data


def _scores(client: TestClient) -> dict[str, int]:
    body = {"Pod": pod("new", gpus=1), "NodeNames": [BUSY, IDLE]}
    r = client.post("/prioritize", json=body)
    assert r.status_code == 200
    return {h["Host"]: h["Score"] for h in r.json()}


def _filter(client: TestClient) -> dict[str, Any]:
    r = client.post("/filter", json={"Pod": pod("new", gpus=1), "NodeNames": [BUSY, IDLE]})
    assert r.status_code == 200
    data: dict[str, Any] = r.json()
    return data


def _metric(client: TestClient, name: str, **labels: str) -> float:
    text = client.get("/metrics").text
    sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    assert sel is not None
    return total


def _fresh_and_matching(client: TestClient, expect: dict[str, list[float]]) -> bool:
    nodes = _snap(client)["nodes"]
    return all(nodes[n]["telemetry"] == "fresh" and nodes[n]["gpu_util"][: len(v)] == v for n, v in expect.items())


def test_prometheus_numbers_outage_and_recovery(tmp_path: Path, prom: PrometheusServer,
                                                exporters: dict[str, DcgmExporterEmulator]) -> None:
    svc = _service(tmp_path, prom)
    expect = {BUSY: [97.0] * 4, IDLE: [0.0] * 4}
    with TestClient(svc.app, client=("127.0.0.1", 50000)) as client:
        took = wait_for(lambda: _fresh_and_matching(client, expect), 30, "telemetry to match the exporters")
        print(f"\nfirst fresh telemetry after {took:.1f}s")
        # The snapshot holds what the exporters serve, memory included, with Prometheus' timestamps.
        view = svc.state.read().view([BUSY, IDLE], time.time(), STALE_S)
        assert view.arrays.fb_free_mib[0, :4].tolist() == [81920.0 - 70000.0] * 4
        assert view.arrays.fb_free_mib[1, :4].tolist() == [81920.0] * 4
        assert all(math.isnan(x) for x in view.arrays.gpu_util[0, 4:])  # only 4 GPUs exist
        nodes = _snap(client)["nodes"]
        assert 0 <= nodes[BUSY]["telemetry_age_s"] < 2.5  # a 1 s scrape: samples are recent
        status = _snap(client)["status"]["telemetry"]
        assert status["source"] == "prometheus" and status["last_error"] is None and status["nodes_unknown"] == 0
        assert svc.telemetry is not None and svc.telemetry.pods["ml/resnet-0"]["util_pct"] == 97.0

        # Busy GPUs (97 % > saturation 90 %) fail the filter; the idle node scores higher.
        f = _filter(client)
        assert f["NodeNames"] == [IDLE] and BUSY in f["FailedAndUnresolvableNodes"]
        before = _scores(client)
        assert before[IDLE] > before[BUSY]
        assert _metric(client, "flowsched_telemetry_unknown_nodes") == 0

        # Outage: Prometheus goes away. Within the staleness bound both nodes become unknown,
        # which is neutral (equal scores, nobody filtered), never idle.
        prom.stop()
        stopped = time.monotonic()
        took = wait_for(lambda: all(n["telemetry"] == "unknown" for n in _snap(client)["nodes"].values()),
                        STALE_S + 5, "telemetry to turn unknown after the outage", interval_s=0.05)
        print(f"unknown {took:.2f}s after Prometheus stopped (stale bound {STALE_S}s, refresh {REFRESH_S}s)")
        assert took <= STALE_S + 2 * REFRESH_S + 0.5
        assert took >= STALE_S - 2.5  # the last real samples were honoured until they aged out
        during = _scores(client)
        assert during[BUSY] == during[IDLE], during
        assert _filter(client)["NodeNames"] == [BUSY, IDLE]
        assert _metric(client, "flowsched_telemetry_unknown_nodes") == 2
        assert _metric(client, "flowsched_telemetry_failures_total", source="prometheus") >= 1
        status = _snap(client)["status"]["telemetry"]
        assert status["consecutive_failures"] >= 1 and status["last_error"] and status["last_success_at"]
        assert time.monotonic() - stopped < 30

        # Restart (same port, same storage): telemetry recovers by itself.
        restarted = time.monotonic()
        prom.start()
        took = wait_for(lambda: _fresh_and_matching(client, expect), 30, "telemetry to recover after restart")
        print(f"fresh again {took:.2f}s after restart began ({time.monotonic() - restarted:.2f}s incl. startup)")
        after = _scores(client)
        assert after == before
        assert _metric(client, "flowsched_telemetry_unknown_nodes") == 0
        assert _snap(client)["status"]["telemetry"]["consecutive_failures"] == 0


def test_relabelled_node_label_and_pod_changes(tmp_path: Path, prom: PrometheusServer,
                                               exporters: dict[str, DcgmExporterEmulator]) -> None:
    # Exporters report a Hostname that is not a node name (their pod name, without NODE_NAME):
    # the node comes from the kubernetes_node label that Prometheus' relabelling added.
    exporters[BUSY].hostname = "dcgm-exporter-x7k2p"
    exporters[IDLE].hostname = "dcgm-exporter-9qz4m"
    svc = _service(tmp_path, prom, node_label="kubernetes_node")
    with TestClient(svc.app, client=("127.0.0.1", 50000)) as client:
        wait_for(lambda: _fresh_and_matching(client, {BUSY: [97.0] * 4, IDLE: [0.0] * 4}), 30,
                 "telemetry keyed by kubernetes_node")
        # The training pod finishes: the busy node's GPUs go idle, the snapshot follows.
        exporters[BUSY].stop_pod("ml", "resnet-0")
        exporters[IDLE].run_pod("ml", "bert-0", gpus=1, util_pct=60, fb_used_mib=20000)
        took = wait_for(lambda: _fresh_and_matching(client, {BUSY: [0.0] * 4, IDLE: [60.0, 0.0, 0.0, 0.0]}), 30,
                        "telemetry to follow the pods")
        print(f"\nfollowed pod changes in {took:.1f}s (range 3 s average)")
        assert svc.telemetry is not None and set(svc.telemetry.pods) == {"ml/bert-0"}
        assert _snap(client)["status"]["telemetry"]["unmatched_nodes"] == []


def test_wrong_node_label_leaves_nodes_unknown_and_says_why(tmp_path: Path, prom: PrometheusServer) -> None:
    svc = _service(tmp_path, prom, node_label="node")  # nobody sets `node` here
    with TestClient(svc.app, client=("127.0.0.1", 50000)) as client:
        wait_for(lambda: _snap(client)["status"]["telemetry"]["refreshes"] >= 2, 15, "two refreshes")
        nodes = _snap(client)["nodes"]
        assert nodes[BUSY]["telemetry"] == nodes[IDLE]["telemetry"] == "unknown"
        s = _scores(client)
        assert s[BUSY] == s[IDLE]
