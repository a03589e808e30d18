"""deploy/chart: rendered by the real helm, equal to deploy/ by default, and every rendered
object accepted by the real apiserver's server-side dry run (dryRun=All, strict fields)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.chart import CHART, PROMETHEUS_OPERATOR, helm, render
from tests.cluster.controlplane import ControlPlane
from tests.cluster.kubeapi import JSON, Kube, KubeError
from tests.cluster.manifests import Discovery, apply, create_dry_run, load_docs, manifest_files
from tests.cluster.tools import go_module_dir

pytestmark = pytest.mark.helm

# Chart-only objects, off by default (deploy/ has neither).
CHART_ONLY_KINDS = {"ServiceMonitor"}  # what deploy/ does not ship (the CRD may be absent)
EVERYTHING_ON = ["namespace.create=true", "networkPolicy.enabled=true", "serviceMonitor.enabled=true"]


def key(doc: JSON) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def comparable(doc: JSON) -> JSON:
    """The object as the apiserver reads it: the scheduler configuration parsed, not as text."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    if doc["kind"] == "ConfigMap" and "scheduler-config.yaml" in doc.get("data", {}):
        doc["data"]["scheduler-config.yaml"] = yaml.safe_load(doc["data"]["scheduler-config.yaml"])
    return doc


def by_key(docs: list[JSON]) -> dict[tuple[str, str, str], JSON]:
    return {key(d): d for d in docs}


def test_helm_lint_passes() -> None:
    r = helm("lint", "--strict", str(CHART))
    assert r.returncode == 0, r.stdout + r.stderr


def test_chart_defaults_equal_deploy_manifests() -> None:
    # deploy/ is what the e2e tests run against a real kube-scheduler; the chart must install
    # the same objects unless a value says otherwise.
    deploy = by_key([d for p in manifest_files() for d in load_docs(p)])
    chart = by_key(render("flowsched", ["namespace.create=true"]))
    assert sorted(chart) == sorted(deploy)
    for k, want in deploy.items():
        assert comparable(chart[k]) == comparable(want), f"chart and deploy/ differ on {k}"
    assert not ({k[0] for k in chart} & CHART_ONLY_KINDS)


def test_values_change_what_they_say() -> None:
    docs = render("gpu-sched", [
        "fullnameOverride=fs", "flowsched.controllers={migrator,elastic}", "flowsched.act=true",
        "flowsched.persistence.existingClaim=fs-data", "scheduler.schedulerName=gpu",
        "scheduler.extender.mode=filter-prioritize", "scheduler.extender.weight=7", "image.tag=9.9.9",
        *EVERYTHING_ON[1:],
    ])
    got = by_key(docs)
    dep = got[("Deployment", "gpu-sched", "fs")]["spec"]["template"]["spec"]
    (c,) = dep["containers"]
    assert c["image"] == "ghcr.io/flowsched/flowsched:9.9.9"
    assert c["args"] == ["serve", "--port", "8888", "--api-port", "8889", "--controllers", "migrator,elastic", "--act"]
    # The control loops' Lease follows the release namespace (the setting defaults to flowsched).
    assert {"name": "FLOWSCHED_CONTROL__LEASE_NAMESPACE", "value": "gpu-sched"} in c["env"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "fs-data"}} in dep["volumes"]
    cfg = yaml.safe_load(got[("ConfigMap", "gpu-sched", "fs-scheduler-config")]["data"]["scheduler-config.yaml"])
    assert cfg["profiles"] == [{"schedulerName": "gpu"}]
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "http://fs.gpu-sched.svc:8888" and ext["weight"] == 7
    assert cfg["leaderElection"]["resourceNamespace"] == "gpu-sched"
    # The Service, the NetworkPolicy and the ServiceMonitor select the pods the Deployment makes.
    pod_labels = got[("Deployment", "gpu-sched", "fs")]["spec"]["template"]["metadata"]["labels"]
    svc = got[("Service", "gpu-sched", "fs")]
    netpol = got[("NetworkPolicy", "gpu-sched", "fs")]
    mon = got[("ServiceMonitor", "gpu-sched", "fs")]
    for selector in (svc["spec"]["selector"], netpol["spec"]["podSelector"]["matchLabels"]):
        assert selector.items() <= pod_labels.items()
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    sched_pod = got[("Deployment", "gpu-sched", "fs-scheduler")]["spec"]["template"]["metadata"]["labels"]
    peers = netpol["spec"]["ingress"][0]["from"]
    assert peers[0]["podSelector"]["matchLabels"].items() <= sched_pod.items()
    # The verbs' port admits the scheduler alone; tenants reach only the API port (DESIGN.md §12).
    assert len(peers) == 1 and netpol["spec"]["ingress"][0]["ports"] == [{"port": "verbs", "protocol": "TCP"}]
    assert netpol["spec"]["ingress"][1]["ports"] == [{"port": "api", "protocol": "TCP"}]
    assert mon["spec"]["endpoints"][0]["port"] == "api"


def test_scheduler_off_renders_no_scheduler() -> None:
    kinds_names = set(by_key(render("flowsched", ["scheduler.enabled=false"])))
    assert not any(name.startswith("flowsched-scheduler") for _, _, name in kinds_names)
    assert ("Deployment", "flowsched", "flowsched") in kinds_names


def _install_servicemonitor_crd(kube: Kube) -> None:
    """The real ServiceMonitor CRD of the pinned prometheus-operator release, established."""
    module, version = PROMETHEUS_OPERATOR
    path = go_module_dir(module, version) / "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
    (crd,) = load_docs(path)
    crd["metadata"].pop("annotations", None)  # controller-gen's, not needed
    crd.pop("status", None)
    name = crd["metadata"]["name"]
    coll = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    if not kube.exists(f"{coll}/{name}"):
        kube.create(coll, crd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conds = (kube.get(f"{coll}/{name}").get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not established after 30 s")


def _dry_run(kube: Kube, disco: Discovery, doc: JSON) -> JSON:
    coll = disco.collection(doc)
    path = f"{coll}/{doc['metadata']['name']}"
    if kube.exists(path):  # deploy/'s RBAC, which the session applied for real
        return apply(kube, disco, doc, dry_run=True)
    out = create_dry_run(kube, disco, doc)
    assert not kube.exists(path), f"dry run of {key(doc)} persisted it"
    return out


@pytest.mark.cluster
def test_every_rendered_object_passes_server_side_dry_run(kube: Kube, deploy_rbac: None) -> None:
    _install_servicemonitor_crd(kube)
    disco = Discovery(kube)
    checked: list[tuple[str, str, str]] = []
    # Defaults in deploy/'s namespace, and everything switched on in a new namespace (created
    # for real first: namespaced dry runs need their namespace to exist).
    for ns, values in (("flowsched", EVERYTHING_ON), ("flowsched-chart", [*EVERYTHING_ON, "fullnameOverride=fsc"])):
        docs = render(ns, values)
        for doc in docs:
            if doc["kind"] == "Namespace":
                if ns != "flowsched":
                    apply(kube, disco, doc)
                else:
                    _dry_run(kube, disco, doc)
                checked.append(key(doc))
        for doc in docs:
            if doc["kind"] != "Namespace":
                out = _dry_run(kube, disco, doc)
                assert (out["kind"], out["metadata"]["name"]) == (doc["kind"], doc["metadata"]["name"])
                checked.append(key(doc))
    kinds = {k for k, _, _ in checked}
    assert {"Namespace", "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
            "RoleBinding", "ConfigMap", "NetworkPolicy", "ServiceMonitor"} <= kinds, checked


@pytest.mark.cluster
def test_dry_run_rejects_a_broken_servicemonitor(kube: Kube, deploy_rbac: None) -> None:
    # The CRD's schema is enforced (strict): the ServiceMonitor check above is not vacuous.
    _install_servicemonitor_crd(kube)
    (mon,) = [d for d in render("flowsched", ["serviceMonitor.enabled=true"]) if d["kind"] == "ServiceMonitor"]
    bad: dict[str, Any] = yaml.safe_load(yaml.safe_dump(mon))
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(KubeError) as e:
        create_dry_run(kube, Discovery(kube), bad)
    assert e.value.status in (400, 422) and "intervall" in e.value.message


def _kube_scheduler_reads(cp: ControlPlane, tmp_path: Path, values: list[str]) -> subprocess.CompletedProcess[str]:
    """The real kube-scheduler loads, defaults and validates the chart's configuration, writes
    it out (--write-config-to) and exits without scheduling anything."""
    (cm,) = [d for d in render("flowsched", values) if d["kind"] == "ConfigMap"]
    cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    cfg["clientConnection"] = {"kubeconfig": str(cp.kubeconfigs["scheduler"])}  # none in-cluster here
    cfg["leaderElection"]["leaderElect"] = False
    (tmp_path / "in.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.run([str(cp.bin_dir / "kube-scheduler"), f"--config={tmp_path / 'in.yaml'}",
                           f"--write-config-to={tmp_path / 'out.yaml'}"],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.cluster
def test_real_kube_scheduler_accepts_the_charts_configuration(control_plane: ControlPlane, tmp_path: Path) -> None:
    r = _kube_scheduler_reads(control_plane, tmp_path, ["scheduler.schedulerName=gpu",
                                                        "scheduler.extender.mode=filter-prioritize",
                                                        "scheduler.extender.weight=7"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert [p["schedulerName"] for p in out["profiles"]] == ["gpu"]
    (ext,) = out["extenders"]
    assert ext["urlPrefix"] == "http://flowsched.flowsched.svc:8888" and ext["weight"] == 7
    # (ignoredByScheduler: false is omitted when written back)
    assert [(m["name"], m.get("ignoredByScheduler", False)) for m in ext["managedResources"]] == [
        ("nvidia.com/gpu", False)]


@pytest.mark.cluster
def test_real_kube_scheduler_rejects_a_bad_extender_value(control_plane: ControlPlane, tmp_path: Path) -> None:
    # The check above is not vacuous: kube-scheduler's own validation sees the chart's values.
    r = _kube_scheduler_reads(control_plane, tmp_path, ["scheduler.extender.mode=filter-prioritize",
                                                        "scheduler.extender.weight=0"])
    assert r.returncode != 0 and "weight" in r.stderr, r.stderr[-2000:]
