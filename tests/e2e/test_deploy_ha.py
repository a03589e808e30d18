"""deploy/ha/ (2 replicas, PDB, anti-affinity, shared settings), rendered by the real kustomize as
`kubectl apply -k deploy/ha/` renders it, passes the real apiserver's validation, and its settings
parse as the service parses them."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
import yaml

from extender.settings import Settings
from tests.cluster.kubeapi import JSON, Kube
from tests.cluster.manifests import DEPLOY, Discovery, dry_run, kustomize_build

HA = DEPLOY / "ha"
pytestmark = pytest.mark.kustomize


def ha_objects() -> dict[tuple[str, str], JSON]:
    return {(d["kind"], d["metadata"]["name"]): d for d in kustomize_build(HA)}


def test_ha_variant_shape_and_settings() -> None:
    objs = ha_objects()
    dep = objs[("Deployment", "flowsched")]["spec"]
    assert dep["replicas"] == 2 and dep["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = dep["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert objs[("PodDisruptionBudget", "flowsched")]["spec"]["minAvailable"] == 1
    (container,) = pod["containers"]
    # The base's drain and TLS survive the merge: a rolled replica keeps serving while endpoints drop it.
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    mounts = {m["name"]: PurePosixPath(m["mountPath"]) for m in container["volumeMounts"]}
    assert {"tls", "config", "data"} <= set(mounts)
    # No mount inside another (a read-only ConfigMap over /etc/flowsched would hold the TLS mount point).
    for a, pa in mounts.items():
        for b, pb in mounts.items():
            assert a == b or not pb.is_relative_to(pa), (a, b)
    config_path = PurePosixPath(container["args"][container["args"].index("--config") + 1])
    assert config_path.parent == mounts["config"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm = objs[("ConfigMap", volumes["config"]["configMap"]["name"])]
    s = Settings.model_validate(yaml.safe_load(cm["data"][config_path.name]))
    assert s.progress_sources.shared_prometheus_url and s.controllers and s.control.dry_run


@pytest.mark.cluster
def test_ha_manifests_pass_server_side_dry_run(kube: Kube, deploy_rbac: None) -> None:
    disco = Discovery(kube)
    for doc in ha_objects().values():
        out = dry_run(kube, disco, doc)
        assert out["kind"] == doc["kind"]
