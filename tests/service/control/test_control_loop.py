"""The rounds runner's book around carrying out (leadership, back-off, budgets through the kernel,
dry run, metrics), the core Budget and the kube error mapping, on a fake clock (no sleeping, no
cluster). The fake controller's plans stand in for the kernel's (scoring.kernel.plan_loop is
replaced for these tests); everything around them is the real round: scoring.kernel.run_round
and extender.control.loop.ControlRounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.control.events import ObjectRef, event_body
from extender.control.loop import BACKOFF, FAILED, RETRY, Action, ControlLoop, ControlMetrics
from extender.kube.errors import ApiError, PermanentError, TemporaryError
from extender.kube.responses import map_api_error
from scoring import kernel
from scoring.actions import ControlAction, IdleReport, Release
from scoring.kernel import BUDGET, DRY_RUN, Plan
from scoring.safety import Budget
from scoring.settings import CoreSettings
from scoring.world import World
from tests.control_fakes import OneLoop


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Leader:
    def __init__(self, leader: bool = True) -> None:
        self.is_leader = leader


class FakeController:
    """A loop named like the kernel's admission loop whose plan is whatever the test says."""

    name = "admission"

    def __init__(self, actions: list[ControlAction]) -> None:
        self.actions = actions
        self.acted: list[str] = []
        self.raise_for: dict[str, Exception] = {}
        self.plans = 0
        self.budget_seen = -1

    def world(self, now: float) -> World | None:
        return World(now, (), (), ())

    def plan(self, world: World, budget_left: int) -> Sequence[ControlAction]:
        self.plans += 1
        self.budget_seen = budget_left
        return list(self.actions)

    def bind(self, action: ControlAction) -> Action:
        return Action.of(action)

    def planned(self, plan: Plan) -> None:
        pass

    def act(self, action: Action, now: float) -> str:
        if action.key in self.raise_for:
            raise self.raise_for[action.key]
        self.acted.append(action.key)
        return "done"


def act(key: str) -> Release:
    return Release(key, 1, 1.0, 0, "test")


def plans_of(monkeypatch: pytest.MonkeyPatch, ctrl: Any) -> None:
    """The kernel's plan for the round is `ctrl.plan(world, budget_left)`."""
    def plan_loop(loop: str, world: World, settings: Any, memory: Any, budget_left: int, *_: Any,
                  **__: Any) -> Plan:
        return Plan(loop, tuple(ctrl.plan(world, budget_left)), memory)

    monkeypatch.setattr(kernel, "plan_loop", plan_loop)


def make(monkeypatch: pytest.MonkeyPatch, ctrl: FakeController, clock: Clock, leader: Leader, *,
         dry_run: bool = False, per_interval: int = 5, per_hour: int = 100,
         budget_store: Any = None) -> tuple[OneLoop, CollectorRegistry]:
    plans_of(monkeypatch, ctrl)
    reg = CollectorRegistry()
    loop = ControlLoop(ctrl, leader, ControlMetrics.build(reg), interval_s=10, dry_run=dry_run,
                       per_interval=per_interval, per_hour=per_hour, permanent_backoff_s=600, clock=clock)
    return OneLoop(loop, CoreSettings(), budget_store=budget_store), reg


def count(reg: CollectorRegistry, outcome: str) -> float:
    v = reg.get_sample_value("flowsched_control_actions_total", {"loop": "admission", "action": "admit",
                                                                  "outcome": outcome})
    return v or 0.0


def test_budget_interval_and_sliding_hour() -> None:
    b = Budget(per_interval=2, per_hour=3)
    b.new_interval()
    assert b.allows(0.0) and b.left(0.0) == 2
    b.spend(0.0)
    b.spend(0.0)
    assert not b.allows(0.0) and b.left(0.0) == 0  # interval used up
    b.new_interval()
    assert b.allows(100.0) and b.left(100.0) == 1  # the hour has one left
    b.spend(100.0)
    b.new_interval()
    assert not b.allows(100.0)  # three in the last hour
    assert not b.allows(3599.0)
    assert b.allows(3600.5)  # the first two slid out of the window
    assert b.remaining(3600.5) == {"interval": 2, "hour": 2}


def test_not_leader_neither_plans_nor_acts(monkeypatch: pytest.MonkeyPatch) -> None:
    ctrl = FakeController([act("a")])
    loop, reg = make(monkeypatch, ctrl, Clock(), Leader(False))
    tick = loop.run_once()
    assert not tick.leader and ctrl.plans == 0 and ctrl.acted == []
    assert reg.get_sample_value("flowsched_control_ticks_total", {"loop": "admission", "result": "not_leader"}) == 1


def test_dry_run_plans_and_budgets_but_never_acts(monkeypatch: pytest.MonkeyPatch) -> None:
    ctrl = FakeController([act("a"), act("b"), act("c")])
    loop, reg = make(monkeypatch, ctrl, Clock(), Leader(), dry_run=True, per_interval=2)
    tick = loop.run_once()
    assert ctrl.acted == []
    assert [o.outcome for o in tick.outcomes] == [DRY_RUN, DRY_RUN, BUDGET]
    assert count(reg, DRY_RUN) == 2 and count(reg, BUDGET) == 1
    assert loop.loop.history[-1] is tick  # shown at /debug


def test_budget_restore_counts_actions_of_one_round_each_and_a_reload_once() -> None:
    # A round's actions share one time: [t, t, t] is three actions, not one.
    b = Budget(per_interval=10, per_hour=4)
    b.restore([100.0, 100.0, 100.0, -5000.0], now=200.0)  # the last is outside the hour
    assert b.remaining(200.0)["hour"] == 1
    b.restore([100.0, 100.0, 100.0], now=200.0)  # the same record loaded again
    assert b.spent_times(200.0) == (100.0, 100.0, 100.0)
    b.spend(200.0)
    assert not b.allows(200.0)


def test_budget_limits_real_actions_per_interval_and_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    ctrl = FakeController([act("a"), act("b")])
    loop, reg = make(monkeypatch, ctrl, clock, Leader(), per_interval=1, per_hour=2)
    loop.run_once()
    assert ctrl.acted == ["a"] and ctrl.budget_seen == 1  # the planner is told what is left
    clock.t += 10
    loop.run_once()
    assert ctrl.acted == ["a", "a"]  # the fake plans the same again; the hour budget is now 2/2
    clock.t += 10
    tick = loop.run_once()
    assert ctrl.acted == ["a", "a"] and [o.outcome for o in tick.outcomes] == [BUDGET, BUDGET]
    clock.t += 3600
    loop.run_once()
    assert ctrl.acted == ["a", "a", "a"]
    assert count(reg, "done") == 3


def test_temporary_error_backs_off_that_key_only_then_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    ctrl = FakeController([act("a"), act("b")])
    ctrl.raise_for["a"] = TemporaryError("pdb says no", delay_s=30)
    loop, reg = make(monkeypatch, ctrl, clock, Leader())
    tick = loop.run_once()
    assert [o.outcome for o in tick.outcomes] == [RETRY, "done"]
    del ctrl.raise_for["a"]
    clock.t += 20
    tick = loop.run_once()
    assert tick.outcomes[0].outcome == BACKOFF and "pdb says no" in tick.outcomes[0].error
    clock.t += 11
    tick = loop.run_once()
    assert tick.outcomes[0].outcome == "done"
    assert count(reg, RETRY) == 1 and count(reg, BACKOFF) == 1


def test_permanent_error_and_bugs_park_the_key_and_the_loop_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    ctrl = FakeController([act("a"), act("b")])
    ctrl.raise_for["a"] = PermanentError("forbidden")
    ctrl.raise_for["b"] = KeyError("bug")
    loop, _ = make(monkeypatch, ctrl, clock, Leader())
    tick = loop.run_once()
    assert [o.outcome for o in tick.outcomes] == [FAILED, FAILED]
    clock.t += 599
    assert [o.outcome for o in loop.run_once().outcomes] == [BACKOFF, BACKOFF]


def test_leadership_lost_between_plan_and_act(monkeypatch: pytest.MonkeyPatch) -> None:
    leader = Leader()

    class Flip(FakeController):
        def plan(self, world: World, budget_left: int) -> Sequence[ControlAction]:
            leader.is_leader = False  # the Lease went away while planning
            return [act("a")]

    ctrl = Flip([])
    loop, _ = make(monkeypatch, ctrl, Clock(), leader)
    tick = loop.run_once()
    assert ctrl.acted == [] and tick.outcomes[0].outcome == "lost_leadership"


def test_planning_exception_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(FakeController):
        def plan(self, world: World, budget_left: int) -> Sequence[ControlAction]:
            raise RuntimeError("snapshot torn")

    loop, reg = make(monkeypatch, Broken([]), Clock(), Leader())
    tick = loop.run_once()
    assert "snapshot torn" in tick.error
    assert reg.get_sample_value("flowsched_control_ticks_total", {"loop": "admission", "result": "error"}) == 1


def test_unreadable_world_skips_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    class Blind(FakeController):
        def world(self, now: float) -> World | None:
            raise TemporaryError("list namespaces: 503", delay_s=30)

    ctrl = Blind([act("a")])
    loop, _ = make(monkeypatch, ctrl, Clock(), Leader())
    tick = loop.run_once()
    assert ctrl.plans == 0 and ctrl.acted == [] and "namespaces" in tick.error


@pytest.mark.parametrize(("status", "kind"), [
    (429, TemporaryError), (500, TemporaryError), (503, TemporaryError), (409, TemporaryError),
    (403, PermanentError), (422, PermanentError), (400, PermanentError),
])
def test_api_errors_map_to_temporary_or_permanent(status: int, kind: type) -> None:
    e = ApiError("POST", "/x", status, '{"reason": "r", "message": "m"}', {"Retry-After": "7"})
    mapped = map_api_error(e, "evict ns/p", retry_s=5.0)
    assert isinstance(mapped, kind)
    if status == 429:
        assert isinstance(mapped, TemporaryError) and mapped.delay_s == 7.0  # the server's, above our least
    assert map_api_error(ApiError("POST", "/x", 429, "{}", {"Retry-After": "0"}), "e", 5.0).delay_s == 5.0  # type: ignore[attr-defined]


def test_connection_errors_are_temporary() -> None:
    assert isinstance(map_api_error(ConnectionRefusedError("down"), "evict"), TemporaryError)


def test_event_reason_must_be_flowsched() -> None:
    from datetime import UTC, datetime

    obj = ObjectRef("ns", "p", "u1")
    body = event_body(obj, "FlowschedMigrated", "x" * 5000, type_="Normal", action="Evict", instance="i",
                      now=datetime(2025, 1, 1, tzinfo=UTC))
    assert body["reportingComponent"] == "flowsched" and body["involvedObject"]["uid"] == "u1"
    assert len(body["message"]) == 1024
    with pytest.raises(ValueError, match="Flowsched"):
        event_body(obj, "Migrated", "m", type_="Normal", action="Evict", instance="i", now=datetime.now(UTC))


def test_unbudgeted_notices_spend_no_budget_but_wait_for_dry_run_and_leadership(
        monkeypatch: pytest.MonkeyPatch) -> None:
    notice = IdleReport("n", 1.0, "test")
    ctrl = FakeController([notice, act("a"), act("b")])
    clock, leader = Clock(), Leader()
    loop, _ = make(monkeypatch, ctrl, clock, leader, per_interval=1)
    outcomes = [o.outcome for o in loop.run_once().outcomes]
    assert outcomes == ["done", "done", BUDGET] and ctrl.acted == ["idle/n", "a"]  # the notice took no budget
    dry = FakeController([notice])
    assert [o.outcome for o in make(monkeypatch, dry, clock, leader, dry_run=True)[0].run_once().outcomes] == [DRY_RUN]
    follower = FakeController([notice])
    make(monkeypatch, follower, clock, Leader(False))[0].run_once()
    assert dry.acted == [] and follower.acted == [] and follower.plans == 0


# ---- the controllers' act() against fakes (admission, the eviction path) ----

H = 3600.0


def _admission_world(now: float = 0.0, migrations: int = 0) -> Any:
    """Two nodes full of long-served checkpointable jobs (queue 1), a gated 8-GPU job waiting 10 min."""
    import math
    from dataclasses import replace

    from scoring.world import JobState, NodeState, World

    def running(key: str, node: str, attained: float, **kw: Any) -> JobState:
        return replace(JobState(key=key, namespace="t", gpus_on={node: 4.0}, live_gpus=4, per_pod=1,
                                checkpointable=True, elastic=None, running=True, settling=False, runtime_s=2 * H,
                                attained_gpu_s=attained), **kw)

    g = JobState(key="t/g", namespace="t", gpus_on={}, live_gpus=8, per_pod=1, checkpointable=True, elastic=None,
                 running=False, settling=True, runtime_s=math.nan, attained_gpu_s=0.0, gated_pods=(4.0, 4.0),
                 wait_s=600.0)
    jobs = (g, running("t/r1", "a", 20 * H, migrations=migrations), running("t/r2", "b", 30 * H,
                                                                             migrations=migrations))
    return World(now, (NodeState("a", 4, 4), NodeState("b", 4, 4)), jobs, (), {})


def _admission(state: Any, actions: Any, clock: Clock) -> Any:
    from extender.control.admission import Admission
    from extender.control.events import LogRecorder
    from extender.settings import Settings
    from tests.control_fakes import FakeTracker, make_context

    return Admission(make_context(state, FakeTracker({}), actions, LogRecorder(), settings=Settings(kube=False),
                                  clock=clock))


def _job_pod(name: str, uid: str, job: str, node: str = "a", mark: dict[str, Any] | None = None) -> Any:
    import json

    from extender.snapshot.objects import MIGRATION, parse_pod
    from tests.k8s_factories import pod

    ann = {"flowsched.io/checkpointable": "true", **({MIGRATION: json.dumps(mark)} if mark else {})}
    return parse_pod(pod(name, gpus=4, node_name=node, namespace="t", phase="Running", annotations=ann,
                         labels={"flowsched.io/job": job}, uid=uid))


class EvictingActions:
    """KubeActions' writes, recorded; evict() refuses the pods in `refuse` with a 429."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.api_client = object()
        self.refuse = refuse
        self.calls: list[tuple[str, ...]] = []

    def annotate_pod(self, ns: str, name: str, ann: dict[str, Any]) -> bool:
        self.calls.append(("annotate", name, str(ann)))
        return True

    def check_evictable(self, ns: str, name: str, uid: str = "") -> str:
        self.calls.append(("check", name))
        return "evicted"

    def evict(self, ns: str, name: str, uid: str = "") -> str:
        if name in self.refuse:
            raise TemporaryError(f"evict {ns}/{name}: 429 Cannot evict pod as it would violate the pod's "
                                 "disruption budget", 45)
        self.calls.append(("evict", name))
        return "evicted"

    def marks(self) -> list[dict[str, Any]]:
        import ast
        import json

        from extender.snapshot.objects import MIGRATION

        out = []
        for c in self.calls:
            if c[0] == "annotate":
                ann = ast.literal_eval(c[2])
                if ann.get(MIGRATION):
                    out.append(json.loads(ann[MIGRATION]))
        return out


def test_a_preemption_counts_on_from_the_jobs_restarts_never_resets_them() -> None:
    from extender.snapshot.state import ClusterState

    state = ClusterState()
    state.upsert_pod(_job_pod("r2-0", "u-r2", "r2", node="b", mark={"from": "x", "at": 10.0, "count": 1}))
    state.upsert_pod(_job_pod("r1-0", "u-r1", "r1"))
    actions = EvictingActions()
    adm = _admission(state, actions, Clock(100.0))
    world = _admission_world(100.0, migrations=1)  # both moved once before (the mark the watch brought back)
    adm.pods_of = {"t/r2": [state.read().pod("u-r2")], "t/r1": [state.read().pod("u-r1")]}
    plan = kernel.plan_loop("admission", world, adm.ctx.core, kernel.Memory(), 10)
    preempts = [adm.bind(a) for a in plan.actions if a.kind == "preempt"]
    assert preempts and all(a.as_dict()["detail"]["count"] == 2 for a in preempts)
    assert adm.act(preempts[0], 100.0) == "evicted"
    assert [m["count"] for m in actions.marks()] == [2]  # 1 + this one; was always 1


def _admission_loop(dry_run: bool, actions: Any, clock: Clock, store: Any = None) -> tuple[OneLoop, Any]:
    from extender.control.leader import AlwaysLeader
    from extender.snapshot.state import ClusterState

    state = ClusterState()
    state.upsert_pod(_job_pod("r1-0", "u-r1", "r1", node="a"))
    state.upsert_pod(_job_pod("r2-0", "u-r2", "r2", node="b"))
    adm = _admission(state, actions, clock)
    pods_of = {"t/r1": [state.read().pod("u-r1")], "t/r2": [state.read().pod("u-r2")]}

    class Shell:  # the real Admission, on a World that stays the same (the victims are never replaced)
        name = "admission"

        def world(self, now: float) -> World:
            adm.pods_of = pods_of
            return _admission_world(now)

        def bind(self, action: ControlAction) -> Action:
            return adm.bind(action)  # type: ignore[no-any-return]

        def planned(self, plan: Plan) -> None:
            adm.planned(plan)

        def act(self, action: Action, now: float) -> str:
            return str(adm.act(action, now))

    loop = ControlLoop(Shell(), AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=30,
                       dry_run=dry_run, per_interval=64, per_hour=100_000, clock=clock)
    # Each round plans on the same World afresh: the victims are never replaced, so the kernel's
    # note of a preemption (the job as migrated now) is forgotten, as a new victim's would be absent.
    return OneLoop(loop, adm.ctx.core, budget_store=store, fresh_memory=True), adm


def _preemptions_in_an_hour(loop: OneLoop, clock: Clock) -> list[str]:
    out: list[str] = []
    for k in range(120):  # one hour of 30 s intervals
        clock.t = k * 30.0
        out += [o.outcome for o in loop.run_once().outcomes if o.action.kind == "preempt"]
    return out


def test_a_dry_run_spends_the_preemption_budget_as_acting_does() -> None:
    clock = Clock(0.0)
    dry, adm = _admission_loop(True, EvictingActions(), clock)
    shown = _preemptions_in_an_hour(dry, clock)
    limit = adm.cfg.max_preemptions_per_hour
    assert shown.count(DRY_RUN) == limit  # was 240: 2 every interval, the hourly limit never applied
    clock = Clock(0.0)
    live, _ = _admission_loop(False, EvictingActions(), clock)
    assert _preemptions_in_an_hour(live, clock).count("evicted") == limit


def test_a_refused_preemption_gives_its_budget_back_and_a_parked_victim_spends_none() -> None:
    clock = Clock(0.0)
    loop, adm = _admission_loop(False, EvictingActions(refuse=("r1-0", "r2-0")), clock)
    outcomes = _preemptions_in_an_hour(loop, clock)
    assert "evicted" not in outcomes and RETRY in outcomes and BACKOFF in outcomes
    assert loop.rounds.preempt_budget.remaining(clock.t)["hour"] == adm.cfg.max_preemptions_per_hour


def _migrator(actions: Any, recorder: Any, n_pods: int = 2) -> tuple[Any, Any, list[dict[str, Any]]]:
    from extender.control.migrator import Migrator
    from extender.settings import Settings
    from extender.snapshot.state import ClusterState
    from tests.control_fakes import FakeTracker, make_context

    state = ClusterState()
    refs = []
    for i in range(n_pods):
        state.upsert_pod(_job_pod(f"j-{i}", f"u{i}", "j", node="n0"))
        refs.append({"namespace": "t", "name": f"j-{i}", "uid": f"u{i}", "node": "n0"})
    mig = Migrator(make_context(state, FakeTracker({}), actions, recorder, settings=Settings(kube=False)))
    return mig, state, refs


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: Any, reason: str, message: str, *, type_: str = "Normal", action: str = "") -> bool:
        self.events.append((obj.name, reason, type_))
        return True


def _evict(refs: list[dict[str, Any]]) -> Action:
    from extender.control.loop import PodRef
    from scoring.actions import Evict

    return Action.of(Evict("t/j", "n0", 1, 0.0, 0.0, (), (), "slow"),
                     tuple(PodRef(r["namespace"], r["name"], r["uid"], r.get("node")) for r in refs))


def test_a_partly_refused_eviction_is_charged_counted_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    actions, events = EvictingActions(refuse=("j-1",)), Events()  # a PDB allowing one disruption at a time
    mig, _, refs = _migrator(actions, events)

    class One:
        name = "migrator"

        def world(self, now: float) -> World:
            return World(now, (), (), ())

        def plan(self, world: World, budget_left: int) -> Sequence[ControlAction]:
            return [a.plan for a in [_evict(refs)] if a.plan is not None] if budget_left else []

        def bind(self, action: ControlAction) -> Action:
            return _evict(refs)

        def planned(self, plan: Plan) -> None:
            pass

        def act(self, action: Action, now: float) -> str:
            return str(mig.act(action, now))

    clock = Clock(0.0)
    plans_of(monkeypatch, One())
    loop = ControlLoop(One(), Leader(), ControlMetrics.build(CollectorRegistry()), interval_s=60, dry_run=False,
                       per_interval=1, per_hour=6, clock=clock)
    assert [o.outcome for o in OneLoop(loop, CoreSettings()).run_once().outcomes] == ["partial"]
    assert loop.budget.remaining(0.0)["hour"] == 5  # the pod that went is charged (was 6: retry_later)
    assert mig.migrations.labels("t")._value.get() == 1  # and counted in flowsched_migrations_total
    assert [c[:2] for c in actions.calls if c[0] != "annotate"] == [("check", "j-0"), ("check", "j-1"),
                                                                    ("evict", "j-0")]
    assert events.events == [("j-0", "FlowschedMigrated", "Normal"), ("j-1", "FlowschedPartialEviction", "Warning")]


def test_a_job_whose_pods_may_not_all_go_is_not_touched() -> None:
    class Guarded(EvictingActions):
        def check_evictable(self, ns: str, name: str, uid: str = "") -> str:
            super().check_evictable(ns, name, uid)
            if name == "j-1":
                raise TemporaryError(f"evict (dry run) {ns}/{name}: 429 disruption budget", 30)
            return "evicted"

    actions = Guarded()
    mig, _, refs = _migrator(actions, Events())
    with pytest.raises(TemporaryError, match="dry run"):
        mig.act(_evict(refs), 0.0)
    assert [c[0] for c in actions.calls] == ["check", "check"]  # no mark, no eviction


class FlakyLeader:
    """Leader for the first `checks` leadership checks, then not (the Lease lost mid-action)."""

    def __init__(self, checks: int) -> None:
        self.left = checks

    @property
    def is_leader(self) -> bool:
        self.left -= 1
        return self.left >= 0


def test_an_eviction_stops_at_the_first_write_after_the_lease_is_lost() -> None:
    actions, events = EvictingActions(), Events()
    mig, _, refs = _migrator(actions, events, n_pods=8)
    mig.ctx.leader = FlakyLeader(6)  # mark, evict, Event for j-0 and j-1; then lost
    assert mig.act(_evict(refs), 0.0) == "lost_leadership"  # two pods went: charged and counted, as such
    assert [c[1] for c in actions.calls if c[0] == "evict"] == ["j-0", "j-1"]
    assert len([c for c in actions.calls if c[0] == "annotate"]) == 2 and len(events.events) == 2
    assert mig.migrations.labels("t")._value.get() == 1
    actions2 = EvictingActions()
    mig2, _, refs2 = _migrator(actions2, Events(), n_pods=8)
    mig2.ctx.leader = FlakyLeader(1)  # lost after the first mark
    with pytest.raises(TemporaryError, match=r"lost_leadership: stopped before evicting t/j-0 after 1 write"):
        mig2.act(_evict(refs2), 0.0)
    assert [c[0] for c in actions2.calls if c[0] != "check"] == ["annotate"]


def test_a_gang_release_stops_when_the_lease_is_lost() -> None:
    from extender.kube.errors import LostLeadership
    from extender.snapshot.state import ClusterState

    class Gates(EvictingActions):
        def set_scheduling_gates(self, ns: str, name: str, gates: list[str]) -> bool:
            self.calls.append(("ungate", name))
            return True

    actions = Gates()
    adm = _admission(ClusterState(), actions, Clock(0.0))
    adm.ctx.leader = FlakyLeader(2)  # release p0 (and its Event), then lost
    from extender.control.loop import PodRef
    from scoring.actions import Release

    admit = Action.of(Release("t/g", 4, 4.0, 0, "fits"), tuple(PodRef("t", f"g-{i}", f"g{i}") for i in range(4)))
    with pytest.raises(LostLeadership) as e:
        adm.act(admit, 0.0)
    assert e.value.writes == 1 and actions.calls == [("ungate", "g-0")]


def test_the_hourly_budget_outlives_a_restart_and_a_change_of_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 per interval, 2 an hour. A leader acts, crashes, restarts (a new ControlLoop, the same
    # saved budget): it may act once more this hour, not twice. Before, each restart had a full hour.
    from tests.control_fakes import MemoryBudgetStore

    store, clock = MemoryBudgetStore(), Clock()

    def loop() -> tuple[FakeController, OneLoop]:
        ctrl = FakeController([act("j")])
        lp, _ = make(monkeypatch, ctrl, clock, Leader(), per_interval=1, per_hour=2, budget_store=store)
        return ctrl, lp

    first, lp = loop()
    lp.run_once()
    assert first.acted == ["j"] and store.saved["admission"] == [clock.t]
    for _ in range(3):  # three restarts within the hour
        clock.t += 60
        ctrl, lp = loop()
        lp.run_once()
    assert len(store.saved["admission"]) == 2  # one more action after the first, then none
    assert [o.outcome for o in lp.loop.history[-1].outcomes] == [BUDGET]
    clock.t += 3600  # the hour slid by
    ctrl, lp = loop()
    lp.run_once()
    assert ctrl.acted == ["j"]


def test_an_unreadable_saved_budget_skips_the_interval_and_dry_run_saves_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.control_fakes import MemoryBudgetStore

    store, clock = MemoryBudgetStore(), Clock()
    store.unreadable = True
    ctrl = FakeController([act("j")])
    lp, _ = make(monkeypatch, ctrl, clock, Leader(), per_interval=1, per_hour=6, budget_store=store)
    tick = lp.run_once()
    assert ctrl.plans == 0 and "unreadable" in tick.error
    store.unreadable = False
    assert lp.run_once().outcomes[0].outcome == "done"  # read once it can be
    dry, _ = make(monkeypatch, FakeController([act("k")]), clock, Leader(), dry_run=True, per_interval=1,
                  per_hour=6, budget_store=store)
    dry.run_once()
    assert store.saved == {"admission": [clock.t]}  # the real action only: a dry run's spends are not saved


def test_the_preemption_budget_outlives_a_restart() -> None:
    # Acting for half an hour spends part of the hourly preemption limit; a restarted admission
    # controller (same saved budgets) preempts only what is left of it in the rest of the hour.
    from tests.control_fakes import MemoryBudgetStore

    store = MemoryBudgetStore()
    clock = Clock(0.0)
    first, _ = _admission_loop(False, EvictingActions(), clock, store)
    done = 0
    for k in range(3):  # 2 preemptions an interval
        clock.t = k * 30.0
        done += [o.outcome for o in first.run_once().outcomes].count("evicted")
    assert done == 6 and len(store.saved["admission-preemptions"]) == 6
    second, adm2 = _admission_loop(False, EvictingActions(), clock, store)  # restarted: a fresh controller
    later = 0
    for k in range(3, 120):
        clock.t = k * 30.0
        later += [o.outcome for o in second.run_once().outcomes].count("evicted")
    assert done + later == adm2.cfg.max_preemptions_per_hour


class FakeLeaseApi:
    """kube.client.send for one namespace's Leases, in a dict (the real apiserver's round trip
    is tests/service/control/test_control_leader.py's): GET, POST, PUT with resourceVersion checks."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0

    def __call__(self, api_client: Any, request: Any, **_: Any) -> Any:
        import json

        from extender.kube.responses import Response

        name = request.path.rstrip("/").rsplit("/", 1)[-1]
        if request.method == "GET":
            if name not in self.objects:
                return Response(404, b"{}")
            return Response(200, json.dumps(self.objects[name]).encode())
        obj = json.loads(json.dumps(request.body))  # what the wire carries
        name = obj["metadata"]["name"]
        if request.method == "PUT" and obj["metadata"].get("resourceVersion") != self.objects[name]["metadata"][
                "resourceVersion"]:
            return Response(409, b"{}")
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[name] = obj
        return Response(201, json.dumps(obj).encode())


def test_saved_spends_read_back_equal_so_regaining_the_lease_counts_each_action_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Wall-clock times have microseconds; a store that rounded them made each reload count a
    # rounded copy as another action (3 actions exhausted a budget of 6).
    import extender.control.budget_store as bs
    import extender.control.lease_notes as notes

    monkeypatch.setattr(notes, "send", FakeLeaseApi())
    store = bs.LeaseBudgetStore(object(), "flowsched", "flowsched-controllers-budgets")
    clock, leader = Clock(1_763_900_000.123456), Leader()
    ctrl = FakeController([act("j")])
    lp, _ = make(monkeypatch, ctrl, clock, leader, per_interval=1, per_hour=6, budget_store=store)
    for _ in range(3):
        lp.run_once()
        leader.is_leader = False  # the Lease flaps between ticks
        clock.t += 30.5
        lp.run_once()
        leader.is_leader = True
        clock.t += 30.5
    assert ctrl.acted == ["j", "j", "j"]
    assert lp.loop.budget.remaining(clock.t)["hour"] == 3
    assert len(store.load()["admission"]) == 3


def test_spends_stamped_ahead_of_this_clock_still_count() -> None:
    # The previous leader's clock ran 2 s ahead: its last spend is "in the future" here.
    b = Budget(per_interval=5, per_hour=1)
    b.restore([1002.0], now=1000.0)
    assert not b.allows(1000.0)


def test_a_refusal_after_a_preemption_in_the_same_round_stays_refunded_in_the_saved_budget() -> None:
    # r2 is preempted, then r1 is refused (429). The kernel spends only what was carried out, so
    # the saved budget holds r2's preemption and not r1's, and the next round's reload agrees.
    from tests.control_fakes import MemoryBudgetStore

    clock, store = Clock(0.0), MemoryBudgetStore()
    loop, _ = _admission_loop(False, EvictingActions(refuse=("r1-0",)), clock, store)
    outcomes = [(o.action.key, o.outcome) for o in loop.run_once().outcomes if o.action.kind == "preempt"]
    assert outcomes == [("t/r2", "evicted"), ("t/r1", RETRY)]
    assert store.saved["admission-preemptions"] == [0.0]
    clock.t = 30.0
    loop.run_once()
    assert loop.rounds.preempt_budget.spent_times(30.0).count(0.0) == 1
