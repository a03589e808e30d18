"""What an elastic job's step times are known to be: one measured step time per GPU count it has
run at steadily, the latest one kept.

Both shells record through `record_step_sample` (extender/control/world_builder.py from the
tracker's step rate of the job's reported progress, benchmarks/sim/world.py from the simulated
job's step time as its per-step reports would time it), so the step times the elastic optimizer's
prior is scaled to (scoring.control.prior_throughput, fitted by scoring.elastic.fit_step_time) are
kept by the same rule in the service and the simulator.
"""

from __future__ import annotations

import math


def record_step_sample(samples: dict[int, float], step_rate: float, held_gpus: int, settling: bool,
                       noise: float = 1.0, batches: dict[int, int] | None = None, batch: int = 0) -> None:
    """Keep 1 / `step_rate` (steps/s measured now) as the step time at `held_gpus`, times `noise`
    (a measurement's error where a shell models one; 1 = exact), and in `batches` the global batch
    it ran at when known (> 0): a step at a larger batch takes longer, and a job whose batch changes
    live would otherwise have its step times compared across batches. Nothing is kept while the
    job is mid-change (a pod starting or terminating), holds no GPU, or has no measurable rate."""
    if settling or held_gpus <= 0 or not (math.isfinite(step_rate) and step_rate > 0):
        return
    samples[held_gpus] = noise / step_rate
    if batches is not None:
        if batch > 0:
            batches[held_gpus] = batch
        else:
            batches.pop(held_gpus, None)
