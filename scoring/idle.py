"""Idle GPUs: pods whose GPUs stay under an idle threshold, and opt-in reclamation of idle
notebooks (the core; the service shell emits the `FlowschedIdleGPU` Event, the metric and the
evictions).

- A pod is *idle since* t when every sample of its GPUs (DCGM, attributed to the pod) has been
  under `threshold_pct` since t; a sample above resets it; a pod without samples is unknown,
  never idle.
- A pod idle for `window_s` gets the Event and counts in the metric.
- Reclamation is opt-in per pod (`flowsched.io/reclaim-idle: "2h"`) and only for notebooks: an
  opted-in notebook idle for its own duration is first warned (an Event), and evicted no sooner
  than `warning_s` after the warning was delivered (the shell reports it, `warning_delivered`),
  only while GPU pods wait, and within the budget the shell passes (the migrator's).

Pure: time comes in as `now`; the idle-since and warned-at maps are values the shell keeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from scoring.safety import namespace_refusal
from scoring.settings import IdleLoopSettings, SafetySettings
from scoring.world import IdlePod

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


@dataclass(frozen=True)
class IdleMemory:
    """What the shell keeps between rounds: when each pod became idle, which idle pods got their
    Event, when each opted-in notebook was warned."""

    idle_since: Mapping[str, float] = field(default_factory=dict)
    reported: frozenset[str] = frozenset()
    warned_at: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class IdlePlan:
    memory: IdleMemory
    idle: tuple[str, ...]  # idle for the window now (the metric)
    idle_gpus: float  # GPUs they hold
    report: tuple[str, ...]  # idle for the window, not reported yet: a FlowschedIdleGPU Event each
    warn: tuple[str, ...]  # opted-in notebooks due for reclamation, to be warned now (planned each round
    # until the shell reports the warning delivered)
    evict: tuple[str, ...]  # warned long enough, GPU pods waiting, within the budget
    refused: Mapping[str, str]  # opted-in pods that will not be reclaimed, and why

    def describe(self, now: float) -> dict[str, object]:
        return {"at": now, "idle": list(self.idle), "idle_gpus": self.idle_gpus, "report": list(self.report),
                "warn": list(self.warn), "evict": list(self.evict), "refused": dict(self.refused),
                "idle_since": {k: round(now - t, 1) for k, t in sorted(self.memory.idle_since.items())}}


def warning_delivered(memory: IdleMemory, pod: str, at: float) -> IdleMemory:
    """The memory once the warning to `pod` was delivered at `at`: the eviction may come
    warning_s after it. Only delivered warnings count (plan_idle never records one itself)."""
    return replace(memory, warned_at={**memory.warned_at, pod: at})


def plan_idle(pods: Sequence[IdlePod], memory: IdleMemory, now: float, gpu_pods_waiting: int, budget_left: int,
              s: IdleLoopSettings, safety: SafetySettings,
              namespace_labels: Mapping[str, Mapping[str, str]]) -> IdlePlan:
    """One round of the idle loop. A pod that is busy again, or gone, loses its idle time, its
    report and its warning. Reclamation is for opted-in notebooks outside excluded and opted-out
    namespaces only (an unreadable duration is refused, with the reason)."""
    samples = {p.key: p.samples for p in pods}
    idle_since = update_idle_since(memory.idle_since, samples, now, s.threshold_pct)
    idle = tuple(idle_for(idle_since, now, s.window_s))
    by_key = {p.key: p for p in pods}
    report = tuple(k for k in idle if k not in memory.reported)
    refused: dict[str, str] = {}
    candidates: list[Reclaimable] = []
    for p in pods:
        if p.reclaim is None:
            continue
        after = parse_duration_s(p.reclaim)
        why = namespace_refusal(p.namespace, namespace_labels, safety)
        if after is None:
            why = f"{s.reclaim_key}={p.reclaim!r} is not a duration (e.g. 2h, 30m)"
        elif p.workload != "notebook":
            why = f"{p.workload} workload: only notebooks are reclaimed"
        if why is not None:
            refused[p.key] = why
            continue
        candidates.append(Reclaimable(p.key, p.workload, after))
    warned = {k: t for k, t in memory.warned_at.items() if k in idle_since and k in by_key}
    rp = plan_reclaim(candidates, idle_since, warned, now, gpu_pods_waiting, budget_left, s.warning_s)
    # A planned warning is not a warning given: the shell records it (warning_delivered) only once
    # the Event was accepted, so a notebook is never evicted on the strength of an undelivered one.
    reported = frozenset(k for k in memory.reported | set(report) if k in idle_since and k in by_key)
    return IdlePlan(
        memory=IdleMemory(idle_since, reported, warned),
        idle=idle,
        idle_gpus=float(sum(by_key[k].gpus for k in idle if k in by_key)),
        report=report,
        warn=rp.warn,
        evict=rp.evict,
        refused=refused,
    )
