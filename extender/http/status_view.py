"""What the status page (/ui) shows, gathered from the same sources as /debug/snapshot
(StateView.describe), /v1/jobs (progress_api.job_summary over the progress store) and
/debug/control (each loop's recent ticks). Rendering is extender.http.ui_render's job.

Nothing here blocks on the network; the progress store is SQLite, so callers on the event loop
run `gather_status` in a thread.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sqlite3
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from extender.http.debug import DutyCycle, describe_unlocked
from extender.http.progress_api import job_summary
from extender.progress.store import JobHistory, ProgressStore
from extender.snapshot.state import ClusterState
from scoring.convergence import Phase
from scoring.settings import TrackerSettings

log = logging.getLogger("flowsched.ui")

PHASES = tuple(p.name.lower() for p in Phase)
CURVE_POINTS = 200  # a loss curve is thinned to this many points for the page


@dataclass(frozen=True)
class NodeRow:
    name: str
    ready: bool
    unschedulable: bool
    gpu_alloc: float
    gpu_used: float
    gpu_util: Sequence[float | None]  # per GPU, percent; None = no fresh sample
    telemetry: str  # "fresh" | "unknown"
    telemetry_age_s: float | None
    pods: int


@dataclass(frozen=True)
class JobRow:
    key: str  # "namespace/job"
    pods: Sequence[str]
    phase: str
    remaining_s: float | None
    progress: float | None  # relative pace P (scoring.convergence), not a completed fraction
    last_step: int | None
    last_value: float | None
    points: int
    higher_is_better: bool
    curve: Sequence[tuple[float, float]] = ()  # (step, loss), thinned; arrival order kept


@dataclass(frozen=True)
class QueuedPod:
    key: str
    gpus: float
    job: str


@dataclass(frozen=True)
class ActionRow:
    loop: str
    at: float
    dry_run: bool
    kind: str
    target: str
    outcome: str
    reason: str
    repeats: int = 1  # the same planned action in this many ticks (a dry-run loop re-plans it every tick)


@dataclass(frozen=True)
class StatusPage:
    now: float
    ready: bool
    nodes: Sequence[NodeRow]
    jobs: Sequence[JobRow]
    queue: Sequence[QueuedPod]
    actions: Sequence[ActionRow]
    loops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> dry_run, budget_left
    notes: Sequence[str] = ()  # what could not be read, said on the page rather than hidden


def job_phase_counts(state: ClusterState) -> dict[str, int]:
    """Jobs with pods in the snapshot, by convergence phase ("unknown" for jobs that never reported)."""
    conv = state.read().convergences()
    return dict(Counter((conv[j].phase.name.lower() if j in conv else "unknown") for j in state.read().job_keys()))


def thin_curve(steps: np.ndarray[Any, Any], values: np.ndarray[Any, Any], limit: int = CURVE_POINTS
               ) -> list[tuple[float, float]]:
    """At most `limit` points, evenly spaced over the history, the last point always kept."""
    n = len(values)
    if n == 0:
        return []
    idx = np.unique(np.linspace(0, n - 1, num=min(n, limit)).round().astype(np.int64))
    return [(float(steps[i]), float(values[i])) for i in idx if math.isfinite(float(values[i]))]


def _opt(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _actions(loops: Iterable[Any], limit: int) -> list[ActionRow]:
    rows: list[ActionRow] = []
    for lp in loops:
        for tick in list(getattr(lp, "history", ())):
            t = tick.as_dict()
            for a in t.get("actions") or ():
                rows.append(ActionRow(loop=str(lp.name), at=float(t.get("at") or 0.0), dry_run=bool(t.get("dry_run")),
                                      kind=str(a.get("kind", "")), target=str(a.get("target", "")),
                                      outcome=str(a.get("outcome", "")), reason=str(a.get("reason", ""))))
    rows.sort(key=lambda r: r.at, reverse=True)
    merged: dict[tuple[str, str, str, str, bool], ActionRow] = {}
    for r in rows:  # newest first: the newest of a repeated action keeps its time and reason
        key = (r.loop, r.kind, r.target, r.outcome, r.dry_run)
        first = merged.get(key)
        merged[key] = r if first is None else dataclasses.replace(first, repeats=first.repeats + 1)
    return list(merged.values())[:limit]


def gather_status(state: ClusterState, store: ProgressStore, convergence: TrackerSettings, controllers: Any,
                  now: float, stale_s: float, max_jobs: int = 100, max_actions: int = 30) -> StatusPage:
    """The page's data. `controllers` is extender.control.runtime.Controllers or None."""
    # Not StateView.describe: it holds the state's lock (and the verbs with it) for the whole build.
    snap = describe_unlocked(state, now, stale_s, DutyCycle())
    notes: list[str] = []
    nodes = [NodeRow(name=name, ready=bool(n["ready"]), unschedulable=bool(n["unschedulable"]),
                     gpu_alloc=float(n["gpu_alloc"]), gpu_used=float(n["gpu_used"]),
                     gpu_util=list(n["gpu_util"][:max(0, int(n["gpu_alloc"]))]) if n["gpu_alloc"] else [],
                     telemetry=str(n["telemetry"]), telemetry_age_s=n["telemetry_age_s"], pods=len(n["pods"]))
             for name, n in sorted(snap["nodes"].items())]
    queue = [QueuedPod(key=k, gpus=float(p["gpus"]), job=str(p["job"]))
             for k, p in sorted(snap["pods"].items()) if not p["node"] and p["phase"] == "Pending"]

    # Jobs: those in the snapshot and those that report progress, the progress history the
    # same as /v1/jobs computes it. A job that reported but has no pods is shown too (done).
    in_cluster: dict[str, Mapping[str, Any]] = snap["jobs"]
    try:
        reported = {f"{s.namespace}/{s.job}": s for s in store.jobs()}
    except sqlite3.Error as e:
        log.error("status page: progress store unreadable: %s", e)
        notes.append(f"progress store unreadable ({e}): loss curves missing")
        reported = {}
    keys = sorted(set(in_cluster) | set(reported),
                  key=lambda k: (k not in reported, -(reported[k].last_ts if k in reported else 0.0), k))[:max_jobs]
    jobs: list[JobRow] = []
    for key in keys:
        live = in_cluster.get(key, {})
        history: JobHistory | None = None
        if key in reported:
            ns, _, name = key.partition("/")
            try:
                history = store.history(ns, name)
            except sqlite3.Error as e:
                notes.append(f"{key}: history unreadable ({e})")
        if history is not None and history.count:
            s = job_summary(history, convergence)
            jobs.append(JobRow(key=key, pods=list(live.get("pods", [])), phase=str(s["phase"]),
                               remaining_s=_opt(s["remaining_seconds"]), progress=_opt(s["progress"]),
                               last_step=s["last_step"], last_value=_opt(s["last_value"]), points=int(s["points"]),
                               higher_is_better=bool(s["higher_is_better"]),
                               curve=thin_curve(history.steps, history.values)))
        else:
            jobs.append(JobRow(key=key, pods=list(live.get("pods", [])), phase=str(live.get("phase", "unknown")),
                               remaining_s=_opt(live.get("remaining_s")), progress=None, last_step=None,
                               last_value=None, points=0, higher_is_better=False))
    loops: dict[str, Mapping[str, Any]] = {}
    actions: list[ActionRow] = []
    if controllers is not None:
        for lp in controllers.loops:
            loops[lp.name] = {"dry_run": lp.dry_run, "interval_s": lp.interval_s,
                              "budget_left": lp.budget.remaining(lp.clock())}
        actions = _actions(controllers.loops, max_actions)
    return StatusPage(now=now, ready=bool(snap["ready"]), nodes=nodes, jobs=jobs, queue=queue, actions=actions,
                      loops=loops, notes=notes)
