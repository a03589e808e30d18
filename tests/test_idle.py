"""scoring/idle.py: idle tracking and opt-in reclamation of idle notebooks."""

from __future__ import annotations

import math

from scoring.idle import Reclaimable, idle_for, parse_duration_s, plan_reclaim, update_idle_since


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
