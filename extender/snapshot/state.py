"""The in-memory cluster state behind every extender answer.

ClusterState is a thin facade over the parts that own the data: the per-node columns
(node_columns.py), the pod and job index (pod_index.py), the job records (records.py:
convergence, migration records, pods' GPU utilisation) and the demand mix (demand.py). It holds
the one lock and is their only writer: the watcher, the telemetry refresher and the convergence
loop call its write methods, one event at a time. Everything else reads through `read()`, a
StateView (state_view.py) whose accessors copy or freeze under that lock.
Nothing here does I/O; the clock is read only through the `now` arguments.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from extender.snapshot.demand import DemandBook
from extender.snapshot.dra import DRA_KINDS, ClaimInfo, DeviceClassInfo, Slice
from extender.snapshot.dra_book import DraBook
from extender.snapshot.node_columns import GPU_SLOTS, NodeColumns, NodeRow, NodeView
from extender.snapshot.objects import GPU_RESOURCE, MigrationMark, NodeInfo, PodInfo, Resources
from extender.snapshot.pod_index import PodIndex
from extender.snapshot.records import (
    ConvergenceBook,
    JobConvergence,
    MigrationBook,
    MigrationRecord,
    PodGpuUtil,
    SyncStatus,
)
from extender.snapshot.state_view import StateView
from scoring.placement import PlacementSettings

# Re-exported: they were defined here before the split, and callers import them from here.
__all__ = ["GPU_SLOTS", "ClusterState", "JobConvergence", "MigrationRecord", "NodeRow", "NodeView", "StateView",
           "total_used"]


class ClusterState:
    def __init__(self, completing_horizon_s: float = 600.0, initial_capacity: int = 64,
                 placement: PlacementSettings | None = None, migration_ttl_s: float = 3600.0,
                 gpu_resource: str = GPU_RESOURCE) -> None:
        self._lock = threading.RLock()
        self._columns = NodeColumns(initial_capacity)
        self._pods = PodIndex()
        self._convergence = ConvergenceBook(completing_horizon_s)
        self._migrations = MigrationBook(migration_ttl_s)
        self._pod_util = PodGpuUtil()
        self._demand = DemandBook(placement or PlacementSettings())
        self._sync = SyncStatus()
        self._dra = DraBook(gpu_resource)
        self._view = StateView(self._lock, columns=self._columns, pods=self._pods, convergence=self._convergence,
                               migrations=self._migrations, pod_util=self._pod_util, demand=self._demand,
                               sync=self._sync, dra=self._dra)

    def read(self) -> StateView:
        """The read-only view (one per state; cheap to call on every request)."""
        return self._view

    def _account(self, pod: PodInfo, sign: float) -> None:
        if pod.node and pod.holds_resources:
            self._columns.account(pod.node, pod.requests, sign, self._convergence.is_completing(pod.job))

    # ---- nodes ----
    def upsert_node(self, node: NodeInfo) -> None:
        with self._lock:
            self._sync.version += 1
            if self._columns.upsert(node):
                for pod in self._pods.on(node.name):  # bound before their node was seen
                    self._account(pod, +1.0)

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._sync.version += 1
            self._columns.delete(name)

    # ---- pods ----
    def upsert_pod(self, pod: PodInfo) -> None:
        with self._lock:
            self._sync.version += 1
            old = self._pods.remove(pod.uid)
            if old is not None:
                self._account(old, -1.0)
            self._pods.add(pod)
            self._demand.learn(pod, self._columns.nodes.get(pod.node) if pod.node else None, self._columns.shared())
            self._migrations.note(pod)
            self._account(pod, +1.0)

    def delete_pod(self, uid: str) -> None:
        with self._lock:
            self._sync.version += 1
            old = self._pods.remove(uid)
            self._demand.forget(uid)
            if old is not None:
                self._account(old, -1.0)

    # ---- DRA: ResourceSlices, DeviceClasses, ResourceClaims (dra_book.py) ----
    def _dra_changed(self, nodes: Iterable[str]) -> None:
        for name in nodes:
            n = self._dra.node(name)
            capacity, counted = (n.capacity, n.counted) if n is not None else (0, 0)
            self._columns.set_dra(name, float(capacity), float(counted))

    def upsert_dra(self, obj: Slice | DeviceClassInfo | ClaimInfo) -> None:
        with self._lock:
            self._sync.version += 1
            if isinstance(obj, Slice):
                changed = self._dra.upsert_slice(obj)
            elif isinstance(obj, DeviceClassInfo):
                changed = self._dra.upsert_class(obj)
            else:
                changed = self._dra.upsert_claim(obj)
            self._dra_changed(changed)

    def delete_dra(self, kind: str, key: str) -> None:
        """key: a slice's or class's name, a claim's "namespace/name"."""
        with self._lock:
            self._sync.version += 1
            if kind == "resourceslices":
                changed = self._dra.delete_slice(key)
            elif kind == "deviceclasses":
                changed = self._dra.delete_class(key)
            else:
                changed = self._dra.delete_claim(key)
            self._dra_changed(changed)

    def replace_all(self, kind: str, objects: Iterable[Any]) -> None:
        """A relist: the listed objects become the whole truth for that kind."""
        with self._lock:
            if kind in DRA_KINDS:
                self._sync.version += 1
                self._dra_changed(self._dra.replace_all(kind, objects))
                # Not part of readiness: a cluster without resource.k8s.io/v1 never lists them.
                self._sync.dra_synced[kind] = True
                return
            if kind == "nodes":
                nodes = list(objects)
                keep = {n.name for n in nodes}
                for name in [n for n in self._columns.nodes if n not in keep]:
                    self.delete_node(name)
                for n in nodes:
                    self.upsert_node(n)
            else:
                pods = list(objects)
                keep = {p.uid for p in pods}
                for uid in [u for u in self._pods.uids() if u not in keep]:
                    self.delete_pod(uid)
                for p in pods:
                    self.upsert_pod(p)
            self._sync.synced[kind] = True

    def mark_synced(self, kinds: Iterable[str] = ("nodes", "pods"), synced: bool = True) -> None:
        """Count these kinds as listed (or not) without a list (no Kubernetes: kube=False, tests,
        benchmarks)."""
        with self._lock:
            for kind in kinds:
                self._sync.synced[kind] = synced

    # ---- telemetry, convergence, migration (written by the loops) ----
    def set_node_telemetry(
        self, node: str, gpu_util_pct: Sequence[float], fb_free_mib: Sequence[float], sampled_at: float
    ) -> bool:
        """Store one node's per-GPU samples; False if the node is unknown (nothing stored)."""
        with self._lock:
            return self._columns.set_telemetry(node, gpu_util_pct, fb_free_mib, sampled_at)

    def clear_node_telemetry(self, node: str) -> None:
        with self._lock:
            self._columns.clear_telemetry(node)

    def set_pod_gpu_util(self, util: Mapping[str, Sequence[float]], sampled_at: float) -> None:
        """The pods' GPU utilisation from one telemetry reading (replaces the previous one)."""
        reading = PodGpuUtil.reading(util, sampled_at)
        with self._lock:
            self._pod_util.replace(reading)

    def set_job_convergence(self, job: str, conv: JobConvergence) -> None:
        with self._lock:
            members = self._pods.members(job)
            for p in members:
                self._account(p, -1.0)
            self._convergence.set(job, conv)
            for p in members:
                self._account(p, +1.0)

    def seed_migrations(self, marks: Mapping[str, MigrationMark]) -> int:
        """MigrationBook.seed under the lock: the saved marks of jobs whose pods may be gone."""
        with self._lock:
            taken = self._migrations.seed(marks)
            if taken:
                self._sync.version += 1
            return taken

    def set_migration_ttl(self, ttl_s: float) -> None:
        """How long a migrated job's origin node is scored down."""
        with self._lock:
            self._migrations.ttl_s = ttl_s


def total_used(pods: Iterable[PodInfo], node: str) -> Resources:
    """Reference computation of a node's usage from scratch (tests compare the columns to it)."""
    total = Resources()
    for p in pods:
        if p.node == node and p.holds_resources:
            total = total + p.requests
    return total
