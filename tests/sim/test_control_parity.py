"""Parity: one scenario, built once as Kubernetes objects for the service shell and once as engine
state for the simulator shell, gives the same World and the same plans, action for action, for
all six loops, dry run included (both shells run scoring.kernel.run_round).

The migrator, the elastic optimizer, admission, the resizer, the idle loop and the remedies are
compared end to end: each shell builds its own World from its own state; the resizer's, the idle
loop's and the remedies' actions are also carried out by both, round after round (the engine's
pod CPU and job speed, its eviction of an idle notebook, notices counted; the service's resize
subresource, its evictions and Events). What the engine does not model (the jobs' diagnoses, the
GPU pods' utilisation samples, the notebook class and its reclaim opt-in) the simulator shell
takes from the scenario (benchmarks/sim/world.py WorldSources), as the service takes it from its
diagnoser, its telemetry and the pods' annotations.

The scenario: 4 nodes x 4 GPUs; a slow (completing) checkpointable job, a growing one, a
completing one in an excluded namespace, a completing one in a namespace labelled
flowsched.io/migrate: "false", a slow job migrated once recently, elastic jobs (one rescaled a
minute ago), pending pods in kube-scheduler's order, and a migrator budget with one action left.

The same scenario is also built with the service side's GPUs coming through Dynamic Resource
Allocation (all nodes, or half of them: a mixed cluster): ResourceSlices instead of
nvidia.com/gpu, a ResourceClaim per pod, allocated on its node's devices (DraCluster). The
simulator's World cannot tell the two kinds apart, and neither may the World the service builds:
the same World and plans are expected (extender/snapshot/dra_control.py, docs/dra.md).

Both shells estimate convergence with the same core tracker from the same points (the service
through its SQLite progress store). What a job reports beyond its points (batch, batch range,
gradient noise, planned end) reaches the service through its report book and the simulator
through its jobs; its step times the service measures from the step rate of its posted points and
the simulator from its engine (learned mode, scoring.step_samples' rule for both), so the elastic
scenario posts its points at the engine's step time and the simulator's measurement error is off:
the elastic plans are compared with throughput included.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.cluster_spec import app_classes, type_speeds
from benchmarks.sim.control import SimControl
from benchmarks.sim.ends import declared
from benchmarks.sim.engine import Engine, EngineSettings, SimJob
from benchmarks.sim.generator import calibrated_profiles
from benchmarks.sim.policies import make_policy, pod_sizes
from benchmarks.sim.variants import core_settings
from benchmarks.sim.workload import JobSpec
from benchmarks.sim.world import WorldSources, node_name, pod_name, true_step_s
from extender.control.elastic import Elastic
from extender.control.events import LogRecorder
from extender.control.migrator import Migrator
from extender.progress.convergence import ConvergenceTracker
from extender.progress.reports import JobReportBook, TrainingReport
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings
from extender.settings import Settings
from extender.snapshot.objects import GPU_PRODUCT, parse_node, parse_pod
from extender.snapshot.state import ClusterState
from extender.snapshot.watcher import apply_event
from scoring.actions import Evict, Scale
from scoring.control import plan_elastic_for
from scoring.gpu_types import cluster_types, speeds_for
from scoring.typed_elastic import plan_typed_elastic_for
from scoring.typed_placement import plan_types
from scoring.world import World
from tests.cluster import dra_objects
from tests.control_fakes import FakeActions, OneLoop, make_context, plan_at
from tests.k8s_factories import node, pod

PROFILES = calibrated_profiles()
APP = "deepspeech2"  # a lower-is-better metric, as a loss posted to /v1/progress is
# The largest batch one GPU holds, which the scenario's elastic jobs report (training.batch_local_max)
# as the artifact's applications do; the generated profiles have none (their step time does not
# depend on the batch), and without one both shells would carry 0 and the field go untested.
PROFILES.apps[APP].max_local_bsz = 64  # type: ignore[attr-defined]
# The planned end each scenario job declares (training.max_steps), in the steps its points are posted at.
PLANNED_STEPS = float(PROFILES.apps[APP].max_epochs)
T0 = 1_700_000_000.0  # the service's clock at the simulator's t = 0
NOW = 20_000.0
# GPU feature discovery's gpu.product values (and the driver's productName) of the typed scenario
PRODUCTS = {"v100": "Tesla-V100-SXM2-16GB", "k80": "Tesla-K80"}
LABELS = {"team-a": {}, "team-b": {}, "frozen": {"flowsched.io/migrate": "false"}, "kube-system": {}}


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def flat(n: int, start: float, every: float) -> list[tuple[float, int, float]]:
    """(time, epoch, loss): improving fast, then flat for the last third."""
    out = []
    for k in range(n):
        loss = 2.0 * math.exp(-k / 4.0) + 1.0 if k < 2 * n // 3 else 1.0 + 2.0 * math.exp(-(2 * n // 3) / 4.0)
        out.append((start + every * k, k + 1, loss + 0.0005 * (k % 2)))
    return out


def growing(n: int, start: float, every: float) -> list[tuple[float, int, float]]:
    return [(start + every * k, k + 1, 5.0 - 0.1 * k) for k in range(n)]


# name, namespace, GPUs, running on (node, GPUs)... or None, started, series, checkpointable, elastic, marks
SCENARIO: list[dict[str, Any]] = [
    {"name": "slow", "ns": "team-a", "gpus": 4, "on": [(0, 4)], "start": 2000.0, "series": flat(30, 2100.0, 500.0)},
    {"name": "fresh", "ns": "team-a", "gpus": 4, "on": [(1, 4)], "start": 1000.0,
     "series": growing(30, 5100.0, 500.0)},
    {"name": "sys", "ns": "kube-system", "gpus": 2, "on": [(2, 2)], "start": 2000.0,
     "series": flat(30, 2100.0, 500.0)},
    {"name": "optout", "ns": "frozen", "gpus": 2, "on": [(2, 2)], "start": 2000.0,
     "series": flat(30, 2100.0, 500.0)},
    {"name": "moved", "ns": "team-b", "gpus": 1, "on": [(3, 1)], "start": 19_000.0,
     "series": flat(30, 2100.0, 500.0), "migrated": (18_500.0, 1)},
    {"name": "el", "ns": "team-b", "gpus": 2, "on": [(3, 1), (3, 1)], "start": 5000.0,
     "series": growing(20, 8100.0, 600.0), "elastic": (1, 8)},
    {"name": "el2", "ns": "team-b", "gpus": 1, "on": [(3, 1)], "start": 5000.0,
     "series": growing(20, 8100.0, 600.0), "elastic": (1, 8), "scaled": 19_940.0},
    {"name": "wait6", "ns": "team-b", "gpus": 6, "on": None, "arrival": 15_000.0},
    {"name": "wait2", "ns": "team-a", "gpus": 2, "on": None, "arrival": 12_000.0},
]


# -- the simulator side -------------------------------------------------------------------
def sim_side(loops: tuple[str, ...], gated: tuple[str, ...] = (), *, scenario: list[dict[str, Any]] = SCENARIO,
             nodes: int = 4, sources: WorldSources | None = None,
             node_types: tuple[str, ...] = ()) -> tuple[SimControl, Engine]:
    """`gated`: waiting jobs whose pods carry flowsched's admission gate (released by admission);
    `sources`: what the engine does not model (diagnoses, utilisation samples, workload class)."""
    specs = [JobSpec(j["name"], j.get("arrival", 0.0), APP, j["gpus"], 320, namespace=j["ns"],
                     checkpointable=j["ns"] != "team-x",
                     elastic_min=j["elastic"][0] if "elastic" in j else 0,
                     elastic_max=j["elastic"][1] if "elastic" in j else 0) for j in scenario]
    cluster = ClusterSettings(nodes=nodes)
    if node_types:  # GPU types, with Gavel's measured speeds as a cluster file gives them
        cluster = replace(cluster, node_types=node_types, type_speeds=tuple(
            sorted((a, t, v) for (a, t), v in type_speeds().items() if t in node_types)))
    eng = Engine(specs, PROFILES, make_policy("flowsched"), EngineSettings(cluster=cluster))
    control = SimControl(core_settings(eng.settings), loops, sources=sources or WorldSources())
    control.builder.namespace_labels = LABELS
    by_name = {j.spec.name: j for j in eng.jobs}
    for j in scenario:
        job: SimJob = by_name[j["name"]]
        eng.active[job.idx] = job
        eng.policy.on_arrival(job, job.spec.arrival)
        if j["on"]:
            eng.now = j["start"]
            eng.start(job, j["on"])
            job.series = list(j.get("series", ()))
            job.series_steps = [float(e) for _, e, _ in job.series]  # the step each point is posted at
            job.planned_steps = PLANNED_STEPS
            job.synced_at = NOW  # the engine adds no points of its own: the scenario's are the job's posts
        if "migrated" in j:
            control.builder.marks.migrated_at[job.idx], control.builder.marks.migrations[job.idx] = j["migrated"]
        if "scaled" in j:
            control.builder.marks.scaled_at[job.idx] = j["scaled"]
        if j["name"] in gated:
            eng.gated[job.idx] = j["arrival"]
    eng.now = NOW
    return control, eng


# -- the service side ---------------------------------------------------------------------
def service_side(tmp_path: Path, loops: list[str], gated: tuple[str, ...] = (), *,
                 dra: frozenset[int] = frozenset()) -> tuple[Migrator, Elastic]:
    ctx = service_context(tmp_path, loops, gated, dra=dra)
    return Migrator(ctx), Elastic(ctx, ctx.core.elastic)


class DraCluster:
    """The service side's GPUs through DRA, as NVIDIA's driver and kube-scheduler leave them: the
    nodes in `nodes` publish their GPUs as ResourceSlices (no nvidia.com/gpu), and each pod of the
    scenario gets its GPUs through its own ResourceClaim, allocated on its node's devices when it is
    bound there; while any node is a DRA node, waiting pods ask through unallocated claims."""

    def __init__(self, state: ClusterState, nodes: frozenset[int], node_types: tuple[str, ...] = ()) -> None:
        self.state, self.nodes = state, nodes
        self.next_device: dict[str, int] = {}
        if nodes:
            self.apply("deviceclasses", dra_objects.device_class())
        for k in sorted(nodes):
            self.apply("resourceslices", dra_objects.gpu_slice(node_name(k), 4, product=PRODUCTS[node_types[k]])
                       if node_types else dra_objects.gpu_slice(node_name(k), 4))

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        apply_event(self.state, kind, {"type": "ADDED", "object": obj}, "nvidia.com/gpu")

    def node_gpus(self, k: int) -> int:
        return 0 if k in self.nodes else 4

    def claim_for(self, body: dict[str, Any], gpus: int, on: int | None) -> None:
        """Moves the pod's GPU request into a claim, if its node (or, waiting, the cluster) is DRA."""
        if (on is None and not self.nodes) or (on is not None and on not in self.nodes):
            return
        meta = body["metadata"]
        body["spec"]["containers"][0]["resources"]["limits"].pop("nvidia.com/gpu")
        body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": f"{meta['name']}-gpus"}]
        claim = dra_objects.resource_claim(f"{meta['name']}-gpus", meta["namespace"], count=gpus)
        if on is not None:
            where = node_name(on)
            first = self.next_device.get(where, 0)
            self.next_device[where] = first + gpus
            claim = dra_objects.allocated(claim, where, [f"gpu-{first + i}" for i in range(gpus)],
                                          ((meta["name"], meta["uid"]),))
        self.apply("resourceclaims", claim)


def service_context(tmp_path: Path, loops: list[str], gated: tuple[str, ...] = (), *,
                    scenario: list[dict[str, Any]] = SCENARIO, nodes: int = 4, actions: Any = None,
                    dra: frozenset[int] = frozenset(), node_types: tuple[str, ...] = ()) -> Any:
    """dra: the nodes (by index) whose GPUs are DRA devices, their pods' GPUs claims (DraCluster);
    node_types: each node's gpu.product (GPU feature discovery's label, or its DRA devices' productName)."""
    state = ClusterState()
    claims = DraCluster(state, dra, node_types)
    for k in range(nodes):
        labels = {GPU_PRODUCT: PRODUCTS[node_types[k]]} if node_types and k not in dra else None
        state.upsert_node(parse_node(node(node_name(k), gpus=claims.node_gpus(k), cpu="64", memory="256Gi",
                                          labels=labels)))
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "progress.sqlite"), max_idle_s=1e9))
    for j in scenario:
        ann: dict[str, str] = {"flowsched.io/checkpointable": "true"}
        if "workload" in j:
            ann["flowsched.io/workload"] = j["workload"]
        if node_types:
            ann["flowsched.io/model-class"] = app_classes()[APP]
        if "reclaim" in j:
            ann["flowsched.io/reclaim-idle"] = j["reclaim"]
        if "elastic" in j:
            ann["flowsched.io/elastic"] = f"{j['elastic'][0]}-{j['elastic'][1]}"
        if "migrated" in j:
            ann["flowsched.io/migration"] = json.dumps({"from": "node-009", "at": T0 + j["migrated"][0],
                                                        "count": j["migrated"][1]})
        if "scaled" in j:
            ann["flowsched.io/elastic-plan"] = json.dumps({"gpus": 1, "at": T0 + j["scaled"]})
        sizes = pod_sizes(j["gpus"], 4) if not j["on"] else [g for _, g in j["on"]]
        for i, g in enumerate(sizes):
            where = node_name(j["on"][i][0]) if j["on"] else None
            p = pod(f"{j['name']}-{i}", gpus=g, node_name=where, namespace=j["ns"], annotations=dict(ann),
                    labels={"flowsched.io/job": j["name"]}, phase="Running" if where else "Pending")
            p["metadata"]["creationTimestamp"] = iso(j.get("arrival", j.get("start", 0.0)))
            if j["name"] in gated:
                p["spec"]["schedulingGates"] = [{"name": "flowsched.io/admission"}]
            if where:
                p["status"]["startTime"] = iso(j["start"])
            claims.claim_for(p, g, j["on"][i][0] if j["on"] else None)
            state.upsert_pod(parse_pod(p))
        if j.get("series"):
            store.add_points(j["ns"], j["name"], [ProgressPoint(step=e, value=v, timestamp=T0 + t)
                                                  for t, e, v in j["series"]])
    state.mark_synced()
    settings = Settings(kube=False, controllers=loops)
    # Each scenario job declares its planned end (JobSpec's default end rule), as the simulated
    # job tells the simulator's tracker (benchmarks/sim/ends.py): the service's tracker reads it too.
    by_name = {f"{j['ns']}/{j['name']}": j for j in scenario}
    tracker = ConvergenceTracker(store, state, settings.convergence, clock=lambda: T0 + NOW,
                                 planned_end=lambda key: declared("planned", PLANNED_STEPS)[0]
                                 if key in by_name else None)
    tracker.refresh_once()
    return make_context(state, tracker, actions if actions is not None else FakeActions(), LogRecorder(),
                        settings=settings, namespace_labels=LABELS)


def _n(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def comparable(world: World, shift: float) -> dict[str, Any]:
    """What drives filtering and ordering, in the simulator's clock."""
    return {
        "now": world.now - shift,
        "nodes": [(n.name, n.gpus, n.used_gpus) for n in world.nodes],
        "pending": [(p.key, p.job, p.gpus, _n(p.wait_s)) for p in world.pending],
        "jobs": [(j.key, j.namespace, dict(j.gpus_on), j.live_gpus, j.per_pod, j.checkpointable, j.elastic,
                  j.running, j.settling, _n(j.runtime_s), _n(j.attained_gpu_s), j.phase,
                  j.migrations, _n(j.since_migration_s), _n(j.since_scaled_s), j.gated_pods, _n(j.wait_s))
                 for j in world.jobs],
        "labels": {k: dict(v) for k, v in world.namespace_labels.items()},
    }


def timed_like_the_engine(loops: tuple[str, ...], node_types: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The scenario with each elastic job's points posted one step apart at the step time the
    engine runs it at (what a job reporting every step posts), the latest a step before now."""
    _, eng = sim_side(loops, node_types=node_types)
    by_name = {j.spec.name: j for j in eng.jobs}
    out = []
    for j in SCENARIO:
        if "elastic" in j:
            t = true_step_s(PROFILES.apps[APP], by_name[j["name"]])
            j = {**j, "series": growing(20, NOW - 20 * t, t)}
        out.append(j)
    return out


def post_reports(ctx: Any, world: World) -> None:
    """What each simulated job reports beyond its points, posted to the service's report book."""
    book = JobReportBook()
    for j in world.jobs:
        rng = j.batch_range
        base = rng[0] if rng is not None else j.batch_size
        noise = j.noise
        book.put(j.key, TrainingReport(
            batch_size=j.batch_size or None, batch_min=rng[0] if rng else None, batch_max=rng[1] if rng else None,
            grad_sqr=noise.grad_sqr if noise else None,
            grad_var=noise.grad_var * base / j.batch_size if noise else None,
            max_steps=int(j.planned_steps) if math.isfinite(j.planned_steps) else None,
            batch_live=j.batch_live, at=T0 + NOW, batch_local_max=j.batch_local_max or None))
    ctx.world.job_reports = book.job_reports


def reports(world: World) -> list[tuple[Any, ...]]:
    return [(j.key, j.batch_size, j.batch_range, j.planned_steps, j.batch_live, j.batch_local_max, dict(j.step_batches),
             {g: float(f"{t:.7g}") for g, t in j.step_samples.items()},  # the store keeps times to ~1e-7 s
             {k: float(f"{t:.7g}") for k, t in j.batch_samples.items()},
             None if j.noise is None else (j.noise.base_batch, float(f"{j.noise.grad_sqr:.9g}"),
                                           float(f"{j.noise.grad_var:.9g}")))
            for j in world.jobs]


# The nodes whose GPUs the service side gets through DRA: none, all, half (a mixed cluster). The
# simulator's World cannot tell them apart, nor may the plans.
NO_DRA, ALL_DRA, HALF_DRA = frozenset(), frozenset(range(4)), frozenset({0, 3})


@pytest.mark.parametrize("loops, dra", [(("migrator",), NO_DRA), (("elastic", "migrator"), NO_DRA),
                                        (("elastic", "migrator"), ALL_DRA), (("elastic", "migrator"), HALF_DRA)],
                         ids=["migrator", "elastic+migrator", "elastic+migrator-dra", "elastic+migrator-mixed"])
def test_both_shells_build_the_same_world_and_the_same_plans(tmp_path: Path, loops: tuple[str, ...],
                                                             dra: frozenset[int]) -> None:
    scenario = timed_like_the_engine(loops)
    control, eng = sim_side(loops, scenario=scenario)
    control.builder.step_noise = 0.0  # the scenario's points are timed exactly
    sim_world = control.builder.build(eng, NOW)
    ctx = service_context(tmp_path, list(loops), scenario=scenario, dra=dra)
    post_reports(ctx, sim_world)
    migrator = Migrator(ctx)
    svc_world = migrator.world(T0 + NOW)
    assert svc_world is not None
    assert comparable(svc_world, T0) == comparable(sim_world, 0.0)
    assert reports(svc_world) == reports(sim_world)
    assert {j.key: len(j.step_samples) for j in sim_world.jobs if j.elastic} == {"team-b/el": 1, "team-b/el2": 1}
    assert {j.batch_local_max for j in svc_world.jobs if j.elastic} == {64}  # the per-GPU limit came through
    phases = {j.key: j.phase.name for j in sim_world.jobs}
    assert phases["team-a/slow"] == "COMPLETING" and phases["team-a/fresh"] == "GROWING"  # the scenario holds

    # The migrator, through each shell's whole path, one action of budget left.
    svc_actions = plan_at(migrator, T0 + NOW, budget_left=1)
    sim_actions = control.plan("migrator", sim_world, budget_left=1)
    assert all(isinstance(a, Evict) for a in sim_actions)
    assert [a.plan for a in svc_actions] == list(sim_actions)  # the same typed actions, field for field
    assert [a.job for a in sim_actions if isinstance(a, Evict)] == ["team-a/slow"]
    decided = migrator.last["jobs"]
    assert decided["kube-system/sys"]["decision"] == "namespace excluded"
    assert decided["frozen/optout"]["decision"] == "namespace opted out"
    assert decided["team-b/moved"]["decision"] in ("too_young", "cooldown")
    assert control.plan("migrator", sim_world, budget_left=0) == ()  # budget spent: nothing

    # The elastic optimizer, throughput and reports included.
    if "elastic" in loops:
        core = control.settings
        a_svc = plan_elastic_for(replace(svc_world, now=0.0), core, migrator_on=True).actions
        a_sim = plan_elastic_for(replace(sim_world, now=0.0), core, migrator_on=True).actions
        assert a_svc == a_sim
        assert all(isinstance(a, Scale) for a in a_sim)
        assert "team-b/el2" not in {a.job for a in a_sim}  # rescaled a minute ago: held
        # The waiting pods' 8 GPUs are kept for them, so the optimizer shrinks el to its minimum.
        assert [(a.job, a.gpus, a.from_gpus) for a in a_sim] == [("team-b/el", 1, 2)]


TYPES = ("v100", "v100", "k80", "k80")  # node k's GPU type in the typed scenario


def typed_view(world: World) -> dict[str, Any]:
    """Each job's model class, the types it measured its speed on and its speed per type relative
    to its fastest (the shells measure in their own units: the profile's, steps/s; only ratios
    reach a decision)."""
    types = cluster_types([n.gpu_type for n in world.nodes])
    out: dict[str, Any] = {}
    for j in world.jobs:
        sp = speeds_for(types, j.model_class, j.gpu_measured)
        top = max(sp.values())
        out[j.key] = (j.model_class, sorted(j.gpu_measured), {t: round(v / top, 6) for t, v in sp.items()})
    return out


@pytest.mark.parametrize("dra", [NO_DRA, HALF_DRA], ids=["gpu.product", "gpu.product+dra-productName"])
def test_a_typed_cluster_gives_both_shells_the_same_types_and_typed_plans(tmp_path: Path,
                                                                          dra: frozenset[int]) -> None:
    """Two V100 and two K80 nodes: the service reads each node's type from its gpu.product label
    (or, for the DRA nodes, its devices' productName), the simulator from its cluster; both Worlds
    carry the same types, the same measured types and speeds per job, the same typed elastic plan
    and the same type for each job's pods."""
    loops = ("elastic", "migrator")
    scenario = timed_like_the_engine(loops, TYPES)
    control, eng = sim_side(loops, scenario=scenario, node_types=TYPES)
    control.builder.step_noise = 0.0
    sim_world = control.builder.build(eng, NOW)
    ctx = service_context(tmp_path, list(loops), scenario=scenario, dra=dra, node_types=TYPES)
    post_reports(ctx, sim_world)
    svc_world = Migrator(ctx).world(T0 + NOW)
    assert svc_world is not None
    assert comparable(svc_world, T0) == comparable(sim_world, 0.0)
    assert reports(svc_world) == reports(sim_world)
    want = [(node_name(k), t) for k, t in enumerate(TYPES)]
    assert [(n.name, n.gpu_type) for n in svc_world.nodes] == [(n.name, n.gpu_type) for n in sim_world.nodes] == want
    view = typed_view(sim_world)
    assert typed_view(svc_world) == view
    assert view["team-b/el"][1] == ["k80"] and view["team-a/slow"][1] == ["v100"] and view["team-a/wait2"][1] == []

    core = control.settings
    e_svc = plan_typed_elastic_for(replace(svc_world, now=0.0), core, migrator_on=True)
    e_sim = plan_typed_elastic_for(replace(sim_world, now=0.0), core, migrator_on=True)
    assert e_svc.actions == e_sim.actions and e_svc.accounting == e_sim.accounting
    # Both waiting jobs wait for the V100s (their type: no room anywhere, so their fastest), so the
    # K80 jobs keep their GPUs: unlike the untyped plan, which shrinks el to make room.
    assert e_sim.actions == ()
    assert e_sim.accounting["v100.reserved_for_waiting"] == 8 and e_sim.accounting["k80.reserved_for_waiting"] == 0

    p_svc, p_sim = plan_types(svc_world, core), plan_types(sim_world, core)
    assert p_svc.node_types == p_sim.node_types and p_svc.room == p_sim.room
    assert {k: (j.home, j.assigned) for k, j in p_svc.jobs.items()} == \
        {k: (j.home, j.assigned) for k, j in p_sim.jobs.items()}
    assert p_sim.jobs["team-b/el"].home == "k80"
    for key in ("team-a/wait2", "team-b/wait6"):
        assert p_svc.allowed(key, T0 + NOW, core.gpu_types) == p_sim.allowed(key, NOW, core.gpu_types) != ()


def test_the_simulator_runs_the_services_defaults_or_prints_the_difference() -> None:
    from benchmarks.sim.variants import INTEGRATED, build, overrides_line
    from scoring.settings import CoreSettings, differences

    v = build("flowsched", PROFILES, 0)
    assert v.control is not None and v.settings is not None
    effective = v.control.settings
    service = Settings(kube=False).core()
    assert differences(service, CoreSettings()) == {}  # the service parses into the same defaults
    line = overrides_line(effective)
    for name, (value, _) in differences(effective, service).items():
        assert f"{name}={value!r}" in line, f"{name} differs from the service's default but is not printed"
    assert v.control.loops == INTEGRATED


def test_the_job_end_forecast_is_a_service_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # convergence.forecast (scoring.job_end.ForecastSettings, nested in the tracker's settings) from
    # flowsched.yaml or FLOWSCHED_CONVERGENCE__FORECAST__<FIELD>: reaches core(), which the tracker
    # and the progress API read; out-of-range values and unknown keys are refused.
    from extender.settings import build_settings

    assert build_settings(convergence={"forecast": {"stall_share": 0.3}}).core().convergence.forecast.stall_share == 0.3
    monkeypatch.setenv("FLOWSCHED_CONVERGENCE__FORECAST__STALL_SHARE", "0.35")
    assert Settings(kube=False).core().convergence.forecast.stall_share == 0.35
    monkeypatch.setenv("FLOWSCHED_CONVERGENCE__FORECAST__STOPPING_RECENT_SHARE", "0.75")
    assert Settings(kube=False).core().convergence.forecast.stopping_recent_share == 0.75
    for bad in ({"stall_share": 1.5}, {"samples": 3}, {"no_such_field": 1}, {"stopping_recent_share": 0.0}):
        with pytest.raises(ValueError):  # pydantic's ValidationError is one
            build_settings(convergence={"forecast": bad})


def test_every_core_section_is_a_service_setting() -> None:
    # A core setting the service cannot parse is stuck at its default in a cluster (the bottleneck
    # thresholds were, docs/bottlenecks.md told operators to set link_bytes_s): each section of
    # CoreSettings is a key of flowsched.yaml / FLOWSCHED_<SECTION>__<FIELD>, and reaches core().
    import dataclasses

    from extender.settings import Settings
    from scoring.settings import CoreSettings

    key = {"safety": "control"}  # the safety rules are flattened into the control section
    for f in dataclasses.fields(CoreSettings):
        default = getattr(CoreSettings(), f.name)
        if not dataclasses.is_dataclass(default):
            continue
        changed = next(g for g in dataclasses.fields(default) if isinstance(getattr(default, g.name), float)
                       and not isinstance(getattr(default, g.name), bool))
        value = getattr(default, changed.name)
        new = value * 0.9 if value else 1.0
        try:
            core = Settings.model_validate({key.get(f.name, f.name): {changed.name: new}}).core()
        except ValueError:  # a cross-field rule refused the nudge: nudge the other way
            new = value * 1.0001
            core = Settings.model_validate({key.get(f.name, f.name): {changed.name: new}}).core()
        assert getattr(getattr(core, f.name), changed.name) == new, f.name


def test_a_dry_run_plans_the_same_in_both_shells_and_carries_nothing_out(tmp_path: Path) -> None:
    # One meaning of dry run: the simulator's round and the service's rounds runner (both
    # scoring.kernel.run_round) plan the same typed actions, spend the same budget, and change nothing.
    from prometheus_client import CollectorRegistry

    from extender.control.loop import ControlLoop, ControlMetrics
    from scoring.kernel import DRY_RUN

    loops = ("migrator",)
    control, eng = sim_side(loops)
    control.settings = replace(control.settings, safety=replace(control.settings.safety, dry_run=True))
    placed = {j.idx: tuple(j.placement) for j in eng.jobs}
    control(eng, NOW)
    sim_planned = [o.action for o in control.last_round.outcomes["migrator"]]
    assert [o.outcome for o in control.last_round.outcomes["migrator"]] == ["dry_run"]
    assert {j.idx: tuple(j.placement) for j in eng.jobs} == placed and control.stats.migrations == 0

    migrator, _ = service_side(tmp_path, list(loops))

    class Leader:
        is_leader = True

    lp = ControlLoop(migrator, Leader(), ControlMetrics.build(CollectorRegistry()), interval_s=60, dry_run=True,
                     per_interval=1, per_hour=6, clock=lambda: T0 + NOW)
    tick = OneLoop(lp).run_once()
    assert [o.action.plan for o in tick.outcomes] == sim_planned != []
    assert [o.outcome for o in tick.outcomes] == [DRY_RUN]
    assert lp.budget.remaining(T0 + NOW) == control.budgets["migrator"].remaining(NOW) == {"interval": 0, "hour": 5}


def test_an_elastic_dry_run_resizes_the_same_jobs_in_both_shells_and_carries_nothing_out(tmp_path: Path) -> None:
    # The elastic optimizer's rounds in a dry run, each shell building its own World: nothing is
    # carried out in either, each budget is spent by its planned actions, and the size changes
    # agree action for action, the batch changes included: the service's jobs report what the
    # simulated ones do, and post their points at the engine's step time.
    from prometheus_client import CollectorRegistry

    from extender.control.leader import AlwaysLeader
    from extender.control.loop import ControlLoop, ControlMetrics
    from scoring.kernel import DRY_RUN

    scenario = timed_like_the_engine(("elastic",))
    control, eng = sim_side(("elastic",), scenario=scenario)
    control.builder.step_noise = 0.0
    control.settings = replace(control.settings, safety=replace(control.settings.safety, dry_run=True))
    ctx = service_context(tmp_path, ["elastic"], scenario=scenario)
    post_reports(ctx, control.builder.build(eng, NOW))
    before = {j.idx: (tuple(j.placement), j.batch_size) for j in eng.jobs}
    control(eng, NOW)
    sim_done = control.last_round.outcomes["elastic"] if control.last_round is not None else ()
    assert {j.idx: (tuple(j.placement), j.batch_size) for j in eng.jobs} == before  # nothing carried out
    assert control.stats.resizes == 0 and {o.outcome for o in sim_done} == {DRY_RUN}

    elastic = Elastic(ctx, ctx.core.elastic)
    actions = FakeActions()
    elastic.ctx.actions = actions
    lp = ControlLoop(elastic, AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=60, dry_run=True,
                     per_interval=16, per_hour=300, clock=lambda: T0 + NOW)
    tick = OneLoop(lp).run_once()
    assert {o.outcome for o in tick.outcomes} == {DRY_RUN} and actions.annotations == []  # nothing written

    def sizes(plans: list[Any]) -> list[tuple[str, int, int]]:
        return [(a.job, a.gpus, a.from_gpus) for a in plans if isinstance(a, Scale) and a.gpus != a.from_gpus]

    svc = [o.action.plan for o in tick.outcomes]
    sim = [o.action for o in sim_done]
    # every action, batch changes included (the reasons name each shell's restart_s: 120 s, 30 s)
    assert [replace(a, reason="") for a in svc] == [replace(a, reason="") for a in sim]
    assert sizes(sim) == [("team-b/el", 1, 2)]
    # el2 runs alone on its GPU: what it measured gives a larger batch no faster steps per sample,
    # and its gradient noise no gain, so neither shell rebatches it (the oracle's table did).
    assert [a.job for a in sim if isinstance(a, Scale) and a.gpus == a.from_gpus] == []
    assert lp.budget.remaining(T0 + NOW)["interval"] == 16 - len(svc)
    assert control.budgets["elastic"].remaining(NOW)["interval"] == control.settings.elastic.max_per_interval - len(sim)


# -- the other loops ----------------------------------------------------------------------
@pytest.mark.parametrize("dra", [NO_DRA, ALL_DRA, HALF_DRA], ids=["device-plugin", "dra", "mixed"])
def test_admission_plans_the_same_releases_and_preemptions_in_both_shells_dry_run_included(
        tmp_path: Path, dra: frozenset[int]) -> None:
    # The two waiting jobs arrive behind flowsched's admission gate: admission releases (and may
    # preempt for) them, in both shells, from the same scenario.
    from prometheus_client import CollectorRegistry

    from extender.control.admission import Admission
    from extender.control.leader import AlwaysLeader
    from extender.control.loop import ControlLoop, ControlMetrics
    from scoring.actions import Preempt, Release

    gated = ("wait6", "wait2")
    loops = ("admission",)
    control, eng = sim_side(loops, gated)
    sim_world = control.builder.build(eng, NOW)
    ctx = service_context(tmp_path, list(loops), gated, dra=dra)
    admission = Admission(ctx)
    svc_world = admission.world(T0 + NOW)
    assert svc_world is not None
    assert comparable(svc_world, T0) == comparable(sim_world, 0.0)
    assert {j.key for j in sim_world.jobs if j.gated_pods} == {"team-b/wait6", "team-a/wait2"}
    sim_actions = control.plan("admission", sim_world, budget_left=4)
    svc_actions = plan_at(admission, T0 + NOW, budget_left=4)
    assert [a.plan for a in svc_actions] == list(sim_actions) != []
    assert all(isinstance(a, Release | Preempt) for a in sim_actions)

    # Dry run, through each shell's round: the same typed actions, nothing released.
    control.settings = replace(control.settings, safety=replace(control.settings.safety, dry_run=True))
    control(eng, NOW)
    sim_round = control.last_round
    assert sim_round is not None and set(eng.gated) == {j.idx for j in eng.jobs if j.spec.name in gated}
    lp = ControlLoop(admission, AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=30,
                     dry_run=True, per_interval=ctx.core.admission.max_per_interval,
                     per_hour=ctx.core.admission.max_per_hour, clock=lambda: T0 + NOW)
    tick = OneLoop(lp).run_once()
    assert [o.action.plan for o in tick.outcomes] == [o.action for o in sim_round.outcomes["admission"]]
    assert {o.outcome for o in tick.outcomes} <= {"dry_run", "budget_exhausted"}
    assert [o.outcome for o in tick.outcomes] == [o.outcome for o in sim_round.outcomes["admission"]]


# Opted in to in-place CPU resize (and to shrinking): every running job, the ones in namespaces the
# safety rules refuse included (their pods are skipped and count as the node's other requests).
RESIZABLE_JOBS = ("slow", "fresh", "sys", "optout", "moved", "el", "el2")


def resizer_sides(tmp_path: Path, dry_run: bool) -> tuple[SimControl, Engine, Any, Any]:
    """The resizer scenario in both shells: the slow job's pod on node 0 and the fresh job's on
    node 1 opted in, each requesting its template CPU (4 GPUs x cpu_per_gpu, limit = request), the
    service's pods carrying the simulator's uids. Returns the simulator shell, its engine, the
    service's resizer and its rounds runner over the loop."""
    from prometheus_client import CollectorRegistry

    from benchmarks.sim.resizer import SimResizer, pod_uid
    from extender.control.leader import AlwaysLeader
    from extender.control.loop import ControlLoop, ControlMetrics
    from extender.control.resizer import Resizer
    from extender.kube.requests import resize_pod

    control, eng = sim_side(("resizer",))
    control.resizer = SimResizer(opted_in=lambda j: j.spec.name in RESIZABLE_JOBS,
                                 may_shrink=lambda j: j.spec.name in RESIZABLE_JOBS)
    control.settings = replace(control.settings, safety=replace(control.settings.safety, dry_run=dry_run))
    ctx = service_context(tmp_path, ["resizer"])
    listed: dict[str, list[dict[str, Any]]] = {}
    for name in RESIZABLE_JOBS:
        job = next(j for j in eng.jobs if j.spec.name == name)
        spec = next(x for x in SCENARIO if x["name"] == name)
        for i, (k, g) in enumerate(spec["on"]):
            cpu = f"{g * eng.cluster.settings.cpu_per_gpu / 1000:g}"
            old = next(p for p in ctx.state.read().control_view()[0] if p.name == f"{name}-{i}")
            p = pod(f"{name}-{i}", gpus=g, node_name=node_name(k), namespace=spec["ns"], cpu=cpu, phase="Running",
                    annotations={"flowsched.io/resizable": "true", "flowsched.io/cpu-shrink": "true"},
                    labels={"flowsched.io/job": name}, uid=pod_uid(job, i))
            p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cpu
            ctx.state.delete_pod(old.uid)
            ctx.state.upsert_pod(parse_pod(p))
            listed.setdefault(node_name(k), []).append(p)
    resizer = Resizer(ctx, pods_on=lambda n: listed.get(n, []))

    def patch(ns: str, name: str, container: str, resources: dict[str, Any]) -> bool:
        resizer.__dict__.setdefault("patched", []).append(resize_pod(ns, name, container, resources).body)
        return True

    resizer._patch_resize = patch  # type: ignore[method-assign]
    r = ctx.core.resizer
    lp = ControlLoop(resizer, AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=r.interval_s,
                     dry_run=dry_run, per_interval=r.max_per_interval, per_hour=r.max_per_hour,
                     clock=lambda: T0 + NOW)
    return control, eng, resizer, OneLoop(lp)


def _cpu_of(body: dict[str, Any]) -> tuple[str, str]:
    res = body["spec"]["containers"][0]["resources"]
    return res["requests"]["cpu"], res["limits"]["cpu"]


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_resizer_is_carried_out_action_for_action_in_both_shells(tmp_path: Path, dry_run: bool) -> None:
    # Each shell builds the resizer's World from its own state (the engine's pods; the pods the
    # API lists), the kernel plans, and each carries the same Resize actions out: the engine's
    # pod CPU and job speed, the service's resize subresource. A dry run carries out nothing in both.
    from benchmarks.sim.cpu_model import cpu_speed, sensitivity_of
    from benchmarks.sim.resizer import pod_uid
    from scoring.actions import Resize

    control, eng, resizer, service = resizer_sides(tmp_path, dry_run)
    svc_world = resizer.world(T0 + NOW)
    sim_world = World(NOW, (), (), (), resize_nodes=control.resizer.nodes(
        eng, NOW, lambda j: control.builder.estimate(eng, j), LABELS, control.settings.safety))
    assert svc_world.resize_nodes == sim_world.resize_nodes  # the same rows, field for field
    assert {r.phase.name for nd in sim_world.resize_nodes for r in nd.rows} == {"COMPLETING", "GROWING"}

    used, speeds = eng.cluster.cpu_used.copy(), {j.idx: j.cpu_speed for j in eng.jobs}
    control(eng, NOW)
    tick = service.run_once()
    sim_round = control.last_round
    assert sim_round is not None
    sim_done = sim_round.outcomes["resizer"]
    assert [o.action.plan for o in tick.outcomes] == [o.action for o in sim_done] != []
    actions = [o.action for o in sim_done]
    assert all(isinstance(a, Resize) for a in actions)
    patched = resizer.__dict__.get("patched", [])
    if dry_run:  # the budget is spent as if carried out: the same ones are held back
        assert [o.outcome for o in tick.outcomes] == [o.outcome for o in sim_done]
        assert {o.outcome for o in sim_done} == {"dry_run", "budget_exhausted"}
        assert patched == [] and resizer.ctx.actions.annotations == []
        assert control.resizer.requests == {} and control.resizer.stats.resizes == 0
        assert (eng.cluster.cpu_used == used).all() and {j.idx: j.cpu_speed for j in eng.jobs} == speeds
        return
    # The same outcomes (the service's label for a done resize is "resized"), the budget included.
    assert [{"resized": "done"}.get(o.outcome, o.outcome) for o in tick.outcomes] == [o.outcome for o in sim_done]
    done = [a for a, o in zip(actions, sim_done, strict=True) if isinstance(a, Resize) and o.outcome == "done"]
    held = {o.action.key for o in sim_done if o.outcome == "budget_exhausted"}
    assert len(done) == control.settings.resizer.max_per_interval and held  # the scenario holds
    assert any(a.to_m < a.from_m for a in done) and any(a.to_m > a.from_m for a in done)
    # The same CPU, written by each shell: the request (and limit = request) of each pod.
    assert [_cpu_of(b) for b in patched] == [(f"{round(a.to_m)}m", f"{round(a.to_m)}m") for a in done]
    by_name = {j.spec.name: j for j in eng.jobs}
    moved = dict.fromkeys(range(eng.cluster.settings.nodes), 0.0)
    for a in done:
        job = by_name[a.job.split("/")[1]]
        i = int(a.pod.rsplit("-", 1)[1])
        assert a.uid == pod_uid(job, i) and control.resizer.requests[a.uid] == a.to_m
        moved[job.placement[i][0]] += a.to_m - a.from_m
        sens = sensitivity_of(job.spec.app, control.resizer.sensitivity)
        slowest = min(float(cpu_speed(control.resizer.requests.get(pod_uid(job, k), a.from_m), a.from_m,
                                      sens.cpu_fraction, sens.saturation)) for k in range(len(job.placement)))
        assert job.cpu_speed == pytest.approx(slowest)  # as fast as its slowest pod's CPU allows
    for k, m in moved.items():
        assert eng.cluster.cpu_used[k] == pytest.approx(used[k] + m)  # the requests count against the node
    assert control.resizer.stats.resizes == len(done)

    # The next round, within the cooldown (the pods' cpu-resized-at): the resized pods are left
    # alone, the ones the budget held back are planned again.
    eng.now = NOW + control.settings.resizer.interval_s
    for j in eng.jobs:
        j.synced_at = max(j.synced_at, eng.now)  # no new points: the same estimates
    control(eng, eng.now)
    again = control.last_round
    assert again is not None and {a.key for a in again.actions("resizer")} == held
    why = {pod: r["why"] for nd in again.plans["resizer"].view["nodes"].values() for pod, r in nd["pods"].items()}
    assert {why[a.pod] for a in done} == {"COOLDOWN"}



# -- the idle loop and the remedies: what the engine does not model, from the scenario -------
class EvictingActions(FakeActions):
    """The service's Kubernetes writes, recorded: every eviction is accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[str] = []

    def evict(self, ns: str, name: str, uid: str = "") -> str:
        self.evicted.append(f"{ns}/{name}")
        return "evicted"


def _service_rounds(controller: Any, clock: list[float], dry_run: bool, *, budgeted: bool = True) -> OneLoop:
    """The service's rounds runner over this one loop, with the loop's own budget (none for the remedies)."""
    from prometheus_client import CollectorRegistry

    from extender.control.leader import AlwaysLeader
    from extender.control.loop import ControlLoop, ControlMetrics

    core = controller.ctx.core
    budget = {"per_interval": core.idle.max_per_interval, "per_hour": core.idle.max_per_hour} if budgeted \
        else {"budgeted": False}
    lp = ControlLoop(controller, AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=60,
                     dry_run=dry_run, clock=lambda: clock[0], **budget)
    return OneLoop(lp)


# The service's label for a done eviction; the simulator's shell reports it as the kernel's DONE.
AS_SIM = {"evicted": "done"}

# An opted-in notebook on a fifth node, idle from the start; every other pod busy.
NOTEBOOK = {"name": "nb", "ns": "team-a", "gpus": 1, "on": [(4, 1)], "start": 19_000.0, "workload": "notebook",
            "reclaim": "1h"}
IDLE_SCENARIO = [*SCENARIO, NOTEBOOK]


def _util(pod_key: str) -> float:
    return 0.0 if pod_key == "team-a/nb-0" else 90.0


@pytest.mark.parametrize("dry_run, dra", [(False, NO_DRA), (True, NO_DRA), (False, frozenset(range(5)))],
                         ids=["act", "dry-run", "act-dra"])
def test_the_idle_loop_runs_the_same_rounds_in_both_shells(tmp_path: Path, dry_run: bool, dra: frozenset[int]) -> None:
    # Each shell builds the idle loop's World from its own state (the engine's placements and the
    # scenario's samples; the pods the snapshot holds and the samples the telemetry refresher
    # writes) and carries out its own rounds, every 5 minutes for two hours: the notebook is
    # reported and warned at the idle window, and evicted warning_s after the delivered warning,
    # GPU pods waiting. A dry run tells and evicts nothing in either, so it is warned every round.
    from extender.control.idle import IdleLoop
    from scoring.actions import IdleReport, IdleWarn, Reclaim
    from scoring.workload import WorkloadClass

    sources = WorldSources(
        gpu_samples=lambda job, i, _now: (_util(pod_name(job, i)),),
        workload=lambda j: WorkloadClass.NOTEBOOK if j.spec.name == "nb" else WorkloadClass.TRAINING,
        reclaim_idle=lambda j: NOTEBOOK["reclaim"] if j.spec.name == "nb" else None)
    control, eng = sim_side(("idle",), scenario=IDLE_SCENARIO, nodes=5, sources=sources)
    control.settings = replace(control.settings, safety=replace(control.settings.safety, dry_run=dry_run))
    actions = EvictingActions()
    ctx = service_context(tmp_path, ["idle"], scenario=IDLE_SCENARIO, nodes=5, actions=actions, dra=dra)
    idle = IdleLoop(ctx)
    clock = [T0 + NOW]
    service = _service_rounds(idle, clock, dry_run)
    nb = next(j for j in eng.jobs if j.spec.name == "nb")
    told: list[tuple[str, str]] = []
    for k in range(0, 7200, 300):
        t = NOW + k
        eng.now, clock[0] = t, T0 + t
        holding = [p.key for p in ctx.state.read().control_view()[0] if p.node and p.requests.gpus > 0]
        ctx.state.set_pod_gpu_util({key: [_util(key)] for key in holding}, T0 + t)
        sim_world, svc_world = control.builder.idle_world(eng, t), idle.world(T0 + t)
        assert svc_world is not None
        assert sorted(svc_world.gpu_pods, key=lambda p: p.key) == sorted(sim_world.gpu_pods, key=lambda p: p.key)
        assert svc_world.gpu_pods_waiting == sim_world.gpu_pods_waiting == 3  # wait6's two pods, wait2's one

        control(eng, t)
        tick = service.run_once()
        sim_done = control.last_round.outcomes["idle"] if control.last_round is not None else ()
        assert [o.action.plan for o in tick.outcomes] == [o.action for o in sim_done]  # field for field
        assert [AS_SIM.get(o.outcome, o.outcome) for o in tick.outcomes] == [o.outcome for o in sim_done]
        told += [(o.action.kind, o.outcome) for o in sim_done]
        if any(isinstance(o.action, Reclaim) and o.outcome == "done" for o in sim_done):
            break  # evicted in both: the notebook's pod is recreated, each shell in its own way
    assert control.budgets["idle"].remaining(eng.now) == service.loop.budget.remaining(clock[0])
    if dry_run:  # planned as if told, nothing told: the warning is never delivered, nothing evicted
        assert {o for _, o in told} == {"dry_run"}
        assert ("idle_event", "dry_run") in told and told.count(("idle_warn", "dry_run")) > 1
        assert "evict" not in {kind for kind, _ in told}
        assert ctx.recorder.events == [] and actions.evicted == []
        assert control.stats.notices == {} and control.stats.reclaimed == 0 and nb.placement
        return
    assert told == [("idle_event", "recorded"), ("idle_warn", "recorded"), ("evict", "done")]
    assert isinstance(control.last_round.plans["idle"].actions[0], Reclaim)  # type: ignore[union-attr]
    assert control.stats.notices == {IdleReport.kind: 1, IdleWarn.kind: 1} and control.stats.reclaimed == 1
    assert actions.evicted == ["team-a/nb-0"] and not nb.placement  # its GPU given back in both


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_remedies_run_the_same_rounds_in_both_shells(tmp_path: Path, dry_run: bool) -> None:
    # The same diagnoses in both shells (the service's diagnoser; the scenario's source for the
    # simulator): each builds its World with them, plans and tells the same remedies, round after
    # round. A dry run tells nothing in either.
    from extender.control.remedies import Remedies
    from scoring.bottleneck import PS, Bottleneck, Diagnosis, JobShape

    one = JobShape(workers=1, ps=0, nodes=1)
    diagnoses = {
        "team-a/slow": Diagnosis("team-a/slow", Bottleneck.INPUT, 0.95, ("cpu at its limit",), one),
        "team-a/fresh": Diagnosis("team-a/fresh", Bottleneck.STRAGGLER, 0.9, ("step time 2x the median",), one,
                                  where=node_name(1), slow_pods=("team-a/fresh-0",)),
        "team-b/el": Diagnosis("team-b/el", Bottleneck.COMMUNICATION, 0.9, ("ps link saturated",),
                               JobShape(workers=2, ps=1, nodes=1, ps_range=(1, 4)), where=PS),
        # Refused or not running: no remedy, in both shells.
        "kube-system/sys": Diagnosis("kube-system/sys", Bottleneck.INPUT, 0.95, ("cpu at its limit",), one),
        "team-a/wait2": Diagnosis("team-a/wait2", Bottleneck.INPUT, 0.95, ("cpu at its limit",), one),
    }
    control, eng = sim_side(("remedies",), sources=WorldSources(diagnoses=lambda _eng, _now: diagnoses))
    control.settings = replace(control.settings, safety=replace(control.settings.safety, dry_run=dry_run))
    ctx = service_context(tmp_path, ["remedies"])
    ctx.world.diagnoses = lambda: diagnoses
    remedies = Remedies(ctx)
    clock = [T0 + NOW]
    service = _service_rounds(remedies, clock, dry_run, budgeted=False)
    assert "remedies" not in control.budgets  # no budget of its own, as in the service

    rounds = []
    hold = control.settings.safety.hold_s
    for t in (NOW, NOW + control.remedies_interval_s, NOW + hold):
        eng.now, clock[0] = t, T0 + t
        for j in eng.jobs:
            j.synced_at = max(j.synced_at, t)  # no new points: the same estimates
        control(eng, t)
        tick = service.run_once()
        sim_done = control.last_round.outcomes.get("remedies", ()) if control.last_round is not None else ()
        assert [o.action.plan for o in tick.outcomes] == [o.action for o in sim_done]  # field for field
        assert [o.outcome for o in tick.outcomes] == [o.outcome for o in sim_done]
        rounds.append([(o.action.kind, o.action.key, o.outcome) for o in sim_done])
    told = "dry_run" if dry_run else "recommended"
    # Told once per hold_s in both (the kernel's Memory notes a told remedy, a dry run's too): not
    # the next round, while the diagnosis still holds, and again once hold_s has passed.
    first = [("move-replica", "team-a/fresh", told), ("give-cpu", "team-a/slow", told), ("add-ps", "team-b/el", told)]
    assert rounds == [first, [], first]
    if dry_run:
        assert ctx.recorder.events == [] and control.stats.notices == {}
    else:
        assert len(ctx.recorder.events) == 6
        assert control.stats.notices == {"give-cpu": 2, "move-replica": 2, "add-ps": 2}


def test_without_sources_the_simulators_idle_loop_and_remedies_find_nothing() -> None:
    # What every benchmark runs: no samples (no pod is ever idle), no diagnosis, training only.
    control, eng = sim_side(("idle", "remedies"))
    control(eng, NOW)
    done = control.last_round
    assert done is not None and set(done.plans) == {"idle", "remedies"}
    assert done.actions("idle") == () and done.actions("remedies") == ()
    pods = control.builder.idle_world(eng, NOW).gpu_pods
    assert pods and all(p.samples == () and p.workload == "training" and p.reclaim is None for p in pods)
    assert all(j.diagnosis is None for j in control.builder.build(eng, NOW).jobs)
