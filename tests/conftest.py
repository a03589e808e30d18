"""Session fixtures for the tests that need a real control plane (marked `cluster`).

The control plane (etcd, kube-apiserver) starts once per session, then deploy/'s RBAC is
applied for real, then flowsched and kube-scheduler run under the ServiceAccount identities
that RBAC authorises. If anything cannot be built or started, cluster tests FAIL with the
reason; only FLOWSCHED_SKIP_CLUSTER=1 (a developer opt-out CI never sets) skips them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.controlplane import ClusterUnavailable, ControlPlane, ensure_binaries
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import Kube
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.manifests import Discovery, apply, load_docs, manifest_files, scheduler_config_for_tests
from tests.cluster.procs import install_exit_hooks
from tests.cluster.scenario import Scenario
from tests.cluster.tools import ToolUnavailable, go_tool, torch_python

# deploy/ objects the tests create for real: the identities flowsched and the second scheduler
# run under here are authorised by exactly these.
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

PRIORITY_CLASSES = {"e2e-low": 100, "e2e-high": 10000}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the real programs the selected tests need before the first test starts, so a cold
    build (minutes, once per machine) counts against no test's timeout and says what it is doing.
    A build that fails here is not fatal: each test that needs it then fails with the reason."""
    if session.config.option.collectonly:
        return
    markers = {m.name for item in session.items for m in item.iter_markers()}
    steps: list[tuple[str, Callable[[], object]]] = []
    if "cluster" in markers and not _skip_requested():
        steps.append(("kube-apiserver, kube-scheduler, etcd", ensure_binaries))
    if "prometheus" in markers and os.environ.get("FLOWSCHED_SKIP_PROMETHEUS") != "1":
        steps.append(("prometheus", lambda: go_tool("prometheus")))
    if "helm" in markers:
        steps.append(("helm", lambda: go_tool("helm")))
    if "kustomize" in markers:
        steps.append(("kustomize", lambda: go_tool("kustomize")))
    if "torch" in markers:
        steps.append(("a Python with torch", torch_python))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for what, step in steps:
        if reporter is not None:  # before the step: a cold build takes minutes
            reporter.write(f"flowsched tests: {what} (found, or built or installed once and cached; "
                           "docs/testing.md): ")
        t0 = time.monotonic()
        try:
            where = step()
        except (ClusterUnavailable, ToolUnavailable) as e:
            where = f"UNAVAILABLE ({str(e).splitlines()[0]})"
        if reporter is not None:
            reporter.write_line(f"{where} ({time.monotonic() - t0:.1f} s)")


def _skip_requested() -> bool:
    return os.environ.get("FLOWSCHED_SKIP_CLUSTER") == "1"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if _skip_requested():
        pytest.skip("FLOWSCHED_SKIP_CLUSTER=1: cluster tests skipped on request (CI never sets this)")
    install_exit_hooks()
    problem = ""
    try:
        bin_dir = ensure_binaries()
    except ClusterUnavailable as e:
        problem = f"cannot build the Kubernetes binaries: {e}"
    if problem:
        pytest.fail(problem, pytrace=False)
    cp = ControlPlane(bin_dir=bin_dir, workdir=tmp_path_factory.mktemp("k8s"))
    try:
        cp.start()
    except ClusterUnavailable as e:
        problem = f"cannot start the control plane: {e}"
    if problem:
        cp.stop()
        pytest.fail(problem, pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(control_plane.server, control_plane.admin_token, control_plane.ssl_context())
    yield k
    k.close()


@pytest.fixture(scope="session")
def deploy_rbac(kube: Kube) -> None:
    disco = Discovery(kube)
    for path in manifest_files():
        for doc in load_docs(path):
            if doc["kind"] in RBAC_KINDS:
                apply(kube, disco, doc)
    for name, value in PRIORITY_CLASSES.items():
        apply(kube, disco, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": name}, "value": value,
                            "preemptionPolicy": "PreemptLowerPriority"})


@pytest.fixture(scope="session")
def emulator(kube: Kube) -> Iterator[KubeletEmulator]:
    em = KubeletEmulator(kube).start()
    yield em
    em.stop()


@pytest.fixture(scope="session")
def flowsched(control_plane: ControlPlane, deploy_rbac: None) -> Iterator[FlowschedService]:
    # It follows no container logs: tests/e2e/test_log_progress_e2e.py runs a follower of its own,
    # and this one, with no control loop (so no Lease), followed the same pod on its next reconcile
    # (every 5 s), a second pods/log stream that failed the test's "one follow" check at random.
    config = control_plane.workdir / "flowsched-session.yaml"
    config.write_text("progress_sources:\n  logs: false\n")
    svc = FlowschedService(control_plane.workdir, control_plane.kubeconfigs["flowsched"],
                           extra_args=["--config", str(config)])
    try:
        svc.start()
    except ClusterUnavailable as e:
        svc.close()
        pytest.fail(f"cannot start flowsched against the control plane: {e}", pytrace=False)
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def scheduler(control_plane: ControlPlane, flowsched: FlowschedService, deploy_rbac: None) -> Path:
    """kube-scheduler on deploy/base/scheduler-config.yaml, pointed at the test's flowsched."""
    cfg = scheduler_config_for_tests(flowsched.verbs_url, control_plane.kubeconfigs["scheduler"])
    try:
        control_plane.start_scheduler(cfg)
    except ClusterUnavailable as e:
        pytest.fail(f"cannot start kube-scheduler: {e}", pytrace=False)
    return control_plane.workdir / "scheduler-config.yaml"


@pytest.fixture
def scenario(kube: Kube, emulator: KubeletEmulator, flowsched: FlowschedService,
             scheduler: Path) -> Iterator[Scenario]:
    with Scenario(kube, emulator, flowsched) as s:
        yield s
