"""StateView: the read-only side of ClusterState, the only way anything outside the writers reads it.

Every accessor takes the state's lock for as long as one C-speed copy takes (a tuple of the
pods, a dict of the estimates, one node's row) and returns something no writer will change:
a tuple, a frozen dataclass, a fresh dict, or a MappingProxyType over a dict the writers
replace rather than change. So a reader may iterate what it got while the watch applies
events, and never holds the lock (nor the verbs waiting on it) while it builds a page.
Nothing here copies every pod on a verb's path: the verbs read a gathered row matrix (view),
the sharing nodes (no copy) and single lookups.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from extender.snapshot.demand import DemandBook
from extender.snapshot.dra import ClaimInfo
from extender.snapshot.dra_book import ClaimDemand, DraBook, DraNode
from extender.snapshot.dra_control import control_gpus
from extender.snapshot.node_columns import NodeColumns, NodeRow, NodeView, node_view
from extender.snapshot.objects import MigrationMark, NodeInfo, PodInfo
from extender.snapshot.pod_index import PodIndex
from extender.snapshot.records import ConvergenceBook, JobConvergence, MigrationBook, PodGpuUtil, SyncStatus
from extender.snapshot.sharing import NodeSharing
from scoring.fragmentation import DemandMix, PodKind


class StateView:
    def __init__(self, lock: threading.RLock, *, columns: NodeColumns, pods: PodIndex, convergence: ConvergenceBook,
                 migrations: MigrationBook, pod_util: PodGpuUtil, demand: DemandBook, sync: SyncStatus,
                 dra: DraBook) -> None:
        self._lock = lock
        self._dra = dra
        self._columns, self._pods, self._convergence = columns, pods, convergence
        self._migrations, self._pod_util, self._demand, self._sync = migrations, pod_util, demand, sync

    # ---- the verbs' path ----
    def view(self, names: Sequence[str], now: float, stale_after_s: float,
             nominated: str | None = None) -> NodeView:
        """The candidate rows of names (a copy gathered under the lock, masked outside it).

        nominated: the node kube-scheduler nominated the pod to after preempting there; the GPUs
        of that node's terminating pods count as free in this view. A preemptor's victims are on
        their way out once kube-scheduler has nominated it: its cache drops a victim when the
        DELETED event arrives, and it retries the pod at once, often before this snapshot has
        applied the same event. Counting the victims' GPUs as still held then rejected the
        nominated node and made kube-scheduler preempt a second victim elsewhere. Only GPUs:
        they are what this filter checks (kube-scheduler checks the rest)."""
        with self._lock:
            idx, g = self._columns.gather(names)
            if nominated and self._columns.slot_of(nominated) >= 0:
                self._columns.release_gpus(g, idx, nominated, self._pods.terminating_gpus_on(nominated))
        return node_view(names, idx, g, now, stale_after_s)

    def slot_of(self, name: str) -> int:
        with self._lock:
            return self._columns.slot_of(name)

    def count_unknown(self, names: Sequence[str]) -> int:
        """How many of names the snapshot does not hold."""
        with self._lock:
            return self._columns.count_unknown(names)

    def shared(self) -> Mapping[str, NodeSharing]:
        """The nodes that share GPUs (no copy: the writers replace this mapping, never change it)."""
        with self._lock:
            return self._columns.shared()

    def demand_mix(self) -> DemandMix:
        with self._lock:
            return self._demand.mix()

    def demand_counts(self) -> Mapping[PodKind, float]:
        with self._lock:
            return self._demand.counts()

    def has_migrations(self) -> bool:
        """Whether any job has a migration record (lets a verb skip working out a job's key)."""
        with self._lock:
            return bool(self._migrations)

    def migration_of(self, job: str) -> MigrationMark | None:
        with self._lock:
            return self._migrations.mark_of(job)

    def migration_origin(self, job: str, now: float) -> str | None:
        """The node the job was last migrated away from, within the migration TTL."""
        with self._lock:
            return self._migrations.origin(job, now)

    # ---- DRA (dra_book.py) ----
    @property
    def dra_extended_resources(self) -> frozenset[str]:
        """The extended resources DeviceClasses map onto GPUs (KEP-5004); empty on a cluster without
        DRA GPU classes. Read without the lock: the book replaces the set, never changes it, and
        the verbs read it on every call."""
        return self._dra.extended_resources

    def claim_demand(self, namespace: str, claims: Iterable[str]) -> ClaimDemand:
        """What a pod's unallocated ResourceClaims ask for."""
        with self._lock:
            return self._dra.demand(namespace, claims)

    def dra_counts(self) -> dict[str, int]:
        """How many nodes have DRA GPUs and how many ResourceClaims the snapshot holds."""
        with self._lock:
            return {"nodes": len(self._dra.nodes()), "claims": self._dra.claim_count()}

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        with self._lock:
            return self._dra.claim(namespace, name)

    def dra_node(self, name: str) -> DraNode | None:
        with self._lock:
            return self._dra.node(name)

    def dra_nodes(self) -> Mapping[str, DraNode]:
        with self._lock:
            return self._dra.nodes()

    def dra_device_nodes(self, uuids: Iterable[str]) -> dict[str, str]:
        """uuid -> the node whose ResourceSlices publish it, for those of uuids that are DRA devices."""
        with self._lock:
            return {u: d[0] for u in uuids if (d := self._dra.device(u)) is not None}

    def dra_pod_gpus(self) -> dict[str, tuple[str, ...]]:
        """"namespace/name" -> the uuids of the GPUs its ResourceClaims hold, for each bound pod that
        uses claims (the telemetry refresher's per-pod attribution by uuid)."""
        with self._lock:
            if not self._dra.has_gpus():
                return {}
            out: dict[str, tuple[str, ...]] = {}
            for p in self._pods.pods():
                if p.claims and p.node and p.holds_resources:
                    uuids = tuple(dict.fromkeys(u for c in p.claims
                                                for u in self._dra.gpu_uuids(f"{p.namespace}/{c}")))
                    if uuids:
                        out[p.key] = uuids
            return out

    def has_dra_gpus(self) -> bool:
        """Whether any node has DRA GPUs (lets a loop skip its DRA work on a device-plugin cluster)."""
        with self._lock:
            return self._dra.has_gpus()

    def dra_frees(self, claims: Iterable[str], leaving: Iterable[str]) -> dict[str, int]:
        """node -> whole GPUs freed if the pods (uids) leaving go: claims ("namespace/name") free
        their devices only when every pod reserving them leaves."""
        with self._lock:
            return self._dra.frees(claims, set(leaving))

    # ---- sync status and counts ----
    @property
    def ready(self) -> bool:
        with self._lock:
            return all(self._sync.synced.values())

    def synced(self) -> Mapping[str, bool]:
        with self._lock:
            return MappingProxyType(dict(self._sync.synced))

    @property
    def version(self) -> int:
        with self._lock:
            return self._sync.version

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"nodes": len(self._columns.nodes), "pods": len(self._pods), "jobs": self._pods.job_count}

    # ---- nodes, pods, jobs ----
    def node_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._columns.nodes)

    def node(self, name: str) -> NodeInfo | None:
        with self._lock:
            return self._columns.nodes.get(name)

    def node_row(self, name: str) -> NodeRow | None:
        with self._lock:
            return self._columns.row(name)

    def pods(self) -> tuple[PodInfo, ...]:
        with self._lock:
            return self._pods.pods()

    def pod(self, uid: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get(uid)

    def pods_by_uid(self, uids: Iterable[str]) -> Mapping[str, PodInfo]:
        """Those of uids the snapshot holds."""
        with self._lock:
            return MappingProxyType(self._pods.subset(uids))

    def pods_on(self, node: str) -> tuple[PodInfo, ...]:
        with self._lock:
            return self._pods.on(node)

    def job_keys(self) -> tuple[str, ...]:
        with self._lock:
            return self._pods.job_keys()

    def job_pods(self, jobs: Iterable[str]) -> dict[str, tuple[PodInfo, ...]]:
        """Each job's pods (a job the snapshot no longer holds: no pods)."""
        with self._lock:
            return {j: self._pods.members(j) for j in jobs}

    def convergence(self, job: str) -> JobConvergence | None:
        with self._lock:
            return self._convergence.get(job)

    def convergences(self) -> Mapping[str, JobConvergence]:
        with self._lock:
            return MappingProxyType(self._convergence.copy())

    def control_view(self) -> tuple[tuple[PodInfo, ...], tuple[NodeInfo, ...], dict[str, MigrationMark]]:
        """What the control loops read (pods, schedulable nodes, migration marks), with DRA GPUs
        counted in pods' requests and nodes' allocatable (dra_control.py)."""
        with self._lock:
            pods = self._pods.pods()
            nodes = tuple(n for n in self._columns.nodes.values() if n.ready and not n.unschedulable)
            marks = self._migrations.marks()
            dra = self._dra.frozen() if self._dra.has_gpus() or self._dra.claim_count() else None
        if dra is None and any(p.claims for p in pods):  # claims named, none seen yet: demand unknown
            with self._lock:
                dra = self._dra.frozen()
        if dra is not None:
            pods, nodes = control_gpus(dra, pods).apply(pods, nodes)
        return pods, nodes, marks

    def plan_of(self, job: str) -> dict[str, Any] | None:
        """The newest elastic plan on any of the job's pods (None: never planned)."""
        with self._lock:
            return self._pods.plan_of(job)

    # ---- telemetry ----
    def pod_gpu_samples(self, now: float, stale_after_s: float) -> dict[str, tuple[float, ...]]:
        """Each pod's latest GPU samples no older than stale_after_s (older ones: unknown, left out)."""
        with self._lock:
            util = self._pod_util.current()
        return {k: v for k, (t, v) in util.items() if now - t <= stale_after_s}

    def count_telemetry_unknown(self, now: float, stale_after_s: float) -> int:
        """GPU nodes without a fresh sample, as the request path would see them right now."""
        with self._lock:
            names = [n for n, info in self._columns.nodes.items()
                     if info.allocatable.gpus > 0 or self._columns.dra_gpus(n) > 0]
        if not names:
            return 0
        util = self.view(names, now, stale_after_s).arrays.gpu_util
        return int(np.isnan(util).all(axis=1).sum())

    # ---- debug ----
    def describe(self, now: float, stale_after_s: float) -> dict[str, Any]:
        """Everything, consistent (built under the lock: ~0.5 s at 50,000 pods, during which the
        verbs wait; extender.http.debug pages the same facts without holding it)."""
        with self._lock:
            nodes: dict[str, Any] = {}
            for name in self._columns.nodes:
                r = self._columns.row(name)
                if r is None:
                    continue
                age = now - r.sampled_at
                fresh = bool(np.isfinite(age) and age <= stale_after_s)
                nodes[name] = {
                    "ready": r.info.ready,
                    "unschedulable": r.info.unschedulable,
                    "labels": dict(r.info.labels),
                    "gpu_alloc": r.gpu_alloc, "gpu_used": r.gpu_used,
                    "cpu_alloc": r.cpu_alloc, "cpu_used": r.cpu_used,
                    "mem_alloc": r.mem_alloc, "mem_used": r.mem_used,
                    "gpu_util": [None if np.isnan(x) else float(x) for x in r.gpu_util],
                    "telemetry_age_s": float(age) if np.isfinite(age) else None,
                    "telemetry": "fresh" if fresh else "unknown",
                    "completing_gpus": r.completing_gpus,
                    "pods": sorted(p.key for p in self._pods.on(name)),
                }
            pods = {
                p.key: {"uid": p.uid, "node": p.node or None, "phase": p.phase, "job": p.job,
                        "gpus": p.requests.gpus, "cpu_m": p.requests.cpu_m, "mem": p.requests.mem,
                        "checkpointable": p.checkpointable, "terminating": p.terminating,
                        "labels": dict(p.labels)}
                for p in self._pods.pods()
            }
            jobs = {}
            for job in self._pods.job_keys():
                c = self._convergence.get(job)
                jobs[job] = {
                    "pods": sorted(p.key for p in self._pods.members(job)),
                    "phase": c.phase.name.lower() if c else "unknown",
                    "remaining_s": None if c is None or not np.isfinite(c.remaining_s) else c.remaining_s,
                }
            return {"ready": all(self._sync.synced.values()), "synced": {**self._sync.synced, **self._sync.dra_synced},
                    "version": self._sync.version, "nodes": nodes, "pods": pods, "jobs": jobs}
