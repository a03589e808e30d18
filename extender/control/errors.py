"""Leadership checks inside one control-loop action. The errors an action may raise
(TemporaryError, PermanentError, LostLeadership) live in extender.kube.errors, beside the
classification of the apiserver's answers into them."""

from __future__ import annotations

from collections.abc import Callable

from extender.kube.errors import LostLeadership


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
