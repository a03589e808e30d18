"""The real kube-scheduler calls flowsched over HTTPS and verifies its certificate (issue 18).

A second flowsched serves TLS (tls_cert_file / tls_key_file) with a certificate signed by the
test CA; a second kube-scheduler, with the profile `flowsched-tls`, runs deploy/'s scheduler
configuration with `enableHTTPS: true` and `tlsConfig.caFile` pointing at that CA. A pod of that
profile is then placed by flowsched's filter, and flowsched's own counters show the verbs were
answered. A third scheduler that trusts another CA gets no answer from flowsched at all
(ignorable: the pod still schedules, but flowsched counts no call from it).
"""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.cluster.controlplane import OPENSSL, ClusterUnavailable, ControlPlane, free_port
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.manifests import render_scheduler_config
from tests.cluster.procs import ManagedProcess, wait_until
from tests.cluster.scenario import Scenario

pytestmark = pytest.mark.cluster

PROFILE = "flowsched-tls"
SATURATED = [100.0] * 8
IDLE = [0.0] * 8
FB = [40000.0] * 8


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"openssl {' '.join(args)}: {r.stderr}"


def serving_cert(ca_dir: Path, out: Path) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 signed by the CA in ca_dir (ca.crt, ca.key)."""
    out.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
             "-subj", "/CN=flowsched", cwd=out)
    (out / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:flowsched.flowsched.svc\n"
                                 "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", str(ca_dir / "ca.crt"), "-CAkey", str(ca_dir / "ca.key"),
             "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "san.ext", cwd=out)
    return out / "tls.crt", out / "tls.key"


class TlsFlowsched(FlowschedService):
    def __init__(self, workdir: Path, kubeconfig: Path, ca_file: Path, extra_args: list[str]) -> None:
        super().__init__(workdir, kubeconfig, extra_args)
        self.http.close()
        self.verbs_http.close()
        self.http = httpx.Client(base_url=self.url, timeout=5,
                                 verify=ssl.create_default_context(cafile=str(ca_file)))
        self.verbs_http = httpx.Client(base_url=self.verbs_url, timeout=5,
                                       verify=ssl.create_default_context(cafile=str(ca_file)))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def verbs_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def verb_calls(self, verb: str) -> float:
        text = self.http.get("/metrics").text
        for line in text.splitlines():
            if line.startswith("flowsched_extender_requests_total{") and f'verb="{verb}"' in line \
                    and 'code="200"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture(scope="module")
def tls_flowsched(control_plane: ControlPlane, deploy_rbac: None) -> Iterator[TlsFlowsched]:
    work = control_plane.workdir / "tls-flowsched"
    cert, key = serving_cert(control_plane.pki, work / "pki")
    cfg = work / "flowsched.yaml"
    cfg.write_text(yaml.safe_dump({"tls_cert_file": str(cert), "tls_key_file": str(key),
                                   "progress_db": str(work / "progress.sqlite")}))
    svc = TlsFlowsched(work, control_plane.kubeconfigs["flowsched"], control_plane.ca_file, ["--config", str(cfg)])
    try:
        svc.start()
    except ClusterUnavailable as e:
        svc.close()
        pytest.fail(f"cannot start flowsched with TLS: {e}", pytrace=False)
    yield svc
    svc.close()


def start_scheduler(control_plane: ControlPlane, name: str, profile: str, url: str, ca_file: Path
                    ) -> ManagedProcess:
    """kube-scheduler on deploy/'s configuration with one profile, the extender over HTTPS."""
    cfg = yaml.safe_load(render_scheduler_config(url))
    cfg["leaderElection"] = {"leaderElect": False}
    cfg["clientConnection"] = {"kubeconfig": str(control_plane.kubeconfigs["scheduler"])}
    cfg["profiles"] = [{"schedulerName": profile}]
    (ext,) = cfg["extenders"]
    ext["enableHTTPS"] = True
    ext["tlsConfig"] = {"caFile": str(ca_file)}
    path = control_plane.workdir / f"{name}-config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = free_port()
    argv = [str(control_plane.bin_dir / "kube-scheduler"), "--config", str(path), "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(control_plane.workdir / f"{name}-certs"), "--v=2"]
    proc = ManagedProcess(name, argv, control_plane.workdir / f"{name}.log").start()

    def ready() -> bool:
        if not proc.alive():
            raise ClusterUnavailable(f"{name} exited; log tail:\n{proc.log_tail()}")
        try:
            return httpx.get(f"https://127.0.0.1:{port}/readyz", verify=False, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, 60, interval_s=0.2, what=f"{name} /readyz")
    return proc


def test_kube_scheduler_calls_flowsched_over_https_with_ca_verification(
        scenario: Scenario, control_plane: ControlPlane, tls_flowsched: TlsFlowsched, tmp_path: Path) -> None:
    s = scenario
    nodes = s.add_nodes("gpu-tls-hot", "gpu-tls-idle")
    wait_until(lambda: set(nodes) <= set(tls_flowsched.snapshot()["nodes"]), 10, what="TLS flowsched lists nodes")
    tls_flowsched.inject_telemetry("gpu-tls-hot", SATURATED, FB)  # flowsched's filter rejects it
    tls_flowsched.inject_telemetry("gpu-tls-idle", IDLE, FB)
    before = tls_flowsched.verb_calls("filter")
    sched = start_scheduler(control_plane, "kube-scheduler-tls", PROFILE, tls_flowsched.verbs_url,
                            control_plane.ca_file)
    try:
        for i in range(3):
            s.create_pod(f"tls-{i}", gpus=1, scheduler=PROFILE)
        for i in range(3):
            assert s.wait_bound(f"tls-{i}", timeout_s=30) == "gpu-tls-idle"
        assert tls_flowsched.verb_calls("filter") >= before + 3
        assert "x509" not in sched.log_tail(200)
    finally:
        sched.stop()

    # A scheduler that trusts another CA must not get through: flowsched sees no call from it.
    other = tmp_path / "other-ca"
    other.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "1", "-subj", "/CN=not-the-cluster-ca", cwd=other)
    before = tls_flowsched.verb_calls("filter")
    wrong = start_scheduler(control_plane, "kube-scheduler-wrong-ca", PROFILE, tls_flowsched.verbs_url,
                            other / "ca.crt")
    try:
        s.create_pod("tls-wrong-ca", gpus=1, scheduler=PROFILE)
        s.wait_bound("tls-wrong-ca", timeout_s=30)  # ignorable: kube-scheduler goes on without flowsched
        assert tls_flowsched.verb_calls("filter") == before
        wait_until(lambda: "certificate" in wrong.log_tail(400), 10, what="the TLS failure in the scheduler log")
    finally:
        wrong.stop()


def test_the_gate_webhook_gates_flowsched_pods_only_and_pods_are_created_without_it(
        scenario: Scenario, control_plane: ControlPlane, tls_flowsched: TlsFlowsched) -> None:
    """kube-apiserver calls POST /webhook/gate over HTTPS (its CA bundle: the test CA); failurePolicy
    Ignore, so with flowsched down pods are still created, ungated."""
    import base64

    from tests.cluster.kubeapi import pods_path
    from tests.cluster.scenario import gpu_pod

    s = scenario
    s.kube.merge_patch(f"/api/v1/namespaces/{s.ns}", {"metadata": {"labels": {"flowsched-webhook-e2e": "on"}}})
    name = f"flowsched-gate-{s.ns}"
    coll = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    s.kube.create(coll, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "gate.flowsched.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 5, "reinvocationPolicy": "Never",
            "clientConfig": {"url": f"{tls_flowsched.url}/webhook/gate",
                             "caBundle": base64.b64encode(control_plane.ca_file.read_bytes()).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"flowsched-webhook-e2e": "on"}},
        }]})
    try:
        def gates(pod: str) -> list[str]:
            return [g["name"] for g in s.pod(pod)["spec"].get("schedulingGates") or []]

        # The webhook configuration takes a moment to reach the apiserver's admission chain.
        def gated_now() -> bool:
            n = f"probe-{int(time.monotonic() * 1000)}"
            s.kube.create(pods_path(s.ns), gpu_pod(n, gpus=1))
            return gates(n) == ["flowsched.io/admission"]

        wait_until(gated_now, 30, interval_s=0.5, what="the webhook gating a flowsched pod")
        s.kube.create(pods_path(s.ns), gpu_pod("other-0", gpus=1, scheduler="default-scheduler"))
        assert gates("other-0") == []  # not flowsched's: untouched
        tls_flowsched.stop()
        try:
            s.kube.create(pods_path(s.ns), gpu_pod("while-down-0", gpus=1))
            assert gates("while-down-0") == []  # created anyway, ungated: failurePolicy Ignore
        finally:
            tls_flowsched.start()
    finally:
        s.kube.delete(f"{coll}/{name}")
