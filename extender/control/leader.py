"""Lease-based leader election over coordination.k8s.io/v1 (client-go's algorithm).

One Lease (default flowsched/flowsched-controllers) names the holder. Every retry_period_s each
candidate reads it; the holder renews renewTime; another candidate takes it over only when the
record has not changed for leaseDurationSeconds *as observed on its own clock* (so clock skew
between replicas does not matter), by an update carrying the resourceVersion it read (a
concurrent writer gets 409 and loses). A holder that could not renew for renew_deadline_s stops
calling itself leader before anyone else may take over (renew_deadline_s < lease_duration_s).
On stop the holder releases the Lease (empty holder, duration 1s) so a successor starts at once.

    elector = LeaderElector(KubeLeaseClient(api_client), "flowsched", "flowsched-controllers", "pod-a")
    elector.start()        # a daemon thread
    elector.is_leader      # read by the control loops before every action
    elector.stop()         # releases the Lease if held
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.kube import requests
from extender.kube.client import send
from extender.kube.requests import Request
from extender.kube.responses import Response, api_error, json_body, json_or_none
from extender.periodic import PeriodicRunner

log = logging.getLogger("flowsched.leader")


class LeaseConflict(Exception):
    """Someone else wrote the Lease between our read and our write (HTTP 409)."""


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    lease_duration_s: int
    acquire_time: str | None  # RFC 3339 with microseconds, as the API returns it
    renew_time: str | None
    transitions: int
    resource_version: str = ""


class LeaseClient(Protocol):
    def get(self, namespace: str, name: str) -> LeaseRecord | None: ...
    def create(self, namespace: str, name: str, rec: LeaseRecord) -> LeaseRecord: ...
    def replace(self, namespace: str, name: str, rec: LeaseRecord) -> LeaseRecord: ...


def micro_time(t: datetime) -> str:
    """metav1.MicroTime's wire form (always six fractional digits, UTC)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or None,
        lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


def _body(namespace: str, name: str, rec: LeaseRecord) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if rec.resource_version:
        meta["resourceVersion"] = rec.resource_version
    spec: dict[str, Any] = {"leaseDurationSeconds": rec.lease_duration_s, "leaseTransitions": rec.transitions}
    if rec.holder:
        spec["holderIdentity"] = rec.holder
    if rec.acquire_time:
        spec["acquireTime"] = rec.acquire_time
    if rec.renew_time:
        spec["renewTime"] = rec.renew_time
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


class KubeLeaseClient:
    """LeaseClient over the kubernetes client's ApiClient (raw JSON in and out). A failure other
    than a conflict raises (ApiError, or the transport's error): the elector counts it."""

    def __init__(self, api_client: Any, timeout_s: float = 10.0) -> None:
        self.api_client, self.timeout_s = api_client, timeout_s

    def _send(self, request: Request) -> Response:
        return send(self.api_client, request, timeout_s=self.timeout_s)

    def get(self, namespace: str, name: str) -> LeaseRecord | None:
        req = requests.get_lease(namespace, name)
        obj = json_or_none(req, self._send(req))
        return None if obj is None else _record(obj)

    def _write(self, req: Request) -> LeaseRecord:
        resp = self._send(req)
        if resp.status == 409:
            raise LeaseConflict(str(api_error(req, resp)))
        return _record(json_body(req, resp))

    def create(self, namespace: str, name: str, rec: LeaseRecord) -> LeaseRecord:
        return self._write(requests.create_lease(namespace, _body(namespace, name, rec)))

    def replace(self, namespace: str, name: str, rec: LeaseRecord) -> LeaseRecord:
        return self._write(requests.replace_lease(namespace, name, _body(namespace, name, rec)))


class LeaderElector:
    def __init__(
        self,
        client: LeaseClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need 0 < retry_period_s < renew_deadline_s < lease_duration_s")
        if not identity:
            raise ValueError("identity must not be empty")
        self.client, self.namespace, self.name, self.identity = client, namespace, name, identity
        self.lease_duration_s, self.renew_deadline_s = lease_duration_s, renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock, self.wall, self.on_change = clock, wall, on_change
        self._observed: LeaseRecord | None = None
        self._observed_at = -float("inf")
        self._renewed_at = -float("inf")  # last successful acquire/renew by us (our clock)
        self._was_leader = False
        self.transitions_seen = 0
        self.errors = 0
        self.last_error = ""
        self._runner = PeriodicRunner(f"leader-{name}", self.step, retry_period_s, logger=log)

    # ---- state ----
    @property
    def is_leader(self) -> bool:
        return self.clock() - self._renewed_at < self.renew_deadline_s

    @property
    def holder(self) -> str | None:
        return self._observed.holder if self._observed else None

    def status(self) -> dict[str, Any]:
        return {"identity": self.identity, "lease": f"{self.namespace}/{self.name}", "is_leader": self.is_leader,
                "holder": self.holder, "errors": self.errors, "last_error": self.last_error or None}

    def _observe(self, rec: LeaseRecord) -> None:
        o = self._observed
        if o is None or (o.holder, o.renew_time, o.resource_version) != (rec.holder, rec.renew_time,
                                                                           rec.resource_version):
            self._observed, self._observed_at = rec, self.clock()

    def _notify(self) -> None:
        now_leader = self.is_leader
        if now_leader != self._was_leader:
            self._was_leader = now_leader
            log.info("%s %s leadership of lease %s/%s", self.identity, "acquired" if now_leader else "lost",
                     self.namespace, self.name)
            if self.on_change is not None:
                try:
                    self.on_change(now_leader)
                except Exception:
                    log.exception("leadership callback failed")

    # ---- one round ----
    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the Lease afterwards. API errors propagate."""
        now = micro_time(self.wall())
        duration = max(1, round(self.lease_duration_s))
        rec = self.client.get(self.namespace, self.name)
        if rec is None:
            mine = LeaseRecord(self.identity, duration, now, now, 0)
            try:
                created = self.client.create(self.namespace, self.name, mine)
            except LeaseConflict:
                return False
            self._observe(created)
            self._renewed_at = self.clock()
            return True
        self._observe(rec)
        ours = rec.holder == self.identity
        if rec.holder and not ours and self.clock() < self._observed_at + max(rec.lease_duration_s, 1):
            return False  # held by someone else whose record changed within its lease duration
        new = replace(rec, holder=self.identity, lease_duration_s=duration, renew_time=now)
        if not ours:
            new = replace(new, acquire_time=now, transitions=rec.transitions + 1)
        try:
            updated = self.client.replace(self.namespace, self.name, new)
        except LeaseConflict:
            return False
        if not ours:
            self.transitions_seen += 1
        self._observe(updated)
        self._renewed_at = self.clock()
        return True

    def release(self) -> bool:
        """Give the Lease up if we hold it (so a successor need not wait out the duration)."""
        if not self.is_leader:
            return False
        self._renewed_at = -float("inf")
        try:
            rec = self.client.get(self.namespace, self.name)
            if rec is None or rec.holder != self.identity:
                return False
            now = micro_time(self.wall())
            self.client.replace(self.namespace, self.name,
                                replace(rec, holder=None, lease_duration_s=1, renew_time=now))
            return True
        except Exception as e:  # best effort: the Lease then simply expires
            log.warning("releasing lease %s/%s failed: %s", self.namespace, self.name, e)
            return False
        finally:
            self._notify()

    # ---- thread ----
    def step(self) -> None:
        try:
            self.try_acquire_or_renew()
        except Exception as e:  # apiserver down, forbidden, ...: not leader once the deadline passes
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            log.warning("lease %s/%s: %s", self.namespace, self.name, self.last_error)
        self._notify()

    def start(self) -> LeaderElector:
        self._runner.start()
        return self

    def stop(self, release: bool = True) -> None:
        # Wait for a round in progress, so the release below is the last write to the Lease.
        self._runner.stop(join_s=self.retry_period_s + 5)
        if release:
            self.release()


class AlwaysLeader:
    """For one-replica setups without a cluster (tests, dry runs): always the leader."""

    identity = "local"
    is_leader = True

    def status(self) -> dict[str, Any]:
        return {"identity": self.identity, "lease": None, "is_leader": True}
