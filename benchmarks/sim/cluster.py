"""The simulated cluster: nodes with GPUs, CPU and memory, and which job holds each GPU slot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

GiB = float(1 << 30)
Placement = Sequence[tuple[int, int]]  # (node index, GPUs on that node), in allocation order


@dataclass(frozen=True)
class ClusterSettings:
    nodes: int = 16  # the artifact's 16 nodes x 4 GPUs
    gpus_per_node: int = 4
    cpu_per_node: float = 64_000.0  # millicores
    mem_per_node: float = 256 * GiB
    # What a training pod requests besides GPUs (proportional, as GPU jobs are usually sized).
    cpu_per_gpu: float = 12_000.0
    mem_per_gpu: float = 48 * GiB
    # GPU types (benchmarks/sim/cluster_spec.py reads them from a cluster file): each node's type,
    # and each application's speed on a type relative to its profile (app, type, speed). Empty:
    # one untyped kind of GPU, every job at its profile's speed.
    node_types: tuple[str, ...] = ()
    type_speeds: tuple[tuple[str, str, float], ...] = ()

    def speed(self, app: str, nodes: Sequence[int]) -> float:
        """How fast `app` runs on these nodes relative to its profile: on mixed types, the slowest
        type's speed (synchronous data-parallel steps wait for the slowest worker)."""
        if not self.node_types or not self.type_speeds:
            return 1.0
        table = {(a, t): v for a, t, v in self.type_speeds}
        return min((table.get((app, self.node_types[n]), 1.0) for n in nodes), default=1.0)


class Cluster:
    def __init__(self, s: ClusterSettings):
        self.settings = s
        n, g = s.nodes, s.gpus_per_node
        self.gpu_alloc = np.full(n, float(g))
        self.free = np.full(n, g, dtype=np.int64)
        self.slot_job = np.full((n, g), -1, dtype=np.int64)
        self.cpu_alloc = np.full(n, s.cpu_per_node)
        self.mem_alloc = np.full(n, s.mem_per_node)
        self.cpu_used = np.zeros(n)
        self.mem_used = np.zeros(n)
        self.total_gpus = n * g
        self.total_free = n * g
        self.frees = 0  # capacity-freed events (kube-scheduler retries unschedulable pods on these)

    @property
    def gpu_used(self) -> npt.NDArray[np.float64]:
        return self.gpu_alloc - self.free

    def fits(self, node: int, gpus: int) -> bool:
        s = self.settings
        return bool(
            self.free[node] >= gpus
            and self.cpu_used[node] + gpus * s.cpu_per_gpu <= self.cpu_alloc[node] + 1e-6
            and self.mem_used[node] + gpus * s.mem_per_gpu <= self.mem_alloc[node] + 1e-6
        )

    def allocate(self, job: int, placement: Placement) -> None:
        s = self.settings
        for node, gpus in placement:
            if self.free[node] < gpus:
                raise ValueError(f"node {node} has {self.free[node]} free GPUs, job {job} wants {gpus}")
            slots = np.flatnonzero(self.slot_job[node] < 0)[:gpus]
            self.slot_job[node, slots] = job
            self.free[node] -= gpus
            self.cpu_used[node] += gpus * s.cpu_per_gpu
            self.mem_used[node] += gpus * s.mem_per_gpu
            self.total_free -= gpus

    def release(self, job: int, placement: Placement) -> None:
        s = self.settings
        for node, gpus in placement:
            row = self.slot_job[node]
            row[row == job] = -1
            self.free[node] += gpus
            self.cpu_used[node] -= gpus * s.cpu_per_gpu
            self.mem_used[node] -= gpus * s.mem_per_gpu
            self.total_free += gpus
        self.frees += 1

    def greedy_most_free(self, gpus: int) -> list[tuple[int, int]] | None:
        """Take GPUs from the node with most free first (lowest index on ties), as the
        artifact's Tiresias allocator does; None if the cluster has too few free GPUs."""
        if self.total_free < gpus:
            return None
        free = self.free.copy()
        out: list[tuple[int, int]] = []
        while gpus > 0:
            node = int(np.argmax(free))
            take = int(min(free[node], gpus))
            out.append((node, take))
            free[node] -= take
            gpus -= take
        return out
