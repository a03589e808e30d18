"""Per-test helpers over the shared control plane: a namespace, fake nodes, GPU pods, waits."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from tests.cluster.fake_nodes import GPU, create_gpu_nodes, delete_fake_nodes
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import JSON, Kube, KubeError, node_path, pod_path, pods_path
from tests.cluster.kubelet_emulator import KubeletEmulator
from tests.cluster.procs import wait_until

SCHEDULER_NAME = "flowsched"
CHECKPOINTABLE = "flowsched.io/checkpointable"


def gpu_pod(name: str, gpus: int = 1, cpu: str = "1", memory: str = "1Gi", scheduler: str = SCHEDULER_NAME,
            priority_class: str | None = None, annotations: dict[str, str] | None = None,
            labels: dict[str, str] | None = None) -> JSON:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        # Extended resources must have limits equal to requests.
        requests[GPU] = limits[GPU] = str(gpus)
    spec: JSON = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "registry.invalid/e2e/train:0",
                        "resources": {"requests": requests, **({"limits": limits} if limits else {})}}],
        "terminationGracePeriodSeconds": 30,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec}


class Scenario:
    """One test's slice of the cluster. Nodes are cluster-wide, so each test owns all of them."""

    def __init__(self, kube: Kube, emulator: KubeletEmulator, flowsched: FlowschedService) -> None:
        self.kube = kube
        self.emulator = emulator
        self.flowsched = flowsched
        self.ns = f"e2e-{uuid.uuid4().hex[:8]}"
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": self.ns}})

    # ---- objects ----
    def add_nodes(self, *names: str, **kw: Any) -> list[str]:
        create_gpu_nodes(self.kube, list(names), **kw)
        return list(names)

    def create_pod(self, name: str, **kw: Any) -> JSON:
        return self.kube.create(pods_path(self.ns), gpu_pod(name, **kw))

    def pod(self, name: str) -> JSON:
        return self.kube.get(pod_path(self.ns, name))

    def node_of(self, name: str) -> str | None:
        node: str | None = self.pod(name)["spec"].get("nodeName")
        return node

    def pod_exists(self, name: str) -> bool:
        return self.kube.exists(pod_path(self.ns, name))

    # ---- waits ----
    def wait_bound(self, name: str, timeout_s: float = 15.0) -> str:
        wait_until(lambda: bool(self.node_of(name)), timeout_s, what=f"pod {self.ns}/{name} to be bound")
        node = self.node_of(name)
        assert node
        return node

    def wait_running(self, name: str, timeout_s: float = 15.0) -> str:
        wait_until(lambda: self.pod(name).get("status", {}).get("phase") == "Running", timeout_s,
                   what=f"pod {self.ns}/{name} to run")
        return self.wait_bound(name, 1)

    def events(self, name: str) -> list[JSON]:
        items = self.kube.get(f"/api/v1/namespaces/{self.ns}/events")["items"]
        return [e for e in items if e.get("involvedObject", {}).get("name") == name]

    def wait_event(self, name: str, reason: str, contains: str = "", timeout_s: float = 15.0) -> JSON:
        found: list[JSON] = []

        def seen() -> bool:
            found[:] = [e for e in self.events(name)
                        if e.get("reason") == reason and contains in (e.get("message") or "")]
            return bool(found)

        try:
            wait_until(seen, timeout_s, interval_s=0.1, what=f"{reason} event on {name} containing {contains!r}")
        except TimeoutError as e:
            got = [(ev.get("reason"), ev.get("message")) for ev in self.events(name)]
            raise AssertionError(f"{e}; events seen: {got}") from e
        return found[0]

    def wait_snapshot(self, pred: Any, what: str, timeout_s: float = 1.0) -> dict[str, Any]:
        """Poll flowsched's /debug/snapshot until pred(snapshot) holds; returns that snapshot."""
        box: list[dict[str, Any]] = []

        def ok() -> bool:
            box[:] = [self.flowsched.snapshot()]
            return bool(pred(box[0]))

        wait_until(ok, timeout_s, interval_s=0.02, what=f"/debug/snapshot: {what}")
        return box[0]

    # ---- teardown ----
    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Force-delete this test's pods and every fake node, then wait until flowsched forgot them.

        Namespaces stay (no namespace controller runs); they are empty and cost nothing.
        """
        with contextlib.suppress(KubeError):
            for p in self.kube.get(pods_path(self.ns))["items"]:
                self.kube.delete(pod_path(self.ns, p["metadata"]["name"]), grace_period_s=0)
        delete_fake_nodes(self.kube)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left_pods = self.kube.get(pods_path(self.ns))["items"]
            left_nodes = self.kube.get(node_path())["items"]
            if not left_pods and not left_nodes:
                break
            time.sleep(0.05)
        with contextlib.suppress(Exception):
            self.wait_snapshot(lambda s: not s["nodes"] and not any(k.startswith(self.ns + "/") for k in s["pods"]),
                               "fake nodes and this test's pods gone", timeout_s=5)
