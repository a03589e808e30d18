"""The flowsched service as a real process (the same entry point users run), for the e2e tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.cluster.controlplane import REPO, ClusterUnavailable, ControlPlane, free_port
from tests.cluster.manifests import scheduler_config_for_tests
from tests.cluster.procs import ManagedProcess, install_exit_hooks, wait_until


def flowsched_argv() -> list[str]:
    # Prefer the installed console script (what the Dockerfile runs); fall back to the module
    # entry point so a checkout without `pip install -e .` still works.
    script = Path(sys.executable).parent / "flowsched"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from extender.cli import main; sys.exit(main())"]


class FlowschedService:
    def __init__(self, workdir: Path, kubeconfig: Path, extra_args: list[str] | None = None,
                 repo: Path | None = None) -> None:
        """repo: the checkout whose code runs (default this one; benchmarks compare two)."""
        self.repo = repo or REPO
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.extra_args = extra_args or []
        self.port = free_port()  # the verbs (kube-scheduler's)
        self.api_port = free_port()  # progress API, webhook, /metrics, UI, debug (DESIGN.md §12)
        self.proc: ManagedProcess | None = None
        self.http = httpx.Client(base_url=self.url, timeout=5)
        self.verbs_http = httpx.Client(base_url=self.verbs_url, timeout=5)  # as kube-scheduler calls

    @property
    def url(self) -> str:
        """The API listener: what the tests call (debug, progress, webhook, /metrics)."""
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def verbs_url(self) -> str:
        """The verbs' listener: what kube-scheduler's configuration names."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 60.0, wait_ready: bool = True) -> None:
        """Start and wait for /readyz (or only /healthz, for a start without a reachable API)."""
        install_exit_hooks()
        argv = [*flowsched_argv(), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--api-port", str(self.api_port),
                "--kubeconfig", str(self.kubeconfig), "--debug-telemetry-injection", *self.extra_args]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.repo), env.get("PYTHONPATH")]))
        # Settings come from flags here; a developer's FLOWSCHED_* must not leak in.
        for k in [k for k in env if k.startswith("FLOWSCHED_")]:
            del env[k]
        # cwd is the session's workdir: relative paths in the service's defaults (its SQLite
        # progress store) land there, never in the checkout.
        self.proc = ManagedProcess("flowsched", argv, self.workdir / "flowsched.log", env=env,
                                   cwd=self.workdir).start()
        proc = self.proc

        def ready() -> bool:
            if not proc.alive():
                raise ClusterUnavailable(f"flowsched exited early; log tail:\n{proc.log_tail()}")
            # Both listeners: the API port's thread may be up before the verbs' loop, or after it.
            path = "/readyz" if wait_ready else "/healthz"
            return all(c.get(path).status_code == 200 for c in (self.http, self.verbs_http))

        try:
            wait_until(ready, ready_timeout_s, interval_s=0.1, what="flowsched /readyz" if wait_ready else "/healthz")
        except TimeoutError as e:
            raise ClusterUnavailable(f"{e}; flowsched log tail:\n{proc.log_tail()}") from e

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def close(self) -> None:
        self.stop()
        self.http.close()
        self.verbs_http.close()

    # ---- debug endpoints ----
    def snapshot(self) -> dict[str, Any]:
        r = self.http.get("/debug/snapshot")
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def inject_telemetry(self, node: str, gpu_util: list[float], fb_free_mib: list[float]) -> None:
        r = self.http.post("/debug/telemetry", json={"node": node, "gpu_util": gpu_util, "fb_free_mib": fb_free_mib})
        r.raise_for_status()


def acting_loop_config(workdir: Path, controller: str, loop: dict[str, Any],
                       extra: dict[str, Any] | None = None) -> Path:
    """A config file for a flowsched that runs one control loop for real (not dry-run) on a
    Lease of its own, with the short intervals an e2e test needs; returns its path."""
    workdir.mkdir(exist_ok=True)
    cfg = workdir / "flowsched.yaml"
    cfg.write_text(yaml.safe_dump({
        **(extra or {}),
        "progress_db": str(workdir / "progress.sqlite"),
        "convergence": {"interval_s": 0.5, "window_s": 30.0},
        "controllers": [controller],
        "control": {"dry_run": False, "identity": f"e2e-{controller}", "lease_name": f"flowsched-e2e-{controller}",
                    "lease_duration_s": 6, "renew_deadline_s": 4, "retry_period_s": 1},
        controller: loop,
    }))
    return cfg


@contextmanager
def scheduling_through(control_plane: ControlPlane, svc: FlowschedService, back_to: FlowschedService
                       ) -> Iterator[FlowschedService]:
    """kube-scheduler calls `svc` while the block runs, then the session's flowsched (`back_to`)
    again, before any other test runs."""
    kubeconfig = control_plane.kubeconfigs["scheduler"]
    control_plane.start_scheduler(scheduler_config_for_tests(svc.verbs_url, kubeconfig))
    try:
        yield svc
    finally:
        control_plane.start_scheduler(scheduler_config_for_tests(back_to.verbs_url, kubeconfig))


@contextmanager
def own_flowsched(control_plane: ControlPlane, config: Path, back_to: FlowschedService) -> Iterator[FlowschedService]:
    """A flowsched of a test module's own, run from `config` (its folder the service's), which
    kube-scheduler calls while the block runs; then the scheduler goes back and it stops."""
    svc = FlowschedService(config.parent, control_plane.kubeconfigs["flowsched"], extra_args=["--config", str(config)])
    try:
        svc.start()
        with scheduling_through(control_plane, svc, back_to):
            yield svc
    finally:
        svc.close()
