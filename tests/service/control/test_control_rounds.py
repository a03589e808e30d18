"""The service runs its control loops a round at a time through the kernel (scoring.kernel.run_round,
in LOOP_ORDER), and a later loop sees what an earlier one did in the same round (extender/control/
loop.py ControlRounds: a World built afresh per loop, the kernel's notes on it): the composition the
simulator runs, not two threads planning on one snapshot (a job scaled up and evicted in one round;
the same free GPUs given twice)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.control.events import LogRecorder
from extender.control.leader import AlwaysLeader
from extender.control.loop import Action, ControlLoop, ControlMetrics, ControlRounds
from extender.control.runtime import _factory
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring import kernel
from scoring.actions import ControlAction, Release
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.kernel import Plan
from scoring.settings import CoreSettings
from scoring.world import World
from tests.control_fakes import LINEAR_PRIOR, FakeActions, FakeTracker, make_context, plan_at
from tests.k8s_factories import node, pod

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Recording:
    """A controller whose World is empty and whose plan (the kernel's, replaced: `one_each`) is one
    action a round; it records when its World was built."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def world(self, now: float) -> World:
        self.log.append(self.name)
        return World(now, (), (), ())

    def bind(self, action: ControlAction) -> Action:
        return Action.of(action)

    def planned(self, plan: Plan) -> None:
        pass

    def act(self, action: Action, now: float) -> str:
        return "done"


@pytest.fixture
def one_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every loop's plan is one budgeted action (the composition and budgets around it are real)."""
    def plan_loop(loop: str, world: World, settings: Any, memory: Any, *_: Any, **__: Any) -> Plan:
        return Plan(loop, (Release(f"k{world.now}", 1, 1.0, 0, "r"),), memory)

    monkeypatch.setattr(kernel, "plan_loop", plan_loop)


def _rounds(names: list[str], intervals: dict[str, float], clock: Clock, log: list[str],
            mono: Clock | None = None) -> ControlRounds:
    metrics = ControlMetrics.build(CollectorRegistry())
    loops = [ControlLoop(Recording(n, log), AlwaysLeader(), metrics, interval_s=intervals[n], dry_run=False,
                         per_interval=1, per_hour=100, clock=clock) for n in names]
    return ControlRounds(loops, CoreSettings(), AlwaysLeader(), metrics, dry_run=False, clock=clock,
                         mono=mono or clock)


def test_a_round_runs_the_due_loops_in_loop_order_each_at_its_own_interval(one_each: None) -> None:
    clock, log = Clock(NOW), []
    names = ["idle", "migrator", "admission", "elastic"]  # as configured: not the core's order
    rounds = _rounds(names, {"idle": 60, "migrator": 60, "admission": 30, "elastic": 30}, clock, log)
    assert rounds.run_round() == ["elastic", "admission", "migrator", "idle"]
    assert log == ["elastic", "admission", "migrator", "idle"]
    clock.t += 30
    assert rounds.run_round() == ["elastic", "admission"]
    clock.t += 10
    assert rounds.run_round() == []
    clock.t += 20
    assert rounds.run_round() == ["elastic", "admission", "migrator", "idle"]


def test_a_shared_budget_starts_a_new_interval_only_at_its_owner(one_each: None) -> None:
    # Idle reclamation spends the migrator's budget (1 an interval; scoring.kernel.SHARED_BUDGET):
    # together, one eviction a round.
    clock, log = Clock(NOW), []
    rounds = _rounds(["migrator", "idle"], {"migrator": 60, "idle": 60}, clock, log)
    migrator, idle = rounds.loops
    rounds.run_round()
    assert [o.outcome for o in migrator.history[-1].outcomes] == ["done"]
    assert [o.outcome for o in idle.history[-1].outcomes] == ["budget_exhausted"]
    clock.t += 60
    rounds.run_round()
    assert [o.outcome for o in migrator.history[-1].outcomes] == ["done"]


def _est(phase: Phase) -> ConvergenceEstimate:
    return ConvergenceEstimate(phase=phase, low_count=2, progress=1e-5, growth_efficiency=1e-5,
                               remaining_steps=0.0, remaining_seconds=0.0, step_rate=1.0, points_used=100,
                               last_step=1000.0)


def _pod(name: str, job: str, gpus: int, node_name: str | None, ann: dict[str, str] | None = None,
         gated: bool = False) -> dict[str, Any]:
    d = pod(name, gpus=gpus, node_name=node_name, namespace="t", annotations=ann or {},
            labels={"flowsched.io/job": job}, phase="Running" if node_name else "Pending")
    if node_name:
        d["status"]["startTime"] = "2023-11-14T20:13:20Z"  # 2 h ago
    d["metadata"]["creationTimestamp"] = "2023-11-14T21:58:20Z"
    if gated:
        d["spec"]["schedulingGates"] = [{"name": "flowsched.io/admission"}]
    return d


def _service_loops(pods: list[dict[str, Any]], nodes: dict[str, int], est: dict[str, ConvergenceEstimate],
                   loops: list[str], dry: bool,
                   notes: bool = True) -> tuple[list[ControlRounds], dict[str, ControlLoop], FakeActions]:
    """The real controllers over one snapshot. notes=False: each loop in a round of its own (what
    two threads planning on one snapshot did), so none sees what another planned."""
    state = ClusterState()
    for n, g in nodes.items():
        state.upsert_node(parse_node(node(n, gpus=g)))
    for d in pods:
        state.upsert_pod(parse_pod(d))
    state.mark_synced()
    actions = FakeActions()
    clock = Clock(NOW)
    ctx = make_context(state, FakeTracker(est), actions, LogRecorder(),
                       settings=Settings(kube=False, controllers=loops, elastic=LINEAR_PRIOR), clock=clock)
    metrics = ControlMetrics.build(CollectorRegistry())
    built = {}
    for name in loops:
        cfg = ctx.core.loop(name)
        built[name] = ControlLoop(_factory(name)(ctx), AlwaysLeader(), metrics, interval_s=cfg.interval_s,
                                  dry_run=dry, per_interval=cfg.max_per_interval, per_hour=cfg.max_per_hour,
                                  clock=clock)
    groups = [list(built.values())] if notes else [[lp] for lp in built.values()]
    rounds = [ControlRounds(g, ctx.core, AlwaysLeader(), metrics, dry_run=dry, clock=clock, mono=clock)
              for g in groups]
    return rounds, built, actions


def _run(rounds: list[ControlRounds]) -> None:
    for r in rounds:
        r.run_round()


def test_the_migrator_sees_the_rescale_the_optimizer_just_made_in_the_same_round() -> None:
    # x (elastic 2-4, checkpointable, slow) at its minimum on a; a 3-GPU pod waits. The optimizer
    # grows x; on the same snapshot the migrator would evict x. In one round, x is held instead.
    pods = [_pod("x-0", "x", 2, "a", {"flowsched.io/elastic": "2-4", "flowsched.io/checkpointable": "true"}),
            _pod("y-0", "y", 1, "a"), _pod("z-0", "z", 2, "b"), _pod("z2-0", "z2", 2, "c"),
            _pod("d-0", "d", 3, None)]
    est = {"t/x": _est(Phase.COMPLETING), "t/y": _est(Phase.GROWING), "t/z": _est(Phase.GROWING),
           "t/z2": _est(Phase.GROWING)}
    # Each loop alone on this snapshot (no notes: what two threads did): the plans contradict.
    rounds, loops, _ = _service_loops(pods, {"a": 4, "b": 4, "c": 4}, est, ["migrator", "elastic"],
                                      dry=True, notes=False)
    _run(rounds)
    assert [(o.action.kind, o.action.key) for o in loops["elastic"].history[-1].outcomes] == [("scale-up", "t/x")]
    assert [(o.action.kind, o.action.key) for o in loops["migrator"].history[-1].outcomes] == [("evict", "t/x")]
    # A dry run previews the composition: the migrator's plan already leaves x alone.
    rounds, loops, actions = _service_loops(pods, {"a": 4, "b": 4, "c": 4}, est, ["migrator", "elastic"],
                                            dry=True)
    _run(rounds)
    assert [o.outcome for o in loops["elastic"].history[-1].outcomes] == ["dry_run"] and not actions.annotations
    assert not any(o.action.key == "t/x" for t in loops["migrator"].history for o in t.outcomes)
    # Acting, in one round: the optimizer's rescale is noted, and the migrator leaves x alone.
    rounds, loops, actions = _service_loops(pods, {"a": 4, "b": 4, "c": 4}, est, ["migrator", "elastic"],
                                            dry=False)
    _run(rounds)
    assert [(o.action.key, o.outcome) for o in loops["elastic"].history[-1].outcomes] == [("t/x", "planned")]
    assert actions.annotations  # the plan was written
    assert not any(o.action.key == "t/x" for t in loops["migrator"].history for o in t.outcomes)


def test_admission_does_not_release_a_gang_into_the_gpus_a_rescale_just_took() -> None:
    # a is full with x (elastic 4-8, 4-GPU pods); b has 4 free GPUs; a gated 4-GPU gang waits.
    pods = [_pod("x-0", "x", 4, "a", {"flowsched.io/elastic": "4-8"}), _pod("g-0", "g", 4, None, gated=True)]
    est = {"t/x": _est(Phase.GROWING)}

    def admitted(loop: ControlLoop) -> list[str]:
        return [o.action.key for t in loop.history for o in t.outcomes if o.action.kind == "admit"]

    # Each alone on this snapshot (no notes): both would give b's 4 GPUs away.
    rounds, loops, _ = _service_loops(pods, {"a": 4, "b": 4}, est, ["admission", "elastic"],
                                      dry=True, notes=False)
    _run(rounds)
    assert [o.action.key for o in loops["elastic"].history[-1].outcomes] == ["t/x"]
    assert admitted(loops["admission"]) == ["t/g"]
    # The optimizer acts first in the round; its promised pod waits for b, so the gang is not released.
    rounds, loops, _ = _service_loops(pods, {"a": 4, "b": 4}, est, ["admission", "elastic"], dry=False)
    _run(rounds)
    grown = [o.action for o in loops["elastic"].history[-1].outcomes if o.outcome == "planned"]
    assert [a.as_dict()["detail"]["gpus"] for a in grown] == [8]
    assert admitted(loops["admission"]) == []


def test_a_job_on_a_cordoned_node_is_held_not_replanned_as_waiting() -> None:
    # x (elastic 1-8) runs 4 GPUs on a, which is then cordoned; one of its pods is still starting,
    # so it is not "running". Its GPUs on a are outside the World's nodes, but they are held: the
    # optimizer must not plan it as a waiting job at a new size while it settles.
    state_pods = [_pod("x-0", "x", 4, "a", {"flowsched.io/elastic": "1-8"}),
                  _pod("x-1", "x", 4, None, {"flowsched.io/elastic": "1-8"})]
    state = ClusterState()
    state.upsert_node(parse_node(node("a", gpus=4, unschedulable=True)))
    state.upsert_node(parse_node(node("b", gpus=8)))
    for d in state_pods:
        state.upsert_pod(parse_pod(d))
    state.mark_synced()
    ctx = make_context(state, FakeTracker({"t/x": _est(Phase.GROWING)}), FakeActions(), LogRecorder(),
                       settings=Settings(kube=False, controllers=["elastic"]), clock=Clock(NOW))
    pods, nodes, marks = state.read().control_view()
    (x,) = ctx.world.build(pods, nodes, marks, NOW).jobs
    assert x.held_gpus == 0 and x.gpus_elsewhere == 4 and x.bound
    elastic = _factory("elastic")(ctx)
    assert [a for a in plan_at(elastic, NOW, 16) if a.key == "t/x"] == []


def test_a_wall_clock_stepped_back_does_not_stop_the_rounds(one_each: None) -> None:
    # The loops read the wall clock (their budgets' hour); the schedule runs on a monotonic one.
    wall, mono, log = Clock(NOW), Clock(0.0), []
    rounds = _rounds(["migrator", "elastic"], {"migrator": 60, "elastic": 30}, wall, log, mono=mono)
    assert rounds.run_round() == ["elastic", "migrator"]
    wall.t -= 3600  # NTP steps the clock back an hour
    mono.t += 60
    assert rounds.run_round() == ["elastic", "migrator"]
