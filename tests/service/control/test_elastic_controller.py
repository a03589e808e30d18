"""extender.control.elastic on a fake snapshot and tracker: what it plans and writes, the opt-in,
holding jobs mid-change, reserving GPUs for waiting pods, and the ControlLoop's dry run."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from extender.control.elastic import PLAN, REASON_PLAN, Elastic, parse_range
from extender.control.events import LogRecorder
from extender.control.leader import AlwaysLeader
from extender.control.loop import DRY_RUN, ControlLoop, ControlMetrics
from extender.settings import ElasticConfig, Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring.convergence import Phase
from scoring.step_samples import MeasuredSteps
from tests.control_fakes import FakeActions, FakeTracker, OneLoop, make_context, plan_at
from tests.k8s_factories import node, pod


@dataclass
class Est:
    phase: Phase
    step_rate: float = math.nan
    remaining_seconds: float = math.nan  # no end estimate (the elastic horizon reads it)
    end: None = None  # no end under a stopping rule either


def worker(job: str, i: int, node_name: str | None, elastic: str | None = "1-8", gpus: int = 1) -> dict[str, Any]:
    ann = {"flowsched.io/elastic": elastic} if elastic else {}
    return pod(f"{job}-{i}", gpus=gpus, node_name=node_name, namespace="t", annotations=ann,
               labels={"flowsched.io/job": job}, phase="Running" if node_name else "Pending")


def make(pods: list[dict[str, Any]], est: dict[str, Est] | None = None, nodes: int = 2,
         **cfg: Any) -> tuple[Elastic, FakeActions, LogRecorder, ClusterState]:
    state = ClusterState()
    for k in range(nodes):
        state.upsert_node(parse_node(node(f"n{k}", gpus=4)))
    for p in pods:
        state.upsert_pod(parse_pod(p))
    state.mark_synced()
    actions, rec = FakeActions(), LogRecorder()
    # Without the exploration cap unless a test asks (its own test: the lone job below), at the 30 %
    # hysteresis these scenarios were written for (the default prior's doubling gains less than 50 %).
    cfg_ = ElasticConfig(**{"las_power": 0.0, "explore_factor": 0.0, "min_gain": 0.30, **cfg})
    ctx = make_context(state, FakeTracker(est or {}), actions, rec, settings=Settings(kube=False, elastic=cfg_))
    return Elastic(ctx, cfg_), actions, rec, state


def test_parse_range() -> None:
    assert parse_range("1-8") == (1, 8) and parse_range(" 2 - 4 ") == (2, 4)
    for bad in (None, "", "8-1", "0-4", "x", "4"):
        assert parse_range(bad) is None


def test_lone_elastic_job_grows_into_free_gpus_and_the_plan_is_published() -> None:
    el, actions, rec, _ = make([worker("a", 0, "n0"), worker("a", 1, "n0")], explore_factor=2.0)
    acts = plan_at(el, 1000.0)
    # It has measured only its own size: it grows to twice that (elastic.explore_factor), not to all 8.
    assert len(acts) == 1 and acts[0].kind == "scale-up" and acts[0].as_dict()["detail"]["gpus"] == 4
    assert el.act(acts[0], 1000.0) == "planned"
    plans = [json.loads(a[2][PLAN]) for a in actions.annotations]
    assert [a[1] for a in actions.annotations] == ["a-0", "a-1"]
    assert all(p["gpus"] == 4 and p["replicas"] == 4 and p["at"] == 1000.0 for p in plans)
    assert [e[1] for e in rec.events] == [REASON_PLAN, REASON_PLAN]


def test_not_opted_in_is_never_planned_and_its_gpus_are_not_shared() -> None:
    pods = [worker("a", 0, "n0"), worker("b", 0, "n1", elastic=None, gpus=4)]
    el, *_ = make(pods)
    acts = plan_at(el, 0.0)
    assert [a.target for a in acts] == ["t/a"] and acts[0].as_dict()["detail"]["gpus"] == 4  # 8 GPUs - b's 4
    # Mixed annotations within one job: not elastic.
    el2, *_ = make([worker("c", 0, "n0"), worker("c", 1, "n0", elastic=None)])
    assert plan_at(el2, 0.0) == []


def test_waiting_pods_are_reserved_and_running_jobs_shrink_for_them() -> None:
    pods = [worker("a", i, f"n{i // 4}") for i in range(8)]
    pods.append(worker("w", 0, None, elastic=None, gpus=4))  # a waiting 4-GPU pod
    el, *_ = make(pods)
    acts = plan_at(el, 0.0)
    assert len(acts) == 1 and acts[0].kind == "scale-down" and acts[0].as_dict()["detail"]["gpus"] == 4
    el_off, *_ = make(pods, reserve_pending=False)
    assert plan_at(el_off, 0.0) == []


def test_jobs_mid_change_or_in_cooldown_are_held() -> None:
    pods = [worker("a", 0, "n0"), worker("a", 1, None)]  # one pod still waiting
    el, *_ = make(pods)
    assert plan_at(el, 0.0) == []
    pods2 = [worker("a", 0, "n0"), worker("a", 1, "n0")]
    el2, actions, _, state = make(pods2, cooldown_s=300)
    act = plan_at(el2, 0.0)[0]
    el2.act(act, 0.0)
    for p, (_, _, ann) in zip(pods2, actions.annotations, strict=True):  # what the pod watch brings back
        p["metadata"].setdefault("annotations", {}).update(ann)
        state.upsert_pod(parse_pod(p))
    assert plan_at(el2, 100.0) == []  # within cooldown, read from the pods' plan annotation
    assert plan_at(el2, 400.0) != []  # the pods did not change (no job controller here): planned again


def test_a_plan_that_changes_only_the_batch_keeps_the_time_of_the_last_rescale() -> None:
    from scoring.control import Scale

    pods = [worker("a", 0, "n0"), worker("a", 1, "n0")]
    el, actions, _, state = make(pods, cooldown_s=300)

    def act(kind_gpus: int, now: float) -> dict[str, Any]:
        s = Scale("t/a", kind_gpus, 2, 512, 256, 1, 1, 8, "test plan")
        el.world(now)  # the pods, as a round reads them
        el.act(el.bind(s), now)
        body: dict[str, Any] = json.loads(actions.annotations[-1][2][PLAN])
        for p in pods:  # what the pod watch brings back
            p["metadata"].setdefault("annotations", {}).update({PLAN: json.dumps(body)})
            state.upsert_pod(parse_pod(p))
        return body

    first = act(4, 100.0)  # a rescale: 2 -> 4 GPUs
    assert first["at"] == first["resized_at"] == 100.0
    again = act(2, 250.0)  # same size, new batch: a rebatch
    assert again["at"] == 250.0 and again["resized_at"] == 100.0
    assert state.read().pod(pods[0]["metadata"]["uid"]).elastic_resized_at == 100.0  # type: ignore[union-attr]
    # An annotation written before resized_at existed counts from its "at".
    assert parse_pod(worker("b", 0, "n1")).elastic_resized_at is None
    pods[0]["metadata"]["annotations"][PLAN] = json.dumps({"gpus": 2, "at": 7.0})
    assert parse_pod(pods[0]).elastic_resized_at == 7.0


def test_convergence_weight_gives_gpus_to_the_growing_job() -> None:
    pods = [worker("g", i, "n0") for i in range(4)] + [worker("c", i, "n1") for i in range(4)]
    est = {"t/g": Est(Phase.GROWING), "t/c": Est(Phase.COMPLETING)}
    # The phase weights are neutral by default (scoring/settings.py); set, they move GPUs.
    el, *_ = make(pods, est, min_gain=0.0, restart_s=0.0, completing_weight=0.5)
    acts = {a.target: a.as_dict()["detail"]["gpus"] for a in plan_at(el, 0.0)}
    assert acts["t/g"] > 4 > acts["t/c"]
    neutral, *_ = make(pods, est, min_gain=0.0, restart_s=0.0)
    assert plan_at(neutral, 0.0) == []


def test_measured_step_times_shape_the_plan() -> None:
    # Job a measured at 4 GPUs; nothing else known. A job that barely speeds up is left alone
    # once a second size shows it: with 2 GPUs the step took almost as long as with 4.
    pods = [worker("a", i, "n0") for i in range(4)]
    el, *_ = make(pods, {"t/a": Est(Phase.GROWING, step_rate=1.0)}, nodes=2)
    el.ctx.world.measured["t/a"] = MeasuredSteps(samples={2: 1.02})
    acts = plan_at(el, 0.0)  # records the 4-GPU sample (1.0 s/step)
    assert el.ctx.world.measured["t/a"].samples[4] == 1.0
    assert acts == []  # 8 GPUs would not be faster by the margin a restart needs


def test_dry_run_loop_plans_but_writes_nothing() -> None:
    el, actions, rec, _ = make([worker("a", 0, "n0")])
    loop = ControlLoop(el, AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=30, dry_run=True,
                       per_interval=4, per_hour=30)
    tick = OneLoop(loop).run_once()
    assert [o.outcome for o in tick.outcomes] == [DRY_RUN]
    assert actions.annotations == [] and rec.events == []


def test_planned_gpus_is_the_latest_plan_on_the_jobs_pods() -> None:
    from extender.control.world_builder import planned_gpus

    def with_plan(i: int, plan: object) -> Any:
        p = worker("a", i, "n0")
        p["metadata"]["annotations"][PLAN] = json.dumps(plan)
        return parse_pod(p)

    assert planned_gpus([parse_pod(worker("a", 0, "n0"))]) == 0  # never planned
    assert planned_gpus([with_plan(0, {"gpus": 2, "at": 10.0}), with_plan(1, {"gpus": 4, "at": 20.0})]) == 4
    assert planned_gpus([with_plan(0, {"gpus": 4, "at": 20.0}), with_plan(1, {"gpus": 2, "at": 10.0})]) == 4
    for bad in ("4", True, -1, 2.5, None):  # a malformed count reads as no plan, never as a size
        assert planned_gpus([with_plan(0, {"gpus": bad, "at": 10.0})]) == 0


def test_a_replica_that_loses_the_lease_mid_action_writes_nothing_more() -> None:
    from extender.kube.errors import LostLeadership

    el, actions, rec, _ = make([worker("a", 0, "n0"), worker("a", 1, "n0")])
    acts = plan_at(el, 1000.0)

    class Flaky:  # leader for the first annotation and its Event, then the Lease is lost
        def __init__(self) -> None:
            self.checks = 0

        @property
        def is_leader(self) -> bool:
            self.checks += 1
            return self.checks <= 2

    el.ctx.leader = Flaky()
    try:
        el.act(acts[0], 1000.0)
    except LostLeadership as e:
        assert e.writes == 2 and "lost_leadership" in str(e)
    else:
        raise AssertionError("the action went on after leadership was lost")
    assert [a[1] for a in actions.annotations] == ["a-0"] and len(rec.events) == 1  # a-1 untouched


def v100_and_k80(job_on: str) -> ClusterState:
    """A V100 node n0 and a K80 node n1 (gpu.product), job a's two workers on `job_on`."""
    state = ClusterState()
    for name, product in (("n0", "Tesla-V100-SXM2-16GB"), ("n1", "Tesla-K80")):
        state.upsert_node(parse_node(node(name, gpus=4, labels={"nvidia.com/gpu.product": product})))
    for p in (worker("a", 0, job_on), worker("a", 1, job_on)):
        state.upsert_pod(parse_pod(p))
    state.mark_synced()
    return state


def test_on_a_typed_cluster_the_plan_names_the_gpu_type_the_filter_then_keeps_the_job_on() -> None:
    """A V100 node and a K80 node (gpu.product): the lone job on the V100 is planned within the
    V100s only (a job never spans types), and its plan annotation names the type."""
    state = v100_and_k80("n0")
    actions = FakeActions()
    cfg = ElasticConfig(las_power=0.0, explore_factor=0.0, min_gain=0.30)
    ctx = make_context(state, FakeTracker({}), actions, LogRecorder(), settings=Settings(kube=False, elastic=cfg))
    el = Elastic(ctx, cfg)
    acts = plan_at(el, 1000.0)
    assert len(acts) == 1 and acts[0].as_dict()["detail"]["gpus"] == 4  # the V100 node's 4, not all 8
    assert el.act(acts[0], 1000.0) == "planned"
    assert {json.loads(a[2][PLAN])["gpu_type"] for a in actions.annotations} == {"v100"}


def test_on_a_typed_cluster_a_step_time_on_another_type_restarts_the_jobs_samples() -> None:
    """The service keeps a job's step times by the rule the simulator keeps them by
    (scoring.step_samples): 1 and 3 GPUs measured on a V100 node are dropped once the job's pods run
    on a K80 node, whose steps take 7x longer; one type's samples are one curve."""
    state = v100_and_k80("n1")
    cfg = ElasticConfig(las_power=0.0, explore_factor=0.0)
    ctx = make_context(state, FakeTracker({"t/a": Est(Phase.GROWING, step_rate=1 / 305.0)}), FakeActions(),
                       LogRecorder(), settings=Settings(kube=False, elastic=cfg))
    el = Elastic(ctx, cfg)
    el.ctx.world.measured["t/a"] = MeasuredSteps(samples={1: 82.0, 3: 28.0}, types={1: "v100", 3: "v100"})
    plan_at(el, 1000.0)  # records the 2-GPU sample on the K80 node
    assert el.ctx.world.measured["t/a"].samples == {2: 305.0}
    assert el.ctx.world.measured["t/a"].types == {2: "k80"}


def test_note_and_restore_carry_the_step_times_in_the_plan_within_its_bound() -> None:
    from extender.control.measured_note import MAX_SIZES, note, restore

    m = MeasuredSteps(samples={1: 2.0, 4: 0.6, 8: 0.35}, batches={1: 128, 4: 512}, types={8: "a100"})
    saved = json.loads(json.dumps(note(m, 4)))  # as it travels in the annotation
    assert saved == {"1": [2.0, 128, ""], "4": [0.6, 512, ""], "8": [0.35, 0, "a100"]}
    back = MeasuredSteps(samples={4: 0.55})  # measured again since: kept, not overwritten
    assert restore(back, saved) == 2
    assert back.samples == {4: 0.55, 1: 2.0, 8: 0.35} and back.batches == {1: 128} and back.types == {8: "a100"}
    assert back.by_batch == {(1, 128): 2.0}
    bad = {"0": [1.0, 1, ""], "x": [1.0, 1, ""], "2": [float("nan"), 1, ""], "3": [1.0, -1, ""], "5": [1.0, 1],
           "6": "abc", "7": [1.0, 1, 7], "9": [0.5, 64, ""]}
    fresh = MeasuredSteps()
    assert restore(fresh, bad) == 1 and fresh.samples == {9: 0.5}
    assert restore(MeasuredSteps(), "not a mapping") == 0 and note(MeasuredSteps(), 4) == {}
    many = MeasuredSteps(samples={g: 1.0 / g for g in range(1, 65)})
    kept = note(many, 8)
    assert len(kept) == MAX_SIZES and "8" in kept and "1" not in kept and "64" not in kept  # the nearest sizes


def test_a_replica_started_later_knows_the_step_times_its_plan_carries() -> None:
    # Job a ran at 2 and 8 GPUs, each step barely faster than at 4: at 4 it stays. A replica that
    # starts after the rescale (an upgrade) knows only what the plan on its pods carries; without it,
    # the prior promises 8 GPUs again and the job is restarted to find out.
    from scoring.actions import Scale

    pods = [worker("a", i, "n0") for i in range(4)]
    est = {"t/a": Est(Phase.GROWING, step_rate=1.0)}
    el, actions, _, _ = make(pods, est, nodes=2, cooldown_s=0.0)
    el.ctx.world.measured["t/a"] = MeasuredSteps(samples={2: 1.02, 8: 0.99})
    el.world(0.0)  # records the 4-GPU sample: 1.0 s a step
    el.act(el.bind(Scale("t/a", 4, 2, 0, 0, 1, 1, 8, "test plan")), 0.0)
    plan = actions.annotations[-1][2][PLAN]
    assert json.loads(plan)["measured"] == {"2": [1.02, 0, ""], "4": [1.0, 0, ""], "8": [0.99, 0, ""]}
    for p in pods:
        p["metadata"].setdefault("annotations", {})[PLAN] = plan
    later, *_ = make(pods, est, nodes=2, cooldown_s=0.0)
    assert plan_at(later, 600.0) == []
    assert later.ctx.world.measured["t/a"].samples == {2: 1.02, 4: 1.0, 8: 0.99}
    for p in pods:  # the same plan without the step times, as written before they were carried
        p["metadata"]["annotations"][PLAN] = json.dumps({k: v for k, v in json.loads(plan).items() if k != "measured"})
    forgetful, *_ = make(pods, est, nodes=2, cooldown_s=0.0)
    assert [a.as_dict()["detail"]["gpus"] for a in plan_at(forgetful, 600.0)] == [8]
