"""The openb node and pod lists, and the arrival sequence FGD's artifact replays.

The artifact (hkust-adsl/kubernetes-scheduler-simulator, "workload tuning" ratio 1.3) tops the
pod list up by sampling pods of the list uniformly at random until the GPU demand would pass
1.3x the cluster's GPU capacity, shuffles the result, and lets pods arrive one by one, never
leaving. We do the same with numpy's generator (so seeds do not reproduce Go's sequences,
only the procedure).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scoring.fragmentation import MILLI, PodKind

REPO_DATA = Path(__file__).resolve().parents[1] / "data" / "alibaba-openb"
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alibaba-openb"
POD_LISTS = ("default", "gpushare40", "multigpu50", "gpuspec33")


def default_data_dir() -> Path:
    """benchmarks/data/alibaba-openb when the repository carries the lists, else ../shared/data."""
    for d in (REPO_DATA, SHARED_DATA):
        if (d / "openb_node_list_gpu_node.csv").is_file():
            return d
    return REPO_DATA


@dataclass(frozen=True)
class Nodes:
    names: tuple[str, ...]
    cpu_milli: npt.NDArray[np.float64]
    memory_mib: npt.NDArray[np.float64]
    gpus: npt.NDArray[np.int64]
    models: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * MILLI


@dataclass(frozen=True)
class Pods:
    """Columns of a pod list (row i is one pod)."""

    cpu_milli: npt.NDArray[np.float64]
    memory_mib: npt.NDArray[np.float64]
    gpus: npt.NDArray[np.int64]
    gpu_milli: npt.NDArray[np.int64]  # per GPU
    spec: tuple[str, ...]  # "" = any model, else "A|B"

    @property
    def count(self) -> int:
        return int(self.gpus.shape[0])

    @property
    def total_milli(self) -> npt.NDArray[np.int64]:
        out: npt.NDArray[np.int64] = self.gpus * self.gpu_milli
        return out

    def kind(self, i: int) -> PodKind:
        s = self.spec[i]
        return PodKind(int(self.cpu_milli[i]), int(self.gpus[i]), int(self.gpu_milli[i]),
                       frozenset(s.split("|")) if s else frozenset())

    def take(self, idx: npt.NDArray[np.int64]) -> Pods:
        return Pods(self.cpu_milli[idx], self.memory_mib[idx], self.gpus[idx], self.gpu_milli[idx],
                    tuple(self.spec[int(i)] for i in idx))


def read_nodes(data_dir: Path) -> Nodes:
    path = data_dir / "openb_node_list_gpu_node.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass --data DIR holding the openb csv lists")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return Nodes(
        names=tuple(r["sn"] for r in rows),
        cpu_milli=np.array([float(r["cpu_milli"]) for r in rows]),
        memory_mib=np.array([float(r["memory_mib"]) for r in rows]),
        gpus=np.array([int(r["gpu"]) for r in rows], dtype=np.int64),
        models=tuple(r["model"] for r in rows),
    )


def read_pods(data_dir: Path, name: str) -> Pods:
    path = data_dir / f"openb_pod_list_{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass --data DIR holding the openb csv lists")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    gpus = np.array([int(r["num_gpu"]) for r in rows], dtype=np.int64)
    milli = np.array([int(r["gpu_milli"]) for r in rows], dtype=np.int64)
    bad = (gpus > 1) & (milli < MILLI)
    if bad.any():
        raise ValueError(f"{path}: {int(bad.sum())} pods ask for a fraction of more than one GPU")
    return Pods(
        cpu_milli=np.array([float(r["cpu_milli"]) for r in rows]),
        memory_mib=np.array([float(r["memory_mib"]) for r in rows]),
        gpus=gpus,
        gpu_milli=np.where(gpus > 0, milli, 0),
        spec=tuple((r.get("gpu_spec") or "").strip() for r in rows),
    )


def arrivals(pods: Pods, capacity_milli: int, rng: np.random.Generator, tune_ratio: float = 1.3) -> Pods:
    """The pod list topped up to tune_ratio x capacity by uniform sampling, then shuffled."""
    demand = int(pods.total_milli.sum())
    target = tune_ratio * capacity_milli
    idx = list(range(pods.count))
    if demand > target:
        keep = rng.permutation(pods.count)
        while demand > target and keep.size:
            demand -= int(pods.total_milli[keep[-1]])
            keep = keep[:-1]
        idx = sorted(int(i) for i in keep)
    else:
        per = pods.total_milli
        while True:
            j = int(rng.integers(pods.count))
            if demand + int(per[j]) > target:
                break
            demand += int(per[j])
            idx.append(j)
    order = rng.permutation(len(idx))
    return pods.take(np.asarray(idx, dtype=np.int64)[order])
