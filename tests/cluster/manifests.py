"""deploy/ manifests: load them, find their REST paths by discovery, apply or dry-run them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import REPO
from tests.cluster.kubeapi import APPLY_PATCH, JSON, Kube
from tests.cluster.tools import go_tool

DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"  # the objects of `kubectl apply -k deploy/`, which deploy/ha/ builds on too
SCHEDULER_CONFIG = BASE / "scheduler-config.yaml"
URL_PLACEHOLDER = "${FLOWSCHED_URL}"
IN_CLUSTER_URL = "http://flowsched.flowsched.svc:8888"
# Files in deploy/base/ that are not API objects.
NOT_API_OBJECTS = {"scheduler-config.yaml", "kustomization.yaml"}
FIELD_MANAGER = "flowsched-e2e"


def render_scheduler_config(url: str) -> str:
    """deploy/base/scheduler-config.yaml with its placeholder substituted, as envsubst would."""
    text = SCHEDULER_CONFIG.read_text()
    if URL_PLACEHOLDER not in text:
        raise AssertionError(f"{SCHEDULER_CONFIG} lost its {URL_PLACEHOLDER} placeholder")
    return text.replace(URL_PLACEHOLDER, url)


def scheduler_config_for_tests(url: str, kubeconfig: Path) -> str:
    """The deploy file, plus the one thing a process outside a cluster needs: a kubeconfig.

    With --config, kube-scheduler ignores --kubeconfig, and an empty clientConnection.kubeconfig
    means in-cluster config, which does not exist here.
    """
    cfg = yaml.safe_load(render_scheduler_config(url))
    cfg.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    return yaml.safe_dump(cfg, sort_keys=False)


def manifest_files() -> list[Path]:
    return sorted(p for p in BASE.glob("*.yaml") if p.name not in NOT_API_OBJECTS)


def load_docs(path: Path) -> list[JSON]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomize_build(folder: Path) -> list[JSON]:
    """The objects `kubectl apply -k folder` would send, rendered by the real kustomize
    (tests/cluster/tools.py builds it when absent); fails the caller with kustomize's message."""
    r = subprocess.run([go_tool("kustomize"), "build", str(folder)], capture_output=True, text=True, timeout=120,
                       check=False)
    if r.returncode != 0:
        raise AssertionError(f"kustomize build {folder} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


class Discovery:
    """Kind -> resource name and scope, from the apiserver's own discovery documents."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._cache: dict[str, list[dict[str, Any]]] = {}

    def collection(self, doc: JSON) -> str:
        api, kind = doc["apiVersion"], doc["kind"]
        base = "/api/v1" if api == "v1" else f"/apis/{api}"
        if base not in self._cache:
            self._cache[base] = self.kube.get(base)["resources"]
        for r in self._cache[base]:
            if r["kind"] == kind and "/" not in r["name"]:
                if r["namespaced"]:
                    ns = doc["metadata"].get("namespace")
                    if not ns:
                        raise AssertionError(f"{kind} {doc['metadata']['name']} is namespaced but names no namespace")
                    return f"{base}/namespaces/{ns}/{r['name']}"
                return f"{base}/{r['name']}"
        raise AssertionError(f"the apiserver serves no {kind} in {api}")


def apply(kube: Kube, disco: Discovery, doc: JSON, dry_run: bool = False) -> JSON:
    """Server-side apply; fieldValidation=Strict so an unknown or duplicated field is an error."""
    params = {"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": "Strict"}
    if dry_run:
        params["dryRun"] = "All"
    path = f"{disco.collection(doc)}/{doc['metadata']['name']}"
    return kube.request("PATCH", path, json.dumps(doc), params=params, content_type=APPLY_PATCH)


def create_dry_run(kube: Kube, disco: Discovery, doc: JSON) -> JSON:
    """POST ?dryRun=All: admission and validation run, nothing is stored."""
    return kube.create(disco.collection(doc), doc, dryRun="All", fieldValidation="Strict")


def dry_run(kube: Kube, disco: Discovery, doc: JSON) -> JSON:
    """A dry-run create, or a dry-run server-side apply for an object the session already created
    (the RBAC objects, the namespace); asserts that a dry-run create stored nothing."""
    path = f"{disco.collection(doc)}/{doc['metadata']['name']}"
    if kube.exists(path):
        return apply(kube, disco, doc, dry_run=True)
    out = create_dry_run(kube, disco, doc)
    assert not kube.exists(path), f"dry run of {doc['kind']} {doc['metadata']['name']} persisted it"
    return out
