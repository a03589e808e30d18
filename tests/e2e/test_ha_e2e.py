"""Two flowsched replicas behind HAProxy as kube-scheduler's extender; the Lease holder is killed.

Real: etcd, kube-apiserver, a kube-scheduler of its own (profile `flowsched-ha`, the extender
URL is HAProxy's), HAProxy (Debian package) health-checking both replicas, two flowsched
processes sharing their progress history through a real Prometheus (remote-write receiver),
the Lease. Emulated: the kubelets (KubeletEmulator marks bound pods Running).

Figures printed (pytest -s): time from SIGKILL of the Lease holder until the verbs answer again
through HAProxy, pods that failed scheduling, acknowledged progress points lost, time until the
survivor holds the Lease (its loops act from their next interval, 1 s here).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import Kube, pods_path
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.manifests import scheduler_config_for_tests
from tests.cluster.procs import ManagedProcess, wait_until
from tests.cluster.scenario import Scenario, gpu_pod
from tests.cluster.tools import system_command
from tests.prometheus_harness import PrometheusServer, running_prometheus

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

PROFILE = "flowsched-ha"


def haproxy_config(port: int, backends: list[int], api_port: int, api_backends: list[int]) -> str:
    """One balancer per listener (DESIGN.md §12): the verbs' port and the API's."""
    servers = "\n".join(f"  server r{i} 127.0.0.1:{p} check" for i, p in enumerate(backends))
    api_servers = "\n".join(f"  server r{i} 127.0.0.1:{p} check" for i, p in enumerate(api_backends))
    return f"""global
  maxconn 2000
defaults
  mode http
  timeout connect 300ms
  timeout client 30s
  timeout server 10s
  retries 3
  option redispatch 1
  retry-on conn-failure empty-response response-timeout
  option http-buffer-request
listen extender
  bind 127.0.0.1:{port}
  balance roundrobin
  option httpchk GET /healthz
  default-server inter 250ms fall 1 rise 2
{servers}
listen api
  bind 127.0.0.1:{api_port}
  balance roundrobin
  option httpchk GET /healthz
  default-server inter 250ms fall 1 rise 2
{api_servers}
"""


@pytest.fixture
def ha(control_plane: ControlPlane, deploy_rbac: None, tmp_path: Path
       ) -> Iterator[tuple[PrometheusServer, list[FlowschedService], str, str, str]]:
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.access(binary, os.X_OK):  # installed here with apt-get when root, else the exact command
        binary = system_command("haproxy", "haproxy")
    token = secrets.token_hex(16)
    (tmp_path / "tokens").write_text(f"{token} *\n")
    lease = f"e2e-ha-{uuid.uuid4().hex[:6]}"
    with running_prometheus(tmp_path / "prom", [], extra_args=["--web.enable-remote-write-receiver"]) as prom:
        services = []
        for ident in ("ha-a", "ha-b"):
            cfg = {"progress_auth": "static", "static_tokens_file": str(tmp_path / "tokens"),
                   "progress_db": str(tmp_path / f"{ident}.sqlite"),
                   "convergence": {"interval_s": 0.5},
                   "progress_sources": {"shared_prometheus_url": prom.url},
                   "controllers": ["migrator"],
                   "control": {"lease_name": lease, "identity": ident, "lease_duration_s": 4,
                               "renew_deadline_s": 3, "retry_period_s": 0.5},
                   "migrator": {"interval_s": 1}}
            path = tmp_path / f"{ident}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            d = tmp_path / ident
            d.mkdir()
            services.append(FlowschedService(d, control_plane.kubeconfigs["flowsched"],
                                             extra_args=["--config", str(path)]))
        port, api_port = free_port(), free_port()
        (tmp_path / "haproxy.cfg").write_text(haproxy_config(port, [s.port for s in services],
                                                             api_port, [s.api_port for s in services]))
        lb = ManagedProcess("haproxy", [binary, "-db", "-f", str(tmp_path / "haproxy.cfg")], tmp_path / "haproxy.log")
        sched_cfg = yaml.safe_load(scheduler_config_for_tests(f"http://127.0.0.1:{port}",
                                                              control_plane.kubeconfigs["scheduler"]))
        sched_cfg["profiles"][0]["schedulerName"] = PROFILE
        (tmp_path / "sched.yaml").write_text(yaml.safe_dump(sched_cfg))
        sched = ManagedProcess("kube-scheduler-ha", [
            str(control_plane.bin_dir / "kube-scheduler"), "--config", str(tmp_path / "sched.yaml"),
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--cert-dir", str(tmp_path / "sched-certs"), "--v=2"], tmp_path / "kube-scheduler.log")
        try:
            for s in services:
                s.start()
            lb.start()
            sched.start()
            wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, 20,
                       what="HAProxy up")
            yield (prom, services, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{api_port}", token,
                   str(tmp_path / "kube-scheduler.log"))
        finally:
            sched.stop()
            lb.stop()
            for s in services:
                s.close()


def leader_of(services: list[FlowschedService]) -> list[FlowschedService]:
    out = []
    for s in services:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            if s.http.get("/debug/control", timeout=1).json()["leader"]["is_leader"]:
                out.append(s)
    return out


def test_kill_the_lease_holder(ha: tuple[PrometheusServer, list[FlowschedService], str, str, str, str],
                               kube: Kube, emulator: KubeletEmulator, scenario: Scenario) -> None:
    prom, services, lb_url, api_lb_url, token, sched_log = ha
    s = scenario
    s.add_nodes("gpu-ha-1", "gpu-ha-2", gpus=64)
    wait_until(lambda: len(leader_of(services)) == 1, 20, what="one replica holding the Lease")
    (holder,) = leader_of(services)
    (survivor,) = [x for x in services if x is not holder]

    # A training job posts through the load balancer all along; count what was acknowledged.
    acked: list[int] = []
    stop = threading.Event()
    t_base = time.time() - 60

    def post() -> None:
        step = 0
        with httpx.Client(base_url=api_lb_url, timeout=5,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            while not stop.is_set():
                step += 1
                body = {"namespace": s.ns, "job": "ha-job",
                        "points": [{"step": step, "loss": 1.0 / step, "timestamp": t_base + step * 0.01}]}
                with contextlib.suppress(httpx.HTTPError):
                    if c.post("/v1/progress", json=body).status_code == 200:
                        acked.append(step)
                time.sleep(0.02)

    # The verbs, probed through HAProxy as kube-scheduler calls them.
    probe: list[tuple[float, bool]] = []

    def verbs() -> None:
        args = {"Pod": gpu_pod("probe", gpus=1), "Nodes": None, "NodeNames": ["gpu-ha-1", "gpu-ha-2"]}
        with httpx.Client(base_url=lb_url, timeout=5) as c:
            while not stop.is_set():
                ok = False
                with contextlib.suppress(httpx.HTTPError):
                    ok = c.post("/filter", json=args).status_code == 200
                probe.append((time.monotonic(), ok))
                time.sleep(0.02)

    threads = [threading.Thread(target=post, daemon=True), threading.Thread(target=verbs, daemon=True)]
    for t in threads:
        t.start()
    names: list[str] = []
    for i in range(10):  # pods scheduled before the kill
        names.append(f"before-{i}")
        body = gpu_pod(names[-1], gpus=1, scheduler=PROFILE)
        kube.create(pods_path(s.ns), body)
    for n in names:
        s.wait_bound(n, 30)
    time.sleep(1.0)
    acked_before = len(acked)

    assert holder.proc is not None and holder.proc.pid is not None
    killed_at = time.monotonic()
    os.killpg(holder.proc.pid, signal.SIGKILL)
    after = []
    for i in range(10):  # pods created during and right after the fail-over
        after.append(f"after-{i}")
        kube.create(pods_path(s.ns), gpu_pod(after[-1], gpus=1, scheduler=PROFILE))
        time.sleep(0.2)
    wait_until(lambda: leader_of([survivor]) == [survivor], 30, interval_s=0.05, what="the survivor to lead")
    leader_after = time.monotonic() - killed_at
    for n in after:
        s.wait_bound(n, 30)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(timeout=10)

    failures_after = [t for t, ok in probe if t >= killed_at and not ok]
    first_ok = next((t for t, ok in probe if t >= killed_at and ok), None)
    gap = (max(failures_after) - killed_at) if failures_after else 0.0
    view = httpx.get(f"{survivor.url}/v1/jobs/{s.ns}/ha-job", headers={"Authorization": f"Bearer {token}"},
                     timeout=5).json()
    r = httpx.get(f"{prom.url}/api/v1/query",
                  params={"query": f'flowsched_progress_step{{namespace="{s.ns}",flowsched_job="ha-job"}}[10m]'},
                  timeout=5).json()
    stored = {int(float(v)) for row in r["data"]["result"] for _, v in row["values"]}
    lost = sorted(set(acked) - stored)
    failed_sched = [e for e in kube.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
                    if e.get("reason") == "FailedScheduling"]
    with open(sched_log, errors="replace") as f:
        extender_errors = sum(1 for line in f if "extender" in line.lower() and "error" in line.lower())
    print(f"\nHA fail-over: verbs through HAProxy failed for {gap * 1000:.0f} ms after SIGKILL "
          f"({len(failures_after)} of {sum(1 for t, _ in probe if t >= killed_at)} probes failed; first ok after "
          f"{((first_ok or killed_at) - killed_at) * 1000:.0f} ms); pods bound: {len(names)} before, {len(after)} "
          f"after; FailedScheduling events: {len(failed_sched)}; kube-scheduler extender error lines: "
          f"{extender_errors}; acknowledged points: {len(acked)} ({acked_before} before the kill), lost: {len(lost)}; "
          f"survivor led after {leader_after:.2f} s; survivor's view: {view.get('points')} points")
    assert lost == []
    assert view["points"] >= len(acked)
    assert failed_sched == []
