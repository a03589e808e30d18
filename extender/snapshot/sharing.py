"""How a node shares its GPUs, read from its labels and resources, and which physical GPU a
DCGM sample belongs to.

The modes (DESIGN.md §8):
- exclusive: `nvidia.com/gpu` counts physical GPUs.
- time-slicing / MPS (NVIDIA device plugin): each physical GPU is advertised as N replicas of
  `nvidia.com/gpu` (or of `nvidia.com/gpu.shared` with renameByDefault); GPU feature discovery
  labels `nvidia.com/gpu.replicas=N`, `nvidia.com/gpu.sharing-strategy=time-slicing|mps`,
  `nvidia.com/gpu.count` (physical GPUs) and `nvidia.com/gpu.product` (suffixed `-SHARED` when
  renamed). Which physical GPU a replica lands on is the device plugin's choice.
- MIG: mixed strategy exposes `nvidia.com/mig-<profile>` resources; single strategy exposes
  the slices as `nvidia.com/gpu` with `nvidia.com/mig.strategy=single`.
- HAMi: `nvidia.com/gpu` counts vGPUs, `nvidia.com/gpumem` (MiB), `nvidia.com/gpucores`
  (percent of SMs) and `nvidia.com/gpumem-percentage` on the pod; HAMi's own scheduler picks
  the device.

A pod's demand is turned into the share of one physical GPU it takes, so placement can be
compared across modes; telemetry (DCGM: `gpu` index, `UUID`, `GPU_I_ID` for a MIG instance) is
kept per physical GPU. Parsing never raises on odd labels: an unreadable value is ignored and
the node falls back to what its resources say, with the reason in `notes`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.snapshot.objects import NodeInfo, ObjectError, parse_quantity

GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu.shared"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
COUNT_LABEL = "nvidia.com/gpu.count"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per physical GPU (GFD)
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEM_PCT = "nvidia.com/gpumem-percentage"
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+)g\.(\d+)gb$")
MIG_COMPUTE_SLICES = 7  # A100/H100: a full GPU is 7 compute slices


class Mode(StrEnum):
    EXCLUSIVE = "exclusive"
    TIME_SLICING = "time-slicing"
    MPS = "mps"
    MIG_MIXED = "mig-mixed"
    MIG_SINGLE = "mig-single"
    HAMI = "hami"


@dataclass(frozen=True)
class NodeSharing:
    mode: Mode
    physical_gpus: int | None  # None when the labels do not say
    replicas_per_gpu: int = 1  # time-slicing / MPS
    resource: str = GPU  # the resource pods ask for (gpu or gpu.shared)
    mig_slices: Mapping[str, int] = field(default_factory=dict)  # profile -> allocatable instances
    gpu_memory_mib: float | None = None  # per physical GPU
    notes: tuple[str, ...] = ()

    @property
    def device_plugin_picks(self) -> bool:
        """The physical GPU is chosen after scheduling, by the device plugin or HAMi, not by us."""
        return self.mode in (Mode.TIME_SLICING, Mode.MPS, Mode.HAMI)


def _int_label(labels: Mapping[str, str], key: str, notes: list[str]) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    try:
        v = int(str(raw).strip())
    except ValueError:
        notes.append(f"{key}={raw!r} is not an integer; ignored")
        return None
    if v <= 0:
        notes.append(f"{key}={raw!r} is not positive; ignored")
        return None
    return v


def _quantities(allocatable: Mapping[str, Any], notes: list[str]) -> dict[str, float]:
    out = {}
    for k, v in allocatable.items():
        try:
            out[k] = parse_quantity(v)
        except ObjectError:
            notes.append(f"allocatable {k}={v!r} is not a quantity; ignored")
    return out


def parse_node_sharing(labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> NodeSharing:
    """The node's sharing mode from its labels and status.allocatable (raw quantities)."""
    notes: list[str] = []
    res = _quantities(allocatable, notes)
    count = _int_label(labels, COUNT_LABEL, notes)
    memory = _int_label(labels, MEMORY_LABEL, notes)
    mem = float(memory) if memory else None
    mig = {m.group(0)[len("nvidia.com/mig-"):]: int(v) for k, v in res.items() if (m := MIG_RESOURCE.match(k))}
    if mig:
        return NodeSharing(Mode.MIG_MIXED, count, mig_slices=mig, gpu_memory_mib=mem, notes=tuple(notes))
    if str(labels.get(MIG_STRATEGY_LABEL, "")).lower() == "single" and "-MIG-" in str(labels.get(PRODUCT_LABEL, "")):
        profile = str(labels[PRODUCT_LABEL]).split("-MIG-", 1)[1]
        slices = {profile: int(res.get(GPU, 0))}
        physical = None
        m = re.match(r"^(\d+)g\.", profile)
        if m and res.get(GPU):
            # an estimate: instances x their compute slices over 7 per GPU
            physical = max(1, round(res[GPU] * int(m.group(1)) / MIG_COMPUTE_SLICES))
        return NodeSharing(Mode.MIG_SINGLE, physical, mig_slices=slices, gpu_memory_mib=mem, notes=tuple(notes))
    if HAMI_MEM in res or HAMI_CORES in res:
        return NodeSharing(Mode.HAMI, count, gpu_memory_mib=mem, notes=tuple(notes))
    replicas = _int_label(labels, REPLICAS_LABEL, notes)
    strategy = str(labels.get(STRATEGY_LABEL, "")).lower()
    resource = GPU_SHARED if GPU_SHARED in res else GPU
    if (replicas and replicas > 1) or resource == GPU_SHARED or strategy in ("time-slicing", "mps"):
        r = replicas or 1
        advertised = res.get(resource, 0.0)
        physical = count
        if physical is None and advertised and r:
            physical = int(advertised // r)
            notes.append(f"{COUNT_LABEL} missing: {physical} physical GPUs from {advertised:g} replicas / {r}")
        mode = Mode.MPS if strategy == "mps" else Mode.TIME_SLICING
        return NodeSharing(mode, physical, replicas_per_gpu=r, resource=resource, gpu_memory_mib=mem,
                           notes=tuple(notes))
    physical = int(res[GPU]) if GPU in res else count
    return NodeSharing(Mode.EXCLUSIVE, physical, gpu_memory_mib=mem, notes=tuple(notes))


def node_sharing(node: NodeInfo) -> NodeSharing:
    """The sharing mode of a parsed node."""
    return parse_node_sharing(node.labels, node.allocatable_raw)


@dataclass(frozen=True)
class SharedDemand:
    """What a pod takes, in physical GPUs (a fraction for a share), and the framebuffer it needs
    on the GPU it lands on (MiB; None when it does not say)."""

    physical_gpus: float
    fb_mib: float | None = None


def pod_demand(requests: Mapping[str, Any], node: NodeSharing) -> SharedDemand:
    """The pod's requests (merged container requests/limits, raw quantities) on this node."""
    notes: list[str] = []
    q = _quantities(requests, notes)
    if node.mode in (Mode.MIG_MIXED, Mode.MIG_SINGLE):
        total = 0.0
        fb = None
        for k, v in q.items():
            m = MIG_RESOURCE.match(k)
            if m:
                total += v * int(m.group(1)) / MIG_COMPUTE_SLICES
                fb = (fb or 0.0) + v * float(m.group(2)) * 1024.0
        if node.mode == Mode.MIG_SINGLE and GPU in q and node.mig_slices:
            profile = next(iter(node.mig_slices))
            m2 = re.match(r"^(\d+)g\.(\d+)gb", profile)
            if m2:
                total += q[GPU] * int(m2.group(1)) / MIG_COMPUTE_SLICES
                fb = (fb or 0.0) + q[GPU] * float(m2.group(2)) * 1024.0
        return SharedDemand(total, fb)
    if node.mode == Mode.HAMI:
        vgpus = q.get(GPU, 0.0)
        mem = q.get(HAMI_MEM)
        pct = q.get(HAMI_MEM_PCT)
        cores = q.get(HAMI_CORES)
        if mem is None and pct is not None and node.gpu_memory_mib:
            mem = pct / 100.0 * node.gpu_memory_mib
        # a vGPU's share of its physical GPU: its cores if set, else its memory share, else whole
        if cores is not None:
            share = cores / 100.0
        elif mem is not None and node.gpu_memory_mib:
            share = min(1.0, mem / node.gpu_memory_mib)
        else:
            share = 1.0
        return SharedDemand(vgpus * share, mem * vgpus if mem is not None else None)
    if node.mode in (Mode.TIME_SLICING, Mode.MPS):
        replicas = q.get(node.resource, 0.0)
        return SharedDemand(replicas / max(1, node.replicas_per_gpu))
    return SharedDemand(q.get(GPU, 0.0))


@dataclass(frozen=True)
class PhysicalKey:
    """A physical GPU of a node (DCGM `gpu` index, `UUID`), and the MIG instance when a sample
    is for one (`GPU_I_ID`)."""

    gpu: int
    uuid: str = ""
    instance: int | None = None


def physical_key(sample_labels: Mapping[str, str]) -> PhysicalKey | None:
    """The physical GPU a DCGM sample belongs to; None when the sample has no usable `gpu`."""
    try:
        gpu = int(str(sample_labels.get("gpu", "")).strip())
    except ValueError:
        return None
    if gpu < 0:
        return None
    inst_raw = sample_labels.get("GPU_I_ID")
    instance = None
    if inst_raw not in (None, ""):
        try:
            instance = int(str(inst_raw))
        except ValueError:
            instance = None
    return PhysicalKey(gpu, str(sample_labels.get("UUID", "")), instance)


def per_physical_gpu(samples: Sequence[tuple[Mapping[str, str], float]]) -> dict[int, float]:
    """Utilisation per physical GPU index: a GPU's own sample when there is one; otherwise its
    busiest MIG instance (as the telemetry sources count it, docs/telemetry.md)."""
    whole: dict[int, float] = {}
    parts: dict[int, list[float]] = {}
    for labels, value in samples:
        key = physical_key(labels)
        if key is None or value != value:  # NaN
            continue
        if key.instance is None:
            whole[key.gpu] = value
        else:
            parts.setdefault(key.gpu, []).append(value)
    out = dict(whole)
    for gpu, vals in parts.items():
        out.setdefault(gpu, max(vals))
    return out
