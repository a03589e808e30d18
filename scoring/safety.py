"""The safety rules, applied once for every control loop.

- opt-ins: a job is evicted only if every pod is checkpointable, rescaled only if every pod
  carries the same elastic range (and only within it), a pod is resized only if it opted in;
- namespaces: never one in `excluded_namespaces`, never one labelled `<opt_out_label>: "false"`
  (labels come in with the World, read fresh by the shell every interval);
- composition: a job one loop changed is left to settle for `hold_s` before another loop may
  change it (and the migrator leaves an elastic job the optimizer can still shrink alone);
- budgets: at most max_per_interval actions a round and max_per_hour in any sliding hour.

Pure: time comes in as `now`; the budget's memory is a value the shell keeps.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scoring.settings import SafetySettings
from scoring.world import JobState, World

HOUR_S = 3600.0

# Why a job is not for a loop (None: it is).
EXCLUDED = "namespace excluded"
OPTED_OUT = "namespace opted out"
NOT_CHECKPOINTABLE = "not checkpointable"
NOT_ELASTIC = "not elastic"
HELD_SCALED = "rescaled recently (held for the other loop)"
HELD_MIGRATED = "migrated recently (held for the other loop)"
SHRINKABLE = "elastic and above its minimum: the optimizer shrinks it"
INFERENCE = "inference workload: never moved or rescaled by flowsched"
# The elastic optimizer's refusals of a job it cannot plan (held at its size, its GPUs left to it).
NO_WHOLE_POD_SIZE = "no size in its elastic range is a whole number of its pods: held at its size"
NO_PLANNABLE_SIZE = "no size in its elastic range can be planned: held at its size"


def namespace_refusal(namespace: str, labels: Mapping[str, Mapping[str, str]], s: SafetySettings) -> str | None:
    if namespace in s.excluded_namespaces:
        return EXCLUDED
    if str((labels.get(namespace) or {}).get(s.opt_out_label, "")).lower() == "false":
        return OPTED_OUT
    return None


def migrator_refusal(job: JobState, world: World, s: SafetySettings, elastic_on: bool) -> str | None:
    """Why the migrator may not evict this job (None: it may). The composition rules apply only
    when the elastic optimizer runs too."""
    why = namespace_refusal(job.namespace, world.namespace_labels, s)
    if why is not None:
        return why
    if job.workload == "inference":
        return INFERENCE
    if not job.checkpointable:
        return NOT_CHECKPOINTABLE
    if elastic_on and job.elastic is not None and job.held_gpus > max(1, job.elastic[0]):
        return SHRINKABLE
    if elastic_on and job.since_scaled_s < s.hold_s:
        return HELD_SCALED
    return None


def elastic_refusal(job: JobState, world: World, s: SafetySettings, migrator_on: bool) -> str | None:
    """Why the elastic optimizer may not plan for this job (None: it may)."""
    why = namespace_refusal(job.namespace, world.namespace_labels, s)
    if why is not None:
        return why
    if job.workload == "inference":
        return INFERENCE
    if job.elastic is None:
        return NOT_ELASTIC
    if migrator_on and job.since_migration_s < s.hold_s:
        return HELD_MIGRATED
    return None


def resizer_refusal(namespace: str, world: World, s: SafetySettings) -> str | None:
    """The resizer's opt-in is per pod (checked by its row builder); the namespaces are shared."""
    return namespace_refusal(namespace, world.namespace_labels, s)


@dataclass
class Budget:
    """At most per_interval actions in one round and per_hour in any sliding hour."""

    per_interval: int
    per_hour: int
    _interval_spent: int = 0
    _spent_at: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.per_interval < 0 or self.per_hour < 0:
            raise ValueError("budgets must be >= 0")

    def _expire(self, now: float) -> None:
        while self._spent_at and self._spent_at[0] <= now - HOUR_S:
            self._spent_at.popleft()

    def new_interval(self) -> None:
        self._interval_spent = 0

    def allows(self, now: float) -> bool:
        self._expire(now)
        return self._interval_spent < self.per_interval and len(self._spent_at) < self.per_hour

    def left(self, now: float) -> int:
        """Actions still allowed in this round."""
        self._expire(now)
        return max(0, min(self.per_interval - self._interval_spent, self.per_hour - len(self._spent_at)))

    def spend(self, now: float) -> None:
        self._interval_spent += 1
        self._spent_at.append(now)

    def spent_times(self, now: float) -> tuple[float, ...]:
        """When the actions of the sliding hour were taken (what a successor must honour)."""
        self._expire(now)
        return tuple(self._spent_at)

    def restore(self, times: Iterable[float], now: float) -> None:
        """Adds spends recorded elsewhere (before a restart, by the previous leader) to the
        sliding hour. Several actions of one round share a time, so times are a multiset: a time
        counts as often as the larger of the two records has it (a record loaded twice counts
        once); times before the hour are dropped, times after `now` (another replica's clock
        ahead of this one's) count as now."""
        loaded = Counter(min(float(t), now) for t in times if now - HOUR_S < float(t))
        merged = Counter(self._spent_at) | loaded
        self._spent_at = deque(sorted(merged.elements()))

    def remaining(self, now: float) -> dict[str, int]:
        self._expire(now)
        return {"interval": max(0, self.per_interval - self._interval_spent),
                "hour": max(0, self.per_hour - len(self._spent_at))}
