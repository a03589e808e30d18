from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.http.auth import (
    AuthError,
    ReviewResult,
    StaticTokenAuthenticator,
    TokenReviewAuthenticator,
    service_account_namespace,
)
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.progress.store import ProgressStore, ProgressStoreSettings

TOKENS = {"team-a-token": frozenset({"team-a"}), "admin-token": frozenset({"*"})}
A = {"Authorization": "Bearer team-a-token"}


def make_client(store: ProgressStore, max_body: int = 1 << 20) -> TestClient:
    app = FastAPI()
    router = build_progress_router(
        store,
        StaticTokenAuthenticator(TOKENS),
        ProgressApiSettings(max_body_bytes=max_body, max_points_per_request=100),
        ProgressApiMetrics.build(CollectorRegistry()),
        clock=lambda: 5000.0,
    )
    app.include_router(router)
    return TestClient(app)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "progress.sqlite")


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    store = ProgressStore(ProgressStoreSettings(path=db))
    yield make_client(store)
    store.close()


def report(namespace: str = "team-a", points: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    pts = points if points is not None else [{"step": i, "loss": 1.0 / (i + 1), "timestamp": 100.0 + 5 * i}
                                              for i in range(20)]
    return {"namespace": namespace, "job": "resnet", "points": pts, **extra}


def test_report_then_read_back(client: TestClient) -> None:
    r = client.post("/v1/progress", json=report(), headers=A)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 20, "rejected": 0, "reasons": {}, "plan": None}
    job = client.get("/v1/jobs/team-a/resnet", headers=A).json()
    assert job["points"] == 20 and job["last_step"] == 19 and job["phase"] != "unknown"
    assert job["progress"] is not None and job["step_rate"] == pytest.approx(0.2)
    assert job["growth_efficiency"] is None  # no resource share known here: null, not 0


def test_job_shows_the_remaining_interval_and_plateau_probability(client: TestClient) -> None:
    pts = [{"step": i, "loss": 0.3 + math.exp(-0.05 * i), "timestamp": 100.0 + 5 * i} for i in range(30)]
    assert client.post("/v1/progress", json=report(points=pts), headers=A).status_code == 200
    job = client.get("/v1/jobs/team-a/resnet", headers=A).json()
    lo, hi = job["remaining_steps_interval"]
    assert 0 <= lo <= hi
    lo_s, hi_s = job["remaining_seconds_interval"]
    # 0.2 steps/s; both intervals are the rule's calibrated ones (scoring.end_interval), around their points
    assert job["remaining_seconds"] == pytest.approx(job["remaining_steps"] * 5.0)
    assert 0 <= lo_s <= job["remaining_seconds"] <= hi_s
    assert lo <= job["remaining_steps"] <= hi and job["end_reason"] == "plateau"
    assert 0.0 <= job["plateau_probability"] <= 1.0 and 0.0 <= job["evidence_weight"] <= 1.0
    short = [{"step": i, "loss": 1.0 / (i + 1), "timestamp": 100.0 + i} for i in range(3)]
    client.post("/v1/progress", json={"namespace": "team-a", "job": "new", "points": short}, headers=A)
    unknown = client.get("/v1/jobs/team-a/new", headers=A).json()
    assert unknown["remaining_steps_interval"] is None and unknown["plateau_probability"] is None
    assert unknown["evidence_weight"] == 0.0  # no prediction: no evidence


def test_foreign_namespace_is_forbidden(client: TestClient) -> None:
    r = client.post("/v1/progress", json=report(namespace="team-b"), headers=A)
    assert r.status_code == 403 and "team-b" in r.json()["error"]
    assert client.get("/v1/jobs/team-b/resnet", headers=A).status_code == 403
    admin = {"Authorization": "Bearer admin-token"}
    assert client.post("/v1/progress", json=report(namespace="team-b"), headers=admin).status_code == 200


def test_missing_or_wrong_token_is_401(client: TestClient) -> None:
    assert client.post("/v1/progress", json=report()).status_code == 401
    r = client.post("/v1/progress", json=report(), headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (report(points=[{"step": "ten", "loss": 1.0}]), "points.0.step"),
        (report(points=[{"step": 1, "loss": 1.0}, {"step": -1, "loss": 1.0}]), "points.1.step"),
        (report(points=[{"step": 1, "loss": "NaN"}]), "points.0.loss"),
        (report(points=[{"step": 1}]), "points.0.loss"),
        (report(points=[{"step": 1, "loss": 1.0, "epoch": 3}]), "points.0.epoch"),
        (report(points=[]), "points"),
        ({"job": "resnet", "points": [{"step": 1, "loss": 1.0}]}, "namespace"),
        (report(namespace="Team_A"), "namespace"),
        (report(higher_is_better="yes"), "higher_is_better"),
    ],
)
def test_malformed_report_is_400_naming_the_field(client: TestClient, body: dict[str, Any], field: str) -> None:
    r = client.post("/v1/progress", json=body, headers=A)
    assert r.status_code == 400
    assert r.json()["error"].startswith(field + ":")


def test_not_json_is_400(client: TestClient) -> None:
    r = client.post("/v1/progress", content=b"{not json", headers=A)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


@pytest.mark.parametrize("field", ["grad_sqr", "grad_var", "target_metric"])
def test_training_integer_beyond_float_range_is_400_naming_the_field(client: TestClient, field: str) -> None:
    # json.dumps writes 10**400 as plain digits; orjson refuses it and the stdlib reads an int, whose
    # overflow in pydantic's inf/NaN check was a 500.
    raw = json.dumps(report(points=[{"step": 1, "loss": 0.5}], training={field: 10**400})).encode()
    r = client.post("/v1/progress", content=raw, headers={**A, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"training.{field}:")
    for bad in (True, "1.0", float("inf")):  # still refused, as before
        r = client.post("/v1/progress", content=json.dumps(report(training={field: bad})).encode(), headers=A)
        assert r.status_code == 400 and r.json()["error"].startswith(f"training.{field}:"), r.text
    for good in (3, 10**300, 0.5):  # integers within range still count as numbers
        r = client.post("/v1/progress", json=report(training={field: good}), headers=A)
        assert r.status_code == 200, r.text


def test_nan_literals_are_rejected_per_point(client: TestClient) -> None:
    # Python's json.dumps writes NaN/Infinity literals: read them, reject those points only.
    pts: list[dict[str, Any]] = [
        {"step": 1, "loss": 0.9},
        {"step": 2, "loss": float("nan")},
        {"step": 3, "loss": float("inf")},
        {"step": 4, "loss": None},
        {"step": 5, "loss": 0.5, "metrics": {"acc": float("nan"), "f1": 0.3}},
    ]
    raw = json.dumps(report(points=pts)).encode()
    assert b"NaN" in raw
    r = client.post("/v1/progress", content=raw, headers={**A, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "accepted": 2,
        "rejected": 3,
        "reasons": {"loss_nan": 1, "loss_inf": 1, "loss_null": 1, "metric_not_finite": 1},
        "plan": None,
    }
    job = client.get("/v1/jobs/team-a/resnet", headers=A).json()
    assert job["points"] == 2 and job["last_value"] == 0.5
    assert job["last_timestamp"] == 5000.0  # no timestamp given: the receive time


def test_oversized_body_is_413(db: str) -> None:
    store = ProgressStore(ProgressStoreSettings(path=db))
    small = make_client(store, max_body=200)
    r = small.post("/v1/progress", json=report(), headers=A)
    assert r.status_code == 413
    too_many = report(points=[{"step": i, "loss": 1.0} for i in range(101)])
    assert make_client(store).post("/v1/progress", json=too_many, headers=A).status_code == 413
    store.close()


def test_service_restart_keeps_history(db: str) -> None:
    first = ProgressStore(ProgressStoreSettings(path=db))
    assert make_client(first).post("/v1/progress", json=report(), headers=A).status_code == 200
    first.close()
    second = ProgressStore(ProgressStoreSettings(path=db))
    job = make_client(second).get("/v1/jobs/team-a/resnet", headers=A)
    assert job.status_code == 200 and job.json()["points"] == 20
    second.close()


def test_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/v1/jobs/team-a/nothing", headers=A).status_code == 404


# ---- TokenReview authenticator, with a fake reviewer function (no apiserver) ----

def test_service_account_namespace_parsing() -> None:
    assert service_account_namespace("system:serviceaccount:team-a:default") == "team-a"
    assert service_account_namespace("system:serviceaccount:team-a") is None
    assert service_account_namespace("system:serviceaccount::x") is None
    assert service_account_namespace("alice") is None
    assert service_account_namespace("system:serviceaccount:ns:a:b") is None


class FakeReviewer:
    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.calls = 0

    def __call__(self, token: str) -> ReviewResult:
        self.calls += 1
        user = self.users.get(token)
        return ReviewResult(authenticated=user is not None, username=user or "")


def test_token_review_caches_positive_results_for_ttl() -> None:
    now = [0.0]
    fake = FakeReviewer({"good": "system:serviceaccount:team-a:trainer", "human": "alice"})
    auth = TokenReviewAuthenticator(fake, ttl_s=60.0, clock=lambda: now[0])

    async def go() -> None:
        ident = await auth.authenticate("good")
        assert ident.may_write("team-a") and not ident.may_write("team-b")
        await auth.authenticate("good")
        assert fake.calls == 1  # cached
        now[0] = 61.0
        await auth.authenticate("good")
        assert fake.calls == 2  # expired, reviewed again
        for _ in range(2):
            with pytest.raises(AuthError) as e:
                await auth.authenticate("bad")
            assert e.value.status == 401
        assert fake.calls == 3  # a rejection is remembered for negative_ttl_s (10 s) ...
        now[0] = 72.0
        with pytest.raises(AuthError):
            await auth.authenticate("bad")
        assert fake.calls == 4  # ... and reviewed again after it
        with pytest.raises(AuthError) as e:
            await auth.authenticate("human")
        assert e.value.status == 403

    asyncio.run(go())


def test_token_review_outage_is_503_through_the_api(db: str) -> None:
    def broken(token: str) -> ReviewResult:
        raise ConnectionError("apiserver down")

    store = ProgressStore(ProgressStoreSettings(path=db))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, TokenReviewAuthenticator(broken), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()),
    ))
    r = TestClient(app).post("/v1/progress", json=report(), headers={"Authorization": "Bearer x"})
    assert r.status_code == 503
    store.close()


def test_token_review_foreign_namespace_is_403_through_the_api(db: str) -> None:
    fake = FakeReviewer({"pod-token": "system:serviceaccount:team-a:trainer"})
    store = ProgressStore(ProgressStoreSettings(path=db))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, TokenReviewAuthenticator(fake), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()),
    ))
    c = TestClient(app)
    hdr = {"Authorization": "Bearer pod-token"}
    assert c.post("/v1/progress", json=report(namespace="team-b"), headers=hdr).status_code == 403
    assert c.post("/v1/progress", json=report(namespace="team-a"), headers=hdr).status_code == 200
    store.close()
