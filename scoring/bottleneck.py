"""Why is this job slow? Per-job bottleneck diagnosis from live telemetry (after NEARCHUS, NOMS'24).

Pure: numpy and dataclasses, no I/O, no clock. The shell (extender/telemetry/job_signals.py, or
the simulator) turns what it measured over one window into a `JobSignals` value (one entry per pod:
its role, node, GPU utilisation, CPU use against its limit, network bytes/s, and, where the job
reports per pod, its step rate; per job: the step rate, its trend and how it scaled), and
`diagnose` answers one of

    compute-bound        the GPUs are busy: more GPUs would help if the job scales
    input-bound          the GPUs wait while the workers' CPU is at its limit (the input pipeline)
    communication-bound  the GPUs wait while the network (or the parameter servers) is saturated
    straggler            one replica (a minority) is much slower than the others
    idle                 no steps and idle GPUs
    unknown              the evidence is missing, conflicting or not yet stable

with a confidence in [0, 1] and its evidence in words and numbers. Missing metrics are NaN;
a diagnosis needs its own evidence measured, and a rival explanation that could not be
measured lowers its confidence. Unknown is never turned into a guess.

NEARCHUS computes its resource-efficiency value only past a stabilisation threshold; here a
step rate that changed by more than `unstable_trend` over the window gives unknown ("not yet
stable"), except for idle.

The remedies are the existing loops', composed in scoring.remedy: input-bound → the resizer may give CPU and the elastic
optimizer must not grow it; communication-bound → not grown, consolidated onto fewer nodes by
migration (checkpointable jobs only) or given parameter servers within their bounds (PS/worker
jobs); compute-bound → may grow (if it scales); straggler → move the slow replica.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

PS = "ps"
WORKER = "worker"


class Bottleneck(StrEnum):
    COMPUTE = "compute-bound"
    INPUT = "input-bound"
    COMMUNICATION = "communication-bound"
    STRAGGLER = "straggler"
    IDLE = "idle"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BottleneckSettings:
    busy_util: float = 0.80  # workers' mean GPU utilisation at or above: the GPUs are the bottleneck
    starved_util: float = 0.50  # at or below: the GPUs wait for something (between: weaker evidence)
    idle_util: float = 0.05  # below, with no steps: idle
    cpu_saturated: float = 0.90  # CPU use / limit at or above: CPU-bound (CFS throttles at 1.0)
    link_bytes_s: float = 1.25e9  # a pod's share of its node's link (10 Gb/s) when nothing better is known
    net_saturated: float = 0.70  # receive + transmit / link at or above: the network is saturated
    straggler_ratio: float = 0.70  # a replica stepping slower than this x the median is a straggler
    straggler_util_gap: float = 0.30  # ...or whose GPU utilisation is this far below the median
    unstable_trend: float = 0.25  # |relative step-rate change over the window| above: not yet stable
    scaling_poor: float = 0.60  # per-GPU throughput at its size / at its smallest measured size below
    scaling_good: float = 0.80  # ...at or above: it scales well (the elastic optimizer may grow it)
    missing_rival: float = 0.75  # confidence factor per rival explanation that could not be measured
    tie_margin: float = 0.10  # two saturated resources closer than this in strength: unknown
    act_confidence: float = 0.60  # remedies and constraints apply only at or above this confidence
    cpu_raise: float = 0.50  # GiveCpu: raise an input-bound pod's CPU by this fraction a step (to its cpu-max)

    def __post_init__(self) -> None:
        for name in ("busy_util", "starved_util", "idle_util", "cpu_saturated", "net_saturated",
                     "straggler_ratio", "straggler_util_gap", "scaling_poor", "scaling_good", "missing_rival",
                     "act_confidence", "cpu_raise"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 < v <= 1.0):
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")
        if not self.idle_util < self.starved_util <= self.busy_util:
            raise ValueError("need idle_util < starved_util <= busy_util")
        if not self.scaling_poor <= self.scaling_good:
            raise ValueError("need scaling_poor <= scaling_good")
        if not (self.link_bytes_s > 0 and self.unstable_trend > 0 and 0 <= self.tie_margin < 1):
            raise ValueError("link_bytes_s and unstable_trend must be > 0, tie_margin in [0, 1)")


@dataclass(frozen=True)
class JobShape:
    workers: int  # replicas that compute (GPU pods, chief/master included)
    ps: int  # parameter servers (TFJob PS replicas)
    nodes: int  # nodes its pods span
    ps_range: tuple[int, int] | None = None  # flowsched.io/ps "min-max" (bounds on PS replicas); None: fixed


@dataclass(frozen=True)
class JobSignals:
    """What one window measured for one job; NaN where a metric was not there (unknown)."""

    job: str
    pods: tuple[str, ...]
    roles: tuple[str, ...]  # per pod: "ps" or "worker"
    nodes: tuple[str, ...]  # per pod: where it runs
    gpu_util: FloatArray  # per pod, mean utilisation of its GPUs in [0, 1]; NaN unknown or no GPU
    cpu_used: FloatArray  # per pod, cores used (rate over the window)
    cpu_limit: FloatArray  # per pod, cores allowed (quota / period); inf: no limit
    net_bytes_s: FloatArray  # per pod, received + transmitted bytes/s
    pod_step_rate: FloatArray  # per pod, steps/s when the job reports per pod
    step_rate: float = math.nan  # the job's steps/s over the window
    step_trend: float = math.nan  # (rate in this window - rate in the one before) / the one before
    scaling: float = math.nan  # per-GPU throughput at its size / at its smallest measured size
    link_bytes_s: FloatArray | None = None  # per pod, its node's link; None: the settings' default
    ps_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        n = len(self.pods)
        if len(self.roles) != n or len(self.nodes) != n:
            raise ValueError(f"{self.job}: pods, roles and nodes must have one entry per pod")
        for name in ("gpu_util", "cpu_used", "cpu_limit", "net_bytes_s", "pod_step_rate"):
            if np.shape(getattr(self, name)) != (n,):
                raise ValueError(f"{self.job}: {name} must have one entry per pod ({n})")
        if self.link_bytes_s is not None and np.shape(self.link_bytes_s) != (n,):
            raise ValueError(f"{self.job}: link_bytes_s must have one entry per pod ({n})")
        bad = [r for r in self.roles if r not in (PS, WORKER)]
        if bad:
            raise ValueError(f"{self.job}: unknown role(s) {sorted(set(bad))}; expected 'ps' or 'worker'")

    @property
    def shape(self) -> JobShape:
        return JobShape(workers=sum(r == WORKER for r in self.roles), ps=sum(r == PS for r in self.roles),
                        nodes=len(set(self.nodes)), ps_range=self.ps_range)


@dataclass(frozen=True)
class Diagnosis:
    job: str
    kind: Bottleneck
    confidence: float  # 0 for unknown
    evidence: tuple[str, ...]
    shape: JobShape
    where: str = ""  # communication: "ps" or "network"; straggler: the node(s) of the slow pods
    slow_pods: tuple[str, ...] = ()  # straggler: the slow replicas
    scaling: float = math.nan

    def confident(self, s: BottleneckSettings) -> bool:
        return self.kind != Bottleneck.UNKNOWN and self.confidence >= s.act_confidence

    def as_dict(self) -> dict[str, object]:
        return {"bottleneck": str(self.kind), "confidence": round(self.confidence, 3),
                "evidence": list(self.evidence), "where": self.where or None, "slow_pods": list(self.slow_pods),
                "shape": {"workers": self.shape.workers, "ps": self.shape.ps, "nodes": self.shape.nodes}}


# -- the classifier ------------------------------------------------------------------------------------
def _margin(x: float, threshold: float, top: float = 1.0) -> float:
    """Confidence that x >= threshold says what it says: 0.5 at the threshold, 1 at `top`."""
    span = max(top - threshold, 1e-9)
    return 0.5 + 0.5 * min(1.0, max(0.0, (x - threshold) / span))


def _nanmean(a: FloatArray) -> float:
    finite = a[np.isfinite(a)]
    return float(finite.mean()) if finite.size else math.nan


def _nanmax(a: FloatArray) -> float:
    finite = a[np.isfinite(a)]
    return float(finite.max()) if finite.size else math.nan


def _pct(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "unknown"


@dataclass(frozen=True)
class _Saturation:
    strength: float  # NaN: unknown; otherwise the max use/limit (or share of link) over the pods
    where: str
    text: str


def _cpu_ratio(sig: JobSignals, mask: npt.NDArray[np.bool_]) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r = sig.cpu_used[mask] / sig.cpu_limit[mask]
    # No limit (inf): the pod cannot be throttled by its own limit; 0 use of an infinite limit is 0.
    return np.asarray(np.where(np.isinf(sig.cpu_limit[mask]) & np.isfinite(sig.cpu_used[mask]), 0.0, r),
                      dtype=np.float64)


def _net_share(sig: JobSignals, mask: npt.NDArray[np.bool_], s: BottleneckSettings) -> FloatArray:
    link = sig.link_bytes_s[mask] if sig.link_bytes_s is not None else np.full(int(mask.sum()), s.link_bytes_s)
    return np.asarray(sig.net_bytes_s[mask] / link, dtype=np.float64)


def _input_saturation(sig: JobSignals, workers: npt.NDArray[np.bool_]) -> _Saturation:
    ratio = _cpu_ratio(sig, workers)
    known = ratio[np.isfinite(ratio)]
    if known.size == 0:
        return _Saturation(math.nan, "", "workers' CPU use vs limit unknown")
    # The workers run one pipeline each; the job goes at the pace of the slowest, but a single
    # saturated worker is a straggler's business: input-bound needs most workers saturated.
    med = float(np.median(known))
    return _Saturation(med, "workers", f"workers' CPU at {_pct(med)} of their limit (median of {known.size})")


def _comm_saturation(sig: JobSignals, workers: npt.NDArray[np.bool_], ps: npt.NDArray[np.bool_],
                     s: BottleneckSettings) -> _Saturation:
    """The most saturated communication path, in units of the network threshold (so a PS whose CPU
    is at cpu_saturated counts as much as a link at net_saturated)."""
    candidates: list[_Saturation] = []
    if ps.any():
        share = _nanmax(_net_share(sig, ps, s))
        cpu = _nanmax(_cpu_ratio(sig, ps))
        # A PS is saturated by its network or by the CPU that (de)serialises and applies updates.
        if math.isfinite(share) or math.isfinite(cpu):
            norm = max(share / s.net_saturated if math.isfinite(share) else 0.0,
                       cpu / s.cpu_saturated if math.isfinite(cpu) else 0.0)
            candidates.append(_Saturation(norm * s.net_saturated, PS,
                                          f"parameter servers' network at {_pct(share)} of link, "
                                          f"their CPU at {_pct(cpu)} of limit"))
    share_w = _nanmax(_net_share(sig, workers, s))
    if math.isfinite(share_w):
        # On one node without PS, all-reduce goes over NVLink/PCIe, which pod counters do not see.
        one_node = len(set(sig.nodes)) == 1 and not ps.any()
        candidates.append(_Saturation(share_w, "network", f"workers' network at {_pct(share_w)} of link"
                                      + (" (one node)" if one_node else "")))
    if not candidates:
        return _Saturation(math.nan, "", "network use unknown")
    return max(candidates, key=lambda c: c.strength)


def _unknown(sig: JobSignals, why: str, evidence: Iterable[str] = ()) -> Diagnosis:
    return Diagnosis(sig.job, Bottleneck.UNKNOWN, 0.0, (why, *evidence), sig.shape, scaling=sig.scaling)


def _straggler(sig: JobSignals, workers: npt.NDArray[np.bool_], s: BottleneckSettings) -> Diagnosis | None:
    idx = np.flatnonzero(workers)
    if idx.size < 2:
        return None
    slow: set[int] = set()
    evidence: list[str] = []
    confidences: list[float] = []
    rates = sig.pod_step_rate[idx]
    known = np.isfinite(rates)
    if known.sum() >= 2:
        med = float(np.median(rates[known]))
        if med > 0:
            for k in idx[known & (rates < s.straggler_ratio * med)]:
                slow.add(int(k))
                r = float(sig.pod_step_rate[k])
                confidences.append(_margin(1 - r / med, 1 - s.straggler_ratio))
                evidence.append(f"{sig.pods[k]} steps at {r:.3g}/s against a median {med:.3g}/s")
    util = sig.gpu_util[idx]
    known_u = np.isfinite(util)
    if known_u.sum() >= 2:
        med_u = float(np.median(util[known_u]))
        if med_u >= s.starved_util:  # the others are busy (or spin waiting for it at the barrier)
            for k in idx[known_u & (util < med_u - s.straggler_util_gap)]:
                u = float(sig.gpu_util[k])
                slow.add(int(k))
                confidences.append(_margin(med_u - u, s.straggler_util_gap, med_u))
                evidence.append(f"{sig.pods[k]} GPU at {_pct(u)} against a median {_pct(med_u)}")
    if not slow or 2 * len(slow) >= idx.size:  # a majority slow is the job's pace, not a straggler
        return None
    names = tuple(sig.pods[k] for k in sorted(slow))
    where = ",".join(sorted({sig.nodes[k] for k in slow}))
    for k in sorted(slow):
        c = sig.cpu_used[k] / sig.cpu_limit[k] if np.isfinite(sig.cpu_limit[k]) else math.nan
        if math.isfinite(c):
            evidence.append(f"{sig.pods[k]} CPU at {_pct(c)} of limit on {sig.nodes[k]}")
    return Diagnosis(sig.job, Bottleneck.STRAGGLER, min(1.0, max(confidences)), tuple(evidence), sig.shape,
                     where=where, slow_pods=names, scaling=sig.scaling)


def diagnose(sig: JobSignals, s: BottleneckSettings) -> Diagnosis:
    """The job's bottleneck over the window `sig` was measured in (see the module's docstring)."""
    roles = np.array(sig.roles)
    workers = roles == WORKER
    ps = roles == PS
    if not workers.any():
        return _unknown(sig, "no worker pods")
    util = _nanmean(sig.gpu_util[workers])
    stepping = sig.step_rate
    cpu_all = _nanmax(_cpu_ratio(sig, np.ones(len(sig.pods), dtype=bool)))
    net_all = _nanmax(_net_share(sig, np.ones(len(sig.pods), dtype=bool), s))
    base = [f"step rate {stepping:.3g}/s" if math.isfinite(stepping) else "step rate unknown",
            f"GPU utilisation {_pct(util)}"]

    # Idle: no steps and idle GPUs. A job with no steps but busy GPUs is evaluating, compiling or
    # stuck in a way these metrics cannot tell apart: unknown.
    if math.isfinite(stepping) and stepping <= 0.0:
        if math.isfinite(util) and util >= s.idle_util:
            return _unknown(sig, "conflicting: no steps but the GPUs are busy", base)
        conf = 1.0 if math.isfinite(util) else s.missing_rival
        return Diagnosis(sig.job, Bottleneck.IDLE, conf, tuple(base), sig.shape, scaling=sig.scaling)
    if not math.isfinite(stepping) and math.isfinite(util) and util < s.idle_util:
        if math.isfinite(cpu_all) and math.isfinite(net_all) and cpu_all < s.idle_util and net_all < s.idle_util:
            return Diagnosis(sig.job, Bottleneck.IDLE, 0.6, (*base, f"CPU at most {_pct(cpu_all)} of limit, "
                                                             f"network at most {_pct(net_all)} of link"),
                             sig.shape, scaling=sig.scaling)
        return _unknown(sig, "idle GPUs but no step rate, and CPU or network unknown or in use", base)

    if math.isfinite(sig.step_trend) and abs(sig.step_trend) > s.unstable_trend:
        return _unknown(sig, f"not yet stable: step rate changed {sig.step_trend:+.0%} over the window", base)

    straggler = _straggler(sig, workers, s)
    if straggler is not None:
        return straggler

    if not math.isfinite(util):
        return _unknown(sig, "GPU utilisation of its workers unknown", base)

    inp = _input_saturation(sig, workers)
    comm = _comm_saturation(sig, workers, ps, s)
    scales = sig.scaling
    scaling_txt = (f"per-GPU throughput {scales:.0%} of its smallest measured size" if math.isfinite(scales)
                   else "scaling not measured")

    if util >= s.busy_util:
        conf = _margin(util, s.busy_util)
        evidence = [*base, scaling_txt]
        comm_hot = math.isfinite(comm.strength) and comm.strength >= s.net_saturated
        if comm_hot:
            # Collective kernels spin while they wait, so busy GPUs and a saturated network is
            # ambiguous; how the job scaled settles it.
            evidence.append(comm.text)
            if math.isfinite(scales) and scales < s.scaling_poor:
                return Diagnosis(sig.job, Bottleneck.COMMUNICATION, _margin(1 - scales, 1 - s.scaling_poor),
                                 (*evidence, "busy GPUs but poor scaling: waiting in collectives"), sig.shape,
                                 where=comm.where, scaling=scales)
            if not math.isfinite(scales):
                conf *= s.missing_rival
        return Diagnosis(sig.job, Bottleneck.COMPUTE, conf, tuple(evidence), sig.shape, scaling=scales)

    # The GPUs wait. Fully starved GPUs are strong evidence; the band up to busy_util weaker.
    starve = 1.0 if util <= s.starved_util else 0.5 + 0.5 * (s.busy_util - util) / (s.busy_util - s.starved_util)
    in_hot = math.isfinite(inp.strength) and inp.strength >= s.cpu_saturated
    co_hot = math.isfinite(comm.strength) and comm.strength >= s.net_saturated
    evidence = [*base, inp.text, comm.text, scaling_txt]
    if in_hot and co_hot:
        a = inp.strength / s.cpu_saturated
        b = comm.strength / s.net_saturated
        if abs(a - b) < s.tie_margin:
            return _unknown(sig, "conflicting: CPU and network both saturated", evidence[1:])
        in_hot, co_hot = a > b, b > a
        starve *= 0.8  # the loser may be the next bottleneck
    if in_hot:
        conf = _margin(inp.strength, s.cpu_saturated) * starve
        if not math.isfinite(comm.strength):
            conf *= s.missing_rival
        return Diagnosis(sig.job, Bottleneck.INPUT, conf, tuple(evidence), sig.shape, where=inp.where,
                         scaling=scales)
    if co_hot:
        conf = _margin(comm.strength, s.net_saturated) * starve
        if not math.isfinite(inp.strength):
            conf *= s.missing_rival
        return Diagnosis(sig.job, Bottleneck.COMMUNICATION, conf, tuple(evidence), sig.shape, where=comm.where,
                         scaling=scales)
    if (math.isfinite(scales) and scales < s.scaling_poor and sig.shape.nodes > 1
            and math.isfinite(inp.strength) and not math.isfinite(comm.strength)):
        # Network counters missing, CPU known to be free, and it scaled poorly across nodes.
        conf = _margin(1 - scales, 1 - s.scaling_poor) * starve * s.missing_rival
        return Diagnosis(sig.job, Bottleneck.COMMUNICATION, conf,
                         (*evidence, "GPUs wait, CPU free, poor scaling across nodes"), sig.shape,
                         where="network", scaling=scales)
    if not (math.isfinite(inp.strength) and math.isfinite(comm.strength)):
        return _unknown(sig, "GPUs wait but CPU or network use is unknown", evidence)
    return _unknown(sig, "GPUs wait with neither CPU nor network saturated (storage, host or code)", evidence)


def diagnose_all(signals: Iterable[JobSignals], s: BottleneckSettings) -> dict[str, Diagnosis]:
    return {sig.job: diagnose(sig, s) for sig in signals}


def _rate_between(steps: npt.NDArray[np.int64], ts: FloatArray, lo: float, hi: float) -> float:
    """Steps per second over (lo, hi]: from the last point at or before lo (the anchor) to the last
    point in the window; NaN with fewer than two such points. A restart (steps going back) inside
    the window starts the count again from the restart."""
    inside = np.flatnonzero((ts > lo) & (ts <= hi))
    if inside.size == 0:
        return math.nan
    before = np.flatnonzero(ts <= lo)
    idx = np.concatenate([before[-1:], inside])
    back = np.flatnonzero(np.diff(steps[idx]) < 0)
    if back.size:
        idx = idx[back[-1] + 1:]
    if idx.size < 2 or ts[idx[-1]] <= ts[idx[0]]:
        return math.nan
    return float(steps[idx[-1]] - steps[idx[0]]) / float(ts[idx[-1]] - ts[idx[0]])


def step_rate_and_trend(steps: npt.NDArray[np.int64], timestamps: FloatArray, now: float, window_s: float
                        ) -> tuple[float, float]:
    """The step rate over the last window and its relative change from the window before (NaN unknown).
    Points are in arrival order, as the progress store keeps them."""
    if steps.size < 2 or window_s <= 0:
        return math.nan, math.nan
    order = np.argsort(timestamps, kind="stable")
    st, ts = steps[order], timestamps[order]
    now_rate = _rate_between(st, ts, now - window_s, now)
    before = _rate_between(st, ts, now - 2 * window_s, now - window_s)
    trend = (now_rate - before) / before if math.isfinite(now_rate) and math.isfinite(before) and before > 0 \
        else math.nan
    return now_rate, trend


def scaling_from_samples(step_s: Mapping[int, float], gpus: int) -> float:
    """Per-GPU throughput at `gpus` over that at the smallest measured size, from measured seconds
    per step at each GPU count (the same global batch); NaN without a measurement at `gpus` and
    at a smaller size. 1.0 is linear scaling."""
    small = [g for g, t in step_s.items() if 0 < g < gpus and math.isfinite(t) and t > 0]
    t_now = step_s.get(gpus, math.nan)
    if not small or not (math.isfinite(t_now) and t_now > 0):
        return math.nan
    g0 = min(small)
    return (1.0 / t_now / gpus) / (1.0 / step_s[g0] / g0)
