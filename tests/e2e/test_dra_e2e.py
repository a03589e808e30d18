"""GPUs through Dynamic Resource Allocation, end to end: the real kube-apiserver and kube-scheduler
(resource.k8s.io/v1, GA and on by default in 1.35), ResourceSlices published as NVIDIA's driver
publishes them (no kubelet plugin: scheduling needs only the slices), emulated dcgm-exporters
labelling samples by GPU uuid, and `flowsched serve` scraping them (its own process, configured
through --config, as tests/e2e/test_telemetry_e2e.py does).

kube-scheduler's DynamicResources plugin filters the nodes and allocates the devices; flowsched is
called with the nodes it passed and ranks them. A claim-only pod requests no extended resource,
so this module's kube-scheduler calls the extender for every pod (managedResources left empty:
docs/dra.md). No kube-controller-manager runs here, so the test plays the resourceclaim
controller's part for claim templates: it creates the pod's claim and records it in the pod's
status, as that controller does.

Extended-resource mapping (KEP-5004) is alpha in 1.35 (beta in 1.36): its test turns the
DRAExtendedResource feature gate on in kube-apiserver and kube-scheduler for its own duration.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from tests.cluster import dra_objects as d
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fake_nodes import GPU, gpu_node
from tests.cluster.flowsched_proc import FlowschedService, acting_loop_config
from tests.cluster.kubeapi import JSON, Kube, KubeError, node_path, pod_path, pods_path
from tests.cluster.kubelet_emulator import STARTED_AGO, KubeletEmulator
from tests.cluster.manifests import scheduler_config_for_tests
from tests.cluster.procs import wait_until
from tests.cluster.scenario import SCHEDULER_NAME, Scenario

pytestmark = pytest.mark.cluster

RESOURCE = "/apis/resource.k8s.io/v1"
GPUS = 4
STALE_S = 10.0
# Every node any test here creates (one exporter each; a test uses some of them).
DRA_NODES = ("dra-0", "dra-1", "dra-2", "dra-3")
DP_NODES = ("dp-0", "dp-1")
FOREIGN_HOST = "ip-10-0-0-2.ec2.internal"  # dra-2's exporter reports the host's name, not the node's
GATE = "e2e.flowsched.io/claim"
ADMISSION_GATE = "flowsched.io/admission"
JOB = "flowsched.io/job"


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, DcgmExporterEmulator]]:
    ems = {n: DcgmExporterEmulator(n, gpus=GPUS, pod_mapping=False).serve() for n in (*DRA_NODES, *DP_NODES)}
    ems["dra-2"].hostname = FOREIGN_HOST  # only the uuid join can place its samples
    yield ems
    for em in ems.values():
        em.stop()


def _config_for_every_pod(url: str, kubeconfig: Path) -> str:
    cfg = yaml.safe_load(scheduler_config_for_tests(url, kubeconfig))
    for ext in cfg["extenders"]:
        ext.pop("managedResources", None)  # empty: the extender is called for every pod
    return yaml.safe_dump(cfg, sort_keys=False)


@pytest.fixture(scope="module")
def dra_flowsched(control_plane: ControlPlane, deploy_rbac: None, flowsched: FlowschedService, scheduler: Path,
                  exporters: dict[str, DcgmExporterEmulator]) -> Iterator[FlowschedService]:
    workdir = control_plane.workdir / "flowsched-dra"
    workdir.mkdir(exist_ok=True)
    # The admission loop acts (test (d)): it preempts only for pods behind its own gate, which no
    # other test here uses. Short waits, and a first queue of one GPU-minute, so that the test's
    # victims (started two hours ago) are in a later queue than the gang they make room for.
    cfg = acting_loop_config(workdir, "admission", {"interval_s": 0.5, "preempt_after_s": 2.0,
                                                    "queue_thresholds_gpu_s": [60.0], "min_runtime_s": 1.0}, {
        "telemetry_stale_s": STALE_S,
        "telemetry": {"source": "scrape", "scrape_targets": [em.url for em in exporters.values()],
                      "node_label": "Hostname", "refresh_s": 0.5, "query_timeout_s": 1.0},
    })
    svc = FlowschedService(workdir, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(cfg)])
    svc.start()
    sched_kubeconfig = control_plane.kubeconfigs["scheduler"]
    try:
        control_plane.start_scheduler(_config_for_every_pod(svc.verbs_url, sched_kubeconfig))
        yield svc
    finally:
        control_plane.start_scheduler(scheduler_config_for_tests(flowsched.verbs_url, sched_kubeconfig))
        svc.close()


class Dra:
    """The DRA objects one test creates, deleted after it (allocated claims keep a finalizer that
    only kube-controller-manager would remove: the test removes it)."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.created: list[str] = []

    def create(self, collection: str, obj: JSON) -> JSON:
        out = self.kube.create(collection, obj)
        self.created.append(f"{collection}/{obj['metadata']['name']}")
        return out

    def device_class(self, obj: JSON) -> None:
        with contextlib.suppress(KubeError):  # left by an earlier test: the same object
            self.create(f"{RESOURCE}/deviceclasses", obj)

    def slices(self, *slices: JSON) -> None:
        for s in slices:
            self.create(f"{RESOURCE}/resourceslices", s)

    def claim(self, obj: JSON) -> JSON:
        return self.create(f"{RESOURCE}/namespaces/{self.ns}/resourceclaims", obj)

    def get_claim(self, name: str) -> JSON:
        return self.kube.get(f"{RESOURCE}/namespaces/{self.ns}/resourceclaims/{name}")

    def release_claim(self, name: str) -> None:
        """What kube-controller-manager's resourceclaim controller does once the pods of a claim it
        generated are gone: the claim goes, and with it the allocation."""
        path = f"{RESOURCE}/namespaces/{self.ns}/resourceclaims/{name}"
        self.kube.merge_patch(path, {"metadata": {"finalizers": None}})
        self.kube.delete(path)

    def cleanup(self) -> None:
        for path in reversed(self.created):
            if "/resourceclaims/" in path:
                with contextlib.suppress(KubeError):
                    self.kube.merge_patch(path, {"metadata": {"finalizers": None}})
            with contextlib.suppress(KubeError):
                self.kube.delete(path)


@pytest.fixture
def dscenario(kube: Kube, emulator: KubeletEmulator, dra_flowsched: FlowschedService,
              exporters: dict[str, DcgmExporterEmulator]) -> Iterator[tuple[Scenario, Dra]]:
    s = Scenario(kube, emulator, dra_flowsched)
    dra = Dra(kube, s.ns)
    for em in exporters.values():
        for g in range(GPUS):
            em.set_gpu(g, 0.0, 0.0)
    try:
        yield s, dra
    finally:
        s.cleanup()
        dra.cleanup()


def _add_dra_nodes(s: Scenario, *names: str) -> None:
    """Fake nodes as a DRA driver leaves them: no nvidia.com/gpu in capacity or allocatable."""
    for name in names:
        node = gpu_node(name)
        for key in ("capacity", "allocatable"):
            del node["status"][key][GPU]
        s.kube.create(node_path(), node)


def _claim_pod(name: str, claims: list[JSON], gated: bool = False, *, gate: str = GATE,
               labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> JSON:
    """claims: pod.spec.resourceClaims entries; each is used by the one container."""
    spec: JSON = {
        "schedulerName": SCHEDULER_NAME,
        "resourceClaims": claims,
        "containers": [{"name": "main", "image": "registry.invalid/e2e/train:0",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "claims": [{"name": c["name"]} for c in claims]}}],
        "terminationGracePeriodSeconds": 30,
    }
    if gated:
        spec["schedulingGates"] = [{"name": gate}]
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}


def _play_resourceclaim_controller(s: Scenario, dra: Dra, pod: JSON, template: JSON) -> str:
    """What kube-controller-manager's resourceclaim controller does for a claim template: a claim
    owned by the pod, named in the pod's status.resourceClaimStatuses."""
    entry = pod["spec"]["resourceClaims"][0]
    name = f"{pod['metadata']['name']}-{entry['name']}-{uuid.uuid4().hex[:5]}"
    dra.claim({"apiVersion": d.API, "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": s.ns,
                            "annotations": {"resource.kubernetes.io/pod-claim-name": entry["name"]},
                            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                                 "uid": pod["metadata"]["uid"], "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": template["spec"]["spec"]})
    s.kube.merge_patch(pod_path(s.ns, pod["metadata"]["name"]) + "/status",
                       {"status": {"resourceClaimStatuses": [{"name": entry["name"], "resourceClaimName": name}]}})
    return name


def _dra_nodes_seen(snap: dict[str, Any], nodes: tuple[str, ...], gpus: int = GPUS) -> bool:
    return all(n in snap["nodes"] and snap["nodes"][n].get("dra", {}).get("capacity") == gpus
               and snap["nodes"][n]["gpu_alloc"] == gpus for n in nodes)


def _fresh(snap: dict[str, Any], expect: dict[str, list[float]]) -> bool:
    return all(n in snap["nodes"] and snap["nodes"][n]["telemetry"] == "fresh"
               and snap["nodes"][n]["gpu_util"][:GPUS] == v for n, v in expect.items())


def _pin_cpu_hog(s: Scenario, node: str, cpu: str = "16") -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"hog-{node}"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/hog:0",
                                                      "resources": {"requests": {"cpu": cpu}}}]}}
    s.kube.create(pods_path(s.ns), pod)
    s.wait_running(pod["metadata"]["name"])


def _allocation_node(claim: JSON) -> str | None:
    alloc = claim.get("status", {}).get("allocation")
    if not alloc:
        return None
    values: list[str] = alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"]
    return values[0]


def test_claim_template_pod_lands_where_flowsched_scores_best_and_is_allocated_there(
        dscenario: tuple[Scenario, Dra], exporters: dict[str, DcgmExporterEmulator]) -> None:
    s, dra = dscenario
    _add_dra_nodes(s, *DRA_NODES)  # no device plugin: no nvidia.com/gpu at all
    dra.device_class(d.device_class())
    dra.slices(*(d.gpu_slice(n, GPUS) for n in DRA_NODES))
    for n in DRA_NODES:
        for g in range(GPUS):
            exporters[n].set_gpu(g, 0.0 if n == "dra-2" else 85.0, 1000.0 if n == "dra-2" else 60000.0)
    _pin_cpu_hog(s, "dra-2")  # kube-scheduler's own scores now prefer the other three
    s.wait_snapshot(lambda snap: _dra_nodes_seen(snap, DRA_NODES), "the DRA GPUs of every node", timeout_s=15)
    # dra-2's samples carry a hostname that is no node's: only the uuid join puts them on dra-2.
    s.wait_snapshot(lambda snap: _fresh(snap, {n: [0.0 if n == "dra-2" else 85.0] * GPUS for n in DRA_NODES}),
                    "telemetry for every DRA node, dra-2's by uuid", timeout_s=30)

    template = d.claim_template("two-gpus", s.ns, count=2)
    s.kube.create(f"{RESOURCE}/namespaces/{s.ns}/resourceclaimtemplates", template)
    pod = s.kube.create(pods_path(s.ns), _claim_pod("train-0", [
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}], gated=True))
    claim = _play_resourceclaim_controller(s, dra, pod, template)
    s.wait_snapshot(lambda snap: snap["dra"]["claims"] >= 1, "the pod's claim", timeout_s=10)
    s.kube.merge_patch(pod_path(s.ns, "train-0"), {"spec": {"schedulingGates": None}})

    bound = s.wait_bound("train-0", timeout_s=30)
    r = s.flowsched.verbs_http.post("/prioritize", json={"Pod": s.pod("train-0"), "Nodes": None,
                                                   "NodeNames": list(DRA_NODES)})
    scores = {h["Host"]: h["Score"] for h in r.json()}
    assert bound == "dra-2", f"bound to {bound}; flowsched scores {scores}"
    allocated = dra.get_claim(claim)
    assert _allocation_node(allocated) == "dra-2", allocated.get("status")
    results = allocated["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {x["pool"] for x in results} == {"dra-2"}
    assert [c["name"] for c in allocated["status"].get("reservedFor", [])] == ["train-0"]
    # flowsched counts the allocation on dra-2 (capacity 4, 2 held), from the claim alone.
    snap = s.wait_snapshot(lambda snap: snap["nodes"]["dra-2"]["gpu_used"] == 2.0, "the allocation", timeout_s=10)
    assert snap["nodes"]["dra-2"]["dra"] == {"capacity": 4, "used": 2, "free_mig": {}}


def test_mixed_cluster_places_on_device_plugin_and_dra_nodes(dscenario: tuple[Scenario, Dra]) -> None:
    s, dra = dscenario
    s.add_nodes(*DP_NODES, gpus=GPUS)
    _add_dra_nodes(s, "dra-0", "dra-1")
    dra.device_class(d.device_class())
    dra.slices(d.gpu_slice("dra-0", GPUS), d.gpu_slice("dra-1", GPUS))
    for i in range(2):
        dra.claim(d.resource_claim(f"claim-{i}", s.ns, count=3))
    s.wait_snapshot(lambda snap: _dra_nodes_seen(snap, ("dra-0", "dra-1")) and snap["dra"]["claims"] >= 2,
                    "DRA nodes and claims", timeout_s=15)
    for i in range(2):
        s.create_pod(f"dp-pod-{i}", gpus=3)
        claims = [{"name": "gpus", "resourceClaimName": f"claim-{i}"}]
        s.kube.create(pods_path(s.ns), _claim_pod(f"dra-pod-{i}", claims))
    placed = {name: s.wait_bound(name, timeout_s=30) for name in ("dp-pod-0", "dp-pod-1", "dra-pod-0", "dra-pod-1")}
    assert {placed["dp-pod-0"], placed["dp-pod-1"]} == set(DP_NODES), placed
    assert {placed["dra-pod-0"], placed["dra-pod-1"]} == {"dra-0", "dra-1"}, placed
    for i in range(2):
        assert _allocation_node(dra.get_claim(f"claim-{i}")) == placed[f"dra-pod-{i}"]
    every = (*DP_NODES, "dra-0", "dra-1")
    snap = s.wait_snapshot(lambda snap: all(snap["nodes"][n]["gpu_used"] == 3.0 for n in every),
                           "3 GPUs used on each node, of either kind", timeout_s=10)
    assert all(snap["nodes"][n]["gpu_alloc"] == GPUS for n in every)
    assert all("dra" not in snap["nodes"][n] for n in DP_NODES)


def test_mig_slice_request_fits_only_where_that_profile_is_free(dscenario: tuple[Scenario, Dra]) -> None:
    s, dra = dscenario
    _add_dra_nodes(s, "dra-0", "dra-1")
    dra.device_class(d.device_class())
    dra.device_class(d.device_class("mig.nvidia.com", mig=True))
    # dra-0: a whole GPU and two 1g.10gb slices of another; dra-1: one 3g.40gb slice.
    dra.slices(d.resource_slice("dra-0", [d.gpu_device("dra-0", 0), d.mig_device("dra-0", 1, 0),
                                          d.mig_device("dra-0", 1, 1)]),
               d.resource_slice("dra-1", [d.mig_device("dra-1", 0, 0, "3g.40gb")]))
    for i in range(2):
        dra.claim(d.resource_claim(f"mig-{i}", s.ns, device_class_name="mig.nvidia.com", profile="3g.40gb"))
    s.wait_snapshot(lambda snap: snap["dra"]["claims"] >= 2 and snap["nodes"].get("dra-1", {}).get("dra", {})
                    .get("free_mig") == {"3g.40gb": 1}, "the MIG slices", timeout_s=15)
    s.kube.create(pods_path(s.ns), _claim_pod("mig-pod-0", [{"name": "mig", "resourceClaimName": "mig-0"}]))
    assert s.wait_bound("mig-pod-0", timeout_s=30) == "dra-1"
    assert _allocation_node(dra.get_claim("mig-0")) == "dra-1"
    s.wait_snapshot(lambda snap: snap["nodes"]["dra-1"]["dra"]["free_mig"] == {}, "the slice held", timeout_s=10)
    # No 3g.40gb slice is left anywhere: the second pod waits, though dra-0 has a whole GPU free.
    s.kube.create(pods_path(s.ns), _claim_pod("mig-pod-1", [{"name": "mig", "resourceClaimName": "mig-1"}]))

    def unschedulable() -> bool:
        conds = s.pod("mig-pod-1").get("status", {}).get("conditions", [])
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

    wait_until(unschedulable, 30, what="mig-pod-1 to be unschedulable")
    assert s.node_of("mig-pod-1") is None


@pytest.fixture
def extended_resource_gate(control_plane: ControlPlane, dra_flowsched: FlowschedService) -> Iterator[None]:
    """DRAExtendedResource (KEP-5004, alpha in 1.35) on in kube-apiserver and kube-scheduler for
    one test; both restarted without it afterwards (flowsched's watches reconnect on their own)."""
    sched_config = _config_for_every_pod(dra_flowsched.verbs_url, control_plane.kubeconfigs["scheduler"])
    control_plane.feature_gates = {"DRAExtendedResource": True}
    try:
        control_plane.restart_apiserver()
        control_plane.start_scheduler(sched_config)
        yield
    finally:
        control_plane.feature_gates = {}
        control_plane.restart_apiserver()
        control_plane.start_scheduler(sched_config)


def test_mapped_extended_resource_pod_is_scheduled_on_dra_only_nodes(
        extended_resource_gate: None, dscenario: tuple[Scenario, Dra],
        exporters: dict[str, DcgmExporterEmulator]) -> None:
    """A pod asking nvidia.com/gpu: 1, on nodes whose GPUs only DRA publishes: flowsched used to
    reject every node (0 nvidia.com/gpu in its snapshot); now it ranks them by live use."""
    s, dra = dscenario
    _add_dra_nodes(s, "dra-0", "dra-1")
    mapped = d.device_class("gpu-mapped", extended_resource=GPU)
    dra.device_class(mapped)
    assert s.kube.get(f"{RESOURCE}/deviceclasses/gpu-mapped")["spec"].get("extendedResourceName") == GPU, \
        "the apiserver dropped extendedResourceName: DRAExtendedResource is off"
    dra.slices(d.gpu_slice("dra-0", GPUS), d.gpu_slice("dra-1", GPUS))
    for g in range(GPUS):
        exporters["dra-0"].set_gpu(g, 85.0, 60000.0)
    _pin_cpu_hog(s, "dra-1")
    s.wait_snapshot(lambda snap: _dra_nodes_seen(snap, ("dra-0", "dra-1"))
                    and _fresh(snap, {"dra-0": [85.0] * GPUS, "dra-1": [0.0] * GPUS}),
                    "DRA nodes with telemetry", timeout_s=30)

    s.create_pod("mapped-0", gpus=1)
    assert s.wait_bound("mapped-0", timeout_s=30) == "dra-1"
    status: JSON = {}

    def claimed() -> bool:
        status.update(s.pod("mapped-0").get("status", {}).get("extendedResourceClaimStatus") or {})
        return bool(status.get("resourceClaimName"))

    wait_until(claimed, 15, what="the pod's extended-resource claim")
    name = status["resourceClaimName"]
    dra.created.append(f"{RESOURCE}/namespaces/{s.ns}/resourceclaims/{name}")
    claim = dra.get_claim(name)
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    assert _allocation_node(claim) == "dra-1"
    # Counted once: the pod's own nvidia.com/gpu request, not again through kube-scheduler's claim.
    snap = s.wait_snapshot(lambda snap: snap["dra"]["claims"] >= 1 and snap["nodes"]["dra-1"]["dra"]["used"] == 1,
                           "the mapped claim", timeout_s=10)
    assert snap["nodes"]["dra-1"]["gpu_used"] == 1.0


def _admission_view(s: Scenario) -> dict[str, Any]:
    r = s.flowsched.http.get("/debug/admission")
    r.raise_for_status()
    out: dict[str, Any] = r.json()["controller"]["last_plan"]
    return out


def _gates(s: Scenario, name: str) -> list[str]:
    return [g["name"] for g in s.pod(name)["spec"].get("schedulingGates") or []]


def _job_pod(s: Scenario, dra: Dra, name: str, job: str, gpus: int, *, gated: bool = False, claim: str | None = None,
             started_ago_s: float | None = None, checkpointable: bool = True) -> None:
    """A pod of `job` with its own claim for `gpus` GPUs (claim: a claim it uses instead, shared),
    behind admission's gate if gated; checkpointable: admission may preempt it."""
    if claim is None:
        claim = f"{name}-gpus"
        dra.claim(d.resource_claim(claim, s.ns, count=gpus))
    ann = {"flowsched.io/checkpointable": "true"} if checkpointable else {}
    if started_ago_s is not None:
        ann[STARTED_AGO] = str(int(started_ago_s))
    s.kube.create(pods_path(s.ns), _claim_pod(name, [{"name": "gpus", "resourceClaimName": claim}], gated,
                                              gate=ADMISSION_GATE, labels={JOB: job}, annotations=ann))


def test_admission_releases_a_gated_gang_when_it_fits_free_dra_gpus(dscenario: tuple[Scenario, Dra]) -> None:
    """(d) The admission loop counts DRA GPUs: a gang of 3 pods x 2 GPUs (claims) waits behind its
    gate while 5 GPUs are free in pieces of 1 and 4, and is released, all of it, when 8 are."""
    s, dra = dscenario
    _add_dra_nodes(s, "dra-0", "dra-1")
    dra.device_class(d.device_class())
    dra.slices(d.gpu_slice("dra-0", GPUS), d.gpu_slice("dra-1", GPUS))
    s.wait_snapshot(lambda snap: _dra_nodes_seen(snap, ("dra-0", "dra-1")), "the DRA nodes", timeout_s=15)
    _job_pod(s, dra, "blocker", "blocker", 3, checkpointable=False)
    s.wait_running("blocker", timeout_s=30)
    # The pods before their claims, as a controller may create them (and as a lagging claim watch
    # shows them): a pod naming an unseen claim holds its gang, which is never released in part.
    for i in range(3):
        _job_pod(s, dra, f"gang-{i}", "gang", 2, gated=True, claim=f"gang-{i}-gpus")
    s.wait_snapshot(lambda snap: all(f"{s.ns}/gang-{i}" in snap["pods"] for i in range(3)), "the gang's pods")
    for i in range(3):
        dra.claim(d.resource_claim(f"gang-{i}-gpus", s.ns, count=2))
    job = f"{s.ns}/gang"

    def decision() -> str:
        return next((str(q["decision"]) for q in _admission_view(s).get("queue", []) if q["job"] == job), "")

    wait_until(lambda: decision().startswith("waits"), 15, interval_s=0.2,
               what="the admission loop seeing the gang (6 GPUs through claims) wait")
    time.sleep(2.0)  # four intervals: 1 + 4 GPUs free, 2 + 2 + 2 needed -> still gated, nothing bound
    assert all(_gates(s, f"gang-{i}") == [ADMISSION_GATE] and s.node_of(f"gang-{i}") is None for i in range(3))
    assert decision().startswith("waits"), decision()

    s.emulator.finish(s.ns, "blocker")
    dra.release_claim("blocker-gpus")  # its 3 GPUs free up
    nodes = [s.wait_bound(f"gang-{i}", timeout_s=30) for i in range(3)]
    assert sorted(nodes.count(n) for n in set(nodes)) == [1, 2], nodes  # 4 GPUs a node: 2 pods at most
    for i in range(3):
        claim = dra.get_claim(f"gang-{i}-gpus")
        assert _allocation_node(claim) == nodes[i], claim.get("status")
    events = [e for e in s.events("gang-0") if e.get("reason") == "FlowschedAdmitted"]
    assert events and "all 3 pod(s) (6 GPUs)" in events[0]["message"], events


def test_admission_preempts_the_job_whose_claim_it_frees_not_one_sharing_a_claim(
        dscenario: tuple[Scenario, Dra]) -> None:
    """(d) A preemption frees a shared claim only with all its pods: two jobs sharing one claim
    (with more attained service) are left alone; the job with a claim of its own is evicted, and the
    gang takes its GPUs. Nothing else is evicted while the gang waits: no other eviction frees a GPU."""
    s, dra = dscenario
    _add_dra_nodes(s, "dra-0", "dra-1")
    dra.device_class(d.device_class())
    dra.slices(d.gpu_slice("dra-0", 2), d.gpu_slice("dra-1", 2))
    s.wait_snapshot(lambda snap: _dra_nodes_seen(snap, ("dra-0", "dra-1"), gpus=2), "the DRA nodes", timeout_s=15)
    dra.claim(d.resource_claim("across", s.ns, count=2))
    _job_pod(s, dra, "s1-0", "s1", 2, claim="across", started_ago_s=4 * 3600)
    shared_on = s.wait_running("s1-0", timeout_s=30)
    _job_pod(s, dra, "s2-0", "s2", 2, claim="across", started_ago_s=4 * 3600)
    assert s.wait_running("s2-0", timeout_s=30) == shared_on  # the claim's pods share its node
    _job_pod(s, dra, "own-0", "own", 2, started_ago_s=2 * 3600)
    own_on = s.wait_running("own-0", timeout_s=30)
    assert own_on != shared_on
    assert {r["name"] for r in dra.get_claim("across")["status"].get("reservedFor", [])} == {"s1-0", "s2-0"}
    s.wait_snapshot(lambda snap: all(snap["pods"].get(f"{s.ns}/{p}", {}).get("node")
                                     for p in ("s1-0", "s2-0", "own-0")), "the three victims bound")

    _job_pod(s, dra, "urgent-0", "urgent", 2, gated=True)
    s.wait_event("own-0", "FlowschedPreempted", timeout_s=30)
    wait_until(lambda: not s.pod_exists("own-0"), 15, what="the preempted pod to be gone")
    dra.release_claim("own-0-gpus")  # the resourceclaim controller's part once its pod is gone
    assert s.wait_bound("urgent-0", timeout_s=30) == own_on
    assert _allocation_node(dra.get_claim("urgent-0-gpus")) == own_on
    for p in ("s1-0", "s2-0"):
        pod = s.pod(p)
        assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp"), p
        assert not [e for e in s.events(p) if e.get("reason") == "FlowschedPreempted"], p
    plan = _admission_view(s)
    assert f"{s.ns}/s1" not in plan.get("preempt", []) and f"{s.ns}/s2" not in plan.get("preempt", [])
