"""A real Kubernetes control plane on loopback for the tests: etcd, kube-apiserver, kube-scheduler.

The binaries come from `build_k8s.sh` (built from the Go module k8s.io/kubernetes at a pinned
version and cached outside the repository). Nothing here is mocked: the apiserver is the real
one with RBAC, admission, watch cache and the policy/v1 Eviction and coordination.k8s.io/v1
Lease APIs; kube-scheduler is the real one reading the KubeSchedulerConfiguration users deploy.

What is *not* here: kubelets (see kubelet_emulator.py) and kube-controller-manager. Without the
node-lifecycle controller nothing marks nodes NotReady or taints them, so fake nodes need no
heartbeats (kube-scheduler itself never reads node Leases or the Ready condition; it relies on
taints). Without the namespace and garbage-collector controllers, namespaces are never deleted
by the tests and pods are removed explicitly.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.cluster.procs import ManagedProcess, install_exit_hooks, wait_until
from tests.cluster.tools import ToolUnavailable, system_command

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tests" / "cluster" / "build_k8s.sh"
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"

# Identities in the token file. The flowsched and scheduler users are the usernames Kubernetes
# gives the ServiceAccounts in deploy/, so the RBAC in deploy/ (applied for real by the tests)
# is what authorises the service and the second scheduler here, exactly as in a cluster.
ADMIN_USER = "flowsched-e2e-admin"
FLOWSCHED_SA = ("flowsched", "flowsched")
SCHEDULER_SA = ("flowsched", "flowsched-scheduler")


class ClusterUnavailable(RuntimeError):
    """The control plane could not be built or started; cluster tests must fail, not skip."""


def free_port() -> int:
    # Bound and released: a tiny race with other processes is accepted; a collision shows up as
    # a clear "address in use" in the component log and a failed readiness wait.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_binaries() -> Path:
    """The directory holding etcd, kube-apiserver, kube-scheduler (built on first use)."""
    override = os.environ.get("FLOWSCHED_K8S_BIN")
    if override:
        bin_dir = Path(override)
    else:
        try:
            out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                                 timeout=3600, check=False)
        except subprocess.TimeoutExpired as e:
            raise ClusterUnavailable(f"{BUILD_SCRIPT} did not finish within an hour") from e
        if out.returncode != 0:
            tail = "\n".join(out.stderr.splitlines()[-30:])
            raise ClusterUnavailable(f"{BUILD_SCRIPT} failed (rc {out.returncode}):\n{tail}")
        bin_dir = Path(out.stdout.strip().splitlines()[-1])
    missing = [b for b in ("etcd", "kube-apiserver", "kube-scheduler") if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise ClusterUnavailable(f"missing executables in {bin_dir}: {', '.join(missing)}")
    return bin_dir


def _openssl(*args: str, cwd: Path) -> None:
    try:
        openssl = OPENSSL if os.access(OPENSSL, os.X_OK) else system_command("openssl", "openssl")
    except ToolUnavailable as e:
        raise ClusterUnavailable(str(e)) from e
    r = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ClusterUnavailable(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def make_pki(d: Path) -> None:
    """A CA, an apiserver serving cert for 127.0.0.1/localhost, and a service-account key pair."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3", "-subj", "/CN=flowsched-e2e-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=d)
    (d / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "apiserver.crt", "-days", "3", "-extfile", "san.ext", cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_text(server: str, ca_file: Path, user: str, token: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    })


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path
    etcd_port: int = 0
    etcd_peer_port: int = 0
    apiserver_port: int = 0
    scheduler_port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)  # user -> bearer token
    kubeconfigs: dict[str, Path] = field(default_factory=dict)  # "admin" | "flowsched" | "scheduler"
    etcd: ManagedProcess | None = None
    apiserver: ManagedProcess | None = None
    scheduler: ManagedProcess | None = None
    # --feature-gates of kube-apiserver and kube-scheduler from their next start (a test module
    # turning an alpha feature on sets it, restarts both, and clears it when done).
    feature_gates: dict[str, bool] = field(default_factory=dict)

    def _gates(self) -> list[str]:
        if not self.feature_gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))]

    # ---- paths ----
    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def admin_token(self) -> str:
        return self.tokens[ADMIN_USER]

    # ---- lifecycle ----
    def start(self) -> None:
        install_exit_hooks()
        self.workdir.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        self._write_identities()
        self.etcd_port, self.etcd_peer_port, self.apiserver_port = free_port(), free_port(), free_port()
        self.start_etcd()
        self.start_apiserver()

    def stop(self) -> None:
        # Scheduler first (it would only log connection errors), etcd last (the apiserver
        # blocks its shutdown on storage).
        for p in (self.scheduler, self.apiserver, self.etcd):
            if p is not None:
                p.stop()
        self.scheduler = self.apiserver = self.etcd = None

    def _write_identities(self) -> None:
        sa = _sa_user
        users = {
            ADMIN_USER: ("system:masters",),
            sa(*FLOWSCHED_SA): ("system:serviceaccounts", f"system:serviceaccounts:{FLOWSCHED_SA[0]}"),
            sa(*SCHEDULER_SA): ("system:serviceaccounts", f"system:serviceaccounts:{SCHEDULER_SA[0]}"),
        }
        lines = []
        for i, (user, groups) in enumerate(users.items()):
            token = secrets.token_hex(16)
            self.tokens[user] = token
            lines.append(f'{token},{user},uid-{i},"{",".join(groups)}"')
        (self.workdir / "tokens.csv").write_text("\n".join(lines) + "\n")
        self._kubeconfig_names = {"admin": ADMIN_USER, "flowsched": sa(*FLOWSCHED_SA),
                                  "scheduler": sa(*SCHEDULER_SA)}

    def _write_kubeconfigs(self) -> None:
        for name, user in self._kubeconfig_names.items():
            path = self.workdir / f"{name}.kubeconfig"
            path.write_text(kubeconfig_text(self.server, self.ca_file, user, self.tokens[user]))
            self.kubeconfigs[name] = path

    def start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(self.bin_dir / "etcd"), "--name", "e2e", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"e2e={peer}",
            # Test data is thrown away; fsync would dominate write latency on a shared disk.
            "--unsafe-no-fsync", "--log-level", "warn",
        ]
        self.etcd = ManagedProcess("etcd", argv, self.workdir / "etcd.log").start()
        self._wait(self.etcd, lambda: httpx.get(f"{self.etcd_url}/health", timeout=1).json()["health"] == "true",
                   60, "etcd /health")

    def start_apiserver(self) -> None:
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.apiserver_port),
            "--cert-dir", str(self.workdir / "apiserver-certs"),
            "--tls-cert-file", str(self.pki / "apiserver.crt"),
            "--tls-private-key-file", str(self.pki / "apiserver.key"),
            "--token-auth-file", str(self.workdir / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(self.pki / "sa.pub"),
            "--service-account-signing-key-file", str(self.pki / "sa.key"),
            "--service-cluster-ip-range", "10.0.0.0/24",
            # ServiceAccount admission would require a token controller; TaintNodesByCondition
            # would put a not-ready taint on every new Node that no node-lifecycle controller
            # ever removes.
            "--disable-admission-plugins", "ServiceAccount,TaintNodesByCondition",
            # A loopback advertise address is invalid in Endpoints; nothing here needs the
            # in-cluster "kubernetes" Service endpoints.
            "--endpoint-reconciler-type", "none",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *self._gates(),
        ]
        self.apiserver = ManagedProcess("kube-apiserver", argv, self.workdir / "kube-apiserver.log").start()
        self._write_kubeconfigs()
        self._wait(self.apiserver, self._apiserver_ready, 120, "kube-apiserver /readyz")

    def _apiserver_ready(self) -> bool:
        r = httpx.get(f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"},
                      verify=self.ssl_context(), timeout=2)
        return r.status_code == 200

    def restart_apiserver(self, between: Any = None) -> None:
        """Stop kube-apiserver, run `between()` while it is down, start it on the same port."""
        assert self.apiserver is not None
        # Go's HTTP server waits up to a minute for open watch streams after SIGTERM; a test
        # restart does not need a graceful exit (an abrupt one is the harder case anyway).
        self.apiserver.stop(grace_s=2.0)
        try:
            if between is not None:
                between()
        finally:  # a failing `between` must not leave the session's apiserver down for every later test
            self.start_apiserver()

    def start_scheduler(self, config_text: str) -> None:
        """Start kube-scheduler with `config_text` (a KubeSchedulerConfiguration)."""
        self.stop_scheduler()
        cfg = self.workdir / "scheduler-config.yaml"
        cfg.write_text(config_text)
        self.scheduler_port = free_port()
        argv = [
            str(self.bin_dir / "kube-scheduler"),
            "--config", str(cfg),
            # One scheduler per test session: no Lease to wait for (honoured with --config).
            "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(self.scheduler_port),
            "--cert-dir", str(self.workdir / "scheduler-certs"),
            # Bound to loopback in a throwaway control plane: the throughput benchmark's --pprof-dir
            # reads the Go CPU profile without a token (kube-scheduler's own defaults plus pprof).
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/debug/pprof/*",
            "--v=2",
            *self._gates(),
        ]
        self.scheduler = ManagedProcess("kube-scheduler", argv, self.workdir / "kube-scheduler.log").start()
        self._wait(
            self.scheduler,
            lambda: httpx.get(f"https://127.0.0.1:{self.scheduler_port}/readyz", verify=False,
                              timeout=2).status_code == 200,
            60, "kube-scheduler /readyz",
        )

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None

    def _wait(self, proc: ManagedProcess, ready: Any, timeout_s: float, what: str) -> None:
        def check() -> bool:
            if not proc.alive():
                raise ClusterUnavailable(f"{proc.name} exited early; log tail:\n{proc.log_tail()}")
            return bool(ready())

        try:
            wait_until(check, timeout_s, interval_s=0.2, what=what)
        except ClusterUnavailable:
            raise
        except TimeoutError as e:
            if not proc.alive():
                raise ClusterUnavailable(f"{proc.name} exited; log tail:\n{proc.log_tail()}") from e
            raise ClusterUnavailable(f"{e}; {proc.name} log tail:\n{proc.log_tail()}") from e

    # ---- clients ----
    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def http(self) -> httpx.Client:
        """An admin HTTP client for raw API requests (dry runs, discovery)."""
        return httpx.Client(base_url=self.server, verify=self.ssl_context(), timeout=10,
                            headers={"Authorization": f"Bearer {self.admin_token}"})

    # ---- etcd, for forcing watch expiry ----
    def etcd_bump_and_compact(self, writes: int = 3) -> int:
        """Advance etcd's revision with keys outside the apiserver's prefix, then compact.

        Uses etcd's JSON gateway. Any watch resumed from an older resourceVersion afterwards
        is answered 410 Gone by the apiserver (its watch cache starts at the new revision and
        etcd no longer holds the history). Returns the compacted revision.
        """
        rev = 0
        for i in range(writes):
            body = {"key": _b64(f"/flowsched-e2e/bump/{i}"), "value": _b64(secrets.token_hex(4))}
            r = httpx.post(f"{self.etcd_url}/v3/kv/put", json=body, timeout=5)
            r.raise_for_status()
            rev = int(r.json()["header"]["revision"])
        r = httpx.post(f"{self.etcd_url}/v3/kv/compaction", json={"revision": rev, "physical": True}, timeout=10)
        r.raise_for_status()
        return rev


def _sa_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
