"""The control loops count DRA GPUs as they count device-plugin GPUs (extender/snapshot/dra_control.py):
admission's fit check and preemption, the migrator's credit, the elastic optimizer's sizes and the
idle loop, each planned by the real loop over a ClusterState fed DRA objects as the watch feeds them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from extender.control.admission import Admission
from extender.control.elastic import build as build_elastic
from extender.control.idle import IdleLoop
from extender.control.loop import Action
from extender.control.migrator import Migrator
from extender.metrics import build_metrics
from extender.prometheus.config import TelemetryConfig
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from extender.snapshot.watcher import apply_event
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from extender.telemetry.refresher import TelemetryRefresher
from extender.telemetry.scrape_source import ScrapeSource
from scoring.actions import Evict
from tests.cluster import dra_objects as d
from tests.control_fakes import LINEAR_PRIOR, FakeActions, FakeTracker, make_context, plan_at
from tests.k8s_factories import node, pod

GPU = "nvidia.com/gpu"
NOW = 1_800_000_000.0
GATE = "flowsched.io/admission"
NS = "ml"


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _apply(state: ClusterState, kind: str, obj: dict[str, Any]) -> None:
    apply_event(state, kind, {"type": "ADDED", "object": obj}, GPU)


def _cluster(nodes: dict[str, int], *, dra: bool) -> ClusterState:
    """Nodes with `gpus` each: published as ResourceSlices (dra) or as nvidia.com/gpu (device plugin)."""
    state = ClusterState()
    for name, gpus in nodes.items():
        state.upsert_node(parse_node(node(name, gpus=0 if dra else gpus)))
    if dra:
        _apply(state, "deviceclasses", d.device_class())
        for name, gpus in nodes.items():
            _apply(state, "resourceslices", d.gpu_slice(name, gpus))
    state.mark_synced()
    return state


def _pod(state: ClusterState, name: str, job: str, gpus: int, *, dra: bool, node_name: str | None = None,
         claim: str | None = None, gated: bool = False, age_s: float = 0.0, ckpt: bool = False,
         annotations: dict[str, str] | None = None, shared_claim: str | None = None, first: int = 0) -> None:
    """A pod of `job` using `gpus` GPUs: its own claim of that many (dra; when bound, allocated
    devices gpu-<first>... of its node), or an nvidia.com/gpu request. shared_claim: a claim it
    shares instead (created by the caller)."""
    ann = {**(annotations or {}), **({"flowsched.io/checkpointable": "true"} if ckpt else {})}
    body = pod(name, gpus=0 if dra else gpus, node_name=node_name, namespace=NS, labels={"flowsched.io/job": job},
               annotations=ann, phase="Running" if node_name else "Pending")
    body["metadata"]["creationTimestamp"] = _iso(NOW - age_s)
    if node_name:
        body["status"]["startTime"] = _iso(NOW - age_s)
    if gated:
        body["spec"]["schedulingGates"] = [{"name": GATE}]
    uid = body["metadata"]["uid"]
    if dra:
        claim = shared_claim or claim or f"{name}-gpus"
        body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
        if shared_claim is None:
            c = d.resource_claim(claim, NS, count=gpus)
            if node_name:
                c = d.allocated(c, node_name, [f"gpu-{first + i}" for i in range(gpus)], ((name, uid),))
            _apply(state, "resourceclaims", c)
    state.upsert_pod(parse_pod(body))


def _share(state: ClusterState, claim: str, node_name: str, devices: list[str], users: list[str]) -> None:
    c = d.allocated(d.resource_claim(claim, NS, count=len(devices)), node_name, devices,
                    tuple((u, f"uid-{NS}-{u}") for u in users))
    _apply(state, "resourceclaims", c)


class _Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def record(self, obj: Any, reason: str, message: str, **kw: Any) -> bool:
        self.reasons.append(reason)
        return True


def _ctx(state: ClusterState) -> Any:
    return make_context(state, FakeTracker({}), FakeActions(), _Events(), clock=lambda: NOW,
                        settings=Settings(kube=False, elastic=LINEAR_PRIOR))


# ---- the control view ----

def test_control_view_counts_a_claims_gpus_once_on_one_pod_and_leaves_the_verbs_columns_alone() -> None:
    state = _cluster({"d1": 4, "d2": 4}, dra=True)
    _pod(state, "own-0", "own", 2, dra=True, node_name="d1")
    _pod(state, "pair-0", "pair", 0, dra=True, node_name="d2", shared_claim="pair-gpus")
    _pod(state, "pair-1", "pair", 0, dra=True, node_name="d2", shared_claim="pair-gpus")
    _share(state, "pair-gpus", "d2", ["gpu-0"], ["pair-0", "pair-1"])
    _pod(state, "x-0", "x", 0, dra=True, node_name="d2", shared_claim="across")
    _pod(state, "y-0", "y", 0, dra=True, node_name="d2", shared_claim="across")
    _share(state, "across", "d2", ["gpu-1", "gpu-2"], ["x-0", "y-0"])
    _pod(state, "waits", "w", 3, dra=True)  # unallocated: what its claim asks for
    pods, nodes, _ = state.read().control_view()
    gpus = {p.name: p.requests.gpus for p in pods}
    # A claim shared inside a job counts once (on its first pod); one shared across jobs is no job's.
    assert gpus == {"own-0": 2.0, "pair-0": 1.0, "pair-1": 0.0, "x-0": 0.0, "y-0": 0.0, "waits": 3.0}
    # d2: 4 GPUs, 2 held by the claim across jobs: 2 the loops may plan with (1 of them held by pair).
    assert {n.name: n.allocatable.gpus for n in nodes} == {"d1": 4.0, "d2": 2.0}
    row = state.read().node_row("d2")
    assert row is not None and (row.gpu_alloc, row.gpu_used) == (4.0, 3.0)  # the verbs' columns as before


def test_a_mapped_extended_resource_claim_counts_once_and_a_device_plugin_cluster_is_untouched() -> None:
    state = _cluster({"dp": 8}, dra=False)
    _pod(state, "a", "a", 3, dra=False, node_name="dp")
    pods, nodes, _ = state.read().control_view()
    assert [p.requests.gpus for p in pods] == [3.0] and nodes[0].allocatable.gpus == 8.0
    state = _cluster({"d1": 4}, dra=True)
    _apply(state, "deviceclasses", d.device_class("mapped", extended_resource=GPU))
    body = pod("m", gpus=1, node_name="d1", namespace=NS, phase="Running")
    state.upsert_pod(parse_pod(body))
    claim = d.allocated(d.resource_claim("m-gpu", NS, device_class_name="mapped"), "d1", ["gpu-0"],
                        (("m", body["metadata"]["uid"]),), extended=True)
    _apply(state, "resourceclaims", claim)
    pods, nodes, _ = state.read().control_view()
    assert [p.requests.gpus for p in pods] == [1.0] and nodes[0].allocatable.gpus == 4.0


def test_a_mig_slice_held_is_no_pods_gpu_and_not_plannable() -> None:
    state = _cluster({"d1": 1}, dra=True)
    _apply(state, "deviceclasses", d.device_class("mig.nvidia.com", mig=True))
    _apply(state, "resourceslices", d.resource_slice("d1", [d.gpu_device("d1", 0), d.mig_device("d1", 1, 0)]))
    body = pod("m", gpus=0, node_name="d1", namespace=NS, phase="Running")
    body["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimName": "mig"}]
    state.upsert_pod(parse_pod(body))
    mig = d.resource_claim("mig", NS, device_class_name="mig.nvidia.com", profile="1g.10gb")
    _apply(state, "resourceclaims", d.allocated(mig, "d1", [d.mig_device("d1", 1, 0)["name"]],
                                                (("m", body["metadata"]["uid"]),)))
    pods, nodes, _ = state.read().control_view()
    assert [p.requests.gpus for p in pods] == [0.0] and nodes[0].allocatable.gpus == 1.0  # 2 GPUs, 1 partitioned


# ---- admission ----

def _admission_plan(dra: bool, blocker_gpus: int) -> list[Action]:
    state = _cluster({"n1": 4, "n2": 4}, dra=dra)
    _pod(state, "blocker", "blocker", blocker_gpus, dra=dra, node_name="n1", age_s=60.0)
    for i in range(3):
        _pod(state, f"gang-{i}", "gang", 2, dra=dra, gated=True, age_s=10.0)
    return plan_at(Admission(_ctx(state)), NOW)


@pytest.mark.parametrize("blocker_gpus, admitted", [(2, True), (3, False)])
def test_a_gated_gang_is_released_when_it_fits_free_dra_gpus_as_with_the_device_plugin(
        blocker_gpus: int, admitted: bool) -> None:
    dra, dp = _admission_plan(True, blocker_gpus), _admission_plan(False, blocker_gpus)
    assert [(a.kind, a.key, len(a.pods)) for a in dra] == [(a.kind, a.key, len(a.pods)) for a in dp]
    # 3 pods x 2 GPUs: with 2 held on n1, 2 + 4 free take them; with 3 held, only 1 + 4.
    assert [(a.kind, a.key, len(a.pods)) for a in dra] == ([("admit", f"{NS}/gang", 3)] if admitted else [])


def test_a_gated_pod_whose_claim_the_snapshot_has_not_seen_is_not_released() -> None:
    """The claim informer can lag the pods' (CI saw it: a gang released with 1 + 4 GPUs free). A pod
    naming an unseen claim asks for unknown GPUs, not none: its gang waits until the claim arrives."""
    state = _cluster({"n1": 4, "n2": 4}, dra=True)
    _pod(state, "blocker", "blocker", 3, dra=True, node_name="n1", age_s=60.0)
    for i in range(3):
        body = pod(f"gang-{i}", gpus=0, namespace=NS, labels={"flowsched.io/job": "gang"}, phase="Pending")
        body["metadata"]["creationTimestamp"] = _iso(NOW - 10.0)
        body["spec"]["schedulingGates"] = [{"name": GATE}]
        body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": f"gang-{i}-gpus"}]
        state.upsert_pod(parse_pod(body))
    _apply(state, "resourceclaims", d.resource_claim("gang-0-gpus", NS, count=2))  # the others lag
    pods, _, _ = state.read().control_view()
    assert {p.name for p in pods if p.claims_unseen} == {"gang-1", "gang-2"}
    assert plan_at(Admission(_ctx(state)), NOW) == []  # seen as a gang of one pod x 2 GPUs, it would fit
    for i in range(1, 3):
        _apply(state, "resourceclaims", d.resource_claim(f"gang-{i}-gpus", NS, count=2))
    assert not any(p.claims_unseen for p in state.read().control_view()[0])
    assert plan_at(Admission(_ctx(state)), NOW) == []  # 6 GPUs asked, 1 + 4 free: it waits, now knowingly
    state.upsert_pod(parse_pod(pod("late", gpus=0, namespace=NS, phase="Pending")))  # no claims: untouched
    assert not any(p.claims_unseen for p in state.read().control_view()[0])


def test_a_template_claim_not_made_yet_holds_its_gang_and_counts_once_made() -> None:
    state = _cluster({"n1": 4}, dra=True)
    body = pod("t-0", gpus=0, namespace=NS, labels={"flowsched.io/job": "t"}, phase="Pending")
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
    state.upsert_pod(parse_pod(body))
    pods, _, _ = state.read().control_view()
    assert [(p.claims, p.claims_unseen) for p in pods] == [((), True)]
    assert plan_at(Admission(_ctx(state)), NOW) == []
    body["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "t-0-gpus-x1"}]
    state.upsert_pod(parse_pod(body))
    assert [p.claims_unseen for p in state.read().control_view()[0]] == [True]  # named, not delivered yet
    _apply(state, "resourceclaims", d.resource_claim("t-0-gpus-x1", NS, count=2))
    pods, _, _ = state.read().control_view()
    assert [(p.requests.gpus, p.claims_unseen) for p in pods] == [(2.0, False)]
    assert [(a.kind, a.key) for a in plan_at(Admission(_ctx(state)), NOW)] == [("admit", f"{NS}/t")]


def test_admission_preempts_only_a_job_whose_claims_it_frees() -> None:
    """A shared claim frees its GPUs only when all its pods go: the jobs sharing one across jobs are
    no candidates, however much service they attained; the job with its own claim is evicted."""
    state = _cluster({"n1": 2, "n2": 2}, dra=True)
    day = 20 * 3600.0
    _pod(state, "own-0", "own", 2, dra=True, node_name="n1", age_s=day, ckpt=True)
    for j in ("s1", "s2"):
        _pod(state, f"{j}-0", j, 0, dra=True, node_name="n2", age_s=2 * day, ckpt=True, shared_claim="across")
    _share(state, "across", "n2", ["gpu-0", "gpu-1"], ["s1-0", "s2-0"])
    _pod(state, "urgent-0", "urgent", 2, dra=True, gated=True, age_s=600.0)
    actions = plan_at(Admission(_ctx(state)), NOW)
    assert [(a.kind, a.key) for a in actions] == [("preempt", f"{NS}/own")]
    assert [p.gpus for p in actions[0].pods] == [2.0]
    # Without a job that frees a device, nothing is preempted.
    state.delete_pod(f"uid-{NS}-own-0")
    assert plan_at(Admission(_ctx(state)), NOW) == []


# ---- the migrator ----

def test_the_migrators_world_and_credit_count_the_gpus_an_eviction_frees() -> None:
    state = _cluster({"n1": 4, "n2": 4}, dra=True)
    _pod(state, "own-0", "own", 2, dra=True, node_name="n1", age_s=3600.0, ckpt=True)
    _pod(state, "own-1", "own", 2, dra=True, node_name="n2", age_s=3600.0, ckpt=True)
    for j in ("s1", "s2"):
        _pod(state, f"{j}-0", j, 0, dra=True, node_name="n1", age_s=3600.0, ckpt=True, shared_claim="across")
    _share(state, "across", "n1", ["gpu-2", "gpu-3"], ["s1-0", "s2-0"])
    ctx = _ctx(state)
    m = Migrator(ctx)
    world = m.world(NOW)
    assert world is not None
    assert {j.key: dict(j.gpus_on) for j in world.jobs} == {f"{NS}/own": {"n1": 2.0, "n2": 2.0}}
    assert {n.name: n.free_gpus for n in world.nodes} == {"n1": 0.0, "n2": 2.0}
    evicted: list[str] = []

    class Actions(FakeActions):
        def evict(self, ns: str, name: str, uid: str = "") -> str:
            evicted.append(name)
            return "evicted"

    ctx.actions = Actions()
    plan = Evict(f"{NS}/own", "n1", 1, 4.0, 4.0, (), (), "test")
    assert m.act(m.bind(plan), NOW) == "evicted"
    assert sorted(evicted) == ["own-0", "own-1"]
    assert ctx.registry.get_sample_value("flowsched_migration_freed_gpus_total") == 4.0


# ---- the elastic optimizer ----

def _elastic(dra: bool) -> tuple[Any, list[Any]]:
    state = _cluster({"n1": 8}, dra=dra)
    for i in range(2):
        _pod(state, f"el-{i}", "el", 2, dra=dra, node_name="n1", age_s=600.0, first=2 * i,
             annotations={"flowsched.io/elastic": "2-8"})
    loop = build_elastic(_ctx(state))
    world = loop.world(NOW)
    return world, [a.plan for a in plan_at(loop, NOW)]


def test_elastic_sizes_read_a_jobs_gpus_per_pod_from_its_claims() -> None:
    world, scales = _elastic(dra=True)
    assert world is not None
    (job,) = world.jobs
    assert (job.per_pod, job.live_gpus, job.elastic, dict(job.gpus_on)) == (2, 4, (2, 8), {"n1": 4.0})
    assert world.nodes[0].free_gpus == 4.0
    assert [(a.gpus, a.from_gpus, a.per_pod) for a in scales] == [(8, 4, 2)]
    assert scales == _elastic(dra=False)[1]  # the plan of the same job on device-plugin GPUs


# ---- the idle loop ----

@pytest.fixture
def exporter() -> Iterator[DcgmExporterEmulator]:
    em = DcgmExporterEmulator("n1", gpus=4, pod_mapping=False).serve()  # maps no pods: the uuid join does
    yield em
    em.stop()


def test_the_idle_loop_sees_a_claim_pods_gpus_by_uuid_and_reports_it_idle(exporter: DcgmExporterEmulator) -> None:
    state = _cluster({"n1": 4}, dra=True)
    _pod(state, "busy", "busy", 2, dra=True, node_name="n1", age_s=7200.0)
    _pod(state, "nb", "nb", 1, dra=True, node_name="n1", age_s=7200.0, first=2,
         annotations={"flowsched.io/workload": "notebook"})
    exporter.set_gpu(0, 90.0)
    exporter.set_gpu(1, 70.0)
    exporter.set_gpu(2, 0.0)
    clock = [NOW - 4000.0]
    source = ScrapeSource(TelemetryConfig(source="scrape", scrape_targets=[exporter.url], query_timeout_s=0.5),
                          clock=lambda: clock[0])
    refresher = TelemetryRefresher(source, state, build_metrics(), stale_s=60.0, refresh_s=1.0, clock=lambda: clock[0])
    loop = IdleLoop(make_context(state, FakeTracker({}), FakeActions(), _Events(), clock=lambda: clock[0]))
    reports: list[str] = []
    for t in (NOW - 4000.0, NOW):  # idle for longer than window_s (1 h)
        clock[0] = t
        assert refresher.refresh_once()
        observed = loop.observe(t)
        assert observed is not None
        assert {p.key: (p.gpus, p.samples) for p in observed.pods} == {
            f"{NS}/busy": (2.0, (90.0, 70.0)), f"{NS}/nb": (1.0, (0.0,))}
        reports += [a.target for a in plan_at(loop, t) if a.kind == "idle_event"]
    assert reports == [f"{NS}/nb"]

