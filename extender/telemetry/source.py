"""The telemetry source interface and the pure step shared by every source.

A source returns `GpuSeries` rows (one per exporter series: node, GPU index, metric, value,
sample time); `assemble` turns them into per-node, per-GPU arrays. Values that cannot be a
real reading (NaN, a negative utilisation, DCGM's "blank" sentinels near 2**63) are dropped
and counted, so they become unknown rather than zero or full.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
METRICS = (GPU_UTIL, FB_FREE, FB_USED)

# Plausible ranges; anything outside is a bad sample. 16 TiB of framebuffer is far beyond any
# GPU and far below DCGM's blank sentinels (DCGM_FT_INT64_BLANK = 0x7ffffff0 and up).
_VALID = {GPU_UTIL: (0.0, 100.0), FB_FREE: (0.0, 16 * 1024 * 1024.0), FB_USED: (0.0, 16 * 1024 * 1024.0)}
MAX_GPU_INDEX = 1023  # a larger `gpu` label is garbage, not a GPU


@dataclass(frozen=True)
class GpuSeries:
    node: str
    gpu: int
    metric: str  # one of METRICS
    value: float  # averaged over the window where the source has one
    sampled_at: float  # unix seconds of the newest sample behind `value`
    pod: str = ""  # "namespace/name" when the exporter maps the GPU to a pod
    instance: str = ""  # MIG GPU instance id ("" for a whole GPU)
    uuid: str = ""  # DCGM's UUID label: the physical GPU's (a MIG instance's parent's), "" when absent


@dataclass(frozen=True)
class NodeTelemetry:
    util_pct: tuple[float, ...]  # index = GPU index; NaN where unknown
    fb_free_mib: tuple[float, ...]
    fb_used_mib: tuple[float, ...]
    sampled_at: float  # the oldest of the GPUs' newest samples (a node is as fresh as its stalest GPU)


@dataclass(frozen=True)
class TelemetryReading:
    nodes: Mapping[str, NodeTelemetry]
    pods: Mapping[str, tuple[tuple[str, int], ...]]  # "ns/name" -> ((node, gpu), ...)
    pod_util: Mapping[str, float]  # "ns/name" -> mean utilisation of its GPUs
    bad_samples: Mapping[str, int] = field(default_factory=dict)  # reason -> count
    failed_nodes: frozenset[str] = frozenset()  # nodes whose read failed: keep their last samples
    errors: tuple[str, ...] = ()  # partial failures, for status
    series: int = 0
    uuids: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # GPU uuid -> (node, gpu index)


class TelemetrySource(Protocol):
    name: str

    def fetch(self) -> TelemetryReading:
        """One full read. Raises TelemetryError when nothing could be read."""
        ...

    def close(self) -> None: ...


def check_value(metric: str, value: float, bad: Counter[str]) -> bool:
    if not math.isfinite(value):
        bad["not_finite"] += 1
        return False
    lo, hi = _VALID.get(metric, (-math.inf, math.inf))
    if not lo <= value <= hi:
        bad["out_of_range"] += 1
        return False
    return True


def parse_gpu_index(raw: str | None, bad: Counter[str]) -> int | None:
    try:
        i = int(raw or "")
    except ValueError:
        bad["bad_gpu_label"] += 1
        return None
    if not 0 <= i <= MAX_GPU_INDEX:
        bad["bad_gpu_label"] += 1
        return None
    return i


def node_name(labels: Mapping[str, str], node_label: str) -> str:
    v = labels.get(node_label, "")
    if node_label == "instance" and v and not v.startswith("["):
        v = v.rsplit(":", 1)[0] if v.count(":") == 1 else v
    return v


def pod_key(labels: Mapping[str, str]) -> str:
    pod, ns = labels.get("pod", ""), labels.get("namespace", "")
    return f"{ns or 'default'}/{pod}" if pod else ""


def assemble(series: Iterable[GpuSeries], bad: Counter[str] | None = None, *,
             failed_nodes: frozenset[str] = frozenset(), errors: tuple[str, ...] = ()) -> TelemetryReading:
    """Per-node arrays from series rows.

    Several rows for one GPU happen with MIG (one per GPU instance) and with GPU sharing (one per
    pod): utilisation takes the busiest row (never understate load); framebuffer is summed over
    distinct MIG instances, taking the smallest free / largest used value among duplicates.
    """
    util: dict[str, dict[int, float]] = {}
    fb: dict[str, dict[str, dict[int, dict[str, float]]]] = {FB_FREE: {}, FB_USED: {}}
    newest: dict[tuple[str, int], float] = {}
    pods: dict[str, set[tuple[str, int]]] = {}
    uuids: dict[str, tuple[str, int]] = {}
    n = 0
    for s in series:
        n += 1
        key = (s.node, s.gpu)
        if s.uuid:
            uuids[s.uuid] = key
        newest[key] = max(newest.get(key, -math.inf), s.sampled_at)
        if s.metric == GPU_UTIL:
            per = util.setdefault(s.node, {})
            per[s.gpu] = max(per.get(s.gpu, -math.inf), s.value)
            if s.pod:
                pods.setdefault(s.pod, set()).add(key)
        elif s.metric in fb:
            inst = fb[s.metric].setdefault(s.node, {}).setdefault(s.gpu, {})
            pick = min if s.metric == FB_FREE else max
            inst[s.instance] = pick(inst.get(s.instance, s.value), s.value)
    nodes: dict[str, NodeTelemetry] = {}
    for node in sorted({k[0] for k in newest}):
        gpus = [g for (nd, g) in newest if nd == node]
        width = max(gpus) + 1

        def column(values: Mapping[int, float], width: int = width) -> tuple[float, ...]:
            return tuple(values.get(i, math.nan) for i in range(width))

        free = {g: sum(v.values()) for g, v in fb[FB_FREE].get(node, {}).items()}
        used = {g: sum(v.values()) for g, v in fb[FB_USED].get(node, {}).items()}
        nodes[node] = NodeTelemetry(
            util_pct=column(util.get(node, {})), fb_free_mib=column(free), fb_used_mib=column(used),
            sampled_at=min(newest[(node, g)] for g in gpus),
        )
    pod_util: dict[str, float] = {}
    for pod, where in pods.items():
        vals = [util[nd][g] for nd, g in where]
        pod_util[pod] = sum(vals) / len(vals)
    return TelemetryReading(
        nodes=nodes, pods={p: tuple(sorted(w)) for p, w in pods.items()}, pod_util=pod_util,
        bad_samples=dict(bad or {}), failed_nodes=failed_nodes, errors=errors, series=n, uuids=uuids,
    )
