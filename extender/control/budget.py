"""Action budgets: at most `per_interval` actions in one loop interval and `per_hour` in any
sliding hour. Pure: time comes from the injected clock, nothing sleeps.

    budget = ActionBudget(per_interval=1, per_hour=6, clock=time.monotonic)
    budget.new_interval()
    if budget.allows():
        ...act...
        budget.spend()
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

HOUR_S = 3600.0


@dataclass
class ActionBudget:
    per_interval: int
    per_hour: int
    clock: Callable[[], float] = time.monotonic
    window_s: float = HOUR_S
    _interval_spent: int = 0
    _spent_at: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.per_interval < 0 or self.per_hour < 0:
            raise ValueError("budgets must be >= 0")

    def _expire(self) -> None:
        cutoff = self.clock() - self.window_s
        while self._spent_at and self._spent_at[0] <= cutoff:
            self._spent_at.popleft()

    def new_interval(self) -> None:
        self._interval_spent = 0

    def allows(self) -> bool:
        self._expire()
        return self._interval_spent < self.per_interval and len(self._spent_at) < self.per_hour

    def spend(self) -> None:
        self._interval_spent += 1
        self._spent_at.append(self.clock())

    def remaining(self) -> dict[str, int]:
        self._expire()
        return {"interval": max(0, self.per_interval - self._interval_spent),
                "hour": max(0, self.per_hour - len(self._spent_at))}
