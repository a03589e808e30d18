from __future__ import annotations

import json
import sys
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.http.auth import StaticTokenAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.progress.store import ProgressStore, ProgressStoreSettings
from flowsched_client import Reporter, ReporterConfig, gradient_noise


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
                               "flush_every": 3, "flush_s": 1e9, "max_points_per_s": 0.0}
    base.update(kw)
    return ReporterConfig(**base)  # type: ignore[arg-type]


def test_batches_and_sends_nan_as_null() -> None:
    send = FakeSend()
    r = Reporter(config(), send=send, clock=lambda: 10.0)
    r.report(1, 0.9)
    r.report(2, float("nan"))
    r.report(3, 0.7, {"acc": 0.5})
    assert r.flush()
    [body] = send.bodies
    assert body["namespace"] == "ns" and body["job"] == "j"
    assert body["points"] == [
        {"step": 1, "loss": 0.9, "timestamp": 10.0},
        {"step": 2, "loss": None, "timestamp": 10.0},
        {"step": 3, "loss": 0.7, "timestamp": 10.0, "metrics": {"acc": 0.5}},
    ]
    r.close()


class FakeTensor:
    """Duck-typed like a framework scalar: detach() and float(); counts the conversions."""

    converted = 0

    def __init__(self, v: float) -> None:
        self.v = v

    def detach(self) -> FakeTensor:
        return self

    def __float__(self) -> float:
        FakeTensor.converted += 1
        return self.v


def test_tensors_are_converted_on_the_background_thread_not_in_report() -> None:
    send = FakeSend()
    r = Reporter(config(flush_every=1000), send=send)
    FakeTensor.converted = 0
    for step in range(5):
        r.report(step, FakeTensor(1.0 / (step + 1)), {"val": FakeTensor(2.0)})
    assert FakeTensor.converted == 0  # report() only queued them
    assert r.flush() and FakeTensor.converted == 10
    points = send.bodies[0]["points"]
    assert isinstance(points, list) and [p["loss"] for p in points] == [1.0, 0.5, 1.0 / 3, 0.25, 0.2]
    assert all(p["metrics"] == {"val": 2.0} for p in points)
    r.close()


def test_transient_failure_keeps_points_bounded_in_order_and_never_raises() -> None:
    send = FakeSend(status=503)
    r = Reporter(config(flush_every=10**6, max_buffer=4), send=send)
    for step in range(10):
        r.report(step, 1.0)
    assert not r.flush()
    assert r.dropped == 6  # the queue kept the newest 4
    send.status = 200
    assert r.flush()
    points = send.bodies[-1]["points"]
    assert isinstance(points, list) and [p["step"] for p in points] == [6, 7, 8, 9]
    r.close()


def test_unreachable_server_does_not_raise() -> None:
    def boom(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
        raise OSError("connection refused")

    r = Reporter(config(flush_every=1), send=boom)
    r.report(1, 1.0)  # no exception
    assert not r.flush()
    r.close()


def test_refused_points_are_dropped_and_counted() -> None:
    r = Reporter(config(flush_every=1), send=FakeSend(status=403))
    r.report(1, 1.0)
    r.flush()
    assert r.dropped == 1
    r.close()


def test_missing_configuration_drops_with_a_count() -> None:
    send = FakeSend()
    r = Reporter(config(url=None, flush_every=1), send=send)
    r.report(1, 1.0)
    r.flush()
    assert send.bodies == [] and r.dropped == 1
    r.close()


def test_fast_loss_points_are_averaged_per_window_but_evaluations_never() -> None:
    send = FakeSend()
    now = [100.0]
    r = Reporter(config(flush_every=10**6, max_points_per_s=10.0), send=send, clock=lambda: now[0])
    for step in range(1, 21):  # 20 points 0.01 s apart: two 0.1 s windows
        r.report(step, float(step))
        now[0] += 0.01
    r.report(21, 5.0, {"val_loss": 0.5})  # an evaluation goes as it is
    r.report(22, float("nan"))
    assert r.flush()
    points = send.bodies[0]["points"]
    assert isinstance(points, list)
    assert [(p["step"], p["loss"]) for p in points[:2]] == [(10, 5.5), (20, 15.5)]  # means, at the last step
    assert {**points[2], "timestamp": round(points[2]["timestamp"], 6)} == \
        {"step": 21, "loss": 5.0, "timestamp": 100.2, "metrics": {"val_loss": 0.5}}
    assert points[3]["step"] == 22 and points[3]["loss"] is None  # nothing finite to average: rejected
    # early stopping on the loss itself: every point is an evaluation, none merged
    r.training(early_stopping={"patience": 3, "min_delta": 0.0, "metric": None})
    for step in range(23, 33):
        r.report(step, 1.0)
    assert r.flush()
    assert [p["step"] for p in send.bodies[1]["points"]] == list(range(23, 33))  # type: ignore[union-attr]
    r.close()


def test_the_old_import_path_is_the_same_client() -> None:
    from extender.progress import report_client

    assert report_client.Reporter is Reporter


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
    r.close()
    assert replies == [{"accepted": 3, "rejected": 1, "reasons": {"loss_null": 1}, "plan": None}]
    store.close()


def test_training_report_and_the_plan_round_trip_through_the_server(tmp_path: Path) -> None:
    from extender.progress.reports import JobReportBook

    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    book = JobReportBook()
    plans = {"ns/j": {"gpus": 4, "replicas": 4, "batch_size": 1024, "at": 5.0, "reason": "r"}}
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"tok": frozenset({"ns"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()), reports=book, plan_of=plans.get,
    ))
    http = TestClient(app)

    def via_testclient(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
        resp = http.post("/v1/progress", content=body, headers=headers)
        return int(resp.status_code), resp.content

    r = Reporter(config(flush_every=2), send=via_testclient)
    sqr, var = gradient_noise([[1.0, 2.0], [3.0, 2.0], [2.0, 5.0]])
    r.training(batch_size=256, batch_min=64, batch_max=4096, grad_sqr=sqr, grad_var=var, max_steps=1000)
    r.report(1, 1.0)
    r.report(2, 0.9)
    assert r.flush()
    assert r.plan == plans["ns/j"] and r.planned_batch_size() == 1024  # read from the reply
    got = book.get("ns/j")
    assert got is not None and (got.batch_size, got.batch_min, got.batch_max, got.max_steps) == (256, 64, 4096, 1000)
    job = book.job_reports()["ns/j"]
    assert job.noise is not None and job.noise.base_batch == 64 and job.batch_range == (64, 4096)
    assert job.planned_steps == 1000.0  # the planned end reaches the World (JobState.planned_steps)
    assert job.batch_live is False  # not said: the planned batch is adopted at a restart only
    assert abs(job.noise.grad_var - var * 256 / 64) < 1e-12  # scaled to the smallest batch
    r.training(grad_var=10 * var)  # a later post changes one field, the others stay
    r.report(3, 0.8)
    r.report(4, 0.7)
    assert r.flush()
    got = book.get("ns/j")
    assert got is not None and got.grad_var == 10 * var and got.batch_size == 256
    r.training(batch_live=True)  # the script adopts planned_batch_size() while it runs
    r.report(5, 0.6)
    r.report(6, 0.5)
    assert r.flush()
    assert book.job_reports()["ns/j"].batch_live is True and book.get("ns/j").batch_size == 256  # type: ignore[union-attr]
    summary = http.get("/v1/jobs/ns/j", headers={"Authorization": "Bearer tok"}).json()
    assert summary["training"]["batch_size"] == 256 and summary["plan"]["batch_size"] == 1024
    assert summary["training"]["target_metric"] is None
    r.training(target_metric=0.55)  # the loss it stops at, already beaten by the last points
    r.report(7, 0.5)
    r.report(8, 0.5)
    assert r.flush()
    summary = http.get("/v1/jobs/ns/j", headers={"Authorization": "Bearer tok"}).json()
    assert summary["training"]["target_metric"] == 0.55 and book.get("ns/j").max_steps == 1000  # type: ignore[union-attr]
    bad = http.post("/v1/progress", headers={"Authorization": "Bearer tok"},
                    json={"namespace": "ns", "job": "j", "points": [{"step": 9, "loss": 1.0}],
                          "training": {"target_metric": "low"}})
    assert bad.status_code == 400 and "training.target_metric" in bad.json()["error"]
    bad = http.post("/v1/progress", headers={"Authorization": "Bearer tok"},
                    content=b'{"namespace": "ns", "job": "j", "points": [{"step": 9, "loss": 1.0}], '
                            b'"training": {"target_metric": 1e999}}')
    assert bad.status_code == 400 and "target_metric" in bad.text
    bad = http.post("/v1/progress", headers={"Authorization": "Bearer tok"},
                    json={"namespace": "ns", "job": "j", "points": [{"step": 9, "loss": 1.0}],
                          "training": {"grad_var": -1.0}})
    assert bad.status_code == 400 and "training.grad_var" in bad.json()["error"]
    bad = http.post("/v1/progress", headers={"Authorization": "Bearer tok"},
                    json={"namespace": "ns", "job": "j", "points": [{"step": 9, "loss": 1.0}],
                          "training": {"batch_min": 512, "batch_max": 64}})
    assert bad.status_code == 400 and "batch_min" in bad.json()["error"]
    bad = http.post("/v1/progress", headers={"Authorization": "Bearer tok"},
                    json={"namespace": "ns", "job": "j", "points": [{"step": 9, "loss": 1.0}],
                          "training": {"batch_live": "yes"}})
    assert bad.status_code == 400 and "training.batch_live" in bad.json()["error"]
    assert book.job_reports()["ns/j"].batch_live is True  # a rejected post changes nothing
    assert book.job_reports()["ns/j"].batch_local_max == 0  # not said: no per-GPU limit assumed
    r.training(batch_local_max=0, batch_size=2.5)  # type: ignore[arg-type]  # refused by the server with its points: not sent
    assert "batch_local_max" not in r.training_info and r.training_info["batch_size"] == 256
    r.training(batch_local_max=128)  # the largest batch one GPU holds: the model accumulates above it
    r.report(9, 0.5)
    assert r.flush()
    assert book.job_reports()["ns/j"].batch_local_max == 128 and book.get("ns/j").batch_size == 256  # type: ignore[union-attr]
    bad = http.post("/v1/progress", headers={"Authorization": "Bearer tok"},
                    json={"namespace": "ns", "job": "j", "points": [{"step": 9, "loss": 1.0}],
                          "training": {"batch_local_max": 0}})
    assert bad.status_code == 400 and "training.batch_local_max" in bad.json()["error"]
    r.training(early_stopping={"patience": 8, "min_delta": 0.001, "metric": None, "higher_is_better": None})
    r.report(9, 0.5)
    assert r.flush()
    summary = http.get("/v1/jobs/ns/j", headers={"Authorization": "Bearer tok"}).json()
    assert summary["training"]["early_stopping"]["patience"] == 8
    r.close()
    store.close()


def test_gradient_noise_matches_its_definition() -> None:
    # Three shares: mean (2, 3); share deviations (-1,-1), (1,-1), (0,2): sum of squares 8 over 2 = 4.
    sqr, var = gradient_noise([[1.0, 2.0], [3.0, 2.0], [2.0, 5.0]])
    assert var == 4.0 / 3 and abs(sqr - (13.0 - 4.0 / 3)) < 1e-12
    identical = gradient_noise([[1.0, 1.0], [1.0, 1.0]])
    assert identical == (2.0, 0.0)  # no noise: the whole signal is the mean
    import pytest

    with pytest.raises(ValueError):
        gradient_noise([[1.0, 2.0]])
    with pytest.raises(ValueError):
        gradient_noise([[1.0], [1.0, 2.0]])
