"""Idle GPUs: pods whose GPUs stay under an idle threshold, and opt-in reclamation of idle
notebooks (the core; the service shell emits the `FlowschedIdleGPU` Event, the metric and the
evictions).

- A pod is *idle since* t when every sample of its GPUs (DCGM, attributed to the pod) has been
  under `threshold_pct` since t; a sample above resets it; a pod without samples is unknown,
  never idle.
- A pod idle for `window_s` gets the Event and counts in the metric.
- Reclamation is opt-in per pod (`flowsched.io/reclaim-idle: "2h"`) and only for notebooks: an
  opted-in notebook idle for its own duration is first warned (an Event), and evicted no sooner
  than `warning_s` after the warning, only while GPU pods wait, and within the budget the shell
  passes (the migrator's).

Pure: time comes in as `now`; the idle-since and warned-at maps are values the shell keeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration_s(value: object) -> float | None:
    """'90s', '15m', '2h', '1d' or plain seconds; None when absent, malformed or not positive."""
    if not isinstance(value, str):
        return None
    m = _DURATION.match(value)
    if not m:
        return None
    s = float(m.group(1)) * _UNIT_S[m.group(2)]
    return s if s > 0 and math.isfinite(s) else None


def update_idle_since(prev: Mapping[str, float], util_by_pod: Mapping[str, Sequence[float]], now: float,
                      threshold_pct: float) -> dict[str, float]:
    """The new idle-since map: pods with samples all under the threshold keep (or start) their
    time; pods with a busy sample, or no samples this round, drop out."""
    out: dict[str, float] = {}
    for pod, samples in util_by_pod.items():
        vals = [v for v in samples if math.isfinite(v)]
        if vals and max(vals) < threshold_pct:
            out[pod] = prev.get(pod, now)
    return out


def idle_for(idle_since: Mapping[str, float], now: float, window_s: float) -> list[str]:
    """Pods idle for at least window_s, sorted."""
    return sorted(p for p, t in idle_since.items() if now - t >= window_s)


@dataclass(frozen=True)
class Reclaimable:
    pod: str
    workload: str  # scoring/workload.py class
    reclaim_after_s: float | None  # the pod's flowsched.io/reclaim-idle, None: not opted in


@dataclass(frozen=True)
class ReclaimPlan:
    warn: tuple[str, ...]
    evict: tuple[str, ...]


def plan_reclaim(candidates: Sequence[Reclaimable], idle_since: Mapping[str, float],
                 warned_at: Mapping[str, float], now: float, gpu_pods_waiting: int, budget_left: int,
                 warning_s: float) -> ReclaimPlan:
    """Warn the opted-in idle notebooks not warned yet; evict those warned at least warning_s ago,
    longest idle first, only while GPU pods wait and within budget_left."""
    ripe = [c for c in candidates
            if c.workload == "notebook" and c.reclaim_after_s is not None and c.pod in idle_since
            and now - idle_since[c.pod] >= c.reclaim_after_s]
    warn = tuple(sorted(c.pod for c in ripe if c.pod not in warned_at))
    if gpu_pods_waiting <= 0 or budget_left <= 0:
        return ReclaimPlan(warn, ())
    due = sorted((c for c in ripe if c.pod in warned_at and now - warned_at[c.pod] >= warning_s),
                 key=lambda c: (idle_since[c.pod], c.pod))
    return ReclaimPlan(warn, tuple(c.pod for c in due[:budget_left]))
