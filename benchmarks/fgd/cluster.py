"""The replayed cluster as arrays: free CPU, memory and per-GPU share of every node."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from benchmarks.fgd.workload import Nodes
from scoring.fragmentation import MILLI

MAX_GPUS = 8  # openb's widest node


@dataclass
class Cluster:
    nodes: Nodes
    cpu_left: npt.NDArray[np.float64]
    mem_left: npt.NDArray[np.float64]
    gpu_free: npt.NDArray[np.float64]  # (n, MAX_GPUS) milli; a slot the node lacks is 0
    full_gpus: npt.NDArray[np.int64]  # (n,) GPUs with all 1000 milli free
    most_free: npt.NDArray[np.float64]  # (n,) largest free share on one GPU
    used_milli: int = 0

    @classmethod
    def empty(cls, nodes: Nodes) -> Cluster:
        g = int(nodes.gpus.max()) if nodes.count else 0
        if g > MAX_GPUS:
            raise ValueError(f"a node has {g} GPUs; the replay supports at most {MAX_GPUS}")
        free = np.where(np.arange(MAX_GPUS)[None, :] < nodes.gpus[:, None], float(MILLI), 0.0)
        return cls(nodes, nodes.cpu_milli.copy(), nodes.memory_mib.copy(), free, nodes.gpus.copy(),
                   free.max(axis=1))

    def feasible(self, cpu: float, mem: float, gpus: int, milli: int, access: npt.NDArray[np.bool_]) -> npt.NDArray[
            np.int64]:
        ok = (self.cpu_left >= cpu) & (self.mem_left >= mem)
        if gpus == 1 and milli < MILLI:
            ok &= self.most_free >= milli
        elif gpus > 0:
            ok &= self.full_gpus >= gpus
        if gpus > 0:
            ok &= access
        out: npt.NDArray[np.int64] = np.flatnonzero(ok)
        return out

    def place(self, node: int, cols: list[int], cpu: float, mem: float, milli: int) -> None:
        self.cpu_left[node] -= cpu
        self.mem_left[node] -= mem
        for c in cols:
            if self.gpu_free[node, c] < milli:
                raise AssertionError(f"GPU {c} of node {node} has {self.gpu_free[node, c]} < {milli}")
            self.gpu_free[node, c] -= milli
        row = self.gpu_free[node]
        self.full_gpus[node] = int((row >= MILLI).sum())
        self.most_free[node] = float(row.max())
        self.used_milli += milli * len(cols)


def best_fit_gpu(row: npt.NDArray[np.float64], milli: int) -> int:
    """The GPU with the least free share that still fits (first on ties), as open-gpu-share's 'best'."""
    fits = np.flatnonzero(row >= milli)
    return int(fits[np.argmin(row[fits])])


def random_gpu(row: npt.NDArray[np.float64], milli: int, rng: np.random.Generator) -> int:
    fits = np.flatnonzero(row >= milli)
    return int(rng.choice(fits))


def whole_gpus(row: npt.NDArray[np.float64], k: int) -> list[int]:
    """The first k fully free GPUs (as the artifact's exclusive allocation)."""
    return [int(c) for c in np.flatnonzero(row >= MILLI)[:k]]
