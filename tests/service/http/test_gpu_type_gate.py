"""Mixed GPU types in the service: node types from gpu.product, per-type step times from a job's
reported progress on the type its pods run on, the filter keeping each job on one type, and the
speeds per type in GET /v1/jobs (extender/control/type_plan.py, extender/http/gpu_type_gate.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from extender.control.type_plan import FALLBACK, TypePlanSource
from extender.http.auth import StaticTokenAuthenticator
from extender.http.gpu_type_gate import WRONG_TYPE, TypeGate, filter_by_type
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.http.verbs import FilterAnswer, Policy, decide_filter, decide_filter_ranked
from extender.http.wire import ExtenderArgs
from extender.progress.convergence import ConvergenceTracker
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings
from extender.settings import Settings
from extender.snapshot.objects import GPU_PRODUCT, parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring.placement import PlacementSettings
from tests.k8s_factories import node, pod

T0 = 1_700_000_000.0
NODES = {"v1": "Tesla-V100-SXM2-16GB", "v2": "Tesla-V100-SXM2-16GB", "k1": "Tesla-K80", "k2": "Tesla-K80"}
POLICY = Policy(placement=PlacementSettings(), stale_after_s=60.0)


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decider(state: ClusterState, body: dict[str, Any], now: float) -> Callable[[list[str]], FilterAnswer]:
    return lambda names: decide_filter(state, ExtenderArgs(body, names, None), POLICY, now)


def gpu_pod(name: str, cls: str, *, on: str | None = None, created: float = T0, gpus: int = 4) -> dict[str, Any]:
    p = pod(name, gpus=gpus, node_name=on, namespace="ns", labels={"flowsched.io/job": name},
            annotations={"flowsched.io/model-class": cls}, phase="Running" if on else "Pending")
    p["metadata"]["creationTimestamp"] = iso(created)
    if on:
        p["status"]["startTime"] = iso(created)
    return p


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[ClusterState, ProgressStore, TypePlanSource, list[float]]]:
    state = ClusterState()
    for name, product in NODES.items():
        state.upsert_node(parse_node(node(name, gpus=4, labels={GPU_PRODUCT: product})))
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite"), max_idle_s=1e9))
    clock = [T0 + 1000.0]
    settings = Settings(kube=False)
    tracker = ConvergenceTracker(store, state, settings.convergence, clock=lambda: clock[0])
    source = TypePlanSource(state, tracker, settings.core(), clock=lambda: clock[0])
    state.mark_synced()
    yield state, store, source, clock
    store.close()


def test_node_types_come_from_gpu_product_and_each_new_job_gets_the_type_it_gains_most_on(
        world: tuple[ClusterState, ProgressStore, TypePlanSource, list[float]]) -> None:
    state, _, source, clock = world
    plan = source.refresh_once()
    assert plan.node_types == {"v1": "v100", "v2": "v100", "k1": "k80", "k2": "k80"}
    gate = TypeGate(source.get, source.gpu_types)
    names = list(NODES)
    for name, cls, want in (("vis", "vision", ["v1", "v2"]), ("rec", "recommendation", ["k1", "k2"])):
        body = gpu_pod(name, cls, created=clock[0])
        ans = gate.filter(decider(state, body, clock[0]), state, body, 4.0, names, clock[0])
        assert ans.passed == want and set(ans.failed) == set(names) - set(want)
        assert ans.rejected == {WRONG_TYPE: 2}
    # A CPU pod, or a cluster of one type: no constraint.
    cpu = gpu_pod("cpu", "vision", gpus=0)
    assert gate.filter(decider(state, cpu, clock[0]), state, cpu, 0.0, names, clock[0]).passed == names


@pytest.mark.parametrize("elastic", [None, "1-4"])
def test_a_waiting_job_waits_for_its_type_and_past_the_bound_never_takes_one_under_min_share(
        world: tuple[ClusterState, ProgressStore, TypePlanSource, list[float]], elastic: str | None) -> None:
    """Past the bound a job, elastic or not, takes only types within min_share of its fastest: a
    job keeps the type it runs on (the simulator's ImageNet-like jobs held K80s, 0.14 of their V100
    speed, for 917,000 s elastic and 613,713 s not)."""
    state, _, source, clock = world
    for i, n in enumerate(("v1", "v2")):  # the V100s are full
        state.upsert_pod(parse_pod(gpu_pod(f"busy{i}", "vision", on=n, created=T0)))
    body = gpu_pod("late", "vision", created=clock[0])
    if elastic is not None:
        body["metadata"]["annotations"]["flowsched.io/elastic"] = elastic
    state.upsert_pod(parse_pod(body))
    source.refresh_once()
    gate = TypeGate(source.get, source.gpu_types)
    names = list(NODES)

    def passed(now: float) -> list[str]:
        return gate.filter(decider(state, body, now), state, body, 4.0, names, now).passed

    assert passed(clock[0]) == []  # a K80 gives it under min_share of its V100 speed: it waits
    assert passed(clock[0] + source.gpu_types.fallback_s + 1) == []


def test_a_job_past_its_bound_gets_its_waiting_pods_annotated_once_so_kube_scheduler_retries_them(
        world: tuple[ClusterState, ProgressStore, TypePlanSource, list[float]]) -> None:
    state, _, source, clock = world
    calls: list[tuple[str, str, dict[str, str | None]]] = []
    source.annotate = lambda ns, name, ann: calls.append((ns, name, ann)) is None
    for i, n in enumerate(("v1", "v2")):
        state.upsert_pod(parse_pod(gpu_pod(f"busy{i}", "vision", on=n, created=T0)))
    state.upsert_pod(parse_pod(gpu_pod("late", "vision", created=clock[0])))
    source.refresh_once()
    assert calls == []  # waiting, within its bound
    clock[0] += source.gpu_types.fallback_s
    source.refresh_once()
    source.refresh_once()
    bound = iso(clock[0])
    assert calls == [("ns", "late", {FALLBACK: bound})]  # once, the bound's time (the same on any replica)


def test_step_times_are_learned_per_type_and_shown_in_the_job_view(
        world: tuple[ClusterState, ProgressStore, TypePlanSource, list[float]]) -> None:
    state, store, source, clock = world
    state.upsert_pod(parse_pod(gpu_pod("rec", "recommendation", on="k1", created=T0)))
    # One step every 0.5 s, reported as it runs on the K80 node.
    store.add_points("ns", "rec", [ProgressPoint(step=s, value=5.0 - 0.01 * s, timestamp=clock[0] - 100 + 0.5 * s)
                                   for s in range(200)])
    source.builder.estimates.refresh_once()  # type: ignore[attr-defined]  # the tracker
    source.refresh_once()
    view = source.job_view("ns/rec")
    assert view is not None
    assert view["step_s"] == {"k80": {"4": pytest.approx(0.5, rel=1e-3)}}
    assert view["source"] == {"k80": "measured", "v100": "prior"}
    assert view["speed"]["k80"] == 1.0 and view["speed"]["v100"] == pytest.approx(1.0 / 1.308, rel=1e-3)
    assert view["home"] == "k80" and view["allowed"] == ["k80"]

    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"t": frozenset({"ns"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry()), clock=lambda: clock[0], gpu_types=source.job_view))
    got = TestClient(app).get("/v1/jobs/ns/rec", headers={"Authorization": "Bearer t"})
    assert got.status_code == 200, got.text
    assert got.json()["gpu_types"]["step_s"] == {"k80": {"4": pytest.approx(0.5, rel=1e-3)}}


def test_one_type_means_no_plan_and_the_answer_unchanged(tmp_path: Path) -> None:
    state = ClusterState()
    for name in ("a", "b"):
        state.upsert_node(parse_node(node(name, gpus=4, labels={GPU_PRODUCT: "NVIDIA-A100-SXM4-40GB"})))
    state.mark_synced()
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    settings = Settings(kube=False)
    source = TypePlanSource(state, ConvergenceTracker(store, state, settings.convergence), settings.core())
    assert not source.refresh_once().typed and source.job_view("ns/x") is None
    store.close()


def test_the_first_allowed_type_with_a_passing_node_wins_and_ranking_is_within_it(
        world: tuple[ClusterState, ProgressStore, TypePlanSource, list[float]]) -> None:
    state, _, _, clock = world
    names = [*NODES, "unknown"]
    types = {"v1": "v100", "v2": "v100", "k1": "k80", "k2": "k80"}
    body = gpu_pod("x", "vision", created=clock[0])
    # Filter-only mode passes only its best-ranked node: ranked among the allowed type's nodes.
    ranked = Policy(placement=PlacementSettings(), stale_after_s=60.0, rank_keep=1)

    def decide(names: list[str]) -> FilterAnswer:
        return decide_filter_ranked(state, ExtenderArgs(body, names, None), ranked, clock[0])

    ans = filter_by_type(decide, names, types, ("p100", "k80", "v100"))
    assert len(ans.passed) == 1 and ans.passed[0] in ("k1", "k2", "unknown")
    assert ans.failed == {"v1": WRONG_TYPE, "v2": WRONG_TYPE}
    assert filter_by_type(decide, names, types, ())  == decide(names)
    assert filter_by_type(decide, names, types, ("*",)) == decide(names)
    for i, n in enumerate(("k1", "k2")):  # the K80s full: the V100s, the next allowed type
        state.upsert_pod(parse_pod(gpu_pod(f"busy{i}", "vision", on=n, created=clock[0])))
    ans = filter_by_type(decide, ["v1", "v2", "k1", "k2"], types, ("k80", "v100"))
    assert len(ans.passed) == 1 and ans.passed[0] in ("v1", "v2")
    assert ans.failed == {"k1": WRONG_TYPE, "k2": WRONG_TYPE}
