"""What an elastic job's step times are known to be: one measured step time per GPU count it has
run at steadily, the latest one kept, and (by_batch) the latest at each batch it ran at there.

Both shells record through `record_step_sample` (extender/control/world_builder.py from the
tracker's step rate of the job's reported progress, benchmarks/sim/world.py from the simulated
job's step time as its per-step reports would time it), so the step times the elastic optimizer's
prior is scaled to (scoring.step_prior.prior_throughput, fitted by scoring.elastic.fit_step_time) are
kept by the same rule in the service and the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

BATCHES_PER_SIZE = 4  # by_batch keeps the latest this many batches at each GPU count


@dataclass
class MeasuredSteps:
    """What one job's step times were measured to be (an elastic job's; by_type: any job's on a
    typed cluster), kept by a shell from round to round (extender/control/world_builder.py per job
    key, benchmarks/sim/world.py per job) and forgotten with the job in one piece. JobState carries
    copies of samples, batches and by_batch (step_samples, step_batches, batch_samples)."""

    samples: dict[int, float] = field(default_factory=dict)  # GPUs -> s/step, the latest
    batches: dict[int, int] = field(default_factory=dict)  # GPUs -> the global batch `samples` was measured at
    by_batch: dict[tuple[int, int], float] = field(default_factory=dict)  # (GPUs, batch) -> s/step
    types: dict[int, str] = field(default_factory=dict)  # GPUs -> the GPU type `samples` was measured on
    by_type: dict[str, dict[int, float]] = field(default_factory=dict)  # type -> GPUs -> s/step (record_type_sample)

    def drop_size(self, gpus: int) -> None:
        """Forget what was measured at `gpus` (samples, its batch, its type, every batch there)."""
        self.samples.pop(gpus, None)
        self.batches.pop(gpus, None)
        self.types.pop(gpus, None)
        self.drop_batches(gpus)

    def drop_batches(self, gpus: int) -> None:
        """Forget the step time at every batch measured at `gpus`."""
        for k in [k for k in self.by_batch if k[0] == gpus]:
            self.by_batch.pop(k)


def record_step_sample(m: MeasuredSteps, step_rate: float, held_gpus: int, settling: bool, noise: float = 1.0,
                       batch: int = 0, gpu_type: str = "") -> None:
    """Keep 1 / `step_rate` (steps/s measured now) as the step time at `held_gpus`, times `noise`
    (a measurement's error where a shell models one; 1 = exact), and the global batch it ran at
    when known (> 0): a step at a larger batch takes longer, and a job whose batch changes live
    would otherwise have its step times compared across batches. Nothing is kept while the job is
    mid-change (a pod starting or terminating), holds no GPU, or has no measurable rate.

    `gpu_type` (the one type the job's pods run on; "" unknown): a sample on a type drops those
    measured on another. A job requeued onto another type measured 1 and 3 GPUs on V100s and 2
    and 5 on K80s (7x slower), and the fit through them said that more than 3 GPUs made it
    slower: it ran on 2 K80s for 30 days.

    `by_batch`: the latest step time at each batch the job ran at with that many GPUs, at most
    BATCHES_PER_SIZE of them (the latest): a job whose batch changes live at one size measures
    each batch there, and a fit to the latest alone made the batch it had just left look better
    each time (a yolov3 job flipped 128 <-> 223 every round for 23 minutes)."""
    if settling or held_gpus <= 0 or not (math.isfinite(step_rate) and step_rate > 0):
        return
    if gpu_type:
        for g in [g for g, t in m.types.items() if t != gpu_type]:
            m.drop_size(g)
        m.types[held_gpus] = gpu_type
    else:
        m.types.pop(held_gpus, None)
    step_s = noise / step_rate
    m.samples[held_gpus] = step_s
    if batch > 0:
        m.batches[held_gpus] = batch
        m.by_batch.pop((held_gpus, batch), None)  # re-inserted: the latest last
        m.by_batch[(held_gpus, batch)] = step_s
        here = [k for k in m.by_batch if k[0] == held_gpus]
        for k in here[: max(0, len(here) - BATCHES_PER_SIZE)]:
            m.by_batch.pop(k)
    else:
        m.batches.pop(held_gpus, None)
        m.drop_batches(held_gpus)


def record_type_sample(m: MeasuredSteps, gpu_type: str, step_rate: float, held_gpus: int, settling: bool) -> None:
    """As record_step_sample, kept per GPU type in `by_type` (a typed World): the job's step time at
    `held_gpus` on the one type its pods run on ("" when they span types or the node's type is
    unknown: nothing is kept)."""
    if gpu_type and not settling and held_gpus > 0 and math.isfinite(step_rate) and step_rate > 0:
        m.by_type.setdefault(gpu_type, {})[held_gpus] = 1.0 / step_rate


def type_speeds(samples: Mapping[str, Mapping[int, float]]) -> dict[str, float]:
    """The job's speed (steps/s) on each type it was measured on, at one GPU count so that types
    compare: the count measured on the most types (the largest of those). A type measured only at
    other counts: its nearest count's rate scaled as ideal data parallelism would (x g*/g), which
    flatters the smaller count; speeds compare between types of one job, never between jobs."""
    measured = {t: {g: s for g, s in by.items() if g > 0 and math.isfinite(s) and s > 0} for t, by in samples.items()}
    measured = {t: by for t, by in measured.items() if by}
    if not measured:
        return {}
    counts: dict[int, int] = {}
    for by in measured.values():
        for g in by:
            counts[g] = counts.get(g, 0) + 1
    ref = max(counts, key=lambda g: (counts[g], g))
    out: dict[str, float] = {}
    for t, by in sorted(measured.items()):
        g = ref if ref in by else min(by, key=lambda c: (abs(c - ref), c))
        out[t] = (1.0 / by[g]) * ref / g
    return out
