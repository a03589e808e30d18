"""HA progress store: two replicas share one history through a real Prometheus (remote-write receiver)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from extender.http.auth import StaticTokenAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.progress.remote_write import encode_write_request, snappy_block_literals
from extender.progress.replicated_store import (
    ProgressBackendError,
    ReplicatedProgressStore,
    ReplicatedStoreSettings,
)
from extender.progress.store import ProgressPoint, ProgressStoreSettings
from tests.prometheus_harness import PrometheusServer, free_port, running_prometheus

pytestmark = pytest.mark.prometheus

RECEIVER = ["--web.enable-remote-write-receiver"]


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[PrometheusServer]:
    with running_prometheus(tmp_path / "prom", [], extra_args=RECEIVER) as p:
        yield p


def replica(prom_url: str, tmp_path: Path, name: str) -> ReplicatedProgressStore:
    return ReplicatedProgressStore(ProgressStoreSettings(path=str(tmp_path / f"{name}.sqlite")),
                                   ReplicatedStoreSettings(prometheus_url=prom_url,
                                                           remote_write_url=prom_url + "/api/v1/write"))


def app_for(store: ReplicatedProgressStore) -> FastAPI:
    app = FastAPI()
    app.include_router(build_progress_router(store, StaticTokenAuthenticator({"tok": frozenset({"*"})}),
                                             ProgressApiSettings(), ProgressApiMetrics.build(CollectorRegistry())))
    return app


async def call(app: FastAPI, method: str, path: str, body: object = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
        return await c.request(method, path, json=body, headers={"Authorization": "Bearer tok"})


def test_encoding_matches_the_protobuf_wire_format() -> None:
    # One series {a="b"} with one sample (value 1.0 at ts 2): hand-checked bytes.
    body = encode_write_request([({"a": "b"}, [(2, 1.0)])])
    label = b"\x0a\x01a\x12\x01b"
    sample = b"\x09" + (1.0).hex().encode()[:0] + b"\x00\x00\x00\x00\x00\x00\xf0\x3f" + b"\x10\x02"
    ts = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    assert body == b"\x0a" + bytes([len(ts)]) + ts
    # Literal-only Snappy: varint length, then tag (len-1)<<2 and the bytes.
    assert snappy_block_literals(b"abc") == b"\x03\x08abc"
    big = bytes(range(256)) * 300
    block = snappy_block_literals(big)
    assert block[:3] == b"\x80\xd8\x04" and len(block) < len(big) + 16


def test_points_posted_to_one_replica_are_seen_by_the_other(prom: PrometheusServer, tmp_path: Path) -> None:
    a, b = replica(prom.url, tmp_path, "a"), replica(prom.url, tmp_path, "b")
    app_a, app_b = app_for(a), app_for(b)
    now = time.time()
    acked = 0
    lags = []
    for batch in range(5):
        pts = [{"step": batch * 100 + k * 10, "loss": 0.2 + math.exp(-(batch * 100 + k * 10) / 300),
                "timestamp": now - 300 + batch * 50 + k} for k in range(10)]
        r = asyncio.run(call(app_a, "POST", "/v1/progress", {"namespace": "team", "job": "j1", "points": pts}))
        assert r.status_code == 200 and r.json()["accepted"] == 10
        acked += 10
        t0 = time.monotonic()
        while True:  # the other replica reads it from Prometheus
            got = asyncio.run(call(app_b, "GET", "/v1/jobs/team/j1"))
            if got.status_code == 200 and got.json()["points"] == acked:
                break
            assert time.monotonic() - t0 < 5, got.text
            time.sleep(0.01)
        lags.append(time.monotonic() - t0)
    print(f"seen by the other replica after: max {max(lags) * 1000:.0f} ms over {len(lags)} posts")
    va = asyncio.run(call(app_a, "GET", "/v1/jobs/team/j1")).json()
    vb = asyncio.run(call(app_b, "GET", "/v1/jobs/team/j1")).json()
    assert va == vb  # the same view from either replica, estimate included
    assert vb["last_step"] == 490 and vb["points"] == 50
    assert [s.job for s in b.jobs()] == ["j1"] and b.jobs()[0].points == 50
    # Replica a goes away: every acknowledged point is still there for b.
    a.close()
    h = b.history("team", "j1")
    assert h is not None and h.count == acked
    assert list(h.steps) == sorted(h.steps)
    b.close()


def test_restart_from_checkpoint_and_same_millisecond_points(prom: PrometheusServer, tmp_path: Path) -> None:
    a = replica(prom.url, tmp_path, "a")
    now = time.time() - 60
    a.add_points("team", "r", [ProgressPoint(100, 0.5, now), ProgressPoint(110, 0.45, now),
                               ProgressPoint(60, 0.6, now + 1)])  # two in one ms; then back to step 60
    h = a.history("team", "r")
    assert h is not None and list(h.steps) == [100, 110, 60] and list(h.values) == [0.5, 0.45, 0.6]
    # A point older than the job's newest is refused (Prometheus: out of order), not stored.
    assert a.add_points("team", "r", [ProgressPoint(50, 0.7, now - 30)]) == 0
    a.close()


def test_unreachable_prometheus_is_503_not_an_ack(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    a = replica(url, tmp_path, "a")
    with pytest.raises(ProgressBackendError):
        a.add_points("team", "x", [ProgressPoint(1, 1.0, time.time())])
    r = asyncio.run(call(app_for(a), "POST", "/v1/progress",
                         {"namespace": "team", "job": "x", "points": [{"step": 1, "loss": 1.0}]}))
    assert r.status_code == 503
    assert asyncio.run(call(app_for(a), "GET", "/v1/jobs/team/x")).status_code == 503
    a.close()
