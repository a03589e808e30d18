from __future__ import annotations

import json
import sys
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.auth import StaticTokenAuthenticator
from extender.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.progress_store import ProgressStore, ProgressStoreSettings
from extender.report_client import Reporter, ReporterConfig


class FakeSend:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[dict[str, object]] = []

    def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
        assert url == "http://fs/v1/progress" and headers["Authorization"] == "Bearer tok"
        self.bodies.append(json.loads(body))
        return self.status


def config(**kw: object) -> ReporterConfig:
    base: dict[str, object] = {"url": "http://fs/", "job": "j", "namespace": "ns", "token": "tok",
                               "flush_every": 3, "flush_s": 1e9}
    base.update(kw)
    return ReporterConfig(**base)  # type: ignore[arg-type]


def test_batches_and_sends_nan_as_null() -> None:
    send = FakeSend()
    r = Reporter(config(), send=send, clock=lambda: 10.0)
    r.report(1, 0.9)
    r.report(2, float("nan"))
    assert send.bodies == []
    r.report(3, 0.7, {"acc": 0.5})
    [body] = send.bodies
    assert body["namespace"] == "ns" and body["job"] == "j"
    assert body["points"] == [
        {"step": 1, "loss": 0.9, "timestamp": 10.0},
        {"step": 2, "loss": None, "timestamp": 10.0},
        {"step": 3, "loss": 0.7, "timestamp": 10.0, "metrics": {"acc": 0.5}},
    ]


def test_transient_failure_keeps_points_bounded_and_never_raises() -> None:
    send = FakeSend(status=503)
    r = Reporter(config(flush_every=1, max_buffer=4), send=send)
    for step in range(10):
        r.report(step, 1.0)
    assert len(send.bodies) == 10 and r.dropped == 6
    send.status = 200
    assert r.flush()
    points = send.bodies[-1]["points"]
    assert isinstance(points, list) and [p["step"] for p in points] == [6, 7, 8, 9]


def test_unreachable_server_does_not_raise() -> None:
    def boom(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
        raise OSError("connection refused")

    r = Reporter(config(flush_every=1), send=boom)
    r.report(1, 1.0)  # no exception
    assert not r.flush() or True


def test_refused_points_are_dropped_and_counted() -> None:
    r = Reporter(config(flush_every=1), send=FakeSend(status=403))
    r.report(1, 1.0)
    assert r.dropped == 1


def test_missing_configuration_drops_with_a_count() -> None:
    send = FakeSend()
    r = Reporter(config(url=None, flush_every=1), send=send)
    r.report(1, 1.0)
    assert send.bodies == [] and r.dropped == 1


def test_from_env_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("team-a\n")
    (tmp_path / "token").write_text("sa-token")
    cfg = ReporterConfig.from_env({"FLOWSCHED_URL": "http://x", "HOSTNAME": "pod-0"}, sa_dir=tmp_path)
    assert (cfg.url, cfg.job, cfg.namespace, cfg.token) == ("http://x", "pod-0", "team-a", None)
    assert cfg.token_file == tmp_path / "token"


def test_importing_the_client_needs_no_framework() -> None:
    assert not {"torch", "lightning", "keras", "transformers"} & set(sys.modules)


def test_client_output_is_accepted_by_the_server(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"tok": frozenset({"ns"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()),
    ))
    http = TestClient(app)
    replies: list[dict[str, object]] = []

    def via_testclient(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
        resp = http.post("/v1/progress", content=body, headers=headers)
        replies.append(resp.json())
        return int(resp.status_code)

    r = Reporter(config(flush_every=4), send=via_testclient)
    for step, loss in enumerate([1.0, 0.8, float("inf"), 0.5]):
        r.report(step, loss)
    assert replies == [{"accepted": 3, "rejected": 1, "reasons": {"loss_null": 1}}]
    store.close()
