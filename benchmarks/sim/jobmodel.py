"""The Pollux artifact's job model: throughput per placement, progress per epoch, restarts.

Semantics follow petuum/adaptdl@osdi21-artifact `simulator/applications.py` and the Job
class of `simulator/simulator.py` (read, not copied): a job advances in "progress" units
(statistical-efficiency-weighted samples) at goodput = gain / step_time, where gain comes
from the gradient noise scale of the validation trace at the job's batch size; it finishes
after `max_epochs` epochs, whose progress boundaries are the minimum over the validation
traces. The data files are read from a directory passed in (benchmarks/data/pollux/traces).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Target epochs per application, from the artifact's APPLICATIONS table (all have no
# target metric, so a job completes after its last profiled epoch).
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}  # the artifact caps yolov3's per-GPU batch below its profiled max
MAX_GRID_NODES = 16  # the artifact clamps node counts beyond its profiled scalability grid
VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")


@dataclass(frozen=True)
class Validation:
    progress: FloatArray
    iteration: FloatArray
    metric: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray


@dataclass(frozen=True)
class StepCurve:
    """Step and sync time against per-GPU batch size for one placement or (nodes, replicas)."""

    local_bsz: FloatArray
    step_time: FloatArray
    sync_time: FloatArray

    def at(self, local_bsz: float) -> tuple[float, float]:
        return (
            float(np.interp(local_bsz, self.local_bsz, self.step_time)),
            float(np.interp(local_bsz, self.local_bsz, self.sync_time)),
        )


def _read_csv(path: Path) -> dict[str, list[str]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: [r[k] for r in rows] for k in (rows[0].keys() if rows else [])}


def _curves(keys: Sequence[object], bsz: Sequence[float], step: Sequence[float], sync: Sequence[float]) -> dict[
    object, StepCurve
]:
    """Group rows by key; average duplicate (key, local_bsz) rows, as the artifact's groupby does."""
    acc: dict[object, dict[float, list[tuple[float, float]]]] = {}
    for k, b, s, y in zip(keys, bsz, step, sync, strict=True):
        acc.setdefault(k, {}).setdefault(b, []).append((s, y))
    out: dict[object, StepCurve] = {}
    for k, by_bsz in acc.items():
        bs = sorted(by_bsz)
        st = [float(np.mean([v[0] for v in by_bsz[b]])) for b in bs]
        sy = [float(np.mean([v[1] for v in by_bsz[b]])) for b in bs]
        out[k] = StepCurve(np.array(bs, dtype=np.float64), np.array(st), np.array(sy))
    return out


def normalise_placement(placement: Sequence[int]) -> tuple[int, ...]:
    """GPUs per node, empty nodes dropped, rotated to its lexicographically smallest form."""
    p = tuple(int(x) for x in placement if x)
    return min(p[i:] + p[:i] for i in range(len(p))) if p else p


class Application:
    """One model's profile: the artifact's traces/<model>/ directory."""

    def __init__(self, trace_dir: Path, max_epochs: int | None = None, max_local_bsz: int | None = None):
        self.name = trace_dir.name
        vals: dict[int, Validation] = {}
        for path in trace_dir.glob("validation-*.csv"):
            cols = _read_csv(path)
            vals[int(path.stem.split("-")[-1])] = Validation(
                *(np.array(cols[c], dtype=np.float64) for c in VALIDATION_COLUMNS)
            )
        self.validation = dict(sorted(vals.items()))
        self.batch_sizes = np.array(list(self.validation), dtype=np.float64)
        pl = _read_csv(trace_dir / "placements.csv")
        sc = _read_csv(trace_dir / "scalability.csv")
        pl_bsz = [float(x) for x in pl["local_bsz"]]
        pl_step = [float(x) for x in pl["step_time"]]
        pl_sync = [float(x) for x in pl["sync_time"]]
        self.placements: dict[object, StepCurve] = _curves([int(p) for p in pl["placement"]], pl_bsz, pl_step, pl_sync)
        # The artifact's fallback grid: placements averaged per (nodes, replicas, bsz) plus
        # the scalability rows (which cover 6..16 nodes).
        grid_keys: list[object] = [(len(p), sum(int(c) for c in p)) for p in pl["placement"]]
        grid_keys += [(int(n), int(r)) for n, r in zip(sc["num_nodes"], sc["num_replicas"], strict=True)]
        self.grid: dict[object, StepCurve] = _curves(
            grid_keys,
            pl_bsz + [float(x) for x in sc["local_bsz"]],
            pl_step + [float(x) for x in sc["step_time"]],
            pl_sync + [float(x) for x in sc["sync_time"]],
        )
        self.init_batch_size = int(self.batch_sizes[0])
        self.max_batch_size = int(self.batch_sizes[-1])
        self.min_local_bsz = int(min(pl_bsz))
        self.max_local_bsz = int(max_local_bsz or max(pl_bsz))
        self.max_epochs = int(max_epochs or min(len(v.progress) for v in self.validation.values()))
        first = next(iter(self.validation.values())).metric
        self.metric_increases = bool(first[0] < first[-1])
        # progress_at[e] = progress when e epochs are done (min over batch sizes, as the artifact).
        prog = np.min(np.stack([v.progress[: self.max_epochs] for v in self.validation.values()]), axis=0)
        self.progress_at = np.concatenate([[0.0], prog])
        self._tp_cache: dict[tuple[tuple[int, ...], float], tuple[float, float]] = {}

    # -- batch-size interpolation over the validation traces --------------------------------
    def _bracket(self, batch_size: float) -> tuple[int, int, float]:
        """Lower and upper validated batch sizes and the weight of the upper one."""
        bs = self.batch_sizes
        b = min(max(batch_size, bs[0]), bs[-1])
        hi = int(np.searchsorted(bs, b, side="left"))
        if bs[hi] == b:
            return hi, hi, 0.0
        lo = hi - 1
        return lo, hi, float((b - bs[lo]) / (bs[hi] - bs[lo]))

    def _interp(self, get: Callable[[Validation], FloatArray], batch_size: float, epoch: int) -> float:
        lo, hi, w = self._bracket(batch_size)
        vlo = get(self.validation[int(self.batch_sizes[lo])])[epoch]
        vhi = get(self.validation[int(self.batch_sizes[hi])])[epoch]
        return float((1 - w) * vlo + w * vhi)

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        return (
            self._interp(lambda v: v.grad_sqr, batch_size, epoch),
            self._interp(lambda v: v.grad_var, batch_size, epoch),
        )

    def metric(self, batch_size: float, epoch: int) -> float:
        """Validation metric measured after epoch `epoch` (0-based row of the trace)."""
        return self._interp(lambda v: v.metric, batch_size, epoch)

    def iterations(self, batch_size: float, epoch: int) -> float:
        return self._interp(lambda v: v.iteration, batch_size, epoch)

    # -- throughput --------------------------------------------------------------------
    def throughput(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time) for one atomic step on this placement."""
        p = normalise_placement(placement)
        key = (p, float(local_bsz))
        hit = self._tp_cache.get(key)
        if hit is not None:
            return hit
        pid = int("".join(map(str, p))) if p and max(p) < 10 else -1
        curve = self.placements.get(pid)
        res = curve.at(local_bsz) if curve is not None else self._grid_throughput(len(p), sum(p), local_bsz)
        self._tp_cache[key] = res
        return res

    def _grid_throughput(self, nodes: int, replicas: int, local_bsz: float) -> tuple[float, float]:
        # Approximates the artifact's LinearNDInterpolator (no scipy here): linear in
        # replicas within a node-count level, then linear between the two bracketing levels.
        nodes = min(nodes, MAX_GRID_NODES)
        levels = sorted({k[0] for k in self.grid if isinstance(k, tuple)})

        def at_level(n: int) -> tuple[float, float]:
            rs = sorted(k[1] for k in self.grid if isinstance(k, tuple) and k[0] == n)
            r = min(max(replicas, rs[0]), rs[-1])
            j = int(np.searchsorted(rs, r))
            if rs[j] == r:
                return self.grid[(n, r)].at(local_bsz)
            r0, r1 = rs[j - 1], rs[j]
            a, b = self.grid[(n, r0)].at(local_bsz), self.grid[(n, r1)].at(local_bsz)
            w = (r - r0) / (r1 - r0)
            return (1 - w) * a[0] + w * b[0], (1 - w) * a[1] + w * b[1]

        n = min(max(nodes, levels[0]), levels[-1])
        j = int(np.searchsorted(levels, n))
        if levels[j] == n:
            return at_level(n)
        n0, n1 = levels[j - 1], levels[j]
        a, b = at_level(n0), at_level(n1)
        w = (n - n0) / (n1 - n0)
        return (1 - w) * a[0] + w * b[0], (1 - w) * a[1] + w * b[1]

    # -- batch configuration for a fixed (replicas, batch size) job -------------------------
    def batch_config(self, num_replicas: int, batch_size: int) -> tuple[int, int]:
        """(atomic per-GPU batch, gradient accumulation steps), as the artifact's update_local_bsz."""
        local = math.ceil(batch_size / num_replicas - 1e-8)
        accum = math.ceil(local / self.max_local_bsz - 1e-8) - 1
        if num_replicas == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(self.max_batch_size / (num_replicas * (accum + 1))))
        return max(1, atomic), accum


@dataclass(frozen=True)
class RateTable:
    """A job's timeline on one configuration: interference-free seconds to each epoch boundary."""

    progress_at: FloatArray  # (E+1,)
    cum_time: FloatArray  # (E+1,), cum_time[0] = 0
    busy_fraction: float  # share of a step the GPU computes (what DCGM's GPU_UTIL would show)
    batch_size: int
    # Seconds of one optimizer step (its accumulated micro-batches and sync), interference-free: a
    # job's step counter advances at 1 / step_s whatever its progress per step (the gradient noise
    # makes an epoch of progress take more or fewer steps as training goes on).
    step_s: float

    @property
    def total(self) -> float:
        return float(self.cum_time[-1])

    def time_at(self, progress: float) -> float:
        return float(np.interp(progress, self.progress_at, self.cum_time))

    def progress_after(self, progress: float, seconds: float) -> float:
        return float(np.interp(self.time_at(progress) + seconds, self.cum_time, self.progress_at))

    def epoch_of(self, progress: float) -> int:
        """Completed epochs at this progress."""
        return int(np.searchsorted(self.progress_at, progress * (1 + 1e-12), side="right")) - 1

    def steps_between(self, p0: float, p1: float) -> float:
        """Optimizer steps from progress p0 to p1 on this configuration."""
        return (self.time_at(p1) - self.time_at(p0)) / self.step_s


class AppModel(Protocol):
    """What the engine needs of a model: Application (real traces) or a calibrated stand-in."""

    name: str
    max_epochs: int
    init_batch_size: int
    metric_increases: bool
    progress_at: FloatArray

    def batch_config(self, num_replicas: int, batch_size: int) -> tuple[int, int]: ...

    def throughput(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]: ...

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]: ...

    def metric(self, batch_size: float, epoch: int) -> float: ...


@dataclass
class ProfileSet:
    """All applications of a workload, with a cache of rate tables per configuration."""

    apps: Mapping[str, AppModel]
    _tables: dict[tuple[str, tuple[int, ...], int, int], RateTable] = field(default_factory=dict)

    def app_objects(self) -> dict[str, Application]:
        """The real-trace applications (those with profiled batch-size limits)."""
        return {n: a for n, a in self.apps.items() if isinstance(a, Application)}

    def rate_table(self, app_name: str, placement: Sequence[int], atomic: int, accum: int) -> RateTable:
        p = normalise_placement(placement)
        key = (app_name, p, atomic, accum)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        app = self.apps[app_name]
        replicas = sum(p)
        step, sync = app.throughput(p, atomic)
        batch = replicas * atomic * (accum + 1)
        scale = batch / app.init_batch_size
        total_time = step + (step - sync) * accum
        e = app.max_epochs
        sqr = np.array([app.grad_stats(batch, k)[0] for k in range(e)])
        var = np.array([app.grad_stats(batch, k)[1] for k in range(e)])
        gain = (var + sqr) / (var / scale + sqr)
        goodput = gain / total_time
        dur = np.diff(app.progress_at) / goodput
        busy = (step - sync) * (accum + 1) / total_time if total_time > 0 else 0.0
        table = RateTable(app.progress_at, np.concatenate([[0.0], np.cumsum(dur)]), float(busy), batch,
                          float(total_time))
        self._tables[key] = table
        return table


def load_profiles(traces_dir: Path, names: Sequence[str] | None = None) -> ProfileSet:
    names = list(names) if names is not None else sorted(MAX_EPOCHS)
    return ProfileSet(
        {
            n: Application(traces_dir / n, max_epochs=MAX_EPOCHS.get(n), max_local_bsz=MAX_LOCAL_BSZ.get(n))
            for n in names
        }
    )
