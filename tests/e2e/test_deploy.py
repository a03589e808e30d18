"""deploy/ is what users apply: every manifest must pass the real apiserver's validation."""

from __future__ import annotations

import pytest
import yaml

from tests.cluster.kubeapi import JSON, Kube
from tests.cluster.manifests import (
    BASE,
    DEPLOY,
    IN_CLUSTER_URL,
    NOT_API_OBJECTS,
    Discovery,
    create_dry_run,
    dry_run,
    kustomize_build,
    load_docs,
    manifest_files,
    render_scheduler_config,
)


def test_scheduler_configmap_embeds_the_template_rendered_for_the_cluster() -> None:
    # One source of truth: the ConfigMap the second scheduler reads is the tested template.
    docs = load_docs(BASE / "scheduler.yaml")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["data"]["scheduler-config.yaml"] == render_scheduler_config(IN_CLUSTER_URL)
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--config=/etc/flowsched/scheduler-config.yaml" in args


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in manifest_files())
    assert set(NOT_API_OBJECTS) <= {p.name for p in BASE.iterdir()}


def _key(doc: JSON) -> tuple[str, str, str, str]:
    m = doc["metadata"]
    return doc["apiVersion"], doc["kind"], m.get("namespace", ""), m["name"]


@pytest.mark.kustomize
def test_kustomize_renders_deploy_as_the_files_say() -> None:
    # `kubectl apply -k deploy/` sends exactly the objects of deploy/base/'s files, unchanged:
    # the tests that dry-run and apply those files test what a user applies.
    rendered = {_key(d): d for d in kustomize_build(DEPLOY)}
    files = {_key(d): d for p in manifest_files() for d in load_docs(p)}
    assert rendered == files


def test_extender_config_is_the_documented_one() -> None:
    cfg = yaml.safe_load(render_scheduler_config("http://x"))
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["flowsched"]
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "http://x"
    # Filter-only mode (docs/hot-path.md): one call per pod, the filter ranks; no prioritize, no weight.
    assert (ext["filterVerb"], ext["preemptVerb"]) == ("filter-ranked", "preempt")
    assert "prioritizeVerb" not in ext and "weight" not in ext
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert "bindVerb" not in ext  # kube-scheduler binds (kubernetes#96579)


@pytest.mark.cluster
def test_every_manifest_passes_server_side_dry_run(kube: Kube, deploy_rbac: None) -> None:
    """POST ?dryRun=All (or a dry-run server-side apply for objects the session already created).

    fieldValidation=Strict turns unknown or duplicate fields into errors, so a typo in a
    manifest fails here rather than being silently dropped by the apiserver.
    """
    disco = Discovery(kube)
    checked = []
    for path in manifest_files():
        for doc in load_docs(path):
            name = doc["metadata"]["name"]
            out = dry_run(kube, disco, doc)
            assert out["kind"] == doc["kind"] and out["metadata"]["name"] == name
            checked.append(f"{path.name}:{doc['kind']}/{name}")
    kinds = {c.split(":")[1].split("/")[0] for c in checked}
    assert {"Namespace", "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "ConfigMap", "NetworkPolicy"} <= kinds, checked


@pytest.mark.cluster
def test_dry_run_rejects_a_broken_manifest(kube: Kube, deploy_rbac: None) -> None:
    # The check above could pass vacuously if dry runs accepted anything; this one must fail.
    from tests.cluster.kubeapi import KubeError

    docs = load_docs(BASE / "flowsched.yaml")
    bad = next(d for d in docs if d["kind"] == "Deployment")
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(KubeError) as e:
        create_dry_run(kube, Discovery(kube), bad)
    assert e.value.status in (400, 422) and "imagePullPolicyy" in e.value.message
