"""Per-node arrays: the shape in which every placement policy sees the cluster.

The extender keeps one of these up to date from its watches; the simulator builds one
from its simulated cluster. Unknown values are NaN, never zero: a node whose telemetry is
missing or stale must look neither idle nor busy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class NodeArrays:
    """Column view of the candidate nodes (row i is one node).

    gpu_util has one column per GPU slot (percent, NaN where unknown or where the node has
    fewer GPUs than the widest node). completing_gpus counts GPUs held by jobs whose
    convergence state says they finish soon; NaN when no job on the node has progress data.
    """

    gpu_alloc: FloatArray
    gpu_used: FloatArray
    cpu_alloc: FloatArray  # millicores
    cpu_used: FloatArray
    mem_alloc: FloatArray  # bytes
    mem_used: FloatArray
    gpu_util: FloatArray  # (n, g) percent, NaN = unknown
    fb_free_mib: FloatArray  # (n, g) MiB, NaN = unknown
    completing_gpus: FloatArray  # (n,), NaN = no convergence data

    @property
    def count(self) -> int:
        return int(self.gpu_alloc.shape[0])

    def take(self, idx: IntArray) -> NodeArrays:
        """Rows idx, in that order (a gather, so the result owns its memory)."""
        return NodeArrays(
            gpu_alloc=self.gpu_alloc[idx],
            gpu_used=self.gpu_used[idx],
            cpu_alloc=self.cpu_alloc[idx],
            cpu_used=self.cpu_used[idx],
            mem_alloc=self.mem_alloc[idx],
            mem_used=self.mem_used[idx],
            gpu_util=self.gpu_util[idx],
            fb_free_mib=self.fb_free_mib[idx],
            completing_gpus=self.completing_gpus[idx],
        )


def nodes_from_columns(
    gpu_alloc: npt.ArrayLike,
    gpu_used: npt.ArrayLike,
    *,
    cpu_alloc: npt.ArrayLike | None = None,
    cpu_used: npt.ArrayLike | None = None,
    mem_alloc: npt.ArrayLike | None = None,
    mem_used: npt.ArrayLike | None = None,
    gpu_util: npt.ArrayLike | None = None,
    fb_free_mib: npt.ArrayLike | None = None,
    completing_gpus: npt.ArrayLike | None = None,
) -> NodeArrays:
    """Convenience constructor for tests and the simulator; missing columns are unknown/0."""
    ga = np.asarray(gpu_alloc, dtype=np.float64)
    n = ga.shape[0]

    def col(v: npt.ArrayLike | None, fill: float) -> FloatArray:
        return np.full(n, fill) if v is None else np.asarray(v, dtype=np.float64).reshape(n)

    def mat(v: npt.ArrayLike | None) -> FloatArray:
        if v is None:
            return np.full((n, 1), np.nan)
        m = np.asarray(v, dtype=np.float64)
        return m.reshape(n, -1)

    return NodeArrays(
        gpu_alloc=ga,
        gpu_used=col(gpu_used, 0.0),
        cpu_alloc=col(cpu_alloc, np.inf),
        cpu_used=col(cpu_used, 0.0),
        mem_alloc=col(mem_alloc, np.inf),
        mem_used=col(mem_used, 0.0),
        gpu_util=mat(gpu_util),
        fb_free_mib=mat(fb_free_mib),
        completing_gpus=col(completing_gpus, np.nan),
    )
