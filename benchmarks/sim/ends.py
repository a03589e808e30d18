"""How a simulated job ends, and what it tells flowsched about it (DESIGN.md §11).

Each job's JobSpec.end_rule (benchmarks/sim/variants.py END_MIXES) says what it declares:
- "planned": its planned end, training.max_steps in the optimizer steps it reports (SimJob's
  planned_steps: the steps its epochs take at its batch); it ends there;
- "early": the early-stopping rule EARLY_STOPPING on its reported validation series (one point an
  epoch, the metric the engine emits), as a Lightning / Keras / Hugging Face callback would; it
  ends at the epoch where that rule fires on its own reported curve, or at its epochs' end when
  the rule never fires;
- "none": nothing; it ends at its epochs' end (stopped by a person), which nobody told flowsched.

The core is told only the declaration (`declared`), never the epoch the job will stop at: its
end estimate (scoring.job_end through the tracker) is all it has. The engine asks `stop_epoch`
where the job ends, from the series the job has reported so far and the curve it will report
from now on at its current batch; the noise on each reported point is drawn once per (seed,
job, epoch) (`metric_noise`), so the curve the engine stops on is the one the job reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from benchmarks.sim.jobmodel import AppModel
from scoring.job_end import rule_state
from scoring.stopping import EarlyStopping

FloatArray = npt.NDArray[np.float64]

# What a user would write: stop after 10 validations without a new best (Keras' examples use
# 10; Lightning's default is 3, which on a 1 %-noisy curve stops jobs far too early).
EARLY_STOPPING = EarlyStopping(patience=10, min_delta=0.0)


def declared(end_rule: str, planned_steps: float) -> tuple[float | None, EarlyStopping | None]:
    """(max_steps, early_stopping) the job reports in its progress API `training` object;
    planned_steps: its planned end in the steps it reports (None until it has one)."""
    if end_rule == "planned":
        return (float(planned_steps) if math.isfinite(planned_steps) else None), None
    if end_rule == "early":
        return None, EARLY_STOPPING
    return None, None


def metric_noise(seed: int, idx: int, epochs: int) -> FloatArray:
    """Standard-normal noise on each of a job's reported points, fixed by (seed, job): the same
    whichever policy runs it and whatever else the engine draws."""
    return np.random.default_rng([seed, idx, 0x5EED]).standard_normal(epochs)


def stop_epoch(app: AppModel, end_rule: str, reported: Sequence[tuple[float, int, float]], done: int,
               batch_size: float, noise: FloatArray, noise_sd: float) -> int:
    """Epochs the job runs before it stops: its application's epochs, or for "early" the epoch at
    which EARLY_STOPPING fires on its curve: the points it has reported (epochs 1..done) and the
    points it will report from epoch done + 1 on at `batch_size`, with the same noise."""
    last = int(app.max_epochs)
    if end_rule != "early":
        return last
    past = {int(k): float(v) for _, k, v in reported if int(k) <= done}
    values = [past[k] if k in past else app.metric(batch_size, k - 1) * (1.0 + noise_sd * float(noise[k - 1]))
              for k in range(1, last + 1)]
    curve = np.asarray(values, dtype=np.float64)
    _, _, fired = rule_state(-curve if app.metric_increases else curve, EARLY_STOPPING)
    return last if fired < 0 else max(fired + 1, min(done, last), 1)


def end_progress(progress_at: FloatArray, epoch: int) -> float:
    """Progress at which a job that stops after `epoch` epochs is done."""
    return float(progress_at[min(max(epoch, 0), progress_at.size - 1)])

