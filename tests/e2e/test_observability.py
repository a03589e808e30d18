"""What an operator looks at, against the real control plane: the Grafana dashboard's queries
on a real Prometheus, and the /ui status page in headless Chromium.

One flowsched process for the module (a real `flowsched serve`), fed by kube-apiserver (nodes,
pods), by kube-scheduler calling its verbs (the module points the scheduler at it and back at
the session's flowsched after), by emulated dcgm-exporters through Prometheus (its telemetry
source), by progress reports over its REST API, and running the migrator loop in dry run.
The same Prometheus scrapes that flowsched and the exporters, as a cluster's Prometheus does.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from extender.http.ui_render import duration
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService, scheduling_through
from tests.cluster.kubeapi import Kube, pods_path
from tests.cluster.kubelet_emulator import STARTED_AGO, KubeletEmulator
from tests.cluster.procs import wait_until
from tests.cluster.scenario import CHECKPOINTABLE, Scenario, gpu_pod
from tests.headless_chromium import dump_dom, screenshot
from tests.prometheus_harness import PrometheusServer, prometheus_binary

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "flowsched-dashboard.json"
JOB_LABEL = "flowsched.io/job"
# Nodes with an emulated dcgm-exporter, and their GPU counts; the spare nodes have none, so the
# page must show their telemetry as unknown.
WATCHED = {"obs-a": 4, "obs-b": 4, "obs-c": 2}
SPARE = ("obs-d", "obs-e")
RATE_WINDOW = "20s"  # what the test puts for Grafana's $__rate_interval (scrapes are 1 s apart)


@dataclass
class Observed:
    svc: FlowschedService
    prometheus: PrometheusServer
    exporters: dict[str, DcgmExporterEmulator]
    scenario: Scenario
    token: str
    util: dict[str, list[float]]  # what the exporters report, per node and GPU


def flattening_curve(now: float, n: int = 120, dt: float = 3.0) -> list[dict[str, Any]]:
    return [{"step": k * 10, "loss": 0.2 + math.exp(-k / 8.0), "timestamp": now - (n - 1 - k) * dt}
            for k in range(n)]


def falling_curve(now: float, n: int = 120, dt: float = 3.0) -> list[dict[str, Any]]:
    return [{"step": k * 10, "loss": 3.0 - 0.02 * k, "timestamp": now - (n - 1 - k) * dt} for k in range(n)]


def _pod_on(s: Scenario, name: str, node: str, gpus: int, job: str, checkpointable: bool = False) -> None:
    ann = {STARTED_AGO: "3600"}
    if checkpointable:
        ann[CHECKPOINTABLE] = "true"
    body = gpu_pod(name, gpus=gpus, annotations=ann, labels={JOB_LABEL: job})
    body["spec"]["nodeName"] = node  # the starting layout is the test's
    s.kube.create(pods_path(s.ns), body)


@pytest.fixture(scope="module")
def observed(control_plane: ControlPlane, deploy_rbac: None, kube: Kube, emulator: KubeletEmulator,
             flowsched: FlowschedService, scheduler: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("observability")
    token = secrets.token_hex(16)
    (work / "tokens").write_text(f"{token} *\n")
    exporters = {n: DcgmExporterEmulator(n, gpus=g).serve() for n, g in WATCHED.items()}
    svc = FlowschedService(work, control_plane.kubeconfigs["flowsched"])  # its port is known from here on
    prom = PrometheusServer(prometheus_binary(), work / "prom", [(em.address, {}) for em in exporters.values()],
                            other_jobs={"flowsched": [(f"127.0.0.1:{svc.api_port}", {})]})
    cfg = work / "flowsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "progress_auth": "static", "static_tokens_file": str(work / "tokens"),
        "progress_db": str(work / "progress.sqlite"),
        "convergence": {"window_s": 30, "interval_s": 0.5},
        "telemetry_stale_s": 10.0,
        "telemetry": {"source": "prometheus", "prometheus_url": prom.url, "node_label": "Hostname",
                      "refresh_s": 0.5, "range_s": 3.0, "query_timeout_s": 1.0},
        "controllers": ["migrator"],
        "control": {"dry_run": True, "lease_name": f"e2e-observability-{uuid.uuid4().hex[:6]}",
                    "identity": "observability", "lease_duration_s": 4, "renew_deadline_s": 3,
                    "retry_period_s": 0.5},
        "migrator": {"interval_s": 1, "min_runtime_s": 600, "max_per_interval": 1, "max_per_hour": 10},
    }))
    svc.extra_args = ["--config", str(cfg)]
    s: Scenario | None = None
    try:
        prom.start()
        svc.start()
        with scheduling_through(control_plane, svc, back_to=flowsched):
            s = Scenario(kube, emulator, svc)
            util = _populate(s, exporters, token)
            yield Observed(svc, prom, exporters, s, token, util)
    finally:
        if s is not None:
            s.cleanup()
        svc.close()
        prom.stop()
        for em in exporters.values():
            em.stop()


def _populate(s: Scenario, exporters: dict[str, DcgmExporterEmulator], token: str) -> dict[str, list[float]]:
    # First two 1-GPU nodes and a pod kube-scheduler places through flowsched's filter and
    # prioritize (two feasible nodes, so it scores them).
    s.add_nodes(*SPARE, gpus=1)
    s.create_pod("fits-0", gpus=1, labels={JOB_LABEL: "fits"})
    s.wait_running("fits-0", 30)
    for n, g in WATCHED.items():
        s.add_nodes(n, gpus=g)
    _pod_on(s, "slow-0", "obs-a", 2, "slow", checkpointable=True)  # flattened: the migrator's candidate
    _pod_on(s, "learn-0", "obs-b", 4, "learn")  # still learning
    s.wait_running("slow-0")
    s.wait_running("learn-0")
    exporters["obs-a"].run_pod(s.ns, "slow-0", gpus=2, util_pct=41, fb_used_mib=20000)
    exporters["obs-b"].run_pod(s.ns, "learn-0", gpus=4, util_pct=97, fb_used_mib=70000)
    exporters["obs-c"].set_gpu(1, 12, 1000)  # load from outside Kubernetes
    now = time.time()
    for job, points in (("slow", flattening_curve(now)), ("learn", falling_curve(now))):
        r = s.flowsched.http.post("/v1/progress", json={"namespace": s.ns, "job": job, "points": points},
                                  headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["accepted"] == len(points), r.text
    s.create_pod("big-0", gpus=4, labels={JOB_LABEL: "big"})  # fits nowhere: it waits
    # One malformed call, as a broken client would send: the rejected-requests panel has data.
    assert s.flowsched.verbs_http.post("/filter", content=b"{not json").status_code == 400
    util = {"obs-a": [41.0] * 2 + [0.0] * 2, "obs-b": [97.0] * 4, "obs-c": [0.0, 12.0]}
    s.wait_snapshot(lambda snap: all(snap["nodes"].get(n, {}).get("gpu_util", [])[:len(u)] == u
                                     for n, u in util.items())
                    and snap["jobs"].get(f"{s.ns}/slow", {}).get("phase") == "completing"
                    and snap["jobs"].get(f"{s.ns}/learn", {}).get("phase") == "growing",
                    "telemetry for the watched nodes and both jobs' phases", timeout_s=45)
    return util


# ---- the dashboard ----

def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' nested panels included."""
    dash = json.loads(DASHBOARD.read_text())
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(dash["panels"])
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (flowsched_* and DCGM_* are all this dashboard uses)."""
    return set(re.findall(r"\b(flowsched_[a-z_]+|DCGM_FI_[A-Z_]+)\b", expr))


def exported_names(text: str) -> set[str]:
    """Series names a /metrics page can produce: every TYPE'd family with its suffixes."""
    names: set[str] = set()
    for m in re.finditer(r"^# TYPE (\S+) (\w+)", text, re.M):
        base, kind = m.groups()
        names.add(base)
        names.update({"counter": [f"{base}_total", f"{base}_created"],
                      "histogram": [f"{base}_bucket", f"{base}_sum", f"{base}_count", f"{base}_created"]}
                     .get(kind, []))
    return names


def test_every_dashboard_query_names_exported_metrics(observed: Observed) -> None:
    exported = exported_names(observed.svc.http.get("/metrics").text)
    for em in observed.exporters.values():
        exported |= exported_names(httpx.get(f"http://{em.address}/metrics", timeout=5).text)
    queries = dashboard_queries()
    assert len(queries) >= 15
    unknown = {(title, name) for title, expr in queries for name in metric_names(expr) if name not in exported}
    assert not unknown, f"dashboard panels read metrics nobody exports: {sorted(unknown)}"


def test_every_dashboard_query_returns_series(observed: Observed) -> None:
    queries = [(t, e.replace("$__rate_interval", RATE_WINDOW)) for t, e in dashboard_queries()]
    results: dict[str, list[dict[str, Any]]] = {}

    def all_answer() -> bool:
        for _, expr in queries:
            if not results.get(expr):
                results[expr] = observed.prometheus.query(expr)
        return all(results[e] for _, e in queries)

    try:
        wait_until(all_answer, 60, interval_s=1.0, what="every dashboard query to return series")
    except TimeoutError as e:
        empty = [f"{t}: {q}" for t, q in queries if not results.get(q)]
        raise AssertionError(f"{e}; empty: {empty}") from e

    def by(expr_part: str, label: str) -> dict[str, float]:
        expr = next(e for _, e in queries if expr_part in e)
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in results[expr]}  # type: ignore[index]

    # The figures behind the panels are the cluster's, not just "some series".
    assert by("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "Hostname") == {"obs-a": 20.5, "obs-b": 97.0, "obs-c": 6.0}
    phases = by("sum by (phase) (flowsched_jobs)", "phase")
    assert phases["completing"] >= 1 and phases["growing"] >= 1, phases
    budgets = by("flowsched_control_budget_left", "window")
    assert budgets["hour"] <= 10 and budgets["interval"] <= 1, budgets
    verbs = by("histogram_quantile(0.99", "verb")
    assert "filter" in verbs, verbs


# ---- the status page ----

class _Page(HTMLParser):
    """The elements the page marks with data-* attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, dict[str, str]] = {}
        self.gpus: dict[str, list[str | None]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.queued: list[str] = []
        self.actions: list[dict[str, str]] = []
        self.external: list[str] = []
        self._node: str | None = None
        self._job: str | None = None
        self._in_remaining = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for k in ("src", "href"):
            if k in a:
                self.external.append(a[k])
        if tag == "script":
            self.external.append("<script>")
        cls = a.get("class", "").split()
        if tag == "tr" and "node" in cls:
            self._node = a["data-node"]
            self.nodes[self._node] = a
            self.gpus[self._node] = []
        elif "gpu" in cls and self._node is not None:
            self.gpus[self._node].append(a.get("data-util"))
        elif tag == "section" and "job" in cls:
            self._job = a["data-job"]
            self.jobs[self._job] = {"phase": a["data-phase"], "curve_points": 0, "remaining": ""}
        elif tag == "polyline" and self._job is not None:
            self.jobs[self._job]["curve_points"] = len(a.get("points", "").split())
        elif tag == "b" and "remaining" in cls:
            self._in_remaining = True
        elif tag == "tr" and "queued" in cls:
            self.queued.append(a["data-pod"])
        elif tag == "tr" and "action" in cls:
            self.actions.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._node = None
        elif tag == "section":
            self._job = None
        elif tag == "b":
            self._in_remaining = False

    def handle_data(self, data: str) -> None:
        if self._in_remaining and self._job is not None:
            self.jobs[self._job]["remaining"] += data


def test_status_page_in_headless_chromium(observed: Observed, tmp_path: Path) -> None:
    s, url = observed.scenario, f"{observed.svc.url}/ui"
    # The migrator (dry run) plans moving the flattened job so the waiting 4-GPU pod fits.
    wait_until(lambda: any(t["actions"] for t in observed.svc.http.get("/debug/migrations").json()["recent"]),
               30, interval_s=0.5, what="the migrator's first planned action")
    shot = screenshot(url, tmp_path / "flowsched-ui.png")
    print(f"status page screenshot: {shot}")  # kept with pytest's tmp dirs (see -rP / --basetemp)
    page = _Page()
    page.feed(dump_dom(url))

    assert page.external == [], f"the page loads things from elsewhere: {page.external}"
    assert set(page.nodes) == set(WATCHED) | set(SPARE)
    for node, util in observed.util.items():
        assert page.nodes[node]["data-telemetry"] == "fresh"
        assert [float(u) for u in page.gpus[node] if u is not None] == util, node
    for node in SPARE:  # no exporter: unknown, shown as such, never as 0 %
        assert page.nodes[node]["data-telemetry"] == "unknown"
        assert page.gpus[node] == [None]
    slow, learn = page.jobs[f"{s.ns}/slow"], page.jobs[f"{s.ns}/learn"]
    assert slow["phase"] == "completing" and learn["phase"] == "growing"
    for job in (slow, learn):
        assert job["curve_points"] >= 100  # 120 reported points, drawn (thinned to at most 200)
    for name, job in (("slow", slow), ("learn", learn)):  # the page's prediction is /v1/jobs' one
        api = s.flowsched.http.get(f"/v1/jobs/{s.ns}/{name}", headers={"Authorization": f"Bearer {observed.token}"})
        assert job["remaining"] == duration(api.json()["remaining_seconds"]), (name, api.json())
    assert f"{s.ns}/big-0" in page.queued
    planned = [a for a in page.actions if a["data-loop"] == "migrator" and a["data-outcome"] == "dry_run"]
    assert len(planned) == 1, page.actions  # re-planned every tick, shown once with its count
    assert int(planned[0]["data-repeats"]) >= 1
