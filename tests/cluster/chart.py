"""deploy/chart rendered by the real helm (tests/cluster/tools.py builds it when absent)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

import yaml

from tests.cluster.controlplane import BUILD_SCRIPT
from tests.cluster.kubeapi import JSON
from tests.cluster.manifests import DEPLOY
from tests.cluster.tools import go_tool

CHART = DEPLOY / "chart"
# The version the test control plane runs (build_k8s.sh's pin), for .Capabilities.KubeVersion.
_pin = re.search(r'K8S_VERSION="\$\{K8S_VERSION:-(v[0-9.]+)\}"', BUILD_SCRIPT.read_text())
K8S_VERSION = os.environ.get("K8S_VERSION") or (_pin.group(1) if _pin else "v1.35.4")
# The prometheus-operator release whose ServiceMonitor CRD the chart's ServiceMonitor is
# checked against (read from its Go module's example/prometheus-operator-crd/).
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "v0.85.0")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([go_tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False)


def render(namespace: str = "flowsched", values: Sequence[str] = (), release: str = "flowsched") -> list[JSON]:
    """`helm template` with --set values; fails the caller with helm's own message."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", K8S_VERSION]
    for v in values:
        args += ["--set", v]
    r = helm(*args)
    if r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]
