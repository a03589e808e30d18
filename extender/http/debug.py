"""/debug/snapshot and /debug/explain: filtered, paged, computed off the event loop.

The whole snapshot at 5,000 nodes / 50,000 pods was 18.7 MB built in ~0.5 s on the event loop,
during which no verb was answered (issue 18). Here each call returns at most `limit` entries
per kind (sorted by key, resumed with `after=<last key>`), is built in the debug routes' one
thread (extender.http.app; so at most one debug computation competes with the verbs),
which pauses every CHUNK entries (DutyCycle: without it, the event loop waited up to the 5 ms
switch interval each time it needed the GIL, and prioritize's p50 went from 0.8 to 8.8 ms under
a looping debug client), and reads the state through its read-only view (ClusterState.read), each read a
short copy under the state's lock: a page may mix facts from just before and just after a concurrent watch
event, which is fine for a debugging view, and the lock is never held while a page is built.

Who may call these at all is decided in extender.http.app (debug_access).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from extender.http.verbs import Policy, explain
from extender.snapshot.state import ClusterState

KINDS = ("nodes", "pods", "jobs")
T = TypeVar("T")


class DebugQueryError(ValueError):
    """A bad query parameter; the message names it."""


@dataclass(frozen=True)
class SnapshotQuery:
    kinds: tuple[str, ...] = KINDS
    namespace: str = ""  # pods and jobs of this namespace only
    node: str = ""  # this node only, and the pods bound to it
    after: str = ""  # resume after this key (the previous page's last)
    limit: int = 500

    @classmethod
    def parse(cls, kind: str, namespace: str, node: str, after: str, limit: int, max_limit: int) -> SnapshotQuery:
        kinds = KINDS if kind in ("", "all") else (kind,)
        if any(k not in KINDS for k in kinds):
            raise DebugQueryError(f"kind: expected one of all, {', '.join(KINDS)}")
        if not 1 <= limit <= max_limit:
            raise DebugQueryError(f"limit: expected 1..{max_limit}")
        if after and len(kinds) != 1:
            raise DebugQueryError("after: needs one kind (kind=nodes, pods or jobs)")
        return cls(kinds, namespace, node, after, limit)


Pause = Callable[[], None]
CHUNK = 100  # entries handled between two pauses (tens of µs of work)


def _no_pause() -> None:
    pass


class DutyCycle:
    """A pause that keeps the debug thread to `share` of the wall time.

    Each pause sleeps in proportion to the work done since the last one, releasing the GIL:
    the event loop waits at most one chunk for it (not the 5 ms switch interval), and a client
    looping on /debug/* can take at most `share` of one core from the verbs, however busy
    the machine is. Pages take 1/share times longer; that is the price."""

    def __init__(self, share: float = 0.25) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.factor = (1.0 - share) / share
        self.resumed = time.perf_counter()

    def __call__(self) -> None:
        worked = time.perf_counter() - self.resumed
        time.sleep(worked * self.factor)  # sleep(0) too releases the GIL
        self.resumed = time.perf_counter()


def _page(keys: Sequence[str], after: str, limit: int, pause: Pause = _no_pause) -> tuple[list[str], str | None]:
    """The first `limit` keys after `after`, in order, and the cursor for the next page.

    Sorted in runs of CHUNK and merged lazily: one sort of 50,000 keys is one C call that holds
    the GIL for tens of ms, which the verbs would wait out."""
    runs: list[list[str]] = []
    for i in range(0, len(keys), CHUNK):
        pause()
        run = sorted(k for k in keys[i:i + CHUNK] if k > after)
        if run:
            runs.append(run)
    best: list[str] = []
    for n, k in enumerate(heapq.merge(*runs)):
        if n % CHUNK == 0:
            pause()
        best.append(k)
        if len(best) > limit:
            break
    if len(best) > limit:
        return best[:limit], best[limit - 1]
    return best, None


def _chunked(items: Sequence[T], pause: Pause, size: int = CHUNK) -> Iterator[T]:
    for i in range(0, len(items), size):
        pause()
        yield from items[i:i + size]


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _node_entry(state: ClusterState, name: str, now: float, stale_after_s: float) -> dict[str, Any] | None:
    r = state.read().node_row(name)
    if r is None:
        return None  # deleted since the page was chosen
    info = r.info
    age = now - r.sampled_at
    fresh = bool(np.isfinite(age) and age <= stale_after_s)
    return {
        "ready": info.ready, "unschedulable": info.unschedulable, "labels": dict(info.labels),
        "gpu_alloc": r.gpu_alloc, "gpu_used": r.gpu_used,
        "cpu_alloc": r.cpu_alloc, "cpu_used": r.cpu_used,
        "mem_alloc": r.mem_alloc, "mem_used": r.mem_used,
        "gpu_util": [_num(x) for x in r.gpu_util],
        "telemetry_age_s": age if np.isfinite(age) else None,
        "telemetry": "fresh" if fresh else "unknown",
        "completing_gpus": r.completing_gpus,
        **_dra_entry(state, name),
    }


def _dra_entry(state: ClusterState, name: str) -> dict[str, Any]:
    """A DRA node's GPUs (their part of gpu_alloc and gpu_used), for docs/dra.md's checks."""
    d = state.read().dra_node(name)
    if d is None:
        return {}
    return {"dra": {"capacity": d.capacity, "used": d.used, "free_mig": dict(d.free_mig)}}


def snapshot_page(state: ClusterState, q: SnapshotQuery, now: float, stale_after_s: float,
                  pause: Pause = _no_pause) -> dict[str, Any]:
    """One page; `pause` is called every CHUNK entries (extender.http.app passes a DutyCycle)."""
    read = state.read()
    out: dict[str, Any] = {"ready": read.ready, "synced": dict(read.synced()), "version": read.version,
                           "counts": read.counts(), "dra": read.dra_counts()}
    more: dict[str, str] = {}
    if "nodes" in q.kinds:
        names = [q.node] if q.node else list(read.node_names())
        page, cursor = _page(names, q.after, q.limit, pause)
        entries = {n: _node_entry(state, n, now, stale_after_s) for n in _chunked(page, pause, 10)}
        out["nodes"] = {n: e for n, e in entries.items() if e is not None}
        if cursor:
            more["nodes"] = cursor
    if "pods" in q.kinds:
        pods = {p.key: p for p in _chunked(read.pods(), pause)
                if (not q.namespace or p.namespace == q.namespace) and (not q.node or p.node == q.node)}
        page, cursor = _page(list(pods), q.after, q.limit, pause)
        out["pods"] = {k: {"uid": p.uid, "node": p.node or None, "phase": p.phase, "job": p.job,
                           "gpus": p.requests.gpus, "cpu_m": p.requests.cpu_m, "mem": p.requests.mem,
                           "checkpointable": p.checkpointable, "terminating": p.terminating,
                           "labels": dict(p.labels)}
                       for k in _chunked(page, pause, 20) for p in (pods[k],)}
        if cursor:
            more["pods"] = cursor
    if "jobs" in q.kinds:
        keys = [j for j in read.job_keys() if not q.namespace or j.startswith(q.namespace + "/")]
        page, cursor = _page(keys, q.after, q.limit, pause)
        out["jobs"] = {}
        for job in _chunked(page, pause, 20):
            c = read.convergence(job)
            keys_of = sorted(p.key for p in read.job_pods((job,))[job])
            out["jobs"][job] = {"pods": keys_of, "phase": c.phase.name.lower() if c else "unknown",
                                "remaining_s": None if c is None or not np.isfinite(c.remaining_s)
                                else c.remaining_s}
        if cursor:
            more["jobs"] = cursor
    out["more"] = more  # kind -> the `after` that fetches its next page; empty when complete
    return out


def explain_page(state: ClusterState, pod_key: str, nodes: Sequence[str], after: str, limit: int,
                 policy: Policy, now: float, pause: Pause = _no_pause) -> dict[str, Any] | None:
    """The filter verdict and score terms of one pod on one page of nodes; None if no such pod.

    Nodes are taken in name order, page by page; within a page they are ranked as
    decide.explain ranks them (passing nodes first, best score first)."""
    ns, _, name = pod_key.partition("/")
    found = next((p for p in _chunked(state.read().pods(), pause)
                  if p.namespace == ns and p.name == name), None)
    if found is None:
        return None
    page, cursor = _page(nodes or state.read().node_names(), after, limit, pause)
    rows: list[dict[str, Any]] = []
    for i in range(0, len(page), 100):
        pause()
        rows += explain(state, found, page[i:i + 100], policy, now)
    rows.sort(key=lambda d: (not str(d["filter"]).startswith("pass"), -d["score"]))
    return {"pod": pod_key, "job": found.job, "gpus": found.requests.gpus, "nodes": rows, "more": cursor}



def describe_unlocked(state: ClusterState, now: float, stale_after_s: float,
                      pause: Pause = _no_pause) -> dict[str, Any]:
    """StateView.describe's shape (every node with its pods, every pod, every job), built from
    short reads of the state's view and in chunks: describe holds the lock for the whole build
    (about 0.5 s at 50,000 pods), and every verb waits for that lock (StateView.view)."""
    pods_on: dict[str, list[str]] = {}
    for p in _chunked(state.read().pods(), pause):
        if p.node:
            pods_on.setdefault(p.node, []).append(p.key)
    q = SnapshotQuery(limit=max(1, *state.read().counts().values()))
    out = snapshot_page(state, q, now, stale_after_s, pause)
    for name, entry in out["nodes"].items():
        entry["pods"] = sorted(pods_on.get(name, ()))
    return out
