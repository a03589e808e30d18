"""Fake GPU nodes: Node objects only, no kubelet behind them (see kubelet_emulator.py).

Each node is Ready, untainted, and advertises `nvidia.com/gpu` in capacity/allocatable, which
is all kube-scheduler looks at. A Node may be created with its status in one request (the
node strategy keeps status on create), so no second write is needed.
"""

from __future__ import annotations

from typing import Any

from tests.cluster.kubeapi import JSON, Kube, KubeError, node_path

FAKE_NODE_LABEL = "e2e.flowsched.io/fake-node"
GPU = "nvidia.com/gpu"


def gpu_node(name: str, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", pods: int = 110,
             labels: dict[str, str] | None = None, now: str = "2026-01-01T00:00:00Z") -> JSON:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU: str(gpus)}
    cond: list[dict[str, Any]] = [
        {"type": t, "status": "False", "reason": f"KubeletEmulatorNo{t}", "lastHeartbeatTime": now,
         "lastTransitionTime": now}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    cond.append({"type": "Ready", "status": "True", "reason": "KubeletEmulatorReady",
                 "message": "fake GPU node (no kubelet; pods are played by KubeletEmulator)",
                 "lastHeartbeatTime": now, "lastTransitionTime": now})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              FAKE_NODE_LABEL: "true", **(labels or {})}},
        "spec": {},
        "status": {
            "capacity": resources, "allocatable": dict(resources), "conditions": cond,
            "nodeInfo": {"kubeletVersion": "v1.35.4-emulated", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "emulated://0",
                         "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                         "osImage": "", "kubeProxyVersion": ""},
        },
    }


def create_gpu_nodes(kube: Kube, names: list[str], **kw: Any) -> list[JSON]:
    return [kube.create(node_path(), gpu_node(n, **kw)) for n in names]


def delete_fake_nodes(kube: Kube) -> None:
    nodes = kube.get(node_path(), labelSelector=f"{FAKE_NODE_LABEL}=true")["items"]
    for n in nodes:
        try:
            kube.delete(node_path(n["metadata"]["name"]))
        except KubeError as e:
            if e.status != 404:
                raise
