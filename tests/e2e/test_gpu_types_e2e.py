"""Mixed GPU generations on the real control plane (docs/gpu-types.md, DESIGN §10): two node pools
whose nodes GPU feature discovery labelled with different nvidia.com/gpu.product, and the real
kube-scheduler consulting a flowsched whose filter keeps each job on one GPU type.

- Two jobs whose speed-ups from the faster GPU differ (a vision model gains ~6.6x from a V100 over
  a K80 by Gavel's measurements; a recommendation model runs faster on the K80) each land on the
  pool where it gains most, even when the one that gains less arrives first.
- A job reports its progress on the K80: its step time there is learned and shown per type in
  GET /v1/jobs (measured there, the prior elsewhere).
- A third (vision) job finds the V100 pool full: a K80 would give it under min_share of its
  speed, so it waits for a V100, and past fallback_s too (after the bound a job takes only the
  types within min_share of its fastest; in the typed demo a job that took K80s at 0.14 of its
  speed held them for 613,713 s); it binds to the V100 as soon as the job there is deleted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService, own_flowsched
from tests.cluster.kubeapi import Kube
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario

pytestmark = pytest.mark.cluster

TOKEN = "e2e-gpu-types-token"
PRODUCT = "nvidia.com/gpu.product"
V100 = "Tesla-V100-SXM2-16GB"
K80 = "Tesla-K80"
FALLBACK_S = 20.0  # gpu_types.fallback_s here (600 s by default)


@pytest.fixture(scope="module")
def typed_flowsched(control_plane: ControlPlane, deploy_rbac: None, kube: Kube, flowsched: FlowschedService,
                    scheduler: Path) -> Iterator[FlowschedService]:
    """A flowsched with a short fallback, and kube-scheduler pointed at it (then back)."""
    work = control_plane.workdir / "flowsched-gpu-types"
    work.mkdir(exist_ok=True)
    (work / "tokens").write_text(f"{TOKEN} *\n")
    cfg = work / "flowsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "progress_auth": "static", "static_tokens_file": str(work / "tokens"),
        "progress_db": str(work / "progress.sqlite"),
        "convergence": {"interval_s": 0.5, "window_s": 30.0},
        "gpu_types": {"fallback_s": FALLBACK_S, "refresh_s": 0.5},
    }))
    with own_flowsched(control_plane, cfg, back_to=flowsched) as svc:
        yield svc


@pytest.fixture
def ts(kube: Kube, emulator: KubeletEmulator, typed_flowsched: FlowschedService) -> Iterator[Scenario]:
    with Scenario(kube, emulator, typed_flowsched) as s:
        yield s


def job_pod(s: Scenario, name: str, model_class: str) -> None:
    """One 4-GPU pod: a whole node of either pool."""
    s.create_pod(name, gpus=4, labels={"flowsched.io/job": name},
                 annotations={"flowsched.io/model-class": model_class})


def post_steps(s: Scenario, job: str, step_s: float, n: int = 60) -> None:
    """What the job's reporting client posts: one point per step, `step_s` apart, ending now."""
    now = time.time()
    points = [{"step": k, "loss": 4.0 / (1 + 0.01 * k), "timestamp": now - (n - 1 - k) * step_s} for k in range(n)]
    r = s.flowsched.http.post("/v1/progress", headers={"Authorization": f"Bearer {TOKEN}"},
                              json={"namespace": s.ns, "job": job, "points": points})
    assert r.status_code == 200, r.text


def job_view(s: Scenario, job: str) -> dict[str, Any]:
    r = s.flowsched.http.get(f"/v1/jobs/{s.ns}/{job}", headers={"Authorization": f"Bearer {TOKEN}"})
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def test_each_job_lands_on_the_pool_where_it_gains_most_and_a_waiting_job_never_falls_to_a_far_slower_one(
        ts: Scenario) -> None:
    s = ts
    v_pool = s.add_nodes("ty-v100-0", gpus=4, labels={PRODUCT: V100})
    k_pool = s.add_nodes("ty-k80-0", "ty-k80-1", gpus=4, labels={PRODUCT: K80})
    s.wait_snapshot(lambda snap: set(v_pool + k_pool) <= set(snap["nodes"]), "both pools listed", timeout_s=10)

    def typed_nodes() -> bool:
        r = s.flowsched.http.get("/debug/explain", params={"pod": f"{s.ns}/probe"})
        return r.status_code == 200 and {n.get("gpu_type") for n in r.json()["nodes"]} >= {"v100", "k80"}

    # The type plan refreshes every 0.5 s; a probe pod (no GPU, never scheduled) lets /debug/explain show it.
    s.create_pod("probe", gpus=0, scheduler="nobody")
    wait_until(typed_nodes, 15, interval_s=0.3, what="flowsched seeing two GPU types")

    # The job that gains less from the V100 arrives first; it still goes to the K80s.
    job_pod(s, "rec", "recommendation")
    assert s.wait_running("rec", 30) in k_pool
    job_pod(s, "vis", "vision")
    assert s.wait_running("vis", 30) in v_pool

    # rec reports its progress on the K80: its step time there is learned and shown per type.
    def measured() -> bool:
        post_steps(s, "rec", 0.25)
        gt = job_view(s, "rec").get("gpu_types") or {}
        return (gt.get("source") or {}).get("k80") == "measured"

    wait_until(measured, 30, interval_s=1.0, what="rec's step time on the K80 learned")
    gt = job_view(s, "rec")["gpu_types"]
    assert gt["step_s"]["k80"]["4"] == pytest.approx(0.25, rel=0.05)
    assert gt["source"] == {"k80": "measured", "v100": "prior"}
    assert gt["speed"]["k80"] == 1.0 and gt["speed"]["v100"] < 1.0  # Gavel: recommendation is faster on K80
    assert gt["home"] == "k80" and gt["allowed"] == ["k80"]
    vis = job_view_or_none(s, "vis")
    assert vis is None  # vis never reported: no progress, no job view (the filter still typed it)

    # A third vision job: the V100 is full, the other K80 free. It waits for a V100 ...
    created = time.monotonic()
    job_pod(s, "late", "vision")
    s.wait_event("late", "FailedScheduling", "GPU type", timeout_s=15)
    assert not s.node_of("late")
    explained: list[dict[str, Any]] = []

    def explain() -> bool:  # once the type plan (refreshed every 0.5 s) has the job
        explained[:] = [s.flowsched.http.get("/debug/explain", params={"pod": f"{s.ns}/late"}).json()]
        return "allowed" in (explained[0].get("gpu_types") or {})

    wait_until(explain, 5, interval_s=0.2, what="late's GPU types in /debug/explain")
    late = explained[0]["gpu_types"]
    assert late["allowed"] == ["v100"] and late["speed"]["k80"] < 0.5 and late["source"]["k80"] == "prior"
    assert {r["node"]: r["gpu_type"] for r in explained[0]["nodes"]}["ty-k80-1"] == "k80"
    # ... past the bound too: flowsched nudges it (the fallback annotation), and the filter still
    # keeps it off the free K80 (0.15 of its speed: under min_share).
    wait_until(lambda: "flowsched.io/gpu-type-fallback" in (s.pod("late")["metadata"].get("annotations") or {}),
               FALLBACK_S + 15, interval_s=0.5, what="late's fallback annotation")
    assert time.monotonic() - created >= FALLBACK_S - 2.0
    time.sleep(3.0)  # kube-scheduler retries the annotated pod at once: it must still find no node
    assert not s.node_of("late")
    explained[:] = [s.flowsched.http.get("/debug/explain", params={"pod": f"{s.ns}/late"}).json()]
    assert explained[0]["gpu_types"]["allowed"] == ["v100"]
    # The V100 frees: the waiting job binds there.
    s.kube.delete(f"/api/v1/namespaces/{s.ns}/pods/vis", grace_period_s=0)
    assert s.wait_bound("late", 30) in v_pool


def job_view_or_none(s: Scenario, job: str) -> dict[str, Any] | None:
    r = s.flowsched.http.get(f"/v1/jobs/{s.ns}/{job}", headers={"Authorization": f"Bearer {TOKEN}"})
    if r.status_code == 404:
        return None
    r.raise_for_status()
    with contextlib.suppress(ValueError):
        out: dict[str, Any] = r.json()
        return out
    return None
