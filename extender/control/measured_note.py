"""What an elastic job's step times were measured to be, carried in its elastic-plan annotation
(`"measured": {"<GPUs>": [seconds per step, global batch, GPU type]}`), so that a replica that
starts later (an upgrade, a crash, a new leader) knows them.

Kept in memory only (world_builder.WorldBuilder.measured), they were lost with the process: after
an upgrade every elastic job was known at its current size alone, and the prior promised it again
the sizes it had measured as no faster (a job shrunk from 16 to 8 GPUs for that was grown back and
shrunk again: two restarts). The plan is written at each rescale, when the job's table holds
every size it ran at before; the size it runs at now is measured again within a round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scoring.step_samples import MeasuredSteps

MAX_SIZES = 16  # the plan annotation is bounded (objects.parse_plan: 4096 characters)


def note(m: MeasuredSteps | None, planned_gpus: int) -> dict[str, list[Any]]:
    """The job's latest step time at each GPU count it measured, the MAX_SIZES nearest the planned
    size (by ratio) when it measured more; {} when nothing was measured."""
    if m is None or not m.samples:
        return {}
    sizes = sorted(m.samples, key=lambda g: (abs(math.log(max(g, 1) / max(planned_gpus, 1))), g))[:MAX_SIZES]
    return {str(g): [round(m.samples[g], 6), int(m.batches.get(g, 0)), m.types.get(g, "")] for g in sorted(sizes)}


def restore(m: MeasuredSteps, saved: object) -> int:
    """Puts each well-formed entry of a plan's "measured" into `m` (its sizes not measured yet);
    anything else is skipped. Returns how many sizes were taken."""
    if not isinstance(saved, Mapping):
        return 0
    taken = 0
    for key, entry in saved.items():
        parsed = _entry(key, entry)
        if parsed is None or parsed[0] in m.samples:
            continue
        g, step_s, batch, gpu_type = parsed
        m.samples[g] = step_s
        if batch > 0:
            m.batches[g] = batch
            m.by_batch[(g, batch)] = step_s
        if gpu_type:
            m.types[g] = gpu_type
        taken += 1
    return taken


def _entry(key: object, entry: object) -> tuple[int, float, int, str] | None:
    if not (isinstance(entry, list | tuple) and len(entry) == 3 and isinstance(entry[2], str)):
        return None
    try:
        g, step_s, batch = int(str(key)), float(entry[0]), int(entry[1])
    except (TypeError, ValueError):
        return None
    if g <= 0 or not (math.isfinite(step_s) and step_s > 0) or batch < 0:
        return None
    return g, step_s, batch, entry[2]
