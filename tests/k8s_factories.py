"""Plain Kubernetes objects (as the API serves them) for unit tests."""

from __future__ import annotations

from typing import Any


def node(name: str, gpus: int = 4, cpu: str = "32", memory: str = "128Gi", ready: bool = True,
         labels: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "resourceVersion": "1"},
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": memory, "pods": "110"},
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name: str, gpus: int = 1, node_name: str | None = None, namespace: str = "default",
        cpu: str = "1", memory: str = "4Gi", labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, phase: str = "Pending", uid: str | None = None,
        priority: int = 0, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)  # GPU pods usually set only the limit
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                            "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True,
                                    "apiVersion": "batch/v1", "uid": "x"}]
    spec: dict[str, Any] = {
        "schedulerName": "flowsched", "priority": priority,
        "containers": [{"name": "main", "image": "trainer", "resources": {"requests": requests, "limits": limits}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}
