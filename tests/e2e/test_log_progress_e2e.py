"""Progress from logs through the real kube-apiserver's pods/log endpoint (issue 17).

What is real: kube-apiserver (authorisation of flowsched's ServiceAccount by deploy/'s RBAC,
the pods/log subresource, its proxy to the node's kubelet and its streaming), the flowsched
process with its log follower, SQLite store and convergence estimate. What is emulated: the
kubelet's /containerLogs endpoint (KubeletLogEmulator: lines the test writes, no container),
and the pod lifecycle (KubeletEmulator). The lines written are the real format of a training
script's prints (tests/data/logs/plain-*.log) over a curve long enough to estimate.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.cluster.controlplane import ControlPlane
from tests.cluster.fake_nodes import gpu_node
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import JSON, node_path, pod_path, pods_path
from tests.cluster.kubelet_log_emulator import KubeletLogEmulator
from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario, gpu_pod

pytestmark = pytest.mark.cluster

JOB_LABEL = "flowsched.io/job"


@pytest.fixture
def log_kubelet(tmp_path: Path) -> Iterator[KubeletLogEmulator]:
    em = KubeletLogEmulator(tmp_path / "kubelet").start()
    yield em
    em.stop()


@pytest.fixture
def follower_svc(control_plane: ControlPlane, deploy_rbac: None, tmp_path: Path
                 ) -> Iterator[tuple[FlowschedService, str]]:
    """A flowsched of its own with short follower intervals and a static token to read /v1/jobs."""
    token = secrets.token_hex(16)
    (tmp_path / "tokens").write_text(f"{token} *\n")
    cfg = {"progress_auth": "static", "static_tokens_file": str(tmp_path / "tokens"),
           "progress_db": str(tmp_path / "progress.sqlite"),
           "convergence": {"interval_s": 0.5, "window_s": 30},
           "progress_sources": {"reconcile_s": 0.3, "log_flush_s": 0.2, "log_min_point_interval_s": 0,
                                "log_read_timeout_s": 120, "log_connects_per_s": 20}}
    path = tmp_path / "flowsched.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "svc"
    work.mkdir()
    svc = FlowschedService(work, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(path)])
    svc.start()
    try:
        yield svc, token
    finally:
        svc.close()


def curve_lines(first: int, last: int, every: int = 10) -> list[str]:
    """`step=… loss=…` lines of a loss that falls and flattens (the plain format)."""
    return [f"step={k} loss={0.2 + math.exp(-k / 400.0):.5f} lr=0.1" for k in range(first, last + 1, every)]


def job_view(svc: FlowschedService, token: str, ns: str, job: str) -> dict[str, Any] | None:
    r = svc.http.get(f"/v1/jobs/{ns}/{job}", headers={"Authorization": f"Bearer {token}"})
    if r.status_code == 404:
        return None
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def test_job_reporting_only_in_its_log_gets_an_estimate(
        scenario: Scenario, log_kubelet: KubeletLogEmulator, follower_svc: tuple[FlowschedService, str]) -> None:
    s, (svc, token) = scenario, follower_svc
    node = gpu_node("gpu-logs-1", gpus=4)
    node["status"].update(log_kubelet.node_status())
    s.kube.create(node_path(), node)

    # 60 lines already written over the last 10 minutes, before flowsched sees the pod.
    now = time.time()
    first = curve_lines(10, 600)
    for i, line in enumerate(first):
        log_kubelet.write(s.ns, "trainer-0", "main", line, at=now - 600 + i * 10)
    body: JSON = gpu_pod("trainer-0", gpus=1, labels={JOB_LABEL: "logjob"},
                         annotations={"flowsched.io/progress": "logs"})
    body["spec"]["nodeName"] = "gpu-logs-1"
    s.kube.create(pods_path(s.ns), body)
    s.wait_running("trainer-0")

    wait_until(lambda: (job_view(svc, token, s.ns, "logjob") or {}).get("points") == len(first), 20,
               interval_s=0.2, what="every logged point stored")
    view = job_view(svc, token, s.ns, "logjob")
    assert view is not None
    assert view["last_step"] == 600 and view["last_value"] == pytest.approx(0.2 + math.exp(-1.5), abs=1e-5)
    assert view["phase"] in ("growing", "watching", "completing")
    assert view["remaining_seconds"] is not None and view["remaining_seconds"] > 0
    # The log lines' own times (timestamps=true) are the points' times, not the time of reading.
    assert view["first_timestamp"] == pytest.approx(now - 600, abs=1.0)

    # New lines stream in through the same follow.
    opened = len([r for r in log_kubelet.requests if r["path"].endswith("/trainer-0/main")])
    log_kubelet.write(s.ns, "trainer-0", "main", *curve_lines(610, 650))
    try:
        wait_until(lambda: (job_view(svc, token, s.ns, "logjob") or {}).get("last_step") == 650, 10,
                   interval_s=0.2, what="followed lines stored")
    except TimeoutError as e:
        sources = svc.snapshot()["status"]["progress_sources"]
        raise AssertionError(f"{e}; follower: {sources}; kubelet requests: {log_kubelet.requests}") from e
    assert len([r for r in log_kubelet.requests if r["path"].endswith("/trainer-0/main")]) == opened, \
        f"the follow was reopened; follower: {svc.snapshot()['status']['progress_sources']}"
    req = log_kubelet.requests[-1]["query"]
    assert req.get("follow") == "true" and req.get("timestamps") == "true"

    # A restart from checkpoint: a new container instance whose steps begin below the last ones.
    log_kubelet.restart(s.ns, "trainer-0", "main")
    pod = s.pod("trainer-0")
    statuses = pod["status"]["containerStatuses"]
    statuses[0]["restartCount"] = 1
    s.kube.merge_patch(pod_path(s.ns, "trainer-0") + "/status", {"status": {"containerStatuses": statuses}})
    log_kubelet.write(s.ns, "trainer-0", "main", *curve_lines(500, 560))
    wait_until(lambda: (job_view(svc, token, s.ns, "logjob") or {}).get("last_step") == 560, 15,
               interval_s=0.2, what="the restarted container's lines stored")
    view = job_view(svc, token, s.ns, "logjob")
    assert view is not None and view["restarts"] >= 1
    streams = svc.snapshot()["status"]["progress_sources"]["logs"]["streams"]
    assert streams[f"{s.ns}/logjob"]["restarts"] == 1
    assert streams[f"{s.ns}/logjob"]["patterns"] == {"plain": 7}  # the new instance's fresh parser


def test_log_endpoint_refusal_is_retried_not_fatal(
        scenario: Scenario, log_kubelet: KubeletLogEmulator, follower_svc: tuple[FlowschedService, str]) -> None:
    """A pod whose log cannot be read (the kubelet has no such container) costs bounded retries,
    and the service keeps answering."""
    s, (svc, _token) = scenario, follower_svc
    node = gpu_node("gpu-logs-2", gpus=4)
    node["status"].update(log_kubelet.node_status())
    s.kube.create(node_path(), node)
    body: JSON = gpu_pod("silent-0", gpus=1, labels={JOB_LABEL: "silent"},
                         annotations={"flowsched.io/progress": "logs"})
    body["spec"]["nodeName"] = "gpu-logs-2"
    s.kube.create(pods_path(s.ns), body)
    s.wait_running("silent-0")

    def tries() -> int:
        return len([r for r in log_kubelet.requests if "/silent-0/" in r["path"]])

    wait_until(lambda: tries() >= 1, 20, interval_s=0.05, what="the first try")
    first = tries()
    time.sleep(3.0)
    # Back-off from 1 s doubling (1, 2, 4 s): at most 2 more tries in 3 s (reconciling every 0.3 s).
    assert tries() - first <= 2, tries()
    assert httpx.get(f"{svc.url}/healthz", timeout=5).status_code == 200
