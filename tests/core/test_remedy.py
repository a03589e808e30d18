"""The remedies of bottleneck diagnosis composed with the loops (scoring.remedy, scoring.control)."""

from __future__ import annotations

import math
from dataclasses import replace

from scoring.bottleneck import PS, Bottleneck, BottleneckSettings, Diagnosis, JobShape
from scoring.control import Scale, elastic_job, plan_elastic_for
from scoring.elastic import ElasticJob
from scoring.remedy import (
    AddPs,
    Consolidate,
    GiveCpu,
    MoveReplica,
    cap_growth,
    constrain,
    cpu_target,
    growth_refusal,
    plan_remedies,
    resize_refusal,
    resize_targets,
    wants_cpu,
    with_diagnoses,
)
from scoring.settings import CoreSettings, ElasticLoopSettings, SafetySettings
from scoring.world import JobState, NodeState, World

S = BottleneckSettings()
SAFETY = SafetySettings()


def diag(kind: Bottleneck, confidence: float = 0.9, *, where: str = "", slow: tuple[str, ...] = (),
         shape: JobShape | None = None, scaling: float = math.nan) -> Diagnosis:
    return Diagnosis("ns/a", kind, confidence, ("evidence",), shape or JobShape(1, 0, 1), where=where,
                     slow_pods=slow, scaling=scaling)


def job(key: str = "ns/a", *, gpus_on: dict[str, float] | None = None, elastic: tuple[int, int] | None = (1, 4),
        checkpointable: bool = False, d: Diagnosis | None = None) -> JobState:
    gpus_on = gpus_on if gpus_on is not None else {"n0": 1.0}
    held = int(sum(gpus_on.values()))
    return JobState(key=key, namespace=key.split("/")[0], gpus_on=gpus_on, live_gpus=held, per_pod=1,
                    checkpointable=checkpointable, elastic=elastic, running=True, settling=False,
                    runtime_s=3600.0, attained_gpu_s=3600.0, since_scaled_s=math.inf, diagnosis=d)


def world(*jobs: JobState, free: tuple[float, ...] = (8.0, 8.0)) -> World:
    nodes = []
    for k, f in enumerate(free):
        name = f"n{k}"
        used = sum(j.gpus_on.get(name, 0.0) for j in jobs)
        nodes.append(NodeState(name, f + used, used))
    return World(now=1000.0, nodes=tuple(nodes), jobs=tuple(sorted(jobs, key=lambda j: j.key)), pending=())


def grown(plan_actions: tuple[Scale, ...], key: str) -> bool:
    return any(a.job == key and a.kind == "scale-up" for a in plan_actions)


# -- the elastic optimizer -----------------------------------------------------------------------------
def test_the_elastic_optimizer_grows_an_undiagnosed_or_compute_bound_job() -> None:
    settings = CoreSettings()
    assert grown(plan_elastic_for(world(job()), settings).actions, "ns/a")
    assert grown(plan_elastic_for(world(job(d=diag(Bottleneck.COMPUTE))), settings).actions, "ns/a")


def test_an_input_bound_job_is_not_grown_and_the_plan_says_why() -> None:
    plan = plan_elastic_for(world(job(d=diag(Bottleneck.INPUT))), CoreSettings())
    assert not grown(plan.actions, "ns/a")
    assert "input-bound" in plan.refusals["ns/a"]


def test_a_communication_bound_job_is_not_grown_and_its_gpus_go_to_the_other_job() -> None:
    comm = job("ns/a", d=diag(Bottleneck.COMMUNICATION, where="network"))
    other = job("ns/b", gpus_on={"n1": 1.0})
    capped = CoreSettings(elastic=ElasticLoopSettings(explore_factor=2.0, min_gain=0.30))
    plan = plan_elastic_for(world(comm, other, free=(1.0, 2.0)), capped)
    assert not grown(plan.actions, "ns/a")
    # ns/b has measured nothing: it grows to twice its size, as far as the prior is trusted
    # (elastic.explore_factor 2), into the GPUs ns/a is not given.
    assert any(a.job == "ns/b" and a.gpus == 2 for a in plan.actions)
    undiagnosed = plan_elastic_for(world(replace(comm, diagnosis=None), other, free=(1.0, 2.0)), capped)
    assert grown(undiagnosed.actions, "ns/a")  # the same world without the diagnosis: it is grown


def test_a_low_confidence_or_unknown_diagnosis_changes_nothing() -> None:
    for d in (diag(Bottleneck.INPUT, confidence=0.5), diag(Bottleneck.UNKNOWN, confidence=0.0)):
        assert growth_refusal(d, S) is None
        assert grown(plan_elastic_for(world(job(d=d)), CoreSettings()).actions, "ns/a")


def test_compute_bound_but_scaling_poorly_is_not_grown() -> None:
    assert growth_refusal(diag(Bottleneck.COMPUTE, scaling=0.4), S) is not None
    assert growth_refusal(diag(Bottleneck.COMPUTE, scaling=0.9), S) is None


def test_a_diagnosed_job_may_still_shrink() -> None:
    j = job(gpus_on={"n0": 4.0}, d=diag(Bottleneck.INPUT))
    (opt,), capped = cap_growth([_option(j)], [j], S)
    assert opt.max_gpus == 4 and capped == {}  # at its current size already: nothing capped


def _option(j: JobState) -> ElasticJob:
    return elastic_job(j, world(j), CoreSettings().elastic)


def test_constrain_drops_scale_ups_only() -> None:
    w = world(job(d=diag(Bottleneck.IDLE)))
    up = Scale("ns/a", 4, 1, 0, 0, 1, 1, 4, "r")
    down = Scale("ns/a", 1, 2, 0, 0, 1, 1, 4, "r")
    kept, dropped = constrain([up, down], w, S)
    assert kept == (down,) and "idle" in dropped["ns/a"]


# -- the resizer ---------------------------------------------------------------------------------------
def test_the_resizer_may_give_cpu_to_input_bound_jobs_only() -> None:
    assert wants_cpu(diag(Bottleneck.INPUT), S)
    assert resize_refusal(diag(Bottleneck.INPUT), True, S) is None
    assert "communication-bound" in (resize_refusal(diag(Bottleneck.COMMUNICATION), True, S) or "")
    assert resize_refusal(diag(Bottleneck.COMPUTE), True, S) is not None
    assert resize_refusal(diag(Bottleneck.COMMUNICATION), False, S) is None  # lowering is never refused
    assert resize_refusal(None, True, S) is None and not wants_cpu(None, S)


# -- own remedies --------------------------------------------------------------------------------------
def test_input_bound_gets_a_cpu_hint() -> None:
    (r,) = plan_remedies(world(job(d=diag(Bottleneck.INPUT))), S, SAFETY)
    assert isinstance(r, GiveCpu) and r.job == "ns/a"


def test_communication_bound_spread_job_is_consolidated_only_when_checkpointable_and_it_fits() -> None:
    d = diag(Bottleneck.COMMUNICATION, where="network", shape=JobShape(2, 0, 2))
    spread = {"n0": 2.0, "n1": 2.0}
    (r,) = plan_remedies(world(job(gpus_on=spread, checkpointable=True, d=d), free=(2.0, 1.0)), S, SAFETY)
    assert isinstance(r, Consolidate) and r.target_node == "n0" and r.gpus == 4.0 and r.from_nodes == 2
    assert plan_remedies(world(job(gpus_on=spread, checkpointable=False, d=d), free=(2.0, 1.0)), S, SAFETY) == ()
    assert plan_remedies(world(job(gpus_on=spread, checkpointable=True, d=d), free=(1.0, 1.0)), S, SAFETY) == ()


def test_a_ps_bottleneck_adds_a_parameter_server_within_its_range() -> None:
    shape = JobShape(workers=4, ps=1, nodes=2, ps_range=(1, 2))
    (r,) = plan_remedies(world(job(d=diag(Bottleneck.COMMUNICATION, where=PS, shape=shape))), S, SAFETY)
    assert isinstance(r, AddPs) and (r.from_ps, r.ps) == (1, 2)
    full = replace(shape, ps=2)
    assert plan_remedies(world(job(d=diag(Bottleneck.COMMUNICATION, where=PS, shape=full))), S, SAFETY) == ()
    fixed = replace(shape, ps_range=None)
    assert plan_remedies(world(job(d=diag(Bottleneck.COMMUNICATION, where=PS, shape=fixed))), S, SAFETY) == ()


def test_a_straggler_replica_is_moved_when_checkpointable() -> None:
    d = diag(Bottleneck.STRAGGLER, where="n1", slow=("a-worker-2",), shape=JobShape(4, 0, 2))
    (r,) = plan_remedies(world(job(checkpointable=True, d=d)), S, SAFETY)
    assert isinstance(r, MoveReplica) and (r.pod, r.node) == ("a-worker-2", "n1")
    assert plan_remedies(world(job(checkpointable=False, d=d)), S, SAFETY) == ()


def test_no_remedy_for_excluded_namespaces_held_jobs_or_unsure_diagnoses() -> None:
    d = diag(Bottleneck.INPUT)
    assert plan_remedies(world(job("kube-system/a", d=d)), S, SAFETY) == ()
    assert plan_remedies(world(replace(job(d=d), since_scaled_s=10.0)), S, SAFETY) == ()
    assert plan_remedies(world(job(d=diag(Bottleneck.INPUT, confidence=0.3))), S, SAFETY) == ()
    assert plan_remedies(world(job(d=diag(Bottleneck.COMPUTE))), S, SAFETY) == ()


def test_cpu_target_steps_up_to_the_pods_max() -> None:
    assert cpu_target(2000.0, 8000.0, S) == 3000.0
    assert cpu_target(6000.0, 8000.0, S) == 8000.0
    assert cpu_target(9000.0, 8000.0, S) == 9000.0  # never lowers


def test_with_diagnoses_puts_each_on_its_job() -> None:
    w = world(job("ns/a"), job("ns/b", gpus_on={"n1": 1.0}))
    d = diag(Bottleneck.INPUT)
    w2 = with_diagnoses(w, {"ns/a": d})
    assert w2.job("ns/a").diagnosis is d  # type: ignore[union-attr]
    assert w2.job("ns/b").diagnosis is None  # type: ignore[union-attr]
    assert with_diagnoses(w, {}) is w


def test_resize_targets_raise_input_bound_pods_and_refuse_raises_that_would_not_help() -> None:
    diags = {"ns/in": diag(Bottleneck.INPUT), "ns/net": diag(Bottleneck.COMMUNICATION, where="network")}
    jobs = ["ns/in", "ns/net", "ns/other"]
    cur = [2000.0, 2000.0, 2000.0]
    planned = [2000.0, 3000.0, 2500.0]  # FlowCon would raise the network-bound one and the undiagnosed one
    out, why = resize_targets(jobs, cur, planned, [8000.0] * 3, 10_000.0, diags, S)
    assert out.tolist() == [3000.0, 2000.0, 2500.0]
    assert "input pipeline" in why[0] and "communication-bound" in why[1] and 2 not in why


def test_resize_targets_stay_within_the_pool() -> None:
    out, why = resize_targets(["ns/in"], [2000.0], [2000.0], [8000.0], 2400.0, {"ns/in": diag(Bottleneck.INPUT)}, S)
    assert out.tolist() == [2400.0] and 0 in why
    out, why = resize_targets(["ns/in"], [2000.0], [2000.0], [8000.0], 1500.0, {"ns/in": diag(Bottleneck.INPUT)}, S)
    assert out.tolist() == [2000.0] and why == {}


def test_with_diagnoses_fills_the_measured_scaling_so_poor_scalers_are_not_grown() -> None:
    j = replace(job(gpus_on={"n0": 4.0}), step_samples={1: 1.0, 4: 0.5})  # 4 GPUs: 2x faster, 50 % per GPU
    w = with_diagnoses(world(j), {"ns/a": diag(Bottleneck.COMPUTE)})
    d = w.job("ns/a").diagnosis  # type: ignore[union-attr]
    assert d is not None and d.scaling == 0.5
    assert "scales poorly" in (growth_refusal(d, S) or "")


def test_resize_targets_leave_frozen_rows_alone() -> None:
    out, why = resize_targets(["ns/in"], [2000.0], [2000.0], [8000.0], 10_000.0, {"ns/in": diag(Bottleneck.INPUT)},
                              S, frozen=[True])
    assert out.tolist() == [2000.0] and why == {}
