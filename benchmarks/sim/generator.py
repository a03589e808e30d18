"""A self-contained workload and job model for `flowsched demo` (runs without ../shared).

CALIBRATION was derived from the Pollux artifact's data (petuum/adaptdl osdi21-artifact,
simulator/traces and workloads/workload-1..8.csv, Apache-2.0) with this package's own job
model (benchmarks.sim.jobmodel): per (model, GPUs, global batch) as they occur in the
workloads, the mean epoch time alone on the packed placement (pods of 4 GPUs), the target
epochs, the GPU busy fraction (compute / step time), the step-time factor per extra node
when the same GPUs are spread over pods of 2, and the validation metric after the first and
the last epoch. MIX counts those configurations over the 1,280 jobs of workload-1..8.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.sim.jobmodel import ProfileSet
from benchmarks.sim.workload import JobSpec

# (model, GPUs, batch): (epoch s, epochs, busy fraction, factor per extra node, metric first, last)
CALIBRATION: dict[tuple[str, int, int], tuple[float, int, float, float, float, float]] = {
    ("bert", 6, 384): (1546.3, 2, 0.73, 0.860, 84.88, 88.1),
    ("bert", 8, 384): (1229.9, 2, 0.68, 0.905, 84.81, 88.08),
    ("bert", 12, 384): (796.9, 2, 0.72, 1.012, 84.88, 88.1),
    ("bert", 16, 384): (661.9, 2, 0.64, 0.987, 84.81, 88.08),
    ("cifar10", 6, 2048): (9.0, 100, 0.93, 1.041, 0.4075, 0.9417),
    ("cifar10", 8, 2048): (8.7, 100, 0.77, 0.924, 0.4076, 0.9417),
    ("cifar10", 12, 4096): (6.1, 100, 0.92, 0.999, 0.3744, 0.9412),
    ("cifar10", 16, 4096): (4.8, 100, 0.95, 1.037, 0.3743, 0.9412),
    ("deepspeech2", 6, 320): (51.7, 80, 0.83, 0.978, 99.81, 23.9),
    ("deepspeech2", 8, 320): (44.0, 80, 0.77, 0.922, 99.81, 23.91),
    ("deepspeech2", 12, 640): (31.0, 80, 0.89, 0.996, 100.0, 23.61),
    ("imagenet", 24, 3200): (353.4, 90, 0.92, 0.992, 0.0881, 0.7493),
    ("imagenet", 32, 6400): (304.8, 90, 0.91, 0.993, 0.008057, 0.7493),
    ("imagenet", 48, 6400): (218.8, 90, 0.86, 0.996, 0.008367, 0.7493),
    ("ncf", 1, 32768): (4.6, 10, 0.99, 1.000, 0.628, 0.6892),
    ("yolov3", 4, 64): (282.0, 50, 0.87, 1.763, 22.36, 12.09),
}
MIX: dict[tuple[str, int, int], int] = {
    ("bert", 12, 384): 20, ("bert", 16, 384): 25, ("bert", 6, 384): 23, ("bert", 8, 384): 18,
    ("cifar10", 12, 4096): 133, ("cifar10", 16, 4096): 109, ("cifar10", 6, 2048): 134, ("cifar10", 8, 2048): 119,
    ("deepspeech2", 12, 640): 43, ("deepspeech2", 6, 320): 34, ("deepspeech2", 8, 320): 34,
    ("imagenet", 24, 3200): 9, ("imagenet", 32, 6400): 9, ("imagenet", 48, 6400): 8,
    ("ncf", 1, 32768): 503, ("yolov3", 4, 64): 59,
}  # fmt: skip
STEPS_PER_EPOCH = 100  # synthetic: progress is counted in steps of equal statistical value


class CalibratedApp:
    """Satisfies jobmodel.AppModel from one row per GPU count of CALIBRATION."""

    def __init__(self, name: str, rows: dict[int, tuple[float, int, float, float, float, float]], gpus_per_node: int,
                 batches: tuple[int, int] = (1, 1)):
        self.name = name
        self.rows = rows
        self.gpus_per_node = gpus_per_node
        first = next(iter(rows.values()))
        self.max_epochs = first[1]
        # The batch range the workloads use for this model (the elastic optimizer's candidates).
        # Neither step time nor progress per step depends on the batch here (no gradient noise),
        # so the range only bounds the GPUs a job can use: one sample per GPU at least.
        self.init_batch_size, self.max_batch_size = batches
        self.min_local_bsz = 1
        self.metric_increases = first[5] > first[4]
        self.progress_at = np.arange(self.max_epochs + 1, dtype=np.float64) * STEPS_PER_EPOCH

    def _row(self, replicas: int) -> tuple[float, int, float, float, float, float]:
        known = sorted(self.rows)
        near = min(known, key=lambda r: abs(r - replicas))
        epoch_s, epochs, busy, spread, m0, m1 = self.rows[near]
        # Unprofiled sizes scale linearly from the nearest profiled one.
        return epoch_s * near / replicas, epochs, busy, spread, m0, m1

    def batch_config(self, num_replicas: int, batch_size: int) -> tuple[int, int]:
        return max(1, batch_size // num_replicas), 0

    def throughput(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        r = sum(placement)
        epoch_s, _, busy, spread, _, _ = self._row(r)
        extra = max(0, len([g for g in placement if g]) - math.ceil(r / self.gpus_per_node))
        step = epoch_s / STEPS_PER_EPOCH * spread**extra
        return step, step * (1.0 - busy)

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        return 1.0, 0.0  # no gradient noise: statistical efficiency 1 at every batch size

    def metric(self, batch_size: float, epoch: int) -> float:
        _, epochs, _, _, m0, m1 = next(iter(self.rows.values()))
        return m1 + (m0 - m1) * math.exp(-4.0 * epoch / max(epochs - 1, 1))


def calibrated_profiles(gpus_per_node: int = 4) -> ProfileSet:
    by_model: dict[str, dict[int, tuple[float, int, float, float, float, float]]] = {}
    batches: dict[str, list[int]] = {}
    for (model, gpus, batch), row in CALIBRATION.items():
        by_model.setdefault(model, {})[gpus] = row
        batches.setdefault(model, []).append(batch)
    return ProfileSet({m: CalibratedApp(m, rows, gpus_per_node, (min(batches[m]), max(batches[m])))
                       for m, rows in by_model.items()})


@dataclass(frozen=True)
class GeneratorSettings:
    jobs: int = 160
    hours: float = 8.0  # arrivals spread over this window (the artifact's workloads: 160 in 8 h)
    seed: int = 0


def generate(s: GeneratorSettings) -> list[JobSpec]:
    """Poisson arrivals; (model, GPUs, batch) drawn with the MIX frequencies."""
    rng = np.random.default_rng(s.seed)
    keys = list(MIX)
    p = np.array([MIX[k] for k in keys], dtype=np.float64)
    picks = rng.choice(len(keys), size=s.jobs, p=p / p.sum())
    times = np.sort(rng.uniform(0.0, s.hours * 3600.0, size=s.jobs))
    jobs = []
    for i, (k, t) in enumerate(zip(picks, times, strict=True)):
        model, gpus, batch = keys[int(k)]
        jobs.append(JobSpec(f"{model}-{i}", float(round(t)), model, gpus, batch))
    return jobs
