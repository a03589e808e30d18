"""The pods the watch sees, indexed by uid, by job and by node.

PodIndex takes no lock: ClusterState (state.py) calls it under its own and is its only writer;
every read method returns a copy (a tuple, a dict of its own), never one of the live sets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from extender.snapshot.objects import PodInfo


class PodIndex:
    def __init__(self) -> None:
        self._pods: dict[str, PodInfo] = {}
        self._jobs: dict[str, set[str]] = defaultdict(set)
        self._on: dict[str, set[str]] = defaultdict(set)

    # ---- writes ----
    def add(self, pod: PodInfo) -> None:
        """Index a pod whose uid is not indexed (ClusterState removes the old version first)."""
        self._pods[pod.uid] = pod
        self._jobs[pod.job].add(pod.uid)
        if pod.node:
            self._on[pod.node].add(pod.uid)

    def remove(self, uid: str) -> PodInfo | None:
        pod = self._pods.pop(uid, None)
        if pod is None:
            return None
        if pod.node:
            on = self._on.get(pod.node)
            if on is not None:
                on.discard(pod.uid)
                if not on:
                    del self._on[pod.node]
        members = self._jobs.get(pod.job)
        if members is not None:
            members.discard(pod.uid)
            if not members:
                del self._jobs[pod.job]
        return pod

    # ---- reads ----
    def __len__(self) -> int:
        return len(self._pods)

    @property
    def job_count(self) -> int:
        return len(self._jobs)

    def get(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def uids(self) -> tuple[str, ...]:
        return tuple(self._pods)

    def pods(self) -> tuple[PodInfo, ...]:
        return tuple(self._pods.values())

    def job_keys(self) -> tuple[str, ...]:
        return tuple(self._jobs)

    def members(self, job: str) -> tuple[PodInfo, ...]:
        return tuple(self._pods[u] for u in self._jobs.get(job, ()))

    def on(self, node: str) -> tuple[PodInfo, ...]:
        """The pods bound to node (nodes the snapshot does not hold included)."""
        return tuple(self._pods[u] for u in self._on.get(node, ()))

    def terminating_gpus_on(self, node: str) -> float:
        return sum(p.requests.gpus for uid in self._on.get(node, ())
                   if (p := self._pods[uid]).terminating and p.holds_resources)

    def subset(self, uids: Iterable[str]) -> dict[str, PodInfo]:
        return {u: p for u in uids if (p := self._pods.get(u)) is not None}

    def plan_of(self, job: str) -> dict[str, Any] | None:
        """The newest elastic plan on any of the job's pods (None: never planned)."""
        plans = [p.elastic_plan for u in self._jobs.get(job, ()) if (p := self._pods[u]).elastic_plan is not None]
        return dict(max(plans, key=lambda x: float(x["at"]))) if plans else None
