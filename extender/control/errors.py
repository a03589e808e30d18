"""Outcomes of a control-loop action that is not a plain success (kopf's convention).

- TemporaryError(delay_s): try again later, not before delay_s (a 429 from a PodDisruptionBudget,
  a 5xx, a conflict, the apiserver unreachable). The loop backs that key off; it never forces.
- PermanentError: retrying will not help (403 forbidden, 400/422 invalid); the loop records the
  failure and leaves the key alone for `permanent_backoff_s`.
"""

from __future__ import annotations

from collections.abc import Callable


class ControlError(Exception):
    """Base of the errors a controller's act() may raise."""


class TemporaryError(ControlError):
    def __init__(self, message: str, delay_s: float = 30.0) -> None:
        super().__init__(message)
        self.delay_s = max(0.0, float(delay_s))


class PermanentError(ControlError):
    pass


class LostLeadership(TemporaryError):
    """This replica stopped being the leader part-way through an action: it stopped before the
    next write. `writes`: how many writes of the action it had made."""

    def __init__(self, what: str, writes: int, delay_s: float = 30.0) -> None:
        super().__init__(f"lost_leadership: {what} after {writes} write(s)", delay_s)
        self.writes = writes


class LeaderGuard:
    """Checks leadership before each write of one action (one action is many API calls, each
    with its own timeout: the loop's check before the action is not enough) and counts them.

        guard = LeaderGuard(lambda: ctx.leader.is_leader)
        guard("evict t/j-0")   # raises LostLeadership when no longer leader; else counts the write
    """

    def __init__(self, still_leader: Callable[[], bool]) -> None:
        self.still_leader = still_leader
        self.writes = 0

    def __call__(self, before: str) -> None:
        if not self.still_leader():
            raise LostLeadership(f"stopped before {before}", self.writes)
        self.writes += 1
