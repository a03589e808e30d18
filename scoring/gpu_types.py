"""GPU types: names, a prior of relative speed by model class, per-job speeds, and which type
each waiting job should get (DESIGN §10).

Pure: dataclasses and the standard library. The shells bring each node's type (GPU feature
discovery's `nvidia.com/gpu.product` label, or the simulator's cluster file) and each job's
measured speed on the types it ran on; with one type (or none) nothing here changes a decision.

A job's speed on a type is relative to the type its throughput table describes (the simulator's
profiles are V100 step times; a job that reports step times on a type measures that type), so
speeds are comparable between types for one job, never between jobs. For a type the job has not
run on, the prior below, anchored on what it measured where it did run.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

# GPU feature discovery's gpu.product is the marketing name with spaces as dashes
# ("Tesla-V100-SXM2-16GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"). A token of the
# product naming a known chip gives the short type; matching whole tokens keeps "A10" out of "A100".
ALIASES: Mapping[str, str] = {
    "K80": "k80", "P4": "p4", "P40": "p40", "P100": "p100", "V100": "v100", "V100S": "v100", "T4": "t4",
    "A10": "a10", "A10G": "a10g", "A30": "a30", "A40": "a40", "A100": "a100", "L4": "l4", "L40": "l40",
    "L40S": "l40s", "H100": "h100", "H200": "h200", "GH200": "gh200", "B200": "b200",
}

# Speed relative to a V100 by model class: the geometric mean over Gavel's single-GPU measurements
# of the class's models at every batch size measured (benchmarks/data/gavel/throughputs.csv;
# tests/core/test_gpu_types.py derives them again from it). "other": all of Gavel's models.
# Types Gavel did not measure have no prior: 1.0 (as fast as any), until the job measures them.
CLASS_PRIOR: Mapping[str, Mapping[str, float]] = {
    "vision": {"k80": 0.152, "p100": 0.756, "v100": 1.0},  # ResNet-18, ResNet-50, CycleGAN
    "language": {"k80": 0.265, "p100": 0.789, "v100": 1.0},  # Transformer, LM
    "recommendation": {"k80": 1.308, "p100": 2.168, "v100": 1.0},  # Recommendation
    "other": {"k80": 0.297, "p100": 0.943, "v100": 1.0},
}


def gpu_type_of(product: str) -> str:
    """The short type of a gpu.product label value; the value lower-cased when no token is known;
    "" for no label (an untyped node)."""
    p = product.strip()
    if not p:
        return ""
    tokens = p.replace("_", "-").replace(" ", "-").upper().split("-")
    for t in tokens:
        if t in ALIASES:
            return ALIASES[t]
    return p.lower()


@dataclass(frozen=True)
class GpuTypeSettings:
    """How types steer decisions (the typed layer is neutral on a cluster of one type)."""

    enabled: bool = True  # False: types ignored (flowsched-typeblind)
    # A job waits at most this long for the type it was given, then takes any type within min_share
    # of its fastest that can hold it, fastest first (Gavel's point: a slower GPU now beats a faster
    # one much later), every type only when none of those can. Not a far slower one: a running job
    # keeps its type, and an ImageNet-like job that fell back to K80s (0.14 of its V100 speed) held
    # them for 613,713 s (docs/gpu-types.md).
    fallback_s: float = 600.0
    # A type with room is offered to a waiting job only if it runs there at least this share of its
    # fastest speed; else it waits for its fastest type (up to fallback_s). 0: any room will do.
    min_share: float = 0.5
    # How many waiting jobs, in queue order, share out the types' room each round (the ones that
    # can start soon; bounds the assignment's cost on a long queue).
    queue_window: int = 48
    # The service: how often each replica refreshes the types its extender filter keeps jobs on
    # (extender/control/type_plan.py); a job that arrives in between gets its type alone.
    refresh_s: float = 2.0


def cluster_types(nodes: Sequence[str]) -> tuple[str, ...]:
    """The distinct non-empty types of a cluster's nodes, sorted."""
    return tuple(sorted({t for t in nodes if t}))


def typed(types: Collection[str], s: GpuTypeSettings) -> bool:
    """Whether types steer anything: enabled and more than one type in the cluster."""
    return s.enabled and len(types) > 1


def speeds_for(types: Sequence[str], model_class: str, measured: Mapping[str, float]) -> dict[str, float]:
    """The job's speed on each type: measured where it ran, else the class prior scaled by how the
    job's measurements compare with the prior where it did run (geometric mean of the ratios)."""
    prior = CLASS_PRIOR.get(model_class, CLASS_PRIOR["other"])
    base = {t: prior.get(t, 1.0) for t in types}
    ratios = [math.log(v / base[t]) for t, v in measured.items() if t in base and v > 0 and base[t] > 0]
    anchor = math.exp(sum(ratios) / len(ratios)) if ratios else 1.0
    return {t: measured[t] if measured.get(t, 0.0) > 0 else base[t] * anchor for t in types}


def type_weight(speeds: Mapping[str, float], gpu_type: str) -> float:
    """A job's useful work per GPU on `gpu_type` relative to its slowest type (Sia normalises a
    job's goodput by its goodput on its least configuration): within one type's plan, GPUs go to
    the jobs that gain most there. 1.0 when the type is unknown."""
    slowest = min((v for v in speeds.values() if v > 0), default=0.0)
    v = speeds.get(gpu_type, 0.0)
    return v / slowest if slowest > 0 and v > 0 else 1.0


@dataclass(frozen=True)
class Claim:
    """A waiting job asking for a type: its key, its speeds and the GPUs it needs to start."""

    key: str
    speeds: Mapping[str, float]
    gpus: float


def assign_types(claims: Sequence[Claim], room: Mapping[str, float], min_share: float = 0.0) -> dict[str, str]:
    """Each waiting job's type. Its value on a type is its speed there over its best speed (the
    share of its fastest progress it would get); jobs choose in order of regret (best value among
    the types with room for it, minus the second best: Vogel's rule), so that a job that loses much
    on a slow type gets the fast one before a job that loses little (Gavel's effective throughput:
    what a type gives a job relative to what it gives the others). A job with room nowhere at
    `min_share` of its fastest speed or more gets its fastest type (it waits there, up to
    GpuTypeSettings.fallback_s)."""
    left = dict(room)
    out: dict[str, str] = {}
    todo = [c for c in claims if c.speeds]
    while todo:
        pick: tuple[float, int, str] | None = None
        for i, c in enumerate(todo):
            top = max(c.speeds.values())
            vals = sorted(((c.speeds[t] / top, t) for t in c.speeds
                           if left.get(t, 0.0) >= c.gpus - 1e-9 and c.speeds[t] >= min_share * top), reverse=True)
            if not vals:
                continue
            regret = vals[0][0] - (vals[1][0] if len(vals) > 1 else 0.0)
            if pick is None or regret > pick[0] + 1e-12:
                pick = (regret, i, vals[0][1])
        if pick is None:
            break
        _, i, t = pick
        c = todo.pop(i)
        out[c.key] = t
        left[t] -= c.gpus
    for c in todo:
        out[c.key] = max(sorted(c.speeds), key=lambda t: c.speeds[t])
    return out


ANY = "*"  # allowed_types: all nodes, whatever their type


def allowed_types(assigned: str | None, speeds: Mapping[str, float], waited_s: float, s: GpuTypeSettings,
                  gpus: float = 0.0, capacity: Mapping[str, float] | None = None, elastic_min: float = 0.0
                  ) -> tuple[str, ...]:
    """Types a waiting job's pods may bind to, tried in order: its assigned type until it has waited
    fallback_s, then the types within min_share of its fastest that hold what it needs (`gpus`, or
    `elastic_min` > 0, an elastic job's fewest), fastest for it first; every type if none does. A
    job larger than every type (`capacity`: GPUs per type; a 48-GPU job on 16 + 24 + 24) may only
    span types: (ANY,), at its slowest type's speed, rather than never run. () = no constraint
    (no types known)."""
    if not speeds:
        return ()
    if capacity and gpus > max(capacity.values()) + 1e-9:
        return (ANY,)
    fastest = tuple(sorted(speeds, key=lambda t: (-speeds[t], t)))
    if assigned and assigned in speeds and not (math.isfinite(waited_s) and waited_s >= s.fallback_s):
        return (assigned,)
    need = elastic_min if elastic_min > 0 else gpus
    top = speeds[fastest[0]]
    near = tuple(t for t in fastest if speeds[t] >= s.min_share * top
                 and (not capacity or capacity.get(t, 0.0) >= need - 1e-9))
    return near or fastest
