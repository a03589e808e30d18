"""The status page's rendering and data, /docs and /openapi.json, and the debug gate over them,
on the whole service without a cluster (real SQLite progress store, real ClusterState)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import Depends, HTTPException
from fastapi.testclient import TestClient

import extender.http.debug_gate
from extender.http.status_view import NodeRow, StatusPage, gather_status, job_phase_counts, thin_curve
from extender.http.ui_render import duration, gpu_cells, loss_curve_svg, render_status_page
from extender.service import Service, build_service
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from scoring.settings import TrackerSettings
from tests.k8s_factories import node, pod

TOKEN = "admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


LOOPBACK = ("127.0.0.1", 50000)  # /ui and /docs answer loopback peers only (debug_access)

def _service(tmp_path: Path, **kw: object) -> Service:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} *\n")
    return build_service(Settings(kube=False, progress_db=str(tmp_path / "p.sqlite"), progress_auth="static",
                                  static_tokens_file=str(tokens), **kw))  # type: ignore[arg-type]


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[tuple[TestClient, Service]]:
    s = _service(tmp_path, controllers=["migrator"])
    with TestClient(s.app, client=LOOPBACK) as client:
        yield client, s


# The service's clock is the real one, and points older than the store's idle window are rejected:
# the curves are stamped from T0, ten minutes ago.
T0 = time.time() - 600.0


def _curve(n: int, plateau: bool, t0: float = T0) -> list[dict[str, float]]:
    return [{"step": 10 * k, "loss": (0.3 + 2 * math.exp(-k / 6)) if plateau else 3.0 - 0.01 * k,
             "timestamp": t0 + 5.0 * k} for k in range(n)]


# ---- pure rendering ----

def test_duration_and_unknowns() -> None:
    assert [duration(x) for x in (None, float("nan"), -1.0, 45.2, 750.0, 11100.0)] == \
        ["?", "?", "?", "45s", "12m 30s", "3h 05m"]


def test_loss_curve_svg_scales_points_into_the_box() -> None:
    svg = loss_curve_svg([(0.0, 2.0), (50.0, 1.0), (100.0, 0.5)], width=200, height=100)
    pts = [tuple(map(float, p.split(","))) for p in re.search(r'points="([^"]+)"', svg).group(1).split()]  # type: ignore[union-attr]
    assert len(pts) == 3
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    assert xs == sorted(xs) and ys == sorted(ys)  # steps go right; the loss falls, so y (down) grows
    assert min(xs) >= 0 and max(xs) <= 200 and min(ys) >= 0 and max(ys) <= 100
    assert ">2<" in svg and ">0.5<" in svg  # the value range is written on the chart
    assert "no progress reported" in loss_curve_svg([])
    assert "<polyline" not in loss_curve_svg([(1.0, 1.0)])


def test_loss_curve_svg_has_no_nan_when_values_span_more_than_the_float_range() -> None:
    # Finite losses 1e308 and -1e308 (accepted by /v1/progress): y1 - y0 overflowed to inf and
    # (y1 - y) / inf drew "44.0,nan" into the polyline.
    pts = [(float(k), 1e308 if k % 2 else -1e308) for k in range(6)]
    svg = loss_curve_svg(pts, width=200, height=100)
    line = re.search(r'points="([^"]+)"', svg).group(1)  # type: ignore[union-attr]
    assert "nan" not in line and "inf" not in line
    coords = [tuple(map(float, p.split(","))) for p in line.split()]
    assert all(0 <= x <= 200 and 0 <= y <= 100 for x, y in coords)
    assert {y for _, y in coords} == {6.0, 82.0}  # top and bottom of the box
    same = loss_curve_svg([(0.0, 5e-324), (1.0, 5e-324), (2.0, 0.0)])  # tiny spans stay finite too
    assert "nan" not in same and "inf" not in same


def test_gpu_cells_show_unknown_as_unknown_not_zero() -> None:
    cells = gpu_cells([87.5, None, 0.0])
    assert 'data-util="87.5"' in cells and 'data-util="0"' in cells
    assert cells.count('class="gpu unknown"') == 1


def test_page_escapes_names_and_has_no_script_or_links() -> None:
    page = StatusPage(now=0.0, ready=True, jobs=[], queue=[], actions=[], nodes=[
        NodeRow(name="<b>evil</b>", ready=True, unschedulable=False, gpu_alloc=1, gpu_used=0, gpu_util=[None],
                telemetry="unknown", telemetry_age_s=None, pods=0)])
    text = render_status_page(page)
    assert "&lt;b&gt;evil&lt;/b&gt;" in text and "<b>evil</b>" not in text
    assert not re.search(r"<script|<link|src=|href=|https?://", text)


def test_thin_curve_keeps_ends_and_bounds_points() -> None:
    import numpy as np

    steps = np.arange(5000, dtype=np.int64)
    values = 1.0 / (1 + steps.astype(float))
    pts = thin_curve(steps, values, limit=200)
    assert len(pts) == 200 and pts[0] == (0.0, 1.0) and pts[-1][0] == 4999.0


# ---- the data and the page, through the service ----

def test_status_page_shows_nodes_jobs_queue_and_loops(svc: tuple[TestClient, Service]) -> None:
    client, s = svc
    st = s.state
    st.upsert_node(parse_node(node("n0", gpus=4)))
    st.upsert_node(parse_node(node("n1", gpus=2)))
    st.upsert_pod(parse_pod(pod("done-0", gpus=2, node_name="n0", phase="Running", namespace="a",
                                labels={"flowsched.io/job": "done"})))
    st.upsert_pod(parse_pod(pod("wait-0", gpus=4, namespace="a", labels={"flowsched.io/job": "wait"})))
    st.set_node_telemetry("n0", [90.0, 80.0, 0.0, 0.0], [1000.0] * 4, 2000.0)
    for job, plateau in (("done", True), ("fast", False)):
        r = client.post("/v1/progress", headers=AUTH, json={"namespace": "a", "job": job,
                                                             "points": _curve(120, plateau)})
        assert r.status_code == 200, r.text
    s.tracker.clock = lambda: T0 + 600.0
    assert s.tracker.refresh_once() == 2

    page = gather_status(st, s.store, TrackerSettings(), s.control, now=2001.0, stale_s=30.0)
    assert [n.name for n in page.nodes] == ["n0", "n1"]
    assert page.nodes[0].gpu_util == [90.0, 80.0, 0.0, 0.0] and page.nodes[0].telemetry == "fresh"
    assert page.nodes[1].gpu_util == [None, None] and page.nodes[1].telemetry == "unknown"
    jobs = {j.key: j for j in page.jobs}
    assert set(jobs) == {"a/done", "a/fast", "a/wait"}  # "fast" reported but has no pods: still shown
    assert jobs["a/done"].phase == "completing" and jobs["a/fast"].phase == "growing"
    assert jobs["a/done"].points == 120 and len(jobs["a/done"].curve) == 120
    assert jobs["a/wait"].phase == "unknown" and jobs["a/wait"].curve == ()
    # The page's prediction is exactly what /v1/jobs says.
    api = client.get("/v1/jobs/a/fast", headers=AUTH).json()
    assert jobs["a/fast"].remaining_s == api["remaining_seconds"]
    assert [q.key for q in page.queue] == ["a/wait-0"]
    assert set(page.loops) == {"migrator"}
    assert job_phase_counts(st) == {"completing": 1, "unknown": 1}

    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'data-node="n0"' in r.text and 'data-job="a/done"' in r.text and 'data-phase="completing"' in r.text
    assert 'data-pod="a/wait-0"' in r.text and "migrator: dry run" in r.text
    assert r.text.count("<polyline") == 2


def test_metrics_count_jobs_by_phase_and_budgets(svc: tuple[TestClient, Service]) -> None:
    client, s = svc
    s.state.upsert_pod(parse_pod(pod("x-0", gpus=1, namespace="a", labels={"flowsched.io/job": "x"})))
    text = client.get("/metrics").text
    assert 'flowsched_jobs{phase="unknown"} 1.0' in text
    assert 'flowsched_jobs{phase="growing"} 0.0' in text  # every phase present, 0 when empty
    assert 'flowsched_control_budget_left{loop="migrator",window="hour"} 6.0' in text


def test_status_page_says_when_the_progress_store_is_unreadable(svc: tuple[TestClient, Service]) -> None:
    client, s = svc
    s.store.close()
    r = client.get("/ui")
    assert r.status_code == 200
    assert "progress store unreadable" in r.text


# ---- /docs and /openapi.json ----

def test_openapi_documents_rest_debug_and_the_raw_verbs(tmp_path: Path) -> None:
    s = _service(tmp_path, url_prefix="/scheduler")
    with TestClient(s.app, client=LOOPBACK) as client:
        doc = client.get("/openapi.json").json()
        paths = doc["paths"]
        for p in ("/v1/progress", "/v1/jobs/{namespace}/{job}", "/debug/snapshot", "/debug/explain",
                  "/debug/control", "/ui", "/healthz"):
            assert p in paths, p
        schemas = doc["components"]["schemas"]
        for verb, (req, reply) in {"filter": ("ExtenderArgs", "ExtenderFilterResult"),
                                   "filter-ranked": ("ExtenderArgs", "ExtenderFilterResult"),
                                   "prioritize": ("ExtenderArgs", "HostPriorityList"),
                                   "preempt": ("ExtenderPreemptionArgs", "ExtenderPreemptionResult")}.items():
            op = paths[f"/scheduler/{verb}"]["post"]
            assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(req)
            assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(reply)
            assert req in schemas and reply in schemas
            # ...and the documented path is the one the raw handler really answers.
            assert client.post(f"/scheduler/{verb}", content=b"{").status_code == 400
        assert "FailedNodes" in schemas["ExtenderFilterResult"]["properties"]
        progress = paths["/v1/progress"]["post"]
        assert progress["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("ReportIn")
        assert progress["security"] == [{"bearer": []}]
        assert "points" in schemas["ReportIn"]["properties"]
        page = client.get("/docs")
        assert page.status_code == 200 and "swagger-ui" in page.text and "/openapi.json" in page.text


def test_docs_and_ui_follow_the_debug_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def deny() -> None:
        raise HTTPException(403, "debug endpoints need a debug credential")

    monkeypatch.setattr(extender.http.debug_gate, "debug_dependencies", lambda: [Depends(deny)])
    s = _service(tmp_path)
    with TestClient(s.app, client=LOOPBACK) as client:
        for path in ("/docs", "/openapi.json", "/ui"):
            assert client.get(path).status_code == 403, path
        assert client.get("/healthz").status_code == 200


def test_repeated_dry_run_plans_show_once_with_their_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry

    from extender.control.leader import AlwaysLeader
    from extender.control.loop import Action, ControlLoop, ControlMetrics
    from extender.http.status_view import _actions
    from scoring import kernel
    from scoring.actions import ControlAction, Evict
    from scoring.settings import CoreSettings
    from scoring.world import World
    from tests.control_fakes import OneLoop

    def plan_loop(loop: str, world: World, settings: Any, memory: Any, *_: Any, **__: Any) -> kernel.Plan:
        # The kernel's plan, replaced: the same eviction every round (the round around it is real).
        return kernel.Plan(loop, (Evict("a/slow", "n0", 1, 1.0, 1.0, (), (), f"planned at {world.now:.0f}"),),
                           memory)

    monkeypatch.setattr(kernel, "plan_loop", plan_loop)

    class Evictor:
        name = "migrator"

        def world(self, now: float) -> World:
            return World(now, (), (), ())

        def bind(self, action: ControlAction) -> Action:
            return Action(key="a/slow", kind="evict", target="a/slow-0", reason=action.reason, plan=action)

        def planned(self, plan: kernel.Plan) -> None:
            pass

        def act(self, action: Action, now: float) -> str:
            raise AssertionError("a dry run never acts")

    clock = iter([100.0 + k for k in range(100)])
    loop = ControlLoop(Evictor(), AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=1,
                       dry_run=True, per_interval=1, per_hour=10, clock=lambda: next(clock))
    rounds = OneLoop(loop, CoreSettings())
    for _ in range(3):
        rounds.run_once()
    rows = _actions([loop], limit=30)
    assert len(rows) == 1
    assert rows[0].repeats == 3 and rows[0].outcome == "dry_run" and rows[0].target == "a/slow-0"
    assert rows[0].reason == f"planned at {rows[0].at:.0f}"  # the newest tick's reason
    html_row = render_status_page(StatusPage(now=rows[0].at + 5, ready=True, nodes=[], jobs=[], queue=[],
                                             actions=rows))
    assert "(in 3 ticks)" in html_row and 'data-repeats="3"' in html_row
