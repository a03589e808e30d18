"""Per-namespace quotas and the write probe of the progress store (issue 33, findings 7 and 8).
Each test fails on the store before them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.http.auth import StaticTokenAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.progress import store as store_module
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings, QuotaExceeded, StoreError

NOW = 1_000_000.0


def _points(n: int, metrics: dict[str, float] | None = None, pod: str | None = None) -> list[ProgressPoint]:
    return [ProgressPoint(step=i, value=1.0 / (i + 1), timestamp=NOW + i, pod=pod, metrics=metrics) for i in range(n)]


def _store(tmp_path: Path, **quotas: int) -> ProgressStore:
    return ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite"), **quotas))  # type: ignore[arg-type]


def test_new_jobs_past_the_namespace_quota_are_refused_other_namespaces_unaffected(tmp_path: Path) -> None:
    store = _store(tmp_path, max_jobs_per_namespace=3)
    for job in ("a", "b", "c"):
        store.admit("team-a", job, _points(2))
        store.add_points("team-a", job, _points(2))
    with pytest.raises(QuotaExceeded) as e:
        store.admit("team-a", "d", _points(1))
    assert e.value.what == "jobs"
    store.admit("team-a", "a", _points(1))  # an existing job goes on
    store.admit("team-b", "d", _points(1))  # another namespace has its own quota
    store.close()


def test_points_bytes_and_metric_names_quotas(tmp_path: Path) -> None:
    store = _store(tmp_path, max_points_per_namespace=100, max_bytes_per_namespace=20_000,
                   max_metric_names_per_namespace=4)
    store.add_points("t", "j", _points(90))
    with pytest.raises(QuotaExceeded) as e:
        store.admit("t", "j", _points(11))
    assert e.value.what == "points"
    long_names = {("m" * 120) + str(i): 1.0 for i in range(4)}
    with pytest.raises(QuotaExceeded) as e:
        store.admit("t2", "j", _points(50, metrics=long_names))  # ~25 KB of names
    assert e.value.what == "bytes"
    store.add_points("t3", "j", _points(1, metrics={"a": 1.0, "b": 2.0}))
    store.admit("t3", "j", _points(1, metrics={"a": 1.0, "c": 2.0, "d": 3.0}))
    with pytest.raises(QuotaExceeded) as e:
        store.admit("t3", "j", _points(1, metrics={"e": 1.0, "f": 2.0, "g": 3.0}))
    assert e.value.what == "metric names"
    store.close()


def test_usage_is_read_back_from_the_file_after_a_restart_and_after_thinning(tmp_path: Path) -> None:
    store = _store(tmp_path, max_points_per_namespace=100)
    store.add_points("t", "j", _points(80))
    store.close()
    store = _store(tmp_path, max_points_per_namespace=100)
    with pytest.raises(QuotaExceeded):
        store.admit("t", "j", _points(21))
    assert store.delete_job("t", "j")
    store.admit("t", "j", _points(100))  # room again
    store.close()


def test_the_api_answers_429_with_retry_after_over_a_quota(tmp_path: Path) -> None:
    store = _store(tmp_path, max_jobs_per_namespace=1)
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"t": frozenset({"*"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()), clock=lambda: NOW))
    c = TestClient(app)
    auth = {"Authorization": "Bearer t"}
    point = [{"step": 1, "loss": 0.5}]
    first = c.post("/v1/progress", json={"namespace": "a", "job": "one", "points": point}, headers=auth)
    assert first.status_code == 200
    r = c.post("/v1/progress", json={"namespace": "a", "job": "two", "points": point}, headers=auth)
    assert r.status_code == 429 and r.headers["retry-after"] == "3600"
    assert "quota of 1 jobs" in r.json()["error"]
    store.close()


def test_readyz_health_follows_a_write_probe_not_the_start_up_check(tmp_path: Path) -> None:
    """Finding 8: /readyz said ready while no write could succeed."""
    path = tmp_path / "p.sqlite"
    store = _store(tmp_path)
    assert store.probe_write() and store.health()["ok"] is True
    writable = store._db
    store._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
    assert not store.probe_write()
    health = store.health()
    assert health["ok"] is False and "cannot be written" in str(health["error"])
    store._db.close()
    store._db = writable
    assert store.probe_write() and store.health()["ok"] is True
    store.close()


def test_a_store_that_opens_but_cannot_be_written_refuses_to_start(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(_db: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(store_module, "_probe", read_only)
    with pytest.raises(StoreError) as e:
        _store(tmp_path)
    assert "readonly" in str(e.value) and str(tmp_path / "p.sqlite") in str(e.value)


def test_log_following_is_held_to_the_namespace_quotas(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An operator-configured source wrote past every quota before (only the API checked them)."""
    from extender.progress.log_follower import LogFollower, LogSourceSettings, Target

    store = _store(tmp_path, max_jobs_per_namespace=1)
    follower = LogFollower(lambda: [], store, None, LogSourceSettings())  # type: ignore[arg-type]
    target = Target(namespace="team-a", pod="p", uid="u", job="a", container="c", restarts=0, loss_regex=None)
    follower._sink(target, _points(3))
    with caplog.at_level("WARNING"):
        follower._sink(Target(**{**vars(target), "job": "b"}), _points(2))
        follower._sink(Target(**{**vars(target), "job": "c"}), _points(2))
    assert {j.job for j in store.jobs()} == {"a"}
    assert follower.quota_drops.dropped == {"team-a": 4}
    assert sum("over its quota of 1 jobs" in r.message for r in caplog.records) == 1  # once a minute
    store.close()


def test_the_quotas_are_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.progress.sources import build_progress_store
    from extender.settings import build_settings

    monkeypatch.setenv("FLOWSCHED_PROGRESS_QUOTA__MAX_JOBS_PER_NAMESPACE", "1")
    settings = build_settings(None, kube=False, progress_db=str(tmp_path / "p.sqlite"))
    store = build_progress_store(settings)
    store.admit("team-a", "a", _points(1))
    store.add_points("team-a", "a", _points(1))
    with pytest.raises(QuotaExceeded):
        store.admit("team-a", "b", _points(1))
    store.close()
