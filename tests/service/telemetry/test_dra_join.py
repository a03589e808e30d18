"""GPU telemetry joined to DRA devices by uuid: DCGM's UUID label against the ResourceSlices."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from extender.metrics import build_metrics
from extender.prometheus.config import TelemetryConfig
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from extender.snapshot.watcher import apply_event
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from extender.telemetry.dra_join import join_by_uuid
from extender.telemetry.refresher import TelemetryRefresher
from extender.telemetry.scrape_source import ScrapeSource
from extender.telemetry.source import FB_FREE, GPU_UTIL, GpuSeries, assemble
from tests.cluster import dra_objects as d
from tests.k8s_factories import pod

STALE_S = 60.0
NOW = 1_800_000_000.0


def _series(host: str, node_for_uuid: str, utils: list[float]) -> list[GpuSeries]:
    return [GpuSeries(host, i, m, u if m == GPU_UTIL else 1000.0, NOW, uuid=d.gpu_uuid(node_for_uuid, i))
            for i, u in enumerate(utils) for m in (GPU_UTIL, FB_FREE)]


def test_assemble_keeps_each_uuid_position() -> None:
    r = assemble(_series("d1", "d1", [10.0, 20.0]))
    assert r.uuids == {d.gpu_uuid("d1", 0): ("d1", 0), d.gpu_uuid("d1", 1): ("d1", 1)}


def test_series_under_a_foreign_hostname_go_to_the_node_publishing_their_gpus() -> None:
    r = assemble(_series("ip-10-0-0-1.internal", "d1", [10.0, 20.0]))
    devices = {d.gpu_uuid("d1", i): "d1" for i in range(2)}
    j = join_by_uuid(r, {"d1", "d2"}, devices, {})
    assert set(j.nodes) == {"d1"} and j.nodes["d1"].util_pct == (10.0, 20.0)
    assert j.uuids[d.gpu_uuid("d1", 1)] == ("d1", 1)


def test_no_rename_when_the_node_has_series_of_its_own_or_gpus_span_nodes() -> None:
    own = assemble(_series("host", "d1", [10.0]) + _series("d1", "x", [5.0]))
    assert set(join_by_uuid(own, {"d1"}, {d.gpu_uuid("d1", 0): "d1"}, {}).nodes) == {"host", "d1"}
    other = GpuSeries("host", 1, GPU_UTIL, 3.0, NOW, uuid=d.gpu_uuid("d2", 0))
    mixed = assemble([*_series("host", "d1", [10.0]), other])
    devices = {d.gpu_uuid("d1", 0): "d1", d.gpu_uuid("d2", 0): "d2"}
    assert set(join_by_uuid(mixed, {"d1", "d2"}, devices, {}).nodes) == {"host"}


def test_pods_are_attributed_their_claims_gpus_unless_the_exporter_did() -> None:
    series = _series("d1", "d1", [90.0, 30.0, 0.0])
    series.append(GpuSeries("d1", 2, GPU_UTIL, 0.0, NOW, pod="ns/mapped", uuid=d.gpu_uuid("d1", 2)))
    r = assemble(series)
    pods = {"ns/train": (d.gpu_uuid("d1", 0), d.gpu_uuid("d1", 1)), "ns/mapped": (d.gpu_uuid("d1", 0),),
            "ns/elsewhere": ("GPU-unknown",)}
    j = join_by_uuid(r, {"d1"}, {}, pods)
    assert j.pods["ns/train"] == (("d1", 0), ("d1", 1)) and j.pod_util["ns/train"] == 60.0
    assert j.pods["ns/mapped"] == (("d1", 2),)  # the exporter's own attribution stands
    assert "ns/elsewhere" not in j.pods


@pytest.fixture
def exporter() -> Iterator[DcgmExporterEmulator]:
    # The exporter on DRA node d1, reporting under the host's own name and mapping no pods.
    em = DcgmExporterEmulator("d1", gpus=4, pod_mapping=False).serve()
    em.hostname = "ip-10-0-0-1.internal"
    yield em
    em.stop()


def test_refresher_joins_dra_devices_by_uuid(exporter: DcgmExporterEmulator) -> None:
    state = ClusterState()
    node = {"metadata": {"name": "d1"}, "status": {"allocatable": {"cpu": "32"},
                                                  "conditions": [{"type": "Ready", "status": "True"}]}}
    state.upsert_node(parse_node(node))
    for kind, obj in (("deviceclasses", d.device_class()), ("resourceslices", d.gpu_slice("d1")),
                      ("resourceclaims", d.allocated(d.resource_claim("train-gpus", "ml", count=2), "d1",
                                                     ["gpu-2", "gpu-3"], (("train", "uid-ml-train"),)))):
        apply_event(state, kind, {"type": "ADDED", "object": obj}, "nvidia.com/gpu")
    p = pod("train", gpus=0, namespace="ml", node_name="d1", phase="Running")
    p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "train-gpus"}]
    state.upsert_pod(parse_pod(p))
    exporter.set_gpu(2, 80.0)
    exporter.set_gpu(3, 40.0)
    source = ScrapeSource(TelemetryConfig(source="scrape", scrape_targets=[exporter.url], query_timeout_s=0.5),
                          clock=lambda: NOW)
    r = TelemetryRefresher(source, state, build_metrics(), stale_s=STALE_S, refresh_s=1.0, clock=lambda: NOW)
    assert r.refresh_once()
    assert state.read().view(["d1"], NOW, STALE_S).arrays.gpu_util[0, :4].tolist() == [0.0, 0.0, 80.0, 40.0]
    assert r.status.unmatched_nodes == [] and r.unknown_now() == 0
    assert r.pods["ml/train"] == {"gpus": [["d1", 2], ["d1", 3]], "util_pct": 60.0}
    assert state.read().pod_gpu_samples(NOW, STALE_S)["ml/train"] == (80.0, 40.0)
