"""The Alibaba openb trace (ATC'23, alibaba/clusterdata cluster-trace-gpu-v2023) as Kubernetes
objects and as a populated ClusterState, for the extender's latency and memory benchmarks.

Nodes are replicated (name suffixes) to reach sizes beyond the trace's 1,213 GPU nodes.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import data_paths
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState

DEFAULT_DIR = data_paths.openb_dir()


@dataclass(frozen=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int


def read_nodes(data_dir: Path = DEFAULT_DIR) -> list[OpenbNode]:
    with (data_dir / "openb_node_list_gpu_node.csv").open() as f:
        return [OpenbNode(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
                for r in csv.DictReader(f)]


def read_pods(data_dir: Path = DEFAULT_DIR, gpu_only: bool = True) -> list[OpenbPod]:
    with (data_dir / "openb_pod_list_default.csv").open() as f:
        # gpu_milli < 1000 is a GPU fraction: kube-scheduler sees such pods as asking for 1 GPU
        # through nvidia.com/gpu (time-sliced); the trace's num_gpu already says 1 for them.
        pods = [OpenbPod(r["name"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["num_gpu"]))
                for r in csv.DictReader(f)]
    return [p for p in pods if p.gpus > 0] if gpu_only else pods


def replicate(nodes: list[OpenbNode], count: int) -> list[OpenbNode]:
    out = []
    for i in range(count):
        n = nodes[i % len(nodes)]
        out.append(OpenbNode(f"{n.name}-r{i // len(nodes)}", n.cpu_milli, n.memory_mib, n.gpus, n.model))
    return out


def node_object(n: OpenbNode) -> dict[str, Any]:
    """A Node as the API serves it, with the usual labels, conditions and images (≈4 KB)."""
    res = {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi", "nvidia.com/gpu": str(n.gpus),
           "pods": "110", "ephemeral-storage": "1Ti"}
    conditions = [{"type": t, "status": "False", "reason": f"KubeletHas{t}", "message": "ok",
                   "lastHeartbeatTime": "2026-11-22T00:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"}
                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is ready",
                       "lastHeartbeatTime": "2026-11-22T00:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"})
    return {
        "metadata": {
            "name": n.name, "uid": f"uid-{n.name}", "resourceVersion": "12345",
            "labels": {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "nvidia.com/gpu.product": n.model, "nvidia.com/gpu.count": str(n.gpus),
                       "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "gpu"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": res, "allocatable": res, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": n.name}],
            "nodeInfo": {"kubeletVersion": "v1.35.4", "containerRuntimeVersion": "containerd://2.1.0",
                         "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "architecture": "amd64",
                         "operatingSystem": "linux", "machineID": "m", "systemUUID": "s", "bootID": "b"},
            "images": [{"names": [f"registry.example/ml/image-{k}@sha256:{'0' * 64}"], "sizeBytes": 5_000_000_000}
                       for k in range(8)],
        },
    }


def pod_object(p: OpenbPod, name: str, node: str | None = None, namespace: str = "default") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(p.gpus)} if p.gpus else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "resourceVersion": "1",
                     "labels": {"flowsched.io/job": name}},
        "spec": {"schedulerName": "flowsched", "nodeName": node, "priority": 0, "containers": [
            {"name": "main", "image": "trainer",
             "resources": {"requests": {"cpu": f"{p.cpu_milli}m", "memory": f"{p.memory_mib}Mi"}, "limits": limits}}]},
        "status": {"phase": "Running" if node else "Pending"},
    }


def populate(state: ClusterState, node_count: int, pod_count: int, data_dir: Path = DEFAULT_DIR,
             seed: int = 0) -> list[OpenbNode]:
    """Nodes replicated from the trace and pods from the trace placed where they fit (first fit
    from a random start), as running pods; returns the nodes."""
    nodes = replicate(read_nodes(data_dir), node_count)
    for n in nodes:
        state.upsert_node(parse_node(node_object(n)))
    pods = read_pods(data_dir, gpu_only=False)
    rng = np.random.default_rng(seed)
    free_gpu = np.array([n.gpus for n in nodes], dtype=np.int64)
    free_cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
    placed = 0
    for i in range(pod_count):
        p = pods[int(rng.integers(len(pods)))]
        start = int(rng.integers(len(nodes)))
        order = np.roll(np.arange(len(nodes)), -start)
        fits = order[(free_gpu[order] >= p.gpus) & (free_cpu[order] >= p.cpu_milli)]
        node = nodes[int(fits[0])].name if fits.size else None
        if fits.size:
            free_gpu[fits[0]] -= p.gpus
            free_cpu[fits[0]] -= p.cpu_milli
            placed += 1
        state.upsert_pod(parse_pod(pod_object(p, f"pod-{i:06d}", node)))
    return nodes
