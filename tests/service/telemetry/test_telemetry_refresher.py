"""The refresher and the scrape source over real HTTP against emulated exporters.

The clock is injected (sample times and "now" both come from it), so staleness is tested
exactly; the HTTP, the exposition text and the parser are the real ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from extender.metrics import build_metrics
from extender.prometheus.config import TelemetryConfig
from extender.snapshot.objects import parse_node
from extender.snapshot.state import ClusterState
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from extender.telemetry.refresher import TelemetryRefresher
from extender.telemetry.scrape_source import ScrapeSource
from tests.k8s_factories import node

STALE_S = 60.0


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def ems() -> Iterator[dict[str, DcgmExporterEmulator]]:
    out = {n: DcgmExporterEmulator(n, gpus=2).serve() for n in ("a", "b")}
    out["a"].run_pod("ml", "train", gpus=2, util_pct=95, fb_used_mib=60000)
    yield out
    for em in out.values():
        em.fault = "none"
        em.stop()


def _setup(ems: dict[str, DcgmExporterEmulator], clock: Clock, extra_nodes: tuple[str, ...] = (),
           **cfg: object) -> tuple[ClusterState, TelemetryRefresher, ScrapeSource]:
    state = ClusterState()
    for n in (*ems, *extra_nodes):
        state.upsert_node(parse_node(node(n, gpus=2)))
    config = TelemetryConfig(source="scrape", scrape_targets=[e.url for e in ems.values()], query_timeout_s=0.5,
                             **cfg)  # type: ignore[arg-type]
    source = ScrapeSource(config, clock=clock)
    metrics = build_metrics()
    return state, TelemetryRefresher(source, state, metrics, stale_s=STALE_S, refresh_s=1.0, clock=clock), source


def _util(state: ClusterState, name: str, now: float) -> list[float]:
    return state.read().view([name], now, STALE_S).arrays.gpu_util[0, :2].tolist()


def _counter(r: TelemetryRefresher, name: str, **labels: str) -> float:
    v = r.metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_scrape_fills_the_snapshot_with_scrape_times(ems: dict[str, DcgmExporterEmulator]) -> None:
    clock = Clock()
    state, r, _ = _setup(ems, clock, extra_nodes=("c",))
    assert r.refresh_once()
    assert _util(state, "a", clock.t) == [95.0, 95.0] and _util(state, "b", clock.t) == [0.0, 0.0]
    assert state.read().view(["a"], clock.t, STALE_S).arrays.fb_free_mib[0, :2].tolist() == [21920.0, 21920.0]
    assert state.read().describe(clock.t, STALE_S)["nodes"]["a"]["telemetry_age_s"] == 0.0
    # "c" has no exporter: unknown, and counted as such.
    assert math.isnan(_util(state, "c", clock.t)[0]) and r.unknown_now() == 1
    assert r.pods == {"ml/train": {"gpus": [["a", 0], ["a", 1]], "util_pct": 95.0}}
    assert _counter(r, "flowsched_telemetry_unknown_nodes") == 1.0


@pytest.mark.parametrize(("fault", "reason"), [("http500", "target_http"), ("garbage", "target_parse"),
                                               ("hang", "target_timeout")])
def test_a_failing_exporter_keeps_real_samples_only_until_stale(ems: dict[str, DcgmExporterEmulator], fault: str,
                                                                reason: str) -> None:
    clock = Clock()
    state, r, _ = _setup(ems, clock)
    assert r.refresh_once()
    ems["a"].fault = fault  # type: ignore[assignment]
    clock.t += 30
    started = time.monotonic()
    assert r.refresh_once()  # b still answers: a partial read
    assert time.monotonic() - started < 3  # a hung exporter costs one timeout, not a hang
    assert _counter(r, "flowsched_telemetry_bad_samples_total", source="scrape", reason=reason) == 1
    assert r.status.partial_errors
    # Within the bound a's last real samples stand (busy stays busy)...
    assert _util(state, "a", clock.t) == [95.0, 95.0]
    # ...past it a is unknown (NaN: neutral), never 0.
    clock.t += STALE_S
    assert r.refresh_once()
    assert all(math.isnan(x) for x in _util(state, "a", clock.t)) and _util(state, "b", clock.t) == [0.0, 0.0]
    assert r.unknown_now() == 1


def test_all_exporters_failing_is_a_failed_read(ems: dict[str, DcgmExporterEmulator]) -> None:
    clock = Clock()
    _, r, _ = _setup(ems, clock)
    for em in ems.values():
        em.fault = "http500"
    assert not r.refresh_once()
    assert r.status.consecutive_failures == 1 and "HTTP 500" in (r.status.last_error or "")
    assert _counter(r, "flowsched_telemetry_failures_total", source="scrape", reason="all_targets") == 1
    assert r.unknown_now() == 2
    for em in ems.values():
        em.fault = "none"
    assert r.refresh_once() and r.status.consecutive_failures == 0 and r.unknown_now() == 0


def test_huge_pages_are_refused(ems: dict[str, DcgmExporterEmulator]) -> None:
    # Two GPUs make a page of about 2.7 kB.
    clock = Clock()
    _, r, _ = _setup(ems, clock, max_response_bytes=1024)
    assert not r.refresh_once()
    assert _counter(r, "flowsched_telemetry_failures_total", source="scrape", reason="all_targets") == 1
    assert "is over 1024" in (r.status.last_error or "")


def test_exporter_for_a_node_not_in_the_cluster_is_reported(ems: dict[str, DcgmExporterEmulator]) -> None:
    clock = Clock()
    state, r, _ = _setup(ems, clock)
    state.delete_node("b")
    assert r.refresh_once()
    assert r.status.unmatched_nodes == ["b"]


def test_discovered_exporter_pods_are_scraped_on_their_nodes() -> None:
    em = DcgmExporterEmulator("dcgm-exporter-x7k2p", gpus=2).serve()  # Hostname is not the node name
    try:
        em.set_gpu(1, 55)
        port = int(em.address.rsplit(":", 1)[1])
        pods = {"items": [{"metadata": {"name": "dcgm-exporter-x7k2p"}, "spec": {"nodeName": "gpu-7"},
                           "status": {"phase": "Running", "podIP": "127.0.0.1"}}]}
        calls: list[int] = []

        def list_pods() -> dict[str, object]:
            calls.append(1)
            return pods

        clock = Clock()
        state = ClusterState()
        state.upsert_node(parse_node(node("gpu-7", gpus=2)))
        source = ScrapeSource(TelemetryConfig(source="scrape", scrape_port=port, discovery_s=3600), list_pods,
                              clock=clock)
        r = TelemetryRefresher(source, state, build_metrics(), stale_s=STALE_S, refresh_s=1.0, clock=clock)
        assert r.refresh_once() and r.refresh_once()
        assert _util(state, "gpu-7", clock.t) == [0.0, 55.0]
        assert len(calls) == 1  # listed once per discovery_s, not per refresh
    finally:
        em.stop()
