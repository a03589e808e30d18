"""What a job's JobState in the simulator's World is made of, as one comparable key.

The control round asks for a World once per planning loop (elastic, admission, migrator), and
the loops' actions touch a few jobs at most: a job whose key is the same as at the round's last
World has the same JobState, so SimWorldBuilder keeps it instead of building it again (the
tracker lookup, the step-time sample, the gradient statistics). The key holds `now`, so nothing
is kept from one round to the next. Every input of SimWorldBuilder._job that can change within
a round belongs here: a new one left out would hand a loop a stale job (tests/sim/test_sim_speed.py
runs a workload with and without keeping and finds the same results).

Progress enters only as the epoch the gradient statistics are read at, and the series not at all:
within a round the series changes only as the job is brought up to `now`, which the round's first
World does before it estimates, so each later World reads the same series and estimate.
"""

from __future__ import annotations

from collections.abc import Hashable

from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.typed import TypeBook


def job_key_now(engine: Engine, job: SimJob, now: float, marks: object, types: TypeBook, epoch: int
                ) -> tuple[Hashable, ...]:
    """`marks`: the builder's Marks (the loops' notes on the job's pods); `epoch`: the one its
    progress is in, as the builder reads it."""
    i = job.idx
    notes = tuple(getattr(marks, f).get(i) for f in ("migrations", "migrated_at", "attained", "attained_at",
                                                      "scaled_at"))
    measured = types.measured.get(i)
    return (now, job.placement, job.replicas, job.batch_size, job.atomic, job.accum, job.restart_until,
            job.seg_start, epoch, job.cpu_speed, job.slowdown, job.type_speed,
            job.completion, i in engine.gated, engine.queue_time(job), notes,
            tuple(sorted(measured.items())) if measured else (), types.pinned.get(i))
