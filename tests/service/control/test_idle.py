"""scoring/idle.py: idle tracking and opt-in reclamation of idle notebooks."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from scoring.idle import (
    IdleMemory,
    IdlePod,
    Reclaimable,
    idle_for,
    parse_duration_s,
    plan_idle,
    plan_reclaim,
    update_idle_since,
    warning_delivered,
)
from scoring.settings import IdleLoopSettings, SafetySettings


def test_durations() -> None:
    assert parse_duration_s("2h") == 7200 and parse_duration_s("15m") == 900 and parse_duration_s("90") == 90
    for bad in ("", "two hours", "-1h", "0s", None, 5):
        assert parse_duration_s(bad) is None


def test_idle_since_starts_keeps_and_resets() -> None:
    s = update_idle_since({}, {"a": [1.0, 2.0], "b": [50.0], "c": [math.nan]}, now=100.0, threshold_pct=5.0)
    assert s == {"a": 100.0}  # b busy, c unknown
    s = update_idle_since(s, {"a": [0.0], "b": [1.0]}, now=200.0, threshold_pct=5.0)
    assert s == {"a": 100.0, "b": 200.0}
    s = update_idle_since(s, {"a": [30.0], "b": [1.0]}, now=300.0, threshold_pct=5.0)
    assert s == {"b": 200.0}
    assert idle_for(s, now=900.0, window_s=600.0) == ["b"]
    assert idle_for(s, now=700.0, window_s=600.0) == []


def test_reclaim_only_opted_in_notebooks_after_a_warning_while_gpu_pods_wait() -> None:
    cands = [Reclaimable("nb1", "notebook", 3600.0), Reclaimable("nb2", "notebook", None),
             Reclaimable("tr", "training", 3600.0), Reclaimable("nb3", "notebook", 3600.0)]
    idle = {"nb1": 0.0, "nb2": 0.0, "tr": 0.0, "nb3": 200.0}
    p = plan_reclaim(cands, idle, warned_at={}, now=4000.0, gpu_pods_waiting=3, budget_left=5, warning_s=300.0)
    assert p.warn == ("nb1", "nb3") and p.evict == ()  # warn first, never nb2 (no opt-in) or tr
    warned = {"nb1": 4000.0, "nb3": 4000.0}
    early = plan_reclaim(cands, idle, warned, now=4200.0, gpu_pods_waiting=3, budget_left=5, warning_s=300.0)
    assert early.evict == ()
    p = plan_reclaim(cands, idle, warned, now=4400.0, gpu_pods_waiting=3, budget_left=1, warning_s=300.0)
    assert p.evict == ("nb1",)  # longest idle first, within budget
    none_waiting = plan_reclaim(cands, idle, warned, now=4400.0, gpu_pods_waiting=0, budget_left=5, warning_s=300.0)
    assert none_waiting.evict == ()


def _pod(key: str, util: float, *, workload: str = "notebook", reclaim: str | None = "1h", ns: str = "lab",
         gpus: float = 1.0) -> IdlePod:
    return IdlePod(key=f"{ns}/{key}", namespace=ns, workload=workload, gpus=gpus, reclaim=reclaim,
                   samples=(util,) if math.isfinite(util) else ())


def test_plan_idle_reports_once_per_spell_and_reclaims_only_opted_in_notebooks() -> None:
    s = IdleLoopSettings(threshold_pct=5.0, window_s=600.0, warning_s=300.0)
    safety = SafetySettings()
    pods = [_pod("nb", 1.0), _pod("nb-no", 1.0, reclaim=None), _pod("train", 0.0, workload="training"),
            _pod("inf", 0.0, workload="inference"), _pod("busy", 80.0), _pod("bad", 0.0, reclaim="soon"),
            _pod("sys", 0.0, ns="kube-system"), _pod("dark", math.nan)]
    m = IdleMemory()
    p = plan_idle(pods, m, 0.0, gpu_pods_waiting=2, budget_left=5, s=s, safety=safety, namespace_labels={})
    assert p.idle == () and p.report == () and p.warn == () and p.evict == ()
    p = plan_idle(pods, p.memory, 600.0, 2, 5, s, safety, {})
    idle = {"lab/nb", "lab/nb-no", "lab/train", "lab/inf", "lab/bad", "kube-system/sys"}
    assert set(p.idle) == idle and set(p.report) == idle and p.idle_gpus == 6.0  # busy and unknown are not idle
    assert p.refused["lab/train"].startswith("training") and p.refused["lab/inf"].startswith("inference")
    assert "not a duration" in p.refused["lab/bad"] and p.refused["kube-system/sys"] == "namespace excluded"
    assert p.warn == () and p.evict == ()  # idle 600 s, opted in for 1 h
    p = plan_idle(pods, p.memory, 3600.0, 2, 5, s, safety, {})
    assert p.report == () and p.warn == ("lab/nb",) and p.evict == ()  # reported once; warned before evicting
    undelivered = plan_idle(pods, p.memory, 3900.0, 2, 5, s, safety, {})
    assert undelivered.warn == ("lab/nb",) and undelivered.evict == ()  # a planned warning is not a given one
    p = replace(p, memory=warning_delivered(p.memory, "lab/nb", 3600.0))
    p2 = plan_idle(pods, p.memory, 3800.0, 2, 5, s, safety, {})
    assert p2.warn == ()  # delivered: not warned twice
    assert p2.evict == ()  # the warning is 200 s old, 300 s needed
    p3 = plan_idle(pods, p2.memory, 3900.0, 0, 5, s, safety, {})
    assert p3.evict == ()  # nobody waits: the notebook stays
    p4 = plan_idle(pods, p3.memory, 3900.0, 1, 0, s, safety, {})
    assert p4.evict == ()  # no budget left
    p5 = plan_idle(pods, p4.memory, 3900.0, 1, 1, s, safety, {})
    assert p5.evict == ("lab/nb",)
    # opted out by its namespace's label: never reclaimed
    p6 = plan_idle(pods, p4.memory, 3900.0, 1, 1, s, safety, {"lab": {"flowsched.io/migrate": "false"}})
    assert p6.evict == () and p6.refused["lab/nb"] == "namespace opted out"


def test_plan_idle_forgets_a_pod_that_works_again() -> None:
    s = IdleLoopSettings(threshold_pct=5.0, window_s=60.0, warning_s=0.0)
    p = plan_idle([_pod("nb", 0.0, reclaim="1m")], IdleMemory(), 0.0, 1, 5, s, SafetySettings(), {})
    p = plan_idle([_pod("nb", 0.0, reclaim="1m")], p.memory, 60.0, 1, 5, s, SafetySettings(), {})
    assert p.report == ("lab/nb",) and p.warn == ("lab/nb",)
    p = replace(p, memory=warning_delivered(p.memory, "lab/nb", 60.0))
    p = plan_idle([_pod("nb", 50.0, reclaim="1m")], p.memory, 70.0, 1, 5, s, SafetySettings(), {})
    assert p.idle == () and p.evict == () and p.memory == IdleMemory({}, frozenset(), {})
    p = plan_idle([_pod("nb", 0.0, reclaim="1m")], p.memory, 80.0, 1, 5, s, SafetySettings(), {})
    p = plan_idle([_pod("nb", 0.0, reclaim="1m")], p.memory, 140.0, 1, 5, s, SafetySettings(), {})
    assert p.report == ("lab/nb",) and p.warn == ("lab/nb",) and p.evict == ()  # a new spell: warned again first


def test_idle_settings_are_checked() -> None:
    for bad in ({"threshold_pct": 0.0}, {"window_s": 0.0}, {"warning_s": -1.0}, {"reclaim_key": ""}):
        with pytest.raises(ValueError):
            IdleLoopSettings(**bad)  # type: ignore[arg-type]


def _idle_shell(recorder: Any) -> tuple[Any, Any, list[tuple[str, float]], list[float]]:
    """The real IdleLoop in the rounds runner (acting) over one idle opted-in notebook and a waiting GPU pod."""
    from prometheus_client import CollectorRegistry

    from extender.control.idle import IdleLoop
    from extender.control.leader import AlwaysLeader
    from extender.control.loop import ControlLoop, ControlMetrics
    from extender.settings import Settings
    from extender.snapshot.objects import parse_node, parse_pod
    from extender.snapshot.state import ClusterState
    from tests.control_fakes import FakeActions, FakeTracker, OneLoop, make_context
    from tests.k8s_factories import node, pod

    state = ClusterState()
    evicted: list[tuple[str, float]] = []

    class Actions(FakeActions):
        def namespace_labels(self) -> dict[str, dict[str, str]]:
            return {}

        def evict(self, ns: str, name: str, uid: str = "") -> str:
            evicted.append((name, clock[0]))
            state.delete_pod(uid)
            return "evicted"

    clock = [0.0]
    state.upsert_node(parse_node(node("n0", gpus=4)))
    state.upsert_pod(parse_pod(pod("nb", gpus=1, node_name="n0", namespace="u", phase="Running", annotations={
        "flowsched.io/workload": "notebook", "flowsched.io/reclaim-idle": "1h"})))
    state.upsert_pod(parse_pod(pod("waiting", gpus=1, namespace="u", phase="Pending")))
    state.mark_synced()
    ctx = make_context(state, FakeTracker({}), Actions(), recorder, settings=Settings(kube=False),
                       clock=lambda: clock[0])
    loop = ControlLoop(IdleLoop(ctx), AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=60,
                       dry_run=False, per_interval=1, per_hour=6, clock=lambda: clock[0])
    return OneLoop(loop), state, evicted, clock


def test_a_notebook_is_evicted_only_warning_s_after_a_warning_the_apiserver_accepted() -> None:
    class Events:  # EventRecorder's contract: False when the apiserver refused the Event, never raises
        def __init__(self) -> None:
            self.accept = False
            self.delivered: list[tuple[str, float]] = []

        def record(self, obj: Any, reason: str, message: str, **kw: Any) -> bool:
            if self.accept and reason == "FlowschedIdleGPUReclaim":
                self.delivered.append((obj.name, clock[0]))
            return self.accept

    events = Events()
    loop, state, evicted, clock = _idle_shell(events)
    warns: list[str] = []
    for k in range(90):  # 90 min: warned from 60 min on, while no Event is accepted
        clock[0] = k * 60.0
        if k == 75:
            events.accept = True  # the apiserver takes Events again at 75 min
        state.set_pod_gpu_util({"u/nb": [0.0]}, clock[0])
        warns += [o.outcome for o in loop.run_once().outcomes if o.action.kind == "idle_warn"]
    assert "retry_later" in warns and warns[-1] == "recorded"  # refused warnings are retried, not counted
    assert events.delivered == [("nb", 4500.0)]
    warning_s = loop.loop.controller.cfg.warning_s  # type: ignore[attr-defined]
    assert [name for name, _ in evicted] == ["nb"] and evicted[0][1] >= 4500.0 + warning_s
    # ... and not one round before the delivered warning is warning_s old
    events2 = Events()
    loop2, state2, evicted2, clock2 = _idle_shell(events2)
    for k in range(90):
        clock2[0] = k * 60.0
        state2.set_pod_gpu_util({"u/nb": [0.0]}, clock2[0])
        loop2.run_once()
    assert evicted2 == [] and events2.delivered == []  # never warned: never evicted
