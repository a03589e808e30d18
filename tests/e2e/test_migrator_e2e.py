"""The migrator on the real control plane: kube-apiserver (policy/v1 Eviction, PDBs, Leases,
Events), kube-scheduler consulting the session's flowsched extender, and two more `flowsched
serve --controllers migrator --act` processes competing for one Lease.

No kube-controller-manager runs in the harness, so the test plays the job controller's part:
when the migrated pod is gone it creates the replacement itself (named `<job>-replacement-by-
test-controller`), with the same job label and annotations, as a Job/operator would. For the
same reason no disruption controller computes PodDisruptionBudget status: a PDB selecting a pod
keeps disruptionsAllowed at 0, so the apiserver refuses its eviction with 429, which is what the
PDB test needs.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.cluster.controlplane import ControlPlane
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import JSON, KubeError, pods_path
from tests.cluster.kubelet_emulator import STARTED_AGO
from tests.cluster.procs import wait_until
from tests.cluster.scenario import CHECKPOINTABLE, Scenario, gpu_pod

pytestmark = pytest.mark.cluster

JOB_LABEL = "flowsched.io/job"
MIGRATION = "flowsched.io/migration"


class Migrators:
    def __init__(self, a: FlowschedService, b: FlowschedService, token: str, lease: str) -> None:
        self.a, self.b, self.token, self.lease = a, b, token, lease

    @property
    def both(self) -> tuple[FlowschedService, FlowschedService]:
        return self.a, self.b

    def post_progress(self, namespace: str, job: str, points: list[dict[str, Any]]) -> None:
        for svc in self.both:  # each replica keeps its own progress store (DESIGN §1)
            r = svc.http.post("/v1/progress", json={"namespace": namespace, "job": job, "points": points},
                              headers={"Authorization": f"Bearer {self.token}"})
            assert r.status_code == 200, r.text
            assert r.json()["accepted"] == len(points)

    def control(self, svc: FlowschedService) -> dict[str, Any]:
        r = svc.http.get("/debug/control")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def leader(self) -> FlowschedService:
        found: list[FlowschedService] = []

        def one() -> bool:
            found[:] = [s for s in self.both if self.control(s)["leader"]["is_leader"]]
            return len(found) == 1

        wait_until(one, 20, interval_s=0.1, what="exactly one migrator replica leading")
        return found[0]

    def migrations(self, svc: FlowschedService, namespace: str) -> float:
        text = svc.http.get("/metrics").text
        m = re.search(rf'^flowsched_migrations_total\{{namespace="{namespace}"\}} ([0-9.e+]+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    def plan(self, svc: FlowschedService) -> dict[str, Any]:
        r = svc.http.get("/debug/migrations")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


@pytest.fixture(scope="module")
def migrators(control_plane: ControlPlane, deploy_rbac: None, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Migrators]:
    work = tmp_path_factory.mktemp("migrators")
    token = secrets.token_hex(16)
    (work / "tokens").write_text(f"{token} *\n")
    lease = f"e2e-migrator-{uuid.uuid4().hex[:6]}"
    services = []
    for ident in ("migrator-a", "migrator-b"):
        cfg: dict[str, Any] = {
            "progress_auth": "static", "static_tokens_file": str(work / "tokens"),
            "progress_db": str(work / f"{ident}.sqlite"),
            "convergence": {"window_s": 30, "interval_s": 0.5},
            "control": {"lease_name": lease, "identity": ident, "lease_duration_s": 4, "renew_deadline_s": 3,
                        "retry_period_s": 0.5, "retry_after_s": 2},
            "migrator": {"interval_s": 1, "min_runtime_s": 600, "cooldown_s": 3600, "max_per_interval": 1,
                         "max_per_hour": 10, "max_migrations": 2},
        }
        path = work / f"{ident}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        d = work / ident
        d.mkdir()
        svc = FlowschedService(d, control_plane.kubeconfigs["flowsched"],
                               extra_args=["--config", str(path), "--controllers", "migrator", "--act"])
        services.append(svc)
    try:
        for s in services:
            s.start()
        yield Migrators(services[0], services[1], token, lease)
    finally:
        for s in services:
            s.close()


def flattening_curve(now: float, n: int = 120, dt: float = 3.0) -> list[dict[str, Any]]:
    """A loss that fell fast and has flattened: the last minutes improve by ~1e-4 of the range."""
    return [{"step": k * 10, "loss": 0.2 + math.exp(-k / 8.0), "timestamp": now - (n - 1 - k) * dt}
            for k in range(n)]


def pod_on(s: Scenario, name: str, node: str, gpus: int, job: str, checkpointable: bool) -> JSON:
    ann = {STARTED_AGO: "3600"}
    if checkpointable:
        ann[CHECKPOINTABLE] = "true"
    body = gpu_pod(name, gpus=gpus, annotations=ann, labels={JOB_LABEL: job})
    body["spec"]["nodeName"] = node  # placed directly: the starting layout is the test's, not a score's
    return s.kube.create(pods_path(s.ns), body)


def alive(s: Scenario, name: str, uid: str) -> bool:
    try:
        p = s.pod(name)
    except KubeError as e:
        if e.status == 404:
            return False
        raise
    return bool(p["metadata"]["uid"] == uid and not p["metadata"].get("deletionTimestamp"))


def test_slow_checkpointable_job_migrates_and_opted_out_twin_stays(scenario: Scenario, migrators: Migrators
                                                                     ) -> None:
    s = scenario
    s.add_nodes("mig-n1", gpus=4)
    s.add_nodes("mig-n2", gpus=4)
    s.add_nodes("mig-n3", gpus=2)
    slow = pod_on(s, "slow-0", "mig-n1", 2, "slow", checkpointable=True)
    twin = pod_on(s, "twin-0", "mig-n2", 4, "twin", checkpointable=False)  # same curve, no opt-in
    s.wait_running("slow-0")
    s.wait_running("twin-0")
    now = time.time()
    migrators.post_progress(s.ns, "slow", flattening_curve(now))
    migrators.post_progress(s.ns, "twin", flattening_curve(now))
    # A 4-GPU pod fits nowhere: n1 has 2 free, n2 none, n3 only 2.
    s.create_pod("big-0", gpus=4, labels={JOB_LABEL: "big"})
    leader = migrators.leader()
    other = migrators.b if leader is migrators.a else migrators.a

    # The leader evicts slow-0 (and only slow-0).
    try:
        wait_until(lambda: not alive(s, "slow-0", slow["metadata"]["uid"]), 30, interval_s=0.2,
                   what="slow-0 evicted by the migrator")
    except TimeoutError as e:
        raise AssertionError(f"{e}; leader's /debug/migrations: {migrators.plan(leader)}") from e
    ev = s.wait_event("slow-0", "FlowschedMigrated", contains="frees 2 GPUs on mig-n1")
    assert ev["reportingComponent"] == "flowsched" and ev["reportingInstance"] == leader_identity(migrators, leader)
    assert "phase completing" in ev["message"] and "waiting pod(s) needing 4 GPUs" in ev["message"]

    # The test plays the job controller: the replacement, same job, same opt-in, not placed by us.
    repl = gpu_pod("slow-replacement-by-test-controller", gpus=2,
                   annotations={CHECKPOINTABLE: "true"}, labels={JOB_LABEL: "slow"})
    s.kube.create(pods_path(s.ns), repl)
    assert s.wait_bound("big-0", 30) == "mig-n1"
    assert s.wait_bound("slow-replacement-by-test-controller", 30) == "mig-n3"

    # The extender (session flowsched, which kube-scheduler asks) learnt the origin from the pod
    # watch, so it scores mig-n1 down for this job even though the replacement carries no mark.
    snap = s.flowsched.snapshot()
    assert "slow-replacement-by-test-controller" in str(snap["pods"])

    # Hysteresis and the opt-in: a few more intervals, nothing else is evicted.
    time.sleep(3)
    assert alive(s, "twin-0", twin["metadata"]["uid"])
    assert s.pod("slow-replacement-by-test-controller")["metadata"].get("deletionTimestamp") is None
    plan = migrators.plan(leader)["controller"]["last_plan"]["jobs"]
    assert plan[f"{s.ns}/twin"]["decision"] == "not_opted_in"
    assert plan[f"{s.ns}/slow"]["decision"] in ("cooldown", "too_young", "no_benefit")
    # Exactly one replica acted.
    assert migrators.migrations(leader, s.ns) == 1
    assert migrators.migrations(other, s.ns) == 0
    assert not migrators.control(other)["leader"]["is_leader"]
    assert [e for e in s.events("twin-0") if e.get("reason") == "FlowschedMigrated"] == []


def leader_identity(m: Migrators, svc: FlowschedService) -> str:
    return str(m.control(svc)["leader"]["identity"])


def test_pdb_blocks_eviction_and_the_migrator_backs_off(scenario: Scenario, migrators: Migrators) -> None:
    s = scenario
    s.add_nodes("pdb-n1", gpus=4)
    s.add_nodes("pdb-n2", gpus=2)
    slow = pod_on(s, "guarded-0", "pdb-n1", 2, "guarded", checkpointable=True)
    s.wait_running("guarded-0")
    s.kube.create(f"/apis/policy/v1/namespaces/{s.ns}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {JOB_LABEL: "guarded"}}}})
    migrators.post_progress(s.ns, "guarded", flattening_curve(time.time()))
    s.create_pod("big-0", gpus=4, labels={JOB_LABEL: "big"})
    leader = migrators.leader()
    job = f"{s.ns}/guarded"

    def backed_off() -> bool:
        return job in migrators.plan(leader).get("backoff", {})

    wait_until(backed_off, 30, interval_s=0.2, what="the migrator backing off after the PDB's 429")
    why = migrators.plan(leader)["backoff"][job]["why"]
    assert "429" in why, why
    # Refused, not forced: the pod runs on, its migration mark withdrawn.
    time.sleep(1.5)
    pod = s.pod("guarded-0")
    assert pod["metadata"]["uid"] == slow["metadata"]["uid"] and not pod["metadata"].get("deletionTimestamp")
    assert MIGRATION not in (pod["metadata"].get("annotations") or {})
    text = leader.http.get("/metrics").text
    assert re.search(r'flowsched_control_actions_total\{action="evict",loop="migrator",outcome="retry_later"\} '
                     r'[1-9]', text), text[-2000:]
    assert migrators.migrations(leader, s.ns) == 0
    # The PDB goes away: the next try after the back-off succeeds.
    s.kube.delete(f"/apis/policy/v1/namespaces/{s.ns}/poddisruptionbudgets/guarded")
    wait_until(lambda: not alive(s, "guarded-0", slow["metadata"]["uid"]), 30, interval_s=0.2,
               what="guarded-0 evicted once the PDB is gone")
    s.wait_event("guarded-0", "FlowschedMigrated")


def test_namespace_opt_out_label_set_and_removed_at_run_time(scenario: Scenario, migrators: Migrators) -> None:
    """The label is read every interval: set at run time it holds the migrator back from the next
    interval on, removed it lets the migrator act, without a restart of flowsched."""
    s = scenario
    s.add_nodes("ns-n1", gpus=4)
    s.add_nodes("ns-n2", gpus=2)
    slow = pod_on(s, "optout-0", "ns-n1", 2, "optout", checkpointable=True)
    s.wait_running("optout-0")
    leader = migrators.leader()
    job = f"{s.ns}/optout"
    s.kube.merge_patch(f"/api/v1/namespaces/{s.ns}", {"metadata": {"labels": {"flowsched.io/migrate": "false"}}})
    migrators.post_progress(s.ns, "optout", flattening_curve(time.time()))
    s.create_pod("big-0", gpus=4, labels={JOB_LABEL: "big"})

    def decision() -> str:
        jobs = migrators.plan(leader).get("controller", {}).get("last_plan", {}).get("jobs", {})
        return str((jobs.get(job) or {}).get("decision", ""))

    wait_until(lambda: decision() == "namespace opted out", 10, interval_s=0.2,
               what="the migrator seeing the namespace's opt-out label")
    time.sleep(2.5)  # two more intervals: still not touched
    assert alive(s, "optout-0", slow["metadata"]["uid"]) and decision() == "namespace opted out"
    labelled_off = time.monotonic()
    s.kube.merge_patch(f"/api/v1/namespaces/{s.ns}", {"metadata": {"labels": {"flowsched.io/migrate": None}}})
    wait_until(lambda: not alive(s, "optout-0", slow["metadata"]["uid"]), 10, interval_s=0.1,
               what="optout-0 evicted once the label is gone")
    took = time.monotonic() - labelled_off
    print(f"label removed -> evicted in {took:.2f} s (migrator interval 1 s)")
    s.wait_event("optout-0", "FlowschedMigrated")


def test_leader_fails_over_and_only_the_new_leader_acts(scenario: Scenario, migrators: Migrators) -> None:
    first = migrators.leader()
    first.stop()  # releases the Lease on the way out
    try:
        second = migrators.b if first is migrators.a else migrators.a
        wait_until(lambda: migrators.control(second)["leader"]["is_leader"], 10, interval_s=0.1,
                   what="the other replica taking the Lease")
    finally:
        first.start()
    # Both up again: still exactly one leader.
    assert migrators.leader() in migrators.both


def test_dry_run_is_the_default(control_plane: ControlPlane, deploy_rbac: None, tmp_path: Path) -> None:
    svc = FlowschedService(tmp_path, control_plane.kubeconfigs["flowsched"],
                           extra_args=["--controllers", "migrator"])
    try:
        svc.start()
        r = httpx.get(f"{svc.url}/debug/control", timeout=5).json()
        assert r["enabled"] == ["migrator"] and r["loops"]["migrator"]["dry_run"] is True
    finally:
        svc.close()


def test_replicas_restarted_after_the_evicted_pod_is_gone_still_know_the_jobs_mark(
        scenario: Scenario, migrators: Migrators) -> None:
    """An upgrade after a migration: the evicted pod (which carried the mark) is deleted before
    the replicas restart, so no pod watch can tell them; the mark saved in the marks Lease does
    (extender/control/mark_store.py): the job's move count and its attained service stay."""
    s = scenario
    s.add_nodes("mig-r1", gpus=4)
    s.add_nodes("mig-r2", gpus=4)
    s.add_nodes("mig-r3", gpus=2)
    slow = pod_on(s, "slow-0", "mig-r1", 2, "slow", checkpointable=True)
    pod_on(s, "fill-0", "mig-r2", 4, "fill", checkpointable=False)
    s.wait_running("slow-0")
    migrators.post_progress(s.ns, "slow", flattening_curve(time.time()))
    s.create_pod("big-0", gpus=4, labels={JOB_LABEL: "big"})
    wait_until(lambda: not alive(s, "slow-0", slow["metadata"]["uid"]), 30, interval_s=0.2,
               what="slow-0 evicted by the migrator")
    wait_until(lambda: not s.kube.exists(f"{pods_path(s.ns)}/slow-0"), 30, interval_s=0.2, what="slow-0 deleted")
    path = f"/apis/coordination.k8s.io/v1/namespaces/flowsched/leases/{migrators.lease}-marks"
    saved = json.loads(s.kube.get(path)["metadata"]["annotations"]["flowsched.io/marks"])[f"{s.ns}/slow"]
    assert saved["from"] == "mig-r1" and saved["count"] == 1 and saved["attained"] >= 2 * 3600
    repl = gpu_pod("slow-replacement-by-test-controller", gpus=2, annotations={CHECKPOINTABLE: "true"},
                   labels={JOB_LABEL: "slow"})
    s.kube.create(pods_path(s.ns), repl)
    assert s.wait_bound("slow-replacement-by-test-controller", 30) == "mig-r3"
    for svc in migrators.both:  # the upgrade: every replica restarts, with nothing of the old pod left
        svc.stop()
    for svc in migrators.both:
        svc.start()

    def restored() -> bool:
        leader = migrators.leader()
        job = migrators.plan(leader)["controller"].get("last_plan", {}).get("jobs", {}).get(f"{s.ns}/slow")
        return (bool(job) and job["migrations"] == 1 and (job["attained_gpu_s"] or 0.0) >= saved["attained"]
                and migrators.control(leader)["marks_restored"] is True)

    wait_until(restored, 30, interval_s=0.5, what="the restarted leader planning with the job's saved mark")
