"""Simulated clusters declared in a file, and how fast each application runs on each GPU type.

    name: three-types-64            # optional; the tables' header names it (else the file's stem)
    nodes:
      - {count: 4, gpus: 4, gpu: v100}
      - {count: 6, gpus: 4, gpu: p100}
      - {count: 6, gpus: 4, gpu: k80}

Every node group needs the same `gpus` (the engine's nodes are all one size); `gpu` is a short
type or a GPU feature discovery product name (scoring.gpu_types.gpu_type_of). `cpu` (millicores)
and `memory_gib` per node are optional, as ClusterSettings' defaults.

Speeds: the Pollux profiles' step times are taken as a V100's; another type runs an application
at Gavel's measured single-GPU throughput there over a V100's, for the Gavel model and batch size
benchmarks/data/gavel/apps.csv maps it to (benchmarks/data/gavel/SOURCE.md). The whole step scales
(compute and gradient sync alike). A type Gavel did not measure is an error, not a guess.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.data_paths import SHIPPED
from benchmarks.sim.cluster import ClusterSettings, GiB
from scoring.gpu_types import gpu_type_of

GAVEL = SHIPPED / "gavel"
REFERENCE = "v100"  # the type the Pollux profiles' step times stand for


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    settings: ClusterSettings
    groups: tuple[tuple[int, int, str], ...]  # (nodes, GPUs each, type)

    def describe(self) -> str:
        total = sum(n * g for n, g, _ in self.groups)
        by_type: dict[str, int] = {}
        for n, g, t in self.groups:
            by_type[t] = by_type.get(t, 0) + n * g
        return f"cluster {self.name}: {total} GPUs (" + ", ".join(f"{v} {k}" for k, v in by_type.items()) + ")"


def app_classes(folder: Path = GAVEL) -> dict[str, str]:
    """Pollux application -> its model class (the prior's key, scoring.gpu_types.CLASS_PRIOR)."""
    with (folder / "apps.csv").open(newline="") as f:
        return {r["app"]: r["model_class"] for r in csv.DictReader(f)}


def type_speeds(folder: Path = GAVEL) -> dict[tuple[str, str], float]:
    """(application, type) -> its speed there relative to a V100, from Gavel's throughputs."""
    with (folder / "throughputs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    with (folder / "apps.csv").open(newline="") as f:
        apps = list(csv.DictReader(f))
    types = [c for c in rows[0] if c not in ("model", "batch_size")]
    out: dict[tuple[str, str], float] = {}
    for a in apps:
        hit = [r for r in rows if r["model"] == a["gavel_model"] and r["batch_size"] == a["batch_size"]]
        if len(hit) != 1:
            raise ValueError(f"apps.csv maps {a['app']} to {a['gavel_model']} batch {a['batch_size']}, "
                             "which throughputs.csv does not hold once")
        for t in types:
            out[(a["app"], t)] = float(hit[0][t]) / float(hit[0][REFERENCE])
    return out


def _int(entry: dict[str, Any], key: str, where: str) -> int:
    v = entry.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def parse_cluster(doc: Any, name: str, base: ClusterSettings | None = None) -> ClusterSpec:
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise ValueError(f"{name}: expected a mapping with a non-empty list `nodes`")
    groups: list[tuple[int, int, str]] = []
    cpu: set[float] = set()
    mem: set[float] = set()
    for i, e in enumerate(doc["nodes"]):
        where = f"{name}: nodes[{i}]"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: expected a mapping like {{count: 4, gpus: 4, gpu: v100}}")
        unknown = set(e) - {"count", "gpus", "gpu", "cpu", "memory_gib"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        gpu = gpu_type_of(str(e.get("gpu", "")))
        groups.append((_int(e, "count", where), _int(e, "gpus", where), gpu))
        if "cpu" in e:
            cpu.add(float(e["cpu"]))
        if "memory_gib" in e:
            mem.add(float(e["memory_gib"]) * GiB)
    sizes = {g for _, g, _ in groups}
    if len(sizes) != 1 or len(cpu) > 1 or len(mem) > 1:
        raise ValueError(f"{name}: every node group needs the same gpus (and cpu, memory_gib): the simulated "
                         f"nodes are one size; got gpus {sorted(sizes)}")
    base = base or ClusterSettings()
    nodes = tuple(t for n, _, t in groups for _ in range(n))
    speeds: tuple[tuple[str, str, float], ...] = ()
    types = {t for _, _, t in groups}
    if len(types) > 1 or "" not in types:
        table = type_speeds()
        known = sorted({t for _, t in table})
        missing = sorted(t for t in types if t not in known)
        if missing:
            raise ValueError(f"{name}: no measured speeds for GPU type(s) {missing}; the simulator knows "
                             f"{known} (Gavel's measurements, benchmarks/data/gavel)")
        speeds = tuple(sorted((a, t, v) for (a, t), v in table.items() if t in types))
    settings = replace(base, nodes=len(nodes), gpus_per_node=sizes.pop(), node_types=nodes, type_speeds=speeds,
                       cpu_per_node=cpu.pop() if cpu else base.cpu_per_node,
                       mem_per_node=mem.pop() if mem else base.mem_per_node)
    return ClusterSpec(str(doc.get("name") or name), settings, tuple(groups))


def load_cluster(path: Path, base: ClusterSettings | None = None) -> ClusterSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read cluster file {path}: {e}") from e
    return parse_cluster(doc, path.stem, base)
