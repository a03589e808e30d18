"""Issue 33, findings 9-12: bugs a hostile or merely unusual client found. Each test fails on the
code before its fix."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.http.app import build_app
from extender.http.auth import StaticTokenAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.http.webhook import build_webhook_router
from extender.metrics import build_metrics
from extender.progress.store import ProgressStore, ProgressStoreSettings
from extender.settings import Settings
from tests.k8s_factories import pod
from tests.service.http.test_slow_clients import small_cluster

NOW = 1_000_000.0
AUTH = {"Authorization": "Bearer t"}


def _webhook() -> TestClient:
    app = FastAPI()
    app.include_router(build_webhook_router("flowsched.io/admission", ["flowsched"]))
    return TestClient(app)


@pytest.mark.parametrize("depth", [300, 1000])
def test_9_deeply_nested_json_in_an_admission_review_is_never_a_500(depth: int) -> None:
    """A nested apiVersion was echoed (orjson refuses to encode past 254 levels: a 500); a nested
    annotation went through str() (RecursionError)."""
    c = _webhook()
    base = {"kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                        "object": {"metadata": {"annotations": {"flowsched.io/admission": "no"}},
                                   "spec": {"schedulerName": "flowsched"}}}}
    nest = b"[" * depth + b'"x"' + b"]" * depth  # built as text: no encoder nests this deep
    echo = orjson.dumps({**base, "apiVersion": "NEST"}).replace(b'"NEST"', nest)
    annotation = orjson.dumps(base).replace(b'"no"', nest)
    for raw in (echo, annotation):
        r = c.post("/webhook/gate", content=raw)
        assert r.status_code < 500, r.text
        if r.status_code == 200:
            assert r.json()["apiVersion"] == "admission.k8s.io/v1"


def test_10_unknown_node_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """One warning per call naming unknown nodes: 28,767 lines in 10 s from one client."""
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())
    c = TestClient(app)
    body = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "ghost-1", "ghost-2"]})
    with caplog.at_level(logging.WARNING, logger="flowsched.extender"):
        for _ in range(200):
            assert c.post("/prioritize", content=body).status_code == 200
    lines = [r for r in caplog.records if "not in the snapshot" in r.getMessage()]
    assert len(lines) == 1, len(lines)
    assert "'ghost-1', 'ghost-2'" in lines[0].getMessage() and "(1 so far)" in lines[0].getMessage()


def _progress(tmp_path: Path, prune_slack_s: float) -> tuple[TestClient, ProgressStore]:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite"), max_idle_s=86400.0))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"t": frozenset({"*"})}), ProgressApiSettings(prune_slack_s=prune_slack_s),
        ProgressApiMetrics.build(CollectorRegistry()), clock=lambda: NOW))
    return TestClient(app), store


def test_11_nothing_acknowledged_is_deleted_by_the_next_prune(tmp_path: Path) -> None:
    """Points up to one prune interval younger than the window were acknowledged, then deleted."""
    c, store = _progress(tmp_path, prune_slack_s=3600.0)
    body = {"namespace": "a", "job": "j", "points": [
        {"step": 1, "loss": 0.5, "timestamp": NOW - 86400.0 + 1800.0},  # inside the window, not past the next prune
        {"step": 2, "loss": 0.4, "timestamp": NOW - 86400.0 + 3600.0}]}  # still inside at the next prune
    r = c.post("/v1/progress", json=body, headers=AUTH)
    assert r.status_code == 200
    assert {k: r.json()[k] for k in ("accepted", "rejected", "reasons")} == \
        {"accepted": 1, "rejected": 1, "reasons": {"timestamp_stale": 1}}
    # The prune may come any time within the slack: what was acknowledged survives it.
    assert store.prune(NOW + 3600.0) == 0
    assert c.get("/v1/jobs/a/j", headers=AUTH).json()["points"] == 1
    store.close()


def test_12_restarts_are_counted_per_writer_not_across_interleaved_writers(tmp_path: Path) -> None:
    """32 pods interleaving their steps counted 480 restarts; one pod sending the same, 0."""
    c, store = _progress(tmp_path, prune_slack_s=0.0)
    for step in range(1, 16):
        for w in range(32):  # data-parallel replicas, each a little behind or ahead of the others
            point = {"step": step * 10 + (w % 3), "loss": 1.0 / step, "timestamp": NOW - 1000 + step + w * 0.01}
            r = c.post("/v1/progress", json={"namespace": "a", "job": "dp", "pod": f"dp-{w}", "points": [point]},
                       headers=AUTH)
            assert r.json()["accepted"] == 1
    job = c.get("/v1/jobs/a/dp", headers=AUTH).json()
    assert job["restarts"] == 0
    # ... and the convergence fit uses every step they reported (45 distinct), not only the
    # points after the last step that went back in arrival order.
    assert job["points_used"] == 45, job["points_used"]
    # A real restart (every writer back to its checkpoint) still counts, once.
    for w in range(32):
        point = {"step": 50, "loss": 0.9, "timestamp": NOW - 500 + w * 0.01}
        c.post("/v1/progress", json={"namespace": "a", "job": "dp", "pod": f"dp-{w}", "points": [point]},
               headers=AUTH)
    assert c.get("/v1/jobs/a/dp", headers=AUTH).json()["restarts"] == 1
    store.close()


def test_6_one_clients_random_tokens_cannot_starve_new_legitimate_tokens() -> None:
    """At 25 random tokens/s from one address, 20 of 40 first reports of new legitimate tokens got
    503: the review budget was global only. Now each peer address has a budget of its own too."""
    import asyncio

    from extender.http.auth import AuthError, ReviewLimits, ReviewResult, TokenReviewAuthenticator

    def reviewer(token: str) -> ReviewResult:
        if token.startswith("pod-"):
            return ReviewResult(authenticated=True, username=f"system:serviceaccount:team-a:{token}", error="")
        return ReviewResult(authenticated=False, username="", error="invalid")

    now = [0.0]
    auth = TokenReviewAuthenticator(reviewer, ReviewLimits(rate_per_s=20.0, per_client_rate_per_s=2.0),
                                    clock=lambda: now[0])

    async def go() -> tuple[dict[int, int], dict[str, int]]:
        attacker: dict[int, int] = {}
        legit: dict[str, int] = {}
        for second in range(2):
            now[0] = float(second)
            for i in range(25):  # the flood, all from one address
                try:
                    await auth.authenticate(f"random-{second}-{i}", peer="10.0.0.66")
                except AuthError as e:
                    attacker[e.status] = attacker.get(e.status, 0) + 1
            for i in range(20):  # new pods' first reports, each from its own address
                try:
                    await auth.authenticate(f"pod-{second}-{i}", peer=f"10.1.{second}.{i}")
                    legit["ok"] = legit.get("ok", 0) + 1
                except AuthError as e:
                    legit[str(e.status)] = legit.get(str(e.status), 0) + 1
        return attacker, legit

    attacker, legit = asyncio.run(go())
    assert legit == {"ok": 40}, legit
    assert attacker.get(503, 0) >= 40  # the flood got its own budget (4 + 2) and no more


def test_13_readers_looping_on_a_job_are_answered_without_rereading_it(tmp_path: Path) -> None:
    """16 readers looping on GET /v1/jobs of a 4,000-point job took the verbs from 1,698 to 601
    req/s: every read loaded, fitted and encoded the whole history."""
    c, store = _progress(tmp_path, prune_slack_s=0.0)
    points = [{"step": i, "loss": 1.0 / (i + 1), "timestamp": NOW - 5000 + i} for i in range(4000)]
    assert c.post("/v1/progress", json={"namespace": "a", "job": "big", "points": points},
                  headers=AUTH).json()["accepted"] == 4000
    reads = 0
    history = store.history

    def counted(namespace: str, job: str) -> Any:
        nonlocal reads
        reads += 1
        return history(namespace, job)

    store.history = counted  # type: ignore[method-assign]
    first = c.get("/v1/jobs/a/big", headers=AUTH).json()
    for _ in range(20):
        assert c.get("/v1/jobs/a/big", headers=AUTH).json() == first
    assert reads == 1
    c.post("/v1/progress", json={"namespace": "a", "job": "big", "points": [{"step": 4000, "loss": 0.001}]},
           headers=AUTH)
    assert c.get("/v1/jobs/a/big", headers=AUTH).json()["last_step"] == 4000  # a write is seen at once
    assert reads == 2
    store.close()
