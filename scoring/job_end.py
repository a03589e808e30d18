"""When a job is predicted to end, as far as a decision may lean on it, one rule for every loop:
its declared planned end (max_steps) at its step rate, else the end estimate's time to the
plateau when its interval weighs at least `min_evidence` (scoring.remaining.evidence_weight: a
wide interval is weak evidence); NaN when there is no such prediction. Never the simulator's
truth: the simulated jobs declare what their end mix says (benchmarks/sim/variants.py) and the
rest is what the estimator makes of their reported curves.

Admission orders its queues by the remaining GPU-time (predicted_gpu_s), its preemption picks
the victims with the most work left among equals, and the elastic optimizer's horizon ends at
the predicted end, so that a rescale must pay its restart back before the job ends.
"""

from __future__ import annotations

import math

from scoring.remaining import evidence_weight
from scoring.world import JobState


def predicted_end_s(job: JobState, min_evidence: float) -> float:
    end = job.seconds_to_planned_end()
    if math.isfinite(end):
        return end
    est = job.estimate
    if est is None or not math.isfinite(est.remaining_seconds):
        return math.nan
    return est.remaining_seconds if evidence_weight(est.remaining_distribution()) >= min_evidence else math.nan


def predicted_gpu_s(job: JobState, gpus: float, min_evidence: float) -> float:
    """GPU-seconds left at `gpus` GPUs until the predicted end; NaN unknown."""
    end = predicted_end_s(job, min_evidence)
    return end * gpus if math.isfinite(end) else math.nan
