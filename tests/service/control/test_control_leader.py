"""Leader election against the real kube-apiserver, as the flowsched ServiceAccount (deploy/ RBAC)."""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from extender.control.leader import KubeLeaseClient, LeaderElector, LeaseConflict
from extender.kube.client import load_api_client
from tests.cluster.controlplane import ControlPlane
from tests.cluster.kubeapi import Kube

pytestmark = pytest.mark.cluster

NS = "flowsched"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def api_client(control_plane: ControlPlane, deploy_rbac: None) -> Iterator[Any]:
    c = load_api_client(str(control_plane.kubeconfigs["flowsched"]))
    yield c
    c.close()


def lease_name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def holder(kube: Kube, name: str) -> str | None:
    spec = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}").get("spec") or {}
    h: str | None = spec.get("holderIdentity")
    return h


def electors(api_client: Any, name: str, clocks: tuple[Clock, Clock]) -> tuple[LeaderElector, LeaderElector]:
    client = KubeLeaseClient(api_client)
    kw: dict[str, Any] = {"lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2}
    return (LeaderElector(client, NS, name, "replica-a", clock=clocks[0], **kw),
            LeaderElector(client, NS, name, "replica-b", clock=clocks[1], **kw))


def test_one_holder_takeover_only_after_expiry(api_client: Any, kube: Kube) -> None:
    ca, cb = Clock(), Clock()
    name = lease_name()
    a, b = electors(api_client, name, (ca, cb))
    assert a.try_acquire_or_renew() is True  # creates the Lease
    assert b.try_acquire_or_renew() is False
    assert a.is_leader and not b.is_leader
    assert holder(kube, name) == "replica-a"
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}")["spec"]
    assert lease["leaseDurationSeconds"] == 15 and lease["renewTime"] and lease["acquireTime"]

    # A keeps renewing: B, whose clock runs on, sees the record change and never takes over.
    for _ in range(5):
        ca.t += 5
        cb.t += 5
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        assert a.is_leader and not b.is_leader

    # A stops renewing (hung, partitioned). B waits out the lease duration on its own clock.
    cb.t += 14
    assert not b.try_acquire_or_renew()
    ca.t += 10  # by now A's renew deadline passed: it has stopped calling itself leader
    assert not a.is_leader
    cb.t += 2
    assert b.try_acquire_or_renew() and b.is_leader
    assert holder(kube, name) == "replica-b"
    # A comes back: it must see B's record and not take it back.
    assert not a.try_acquire_or_renew() and not a.is_leader
    spec = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}")["spec"]
    assert spec["leaseTransitions"] == 1


def test_release_hands_over_at_once(api_client: Any, kube: Kube) -> None:
    ca, cb = Clock(), Clock()
    name = lease_name()
    a, b = electors(api_client, name, (ca, cb))
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader
    assert holder(kube, name) is None
    assert b.try_acquire_or_renew() and b.is_leader  # no waiting out the duration


def test_stale_write_conflicts(api_client: Any) -> None:
    client = KubeLeaseClient(api_client)
    name = lease_name()
    a = LeaderElector(client, NS, name, "replica-a", clock=Clock())
    assert a.try_acquire_or_renew()
    stale = client.get(NS, name)
    assert stale is not None
    assert a.try_acquire_or_renew()  # a newer resourceVersion now
    with pytest.raises(LeaseConflict):
        client.replace(NS, name, stale)


def test_two_threads_never_lead_together_and_fail_over(api_client: Any, control_plane: ControlPlane) -> None:
    name = lease_name()
    other_client = load_api_client(str(control_plane.kubeconfigs["flowsched"]))
    kw: dict[str, Any] = {"lease_duration_s": 3, "renew_deadline_s": 2, "retry_period_s": 0.3}
    a = LeaderElector(KubeLeaseClient(api_client), NS, name, "replica-a", **kw)
    b = LeaderElector(KubeLeaseClient(other_client), NS, name, "replica-b", **kw)
    both, leaders = 0, set()
    stop = threading.Event()

    def sample() -> None:
        nonlocal both
        while not stop.is_set():
            la, lb = a.is_leader, b.is_leader
            both += la and lb
            if la or lb:
                leaders.add("a" if la else "b")
            time.sleep(0.02)

    a.start()
    b.start()
    t = threading.Thread(target=sample)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not (a.is_leader or b.is_leader) and time.monotonic() < deadline:
            time.sleep(0.05)
        first = a if a.is_leader else b
        second = b if first is a else a
        assert first.is_leader, "nobody became leader within 10s"
        time.sleep(2.0)  # several renew rounds
        assert first.is_leader and not second.is_leader
        first.stop(release=True)
        deadline = time.monotonic() + 5
        while not second.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.is_leader, "no fail-over within 5s of a release"
        # The sampler polls every 20 ms; let it see the new leader before it is stopped.
        want = "a" if second is a else "b"
        deadline = time.monotonic() + 2
        while want not in leaders and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        t.join()
        a.stop()
        b.stop()
        other_client.close()
    assert both == 0
    assert leaders == {"a", "b"}


def test_the_budget_store_keeps_each_loops_spends_in_a_lease(api_client: Any, kube: Kube) -> None:
    # As the flowsched ServiceAccount (deploy/ RBAC: leases get, create, update): a new leader
    # reads what its predecessor spent; two writers in turn both land (read-modify-write).
    from extender.control.budget_store import LeaseBudgetStore

    name = lease_name() + "-budgets"
    a, b = LeaseBudgetStore(api_client, NS, name), LeaseBudgetStore(api_client, NS, name)
    assert a.load() == {}
    a.save("migrator", [100.0, 200.5])
    b.save("elastic", [150.0])
    a.save("migrator", [100.0, 200.5, 300.0])
    assert b.load() == {"migrator": [100.0, 200.5, 300.0], "elastic": [150.0]}
    obj = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}")
    assert obj["metadata"]["annotations"]["flowsched.io/spent-elastic"] == "[150.0]"
    assert "holderIdentity" not in (obj.get("spec") or {})  # not a leader Lease: nobody holds it


def test_the_mark_store_keeps_each_jobs_newest_eviction_mark_in_a_lease(api_client: Any, kube: Kube) -> None:
    # As the flowsched ServiceAccount: a leader saves the marks of the jobs it evicted; a replica
    # started later reads them back; two writers in turn both land; a hand-edited entry that is not a
    # mark is left out; a mark the pods' parser would not read is refused before anything is written.
    from extender.control.mark_store import ANNOTATION, LeaseMarkStore
    from extender.snapshot.objects import MigrationMark

    name = lease_name() + "-marks"
    a, b = LeaseMarkStore(api_client, NS, name), LeaseMarkStore(api_client, NS, name)
    assert a.load() == {}
    a.save("team-a/train", {"from": "gpu-1", "at": 1000.0, "count": 1, "attained": 3600.0, "preempted_for": "x/y"})
    b.save("team-b/bert", {"from": "gpu-2", "at": 1100.0, "count": 2, "attained": None})
    a.save("team-a/train", {"from": "gpu-3", "at": 1200.0, "count": 2, "attained": 7200.5})
    b.save("team-a/train", {"from": "gpu-9", "at": 900.0, "count": 9, "attained": 1.0})  # older: not taken
    loaded = LeaseMarkStore(api_client, NS, name).load()
    assert set(loaded) == {"team-a/train", "team-b/bert"}
    assert loaded["team-a/train"] == MigrationMark("gpu-3", 1200.0, 2, 7200.5)
    bert = loaded["team-b/bert"]
    assert (bert.origin, bert.at, bert.count, math.isnan(bert.attained_gpu_s)) == ("gpu-2", 1100.0, 2, True)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}"
    value = json.loads(kube.get(path)["metadata"]["annotations"][ANNOTATION])
    value["team-c/broken"] = {"at": 5}
    kube.merge_patch(path, {"metadata": {"annotations": {ANNOTATION: json.dumps(value)}}})
    assert set(b.load()) == {"team-a/train", "team-b/bert"}
    with pytest.raises(ValueError):
        a.save("team-d/x", {"from": "", "at": 1.0})
    assert "team-d/x" not in json.loads(kube.get(path)["metadata"]["annotations"][ANNOTATION])
