"""Issue 18: one regression test (at least) per numbered finding, in-process.

The server-level findings (timeouts, connection cap, SIGTERM) are in test_slow_clients.py;
the fuzz suite is test_fuzz_api.py.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.cli import main as cli_main
from extender.http.app import build_app
from extender.http.auth import AuthError, ReviewLimits, ReviewResult, StaticTokenAuthenticator, TokenReviewAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.metrics import build_metrics
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings, StoreError
from extender.service import build_service
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState, StateView
from tests.k8s_factories import node, pod

NOW = 1_000_000.0
LOOPBACK = ("127.0.0.1", 50000)
REMOTE = ("10.1.2.3", 50000)


def cluster() -> ClusterState:
    s = ClusterState()
    for name, gpus in [("n0", 4), ("n1", 4), ("n2", 8)]:
        s.upsert_node(parse_node(node(name, gpus=gpus)))
    s.upsert_pod(parse_pod(pod("busy", gpus=3, node_name="n1", phase="Running")))
    s.mark_synced()
    return s


def app_for(state: ClusterState, **settings: Any) -> Any:
    return build_app(Settings(kube=False, **settings), state, build_metrics(), clock=lambda: NOW)


def names_args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


# ---- 1: debug endpoints ----

def test_1_debug_endpoints_refuse_remote_peers_by_default() -> None:
    app = app_for(cluster())
    remote, local = TestClient(app, client=REMOTE), TestClient(app, client=LOOPBACK)
    for path in ("/debug/snapshot", "/debug/explain?pod=default/busy", "/debug/status"):
        r = remote.get(path)
        assert r.status_code == 403 and "loopback" in r.json()["error"], path
        assert local.get(path).status_code == 200, path
    assert remote.post("/filter", json=names_args(pod("p"), ["n0"])).status_code == 200  # verbs unaffected
    opened = TestClient(app_for(cluster(), debug_access="open"), client=REMOTE)
    assert opened.get("/debug/snapshot").status_code == 200


def test_1_status_page_and_api_docs_sit_behind_the_same_gate(tmp_path: Path) -> None:
    svc = build_service(Settings(kube=False, progress_db=str(tmp_path / "p.sqlite")))
    remote, local = TestClient(svc.app, client=REMOTE), TestClient(svc.app, client=LOOPBACK)
    for path in ("/ui", "/docs", "/openapi.json", "/debug/control"):
        assert remote.get(path).status_code == 403, path
        assert local.get(path).status_code == 200, path
    assert remote.get("/healthz").status_code == 200
    svc.store.close()


def test_1_debug_snapshot_is_filtered_and_paged() -> None:
    state = cluster()
    for i in range(7):
        state.upsert_pod(parse_pod(pod(f"w{i}", gpus=0, node_name="n2", namespace="team", phase="Running")))
    c = TestClient(app_for(state), client=LOOPBACK)
    seen: list[str] = []
    after = ""
    while True:
        r = c.get("/debug/snapshot", params={"kind": "pods", "namespace": "team", "limit": 3, "after": after})
        assert r.status_code == 200
        body = r.json()
        assert len(body["pods"]) <= 3 and "nodes" not in body
        seen += list(body["pods"])
        after = body["more"].get("pods", "")
        if not after:
            break
    assert seen == sorted(f"team/w{i}" for i in range(7))
    by_node = c.get("/debug/snapshot", params={"node": "n1"}).json()
    assert list(by_node["nodes"]) == ["n1"] and list(by_node["pods"]) == ["default/busy"]
    assert c.get("/debug/snapshot", params={"limit": 100_000}).status_code == 400
    ex = c.get("/debug/explain", params={"pod": "default/busy", "limit": 2}).json()
    assert len(ex["nodes"]) == 2 and ex["more"] == "n1"


class BlockingState(ClusterState):
    """`ready` blocks until released: the debug snapshot reads it first."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.block = False
        self.forced = False  # set when the watchdog had to release the gate: the loop was blocked

    def watchdog(self, after_s: float = 5.0) -> None:
        def run() -> None:
            if not self.gate.wait(after_s):
                self.forced = True
                self.gate.set()
        threading.Thread(target=run, daemon=True).start()

    def read(self) -> Any:
        return _BlockingView(self, super().read())


class _BlockingView:
    """The state's view, but `ready` blocks while the state says block."""

    def __init__(self, owner: BlockingState, inner: StateView) -> None:
        self.owner, self.inner = owner, inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def ready(self) -> bool:
        if self.owner.block:
            self.owner.entered.set()
            self.owner.gate.wait(30)
        return True


def _blocking_state() -> BlockingState:
    s = BlockingState()
    for name in ("n0", "n1"):
        s.upsert_node(parse_node(node(name)))
    s.mark_synced()
    return s


def test_1_debug_snapshot_is_built_off_the_event_loop() -> None:
    state = _blocking_state()
    app = app_for(state)

    async def go() -> None:
        transport = httpx.ASGITransport(app=app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            state.block = True
            state.watchdog()
            debug = asyncio.create_task(c.get("/debug/snapshot"))
            await asyncio.to_thread(state.entered.wait, 10)
            # The snapshot is stuck in its thread; the verbs must still be answered meanwhile.
            r = await c.post("/filter", json=names_args(pod("p"), ["n0", "n1"]))
            assert r.status_code == 200
            state.gate.set()
            assert (await debug).status_code == 200

    asyncio.run(go())
    assert not state.forced, "the snapshot blocked the event loop until the watchdog released it"


def test_1_readyz_shows_no_error_texts() -> None:
    secret = "Get https://10.0.0.1:6443/api/v1/pods: connection refused"
    status = {"watch": {"pods": {"connected": False, "errors": 3, "relists": 1, "last_error": secret}},
              "kube": True, "telemetry": {"source": "prometheus", "url": "http://prom:9090"}}
    app = build_app(Settings(kube=False), cluster(), build_metrics(), status=lambda: status)
    r = TestClient(app, client=REMOTE).get("/readyz")
    assert "6443" not in r.text and "prom:9090" not in r.text
    assert r.json()["watch"]["pods"] == {"connected": False, "errors": 3, "relists": 1}
    assert "6443" in TestClient(app, client=LOOPBACK).get("/debug/status").text  # still there for operators


# ---- 2: body limit and concurrency cap ----

def test_2_default_body_limit_fits_names_mode_at_10000_nodes_and_no_more() -> None:
    settings = Settings(kube=False)
    assert settings.verb_max_body_bytes <= 4 * 1024 * 1024
    state = cluster()
    c = TestClient(build_app(settings, state, build_metrics(), clock=lambda: NOW))
    names = [f"node-{i:05d}-" + "x" * 240 for i in range(10_000)]  # 253 characters, the longest a name can be
    body = orjson.dumps(names_args(pod("p"), names))
    assert len(body) > 2_500_000
    assert c.post("/filter", content=body).status_code == 200
    big = orjson.dumps(names_args(pod("p"), [*names, *names]))
    assert c.post("/filter", content=big).status_code == 413
    full = Settings(kube=False, full_node_mode=True)
    assert full.verb_max_body_bytes == 64 * 1024 * 1024


def test_2_requests_over_the_concurrency_cap_get_503_but_probes_do_not() -> None:
    state = _blocking_state()
    app = app_for(state, max_concurrent_requests=1)

    async def go() -> None:
        transport = httpx.ASGITransport(app=app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            state.block = True
            held = asyncio.create_task(c.get("/debug/snapshot"))
            await asyncio.to_thread(state.entered.wait, 10)
            r = await c.post("/filter", json=names_args(pod("p"), ["n0"]))
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert (await c.get("/healthz")).status_code == 200
            state.gate.set()
            await held
            assert (await c.post("/filter", json=names_args(pod("p"), ["n0"]))).status_code == 200

    asyncio.run(go())


# ---- 3: acknowledged progress is never lost silently ----

def test_3_an_empty_progress_db_path_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="empty"):
        ProgressStore(ProgressStoreSettings(path=""))
    with pytest.raises(StoreError, match="empty"):
        build_service(Settings(kube=False, progress_db=""))


def test_3_memory_store_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        store = ProgressStore(ProgressStoreSettings(path=":memory:"))
    assert "lost on every restart" in caplog.text
    assert store.health()["durable"] is False
    store.close()


def _pt(step: int) -> list[ProgressPoint]:
    return [ProgressPoint(step=step, value=1.0, timestamp=1000.0 + step)]


def test_3_points_acknowledged_after_the_db_was_deleted_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    store = ProgressStore(ProgressStoreSettings(path=str(path)))
    assert store.add_points("ns", "job", _pt(1)) == 1
    for f in tmp_path.glob("p.sqlite*"):
        f.unlink()
    assert store.add_points("ns", "job", _pt(2)) == 1  # acknowledged ...
    store.close()
    again = ProgressStore(ProgressStoreSettings(path=str(path)))
    history = again.history("ns", "job")
    assert history is not None and history.steps.tolist() == [2]  # ... and still there after a restart
    again.close()
    assert store.reopened == 1


def test_3_readyz_is_503_when_the_store_cannot_be_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    svc = build_service(Settings(kube=False, progress_db=str(data / "p.sqlite")))
    c = TestClient(svc.app, client=LOOPBACK)
    svc.state.mark_synced()
    assert c.get("/readyz").status_code == 200
    for f in data.iterdir():
        f.unlink()
    data.rmdir()
    data.write_text("not a directory")  # the store cannot be re-created
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["progress_store"]["ok"] is False
    with pytest.raises(sqlite3.Error):
        svc.store.add_points("ns", "job", _pt(1))
    svc.store.close()


# ---- 6: TokenReview ----

class SlowReviewer:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, token: str) -> ReviewResult:
        self.calls += 1
        if token != "good":
            self.release.wait(30)
            return ReviewResult(authenticated=False, username="", error="unknown")
        return ReviewResult(authenticated=True, username="system:serviceaccount:team-a:trainer")


def test_6_slow_token_reviews_never_delay_a_cached_callers_store_write(tmp_path: Path) -> None:
    reviewer = SlowReviewer()
    auth = TokenReviewAuthenticator(reviewer, ReviewLimits(timeout_s=20.0, max_pending=100, rate_per_s=1000))
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    app = FastAPI()
    app.include_router(build_progress_router(store, auth, ProgressApiSettings(),
                                             ProgressApiMetrics.build(CollectorRegistry())))
    body = {"namespace": "team-a", "job": "j", "points": [{"step": 1, "loss": 0.5}]}

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            good = {"Authorization": "Bearer good"}
            assert (await c.post("/v1/progress", json=body, headers=good)).status_code == 200  # now cached
            # More slow reviews than asyncio's default pool has threads (at most 32).
            slow = [asyncio.create_task(c.post("/v1/progress", json=body, headers={"Authorization": f"Bearer x{i}"}))
                    for i in range(40)]
            await asyncio.sleep(0.2)
            r = await asyncio.wait_for(c.post("/v1/progress", json=body, headers=good), 10)
            assert r.status_code == 200
            reviewer.release.set()
            assert {(await t).status_code for t in slow} <= {401, 503}

    asyncio.run(go())
    store.close()


def test_6_token_reviews_time_out_are_rate_limited_and_rejections_cached() -> None:
    reviewer = SlowReviewer()
    now = [0.0]
    auth = TokenReviewAuthenticator(reviewer, ReviewLimits(timeout_s=0.2, rate_per_s=1.0, negative_ttl_s=10.0),
                                    clock=lambda: now[0])

    async def go() -> None:
        with pytest.raises(AuthError) as e:
            await auth.authenticate("slow")
        assert e.value.status == 503 and "timed out" in e.value.message
        reviewer.release.set()
        await asyncio.sleep(0.05)
        now[0] = 1.0
        with pytest.raises(AuthError) as e:
            await auth.authenticate("bad-1")
        assert e.value.status == 401
        calls = reviewer.calls
        for _ in range(5):  # remembered: no new review
            with pytest.raises(AuthError):
                await auth.authenticate("bad-1")
        assert reviewer.calls == calls
        results = []
        for i in range(10):  # burst is 2 x rate_per_s = 2; the clock does not move
            try:
                await auth.authenticate(f"other-{i}")
            except AuthError as err:
                results.append(err.status)
        assert results.count(503) >= 8

    asyncio.run(go())


# ---- 7: preempt with a non-object metadata ----

def test_7_preempt_full_form_with_bad_metadata_is_400_not_500() -> None:
    c = TestClient(app_for(cluster()))
    body = b'{"Pod":{"metadata":{"name":"p"}},"NodeNameToVictims":{"node-0001":{"Pods":[{"metadata":"x"}]}}}'
    r = c.post("/preempt", content=body)
    assert r.status_code == 400 and "metadata.uid" in r.json()["error"]


# ---- 8: lone surrogates in the progress API ----

@pytest.fixture
def progress_client(tmp_path: Path) -> Iterator[TestClient]:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"t": frozenset({"*"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()), clock=lambda: NOW))
    yield TestClient(app)
    store.close()


def test_8_a_lone_surrogate_in_a_metric_name_or_pod_is_400(progress_client: TestClient) -> None:
    hdr = {"Authorization": "Bearer t", "Content-Type": "application/json"}
    metric = b'{"namespace":"a","job":"j","points":[{"step":1,"loss":0.5,"metrics":{"\\udc00":1}}]}'
    r = progress_client.post("/v1/progress", content=metric, headers=hdr)
    assert r.status_code == 400 and r.json()["error"].startswith("points.0.metrics")
    pod_name = b'{"namespace":"a","job":"j","pod":"\\ud800x","points":[{"step":1,"loss":0.5}]}'
    assert progress_client.post("/v1/progress", content=pod_name, headers=hdr).status_code == 400


# ---- 9: client text in the log is bounded ----

def test_9_unknown_node_names_are_logged_truncated(caplog: pytest.LogCaptureFixture) -> None:
    c = TestClient(app_for(cluster(), max_body_bytes=8 * 1024 * 1024))
    names = [f"{i}" + "y" * 1_000_000 for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="flowsched.extender"):
        assert c.post("/prioritize", json=names_args(pod("p"), names)).status_code == 200
    logged = sum(len(r.getMessage()) for r in caplog.records)
    assert 0 < logged < 2_000


# ---- 10: the filter->prioritize memo must not serve another pod's scores ----

def test_10_memo_is_keyed_by_the_pod_content_not_only_uid_and_version() -> None:
    c = TestClient(app_for(cluster()))
    plain = pod("p", gpus=1, uid="u1")
    plain["metadata"]["resourceVersion"] = "7"
    moved = orjson.loads(orjson.dumps(plain))
    moved["metadata"]["annotations"] = {"flowsched.io/migrated-from": "n0"}
    names = ["n0", "n2"]
    fresh = c.post("/prioritize", json=names_args(plain, names)).json()
    assert c.post("/filter", json=names_args(moved, names)).status_code == 200  # memo holds moved's scores
    after = c.post("/prioritize", json=names_args(plain, names)).json()
    assert after == fresh
    penalised = c.post("/prioritize", json=names_args(moved, names)).json()
    assert penalised != fresh  # the annotation does change the scores: the test can tell


# ---- 11: overflowing requests are a client error, not a pass-all fallback ----

def test_11_gpu_request_overflowing_to_infinity_is_400() -> None:
    c = TestClient(app_for(cluster()))
    p = pod("p", gpus=1)
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1e308"
    p["spec"]["overhead"] = {"nvidia.com/gpu": "1e308"}
    r = c.post("/filter", json=names_args(p, ["n0", "n1", "n2"]))
    assert r.status_code == 400 and "overflow" in r.json()["error"]


# ---- 12: far-future timestamps ----

def test_12_a_far_future_timestamp_is_rejected_so_jobs_still_expire(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"t": frozenset({"*"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()), clock=lambda: NOW))
    c = TestClient(app)
    body = {"namespace": "a", "job": "j", "points": [{"step": 1, "loss": 0.5, "timestamp": 1e308},
                                                      {"step": 2, "loss": 0.4, "timestamp": NOW - 10}]}
    r = c.post("/v1/progress", json=body, headers={"Authorization": "Bearer t"})
    assert {k: r.json()[k] for k in ("accepted", "rejected", "reasons")} == \
        {"accepted": 1, "rejected": 1, "reasons": {"timestamp_future": 1}}
    assert store.prune(NOW + 8 * 86400.0) == 1  # idle past max_idle_s: gone
    store.close()


def test_12_a_timestamp_older_than_the_idle_window_is_rejected_not_pruned_later(tmp_path: Path) -> None:
    # Seconds since the job's start sent as timestamps: accepted, then the hourly prune deleted the
    # job's whole history. Such points are rejected per point, as far-future ones are.
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite"), max_idle_s=86400.0))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"t": frozenset({"*"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()), clock=lambda: NOW))
    c = TestClient(app)
    auth = {"Authorization": "Bearer t"}
    old = {"namespace": "a", "job": "j", "points": [{"step": 100 * i, "loss": 1.0 / (i + 1), "timestamp": 30.0 * i}
                                                    for i in range(20)]}
    r = c.post("/v1/progress", json=old, headers=auth)
    assert r.status_code == 200
    assert r.json() == {"accepted": 0, "rejected": 20, "reasons": {"timestamp_stale": 20}, "plan": None}
    mixed = {"namespace": "a", "job": "j", "points": [
        {"step": 1, "loss": 0.5, "timestamp": NOW - 86400.0 - 1},  # just past the window
        {"step": 2, "loss": 0.4, "timestamp": NOW - 86400.0},  # exactly at it: prune keeps it
        {"step": 3, "loss": 0.3}]}  # no timestamp: the time received
    r = c.post("/v1/progress", json=mixed, headers=auth)
    assert r.json() == {"accepted": 2, "rejected": 1, "reasons": {"timestamp_stale": 1}, "plan": None}
    assert store.prune(NOW) == 0  # what was acknowledged survives the prune
    assert c.get("/v1/jobs/a/j", headers=auth).json()["points"] == 2
    store.close()


# ---- 13: store failures at start-up name the file and the cause ----

def test_13_store_open_failures_name_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    not_db = tmp_path / "garbage.sqlite"
    not_db.write_bytes(b"this is not a database" * 100)
    a_dir = tmp_path / "adir"
    a_dir.mkdir()
    for path in (blocker / "p.sqlite", not_db, a_dir):
        with pytest.raises(StoreError) as e:
            ProgressStore(ProgressStoreSettings(path=str(path)))
        assert str(path) in str(e.value)


def test_13_cli_reports_a_bad_store_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    not_db = tmp_path / "garbage.sqlite"
    not_db.write_bytes(b"this is not a database" * 100)
    monkeypatch.setenv("FLOWSCHED_PROGRESS_DB", str(not_db))
    assert cli_main(["serve", "--no-kube", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert str(not_db) in err and "Traceback" not in err


def test_13_a_full_disk_is_reported_as_full_not_as_a_rollback_error(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    store._db.execute("PRAGMA max_page_count=8")  # a full disk, for SQLite's purposes
    many = [ProgressPoint(step=i, value=1.0, timestamp=1000.0 + i, pod="x" * 200) for i in range(3000)]
    with pytest.raises(sqlite3.Error) as e:
        store.add_points("ns", "job", many)
    assert "full" in str(e.value) and "rollback" not in str(e.value)
    store.close()


def test_deploy_matches_the_server_limits() -> None:
    import yaml

    docs = list(yaml.safe_load_all((Path(__file__).parents[3] / "deploy" / "base" / "flowsched.yaml").read_text()))
    spec = next(d for d in docs if d and d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]
    sleep_s = int(pre_stop["sleep"]["seconds"]) if "sleep" in pre_stop else 0
    grace = int(spec["terminationGracePeriodSeconds"])
    assert grace >= sleep_s + Settings().shutdown_timeout_s + 5  # preStop, then bounded shutdown, then slack


def test_migrate_help_says_it_is_serve_with_the_migrator(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["migrate", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("flowsched migrate [flags]: flowsched serve with the migrator loop on")
    assert "--controllers" in out and "usage: flowsched serve" in out
