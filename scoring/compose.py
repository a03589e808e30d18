"""What the kernel remembers between rounds (Memory), and how a loop's action shows in the World
the later loops plan on (the composition notes).

The notes are what this replica's loops just did, until the shell's World shows it (a real
cluster's pod watch brings annotations back seconds later; a dry run never does): a job just
rescaled counts as rescaled now (the composition hold), a job just evicted as migrated now with
its new count, and GPUs a rescale promised whose pods do not exist yet count as pods waiting for
them, as they will in seconds (so admission does not release a gang into the same GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scoring.actions import AddPs, Consolidate, ControlAction, Evict, GiveCpu, MoveReplica, Preempt, Scale
from scoring.idle import IdleMemory
from scoring.world import JobState, PendingPod, World

# How long a rescale's missing pods count as waiting: the job's controller creates them within
# seconds; a rescale that never materialises must not reserve GPUs for ever.
MATERIALISE_S = 120.0
# How long a note is kept at least (the composition hold, safety.hold_s, when that is longer).
REMEMBER_S = 1800.0


@dataclass(frozen=True)
class Acted:
    """What this replica did to a job (a loop's action: performed, or planned in a dry run), at `at`."""

    at: float
    gpus: int = 0  # a rescale: the planned size
    per_pod: int = 1  # a rescale: GPUs per pod
    count: int = 0  # an eviction: the job's migrations including this one


@dataclass(frozen=True)
class Memory:
    scaled: Mapping[str, Acted] = field(default_factory=dict)  # job -> its latest rescale
    evicted: Mapping[str, Acted] = field(default_factory=dict)  # job -> its latest eviction
    idle: IdleMemory = field(default_factory=IdleMemory)  # the idle loop's idle times, reports, warnings
    resize_reported: Mapping[str, str] = field(default_factory=dict)  # pod uid -> pending reason told
    remedied: Mapping[str, float] = field(default_factory=dict)  # job -> when its remedy was last told

    def note(self, action: ControlAction, now: float) -> Memory:
        """The memory once `action` was carried out (or would have been, in a dry run)."""
        if isinstance(action, Scale) and action.kind in ("scale-up", "scale-down"):
            return replace(self, scaled={**self.scaled, action.job: Acted(now, gpus=action.gpus,
                                                                          per_pod=max(1, action.per_pod))})
        if isinstance(action, Evict | Preempt):
            return replace(self, evicted={**self.evicted, action.job: Acted(now, count=action.count)})
        if isinstance(action, GiveCpu | Consolidate | AddPs | MoveReplica):
            return replace(self, remedied={**self.remedied, action.job: now})
        return self

    def forget(self, now: float, hold_s: float) -> Memory:
        keep = max(hold_s, REMEMBER_S)
        if all(now - a.at <= keep for book in (self.scaled, self.evicted) for a in book.values()) \
                and all(now - at <= hold_s for at in self.remedied.values()):
            return self
        return replace(self, scaled={k: a for k, a in self.scaled.items() if now - a.at <= keep},
                       evicted={k: a for k, a in self.evicted.items() if now - a.at <= keep},
                       remedied={k: at for k, at in self.remedied.items() if now - at <= hold_s})

    def applied(self, world: World) -> World:
        """The World with the notes on it."""
        if not self.scaled and not self.evicted:
            return world
        jobs, promised = with_noted(world.jobs, self.scaled, self.evicted, world.now)
        # Created last: they queue behind the others.
        return replace(world, jobs=jobs, pending=(*world.pending, *promised))


def with_noted(jobs: tuple[JobState, ...], scaled: Mapping[str, Acted], evicted: Mapping[str, Acted],
               now: float) -> tuple[tuple[JobState, ...], list[PendingPod]]:
    """The jobs as this replica's own recent actions left them (the watch may not show them yet),
    and the pods a rescale promised that do not exist yet."""
    out: list[JobState] = []
    promised: list[PendingPod] = []
    for j in jobs:
        s, e = scaled.get(j.key), evicted.get(j.key)
        if s is not None:
            if now - s.at < j.since_scaled_s:  # (a replace costs microseconds, for every job every round)
                j = replace(j, since_scaled_s=now - s.at)
            missing = s.gpus - j.live_gpus
            if missing > 0 and now - s.at <= MATERIALISE_S:
                promised += [PendingPod(f"{j.key}/promised-{i}", j.key, float(s.per_pod), now - s.at)
                             for i in range(missing // s.per_pod)]
        if e is not None and (now - e.at < j.since_migration_s or e.count > j.migrations):
            j = replace(j, since_migration_s=min(j.since_migration_s, now - e.at),
                        migrations=max(j.migrations, e.count))
        out.append(j)
    return tuple(out), promised
