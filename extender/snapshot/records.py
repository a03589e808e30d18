"""What ClusterState remembers about jobs and pods beyond their objects: convergence, the
migrator's eviction records and the pods' GPU utilisation.

None of these takes a lock: ClusterState (state.py) calls them under its own and is their only
writer; every read returns a value or a copy, never a live dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from extender.snapshot.objects import MigrationMark, PodInfo
from scoring.convergence import Phase
from scoring.world import is_completing


@dataclass(frozen=True)
class JobConvergence:
    phase: Phase
    remaining_s: float  # NaN when unknown
    updated_at: float


class ConvergenceBook:
    """job -> its latest convergence estimate (the convergence loop writes it)."""

    def __init__(self, completing_horizon_s: float) -> None:
        self.completing_horizon_s = completing_horizon_s
        self._jobs: dict[str, JobConvergence] = {}

    def set(self, job: str, conv: JobConvergence) -> None:
        self._jobs[job] = conv

    def get(self, job: str) -> JobConvergence | None:
        return self._jobs.get(job)

    def copy(self) -> dict[str, JobConvergence]:
        return dict(self._jobs)

    def is_completing(self, job: str) -> bool | None:
        """None: the job has no estimate."""
        c = self._jobs.get(job)
        return None if c is None else is_completing(c.phase, c.remaining_s, self.completing_horizon_s)


@dataclass(frozen=True)
class MigrationRecord:
    """A job's newest eviction mark, the pods that carried it (evicted ones stay in the set), and
    the mark it replaced (the job's record again if every carrier has this one withdrawn)."""

    mark: MigrationMark
    carriers: frozenset[str] = field(default_factory=frozenset)
    previous: MigrationMark | None = None


class MigrationBook:
    """job -> its newest eviction mark and the pods that carried it: the migrator's record,
    read from the flowsched.io/migration annotation it puts on a pod before evicting it, so
    every replica learns it from its pod watch (see docs/control-loops.md)."""

    def __init__(self, ttl_s: float = 3600.0, retain_s: float = 7 * 86400.0) -> None:
        self.ttl_s = ttl_s  # how long the origin node is scored down
        # Records older than this before the newest mark go when a new one comes (the marks Lease
        # keeps as long): one per evicted job, never withdrawn, they grew with the service's uptime.
        self.retain_s = retain_s
        self._records: dict[str, MigrationRecord] = {}
        self._newest = -math.inf

    def note(self, pod: PodInfo) -> None:
        """One eviction marks every pod of the job with the same mark (same `at`); the record
        goes only when every pod that carried it had it withdrawn (a refused eviction), so a pod
        evicted with it keeps the record even when a later pod's eviction was refused. Then the
        record the mark replaced, if any, is the job's again."""
        rec = self._records.get(pod.job)
        mark = pod.migration
        if mark is not None:
            if rec is None or mark.at > rec.mark.at:
                self._records[pod.job] = MigrationRecord(mark, frozenset((pod.uid,)),
                                                         rec.mark if rec is not None else None)
                self._prune(mark.at)
            elif mark.at == rec.mark.at:
                self._records[pod.job] = MigrationRecord(mark, rec.carriers | {pod.uid}, rec.previous)
        elif rec is not None and pod.uid in rec.carriers:
            carriers = rec.carriers - {pod.uid}  # the mark was withdrawn (that pod's eviction was refused)
            if carriers:
                self._records[pod.job] = MigrationRecord(rec.mark, carriers, rec.previous)
            elif rec.previous is not None:
                self._records[pod.job] = MigrationRecord(rec.previous)
            else:
                del self._records[pod.job]

    def seed(self, marks: Mapping[str, MigrationMark]) -> int:
        """Marks saved by a leader (extender/control/mark_store.py) for jobs whose evicted pods this
        replica may never have seen; a record of the job's the pod watch holds already, as new or
        newer, wins. Returns how many records were taken."""
        taken = 0
        for job, mark in marks.items():
            rec = self._records.get(job)
            if rec is None or mark.at > rec.mark.at:
                self._records[job] = MigrationRecord(mark, frozenset(), rec.mark if rec is not None else None)
                taken += 1
        if marks:
            self._prune(max(m.at for m in marks.values()))
        return taken

    def _prune(self, at: float) -> None:
        if at <= self._newest:
            return
        self._newest = at
        old = [j for j, rec in self._records.items() if rec.mark.at < at - self.retain_s]
        for j in old:
            del self._records[j]

    def __bool__(self) -> bool:
        return bool(self._records)

    def mark_of(self, job: str) -> MigrationMark | None:
        rec = self._records.get(job)
        return rec.mark if rec else None

    def origin(self, job: str, now: float) -> str | None:
        """The node the job was last migrated away from, within ttl_s."""
        rec = self._records.get(job)
        if rec is None or now - rec.mark.at > self.ttl_s:
            return None
        return rec.mark.origin

    def marks(self) -> dict[str, MigrationMark]:
        return {j: rec.mark for j, rec in self._records.items()}


class PodGpuUtil:
    """"namespace/name" -> (sampled at, utilisation % of each of its GPUs): DCGM's pod
    attribution, written by the telemetry refresher, read by the idle loop. Each reading
    replaces the whole mapping, so a reader may keep the one it was given."""

    def __init__(self) -> None:
        self._util: Mapping[str, tuple[float, tuple[float, ...]]] = MappingProxyType({})

    @staticmethod
    def reading(util: Mapping[str, Sequence[float]], sampled_at: float
                ) -> Mapping[str, tuple[float, tuple[float, ...]]]:
        """One reading in the stored form (built before taking the lock: it is per pod)."""
        return MappingProxyType({k: (sampled_at, tuple(float(v) for v in vals)) for k, vals in util.items()})

    def replace(self, reading: Mapping[str, tuple[float, tuple[float, ...]]]) -> None:
        self._util = reading

    def current(self) -> Mapping[str, tuple[float, tuple[float, ...]]]:
        return self._util


class SyncStatus:
    """Whether each kind has been listed once, and a counter of the watch events applied."""

    def __init__(self) -> None:
        self.synced: dict[str, bool] = {"nodes": False, "pods": False}
        self.dra_synced: dict[str, bool] = {}  # DRA kinds listed (optional: not in readiness)
        self.version = 0
