"""scoring/idle.py: idle tracking and opt-in reclamation of idle notebooks."""

from __future__ import annotations

import math

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
    p2 = plan_idle(pods, p.memory, 3800.0, 2, 5, s, safety, {})
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
    p = plan_idle([_pod("nb", 50.0, reclaim="1m")], p.memory, 70.0, 1, 5, s, SafetySettings(), {})
    assert p.idle == () and p.evict == () and p.memory == IdleMemory({}, frozenset(), {})
    p = plan_idle([_pod("nb", 0.0, reclaim="1m")], p.memory, 80.0, 1, 5, s, SafetySettings(), {})
    p = plan_idle([_pod("nb", 0.0, reclaim="1m")], p.memory, 140.0, 1, 5, s, SafetySettings(), {})
    assert p.report == ("lab/nb",) and p.warn == ("lab/nb",) and p.evict == ()  # a new spell: warned again first


def test_idle_settings_are_checked() -> None:
    for bad in ({"threshold_pct": 0.0}, {"window_s": 0.0}, {"warning_s": -1.0}, {"reclaim_key": ""}):
        with pytest.raises(ValueError):
            IdleLoopSettings(**bad)  # type: ignore[arg-type]
