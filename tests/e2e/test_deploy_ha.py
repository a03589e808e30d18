"""deploy/ha/ (2 replicas, PDB, anti-affinity, shared settings) passes the real apiserver's validation,
and its settings parse as the service parses them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from extender.settings import Settings
from tests.cluster.kubeapi import Kube
from tests.cluster.manifests import DEPLOY, Discovery, create_dry_run, load_docs

HA = DEPLOY / "ha"


def merged(base: Any, patch: Any) -> Any:
    """Mappings merge key by key, everything else is replaced (the patch's container entry is
    complete, so this equals kustomize's strategic merge for it)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {k: merged(base.get(k), v) if k in base else v for k, v in patch.items()} | {
            k: v for k, v in base.items() if k not in patch}
    return patch


def ha_objects() -> list[dict[str, Any]]:
    kust = yaml.safe_load((HA / "kustomization.yaml").read_text())
    assert kust["resources"][0] == "../"
    base = [d for d in load_docs(DEPLOY / "flowsched.yaml")]
    (patch,) = load_docs(HA / kust["patches"][0]["path"])
    deployment = next(d for d in base if d["kind"] == "Deployment")
    out = [merged(deployment, patch)]
    for name in kust["resources"][1:]:
        out += load_docs(HA / name)
    return out


def test_ha_variant_shape_and_settings() -> None:
    objs = {d["kind"]: d for d in ha_objects()}
    dep = objs["Deployment"]["spec"]
    assert dep["replicas"] == 2 and dep["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    anti = dep["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert objs["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    cfg = yaml.safe_load(objs["ConfigMap"]["data"]["flowsched.yaml"])
    s = Settings.model_validate(cfg)
    assert s.progress_sources.shared_prometheus_url and s.controllers and s.control.dry_run


@pytest.mark.cluster
def test_ha_manifests_pass_server_side_dry_run(kube: Kube, deploy_rbac: None) -> None:
    disco = Discovery(kube)
    for doc in ha_objects():
        out = create_dry_run(kube, disco, doc)
        assert out["kind"] == doc["kind"]
