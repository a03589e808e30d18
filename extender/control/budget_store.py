"""Where the loops' hourly budgets outlive the leader: a small Lease object beside the leader
Lease (`<lease_name>-budgets`, lease_notes.py), one annotation per loop holding the times of its
real actions in the sliding hour.

Without it a restart, a crash loop or a change of leader started every budget afresh: a leader
restarting five times in an hour could evict 36 jobs against a limit of 6. The leader loads
them before every plan (ControlLoop: the Lease may have changed hands since its last tick); each
real action saves its loop's times. Dry-run spends are never saved: switching to --act must not
find the hour already spent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from extender.control.lease_notes import LeaseNotes

ANNOTATION = "flowsched.io/spent-"  # + loop name


class BudgetStore(Protocol):
    def load(self) -> Mapping[str, list[float]]: ...

    def save(self, loop: str, times: Iterable[float]) -> None: ...


def parse_times(value: str) -> list[float]:
    """An annotation's JSON list -> the finite times in it (anything else: none)."""
    try:
        raw = json.loads(value)
    except ValueError:
        return []
    if not isinstance(raw, list):
        return []
    return [float(t) for t in raw if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)]


class LeaseBudgetStore:
    def __init__(self, api_client: Any, namespace: str, name: str, timeout_s: float = 5.0) -> None:
        self.notes = LeaseNotes(api_client, namespace, name, timeout_s)

    def load(self) -> dict[str, list[float]]:
        """Loop -> its saved times; nothing saved yet -> {}. Unreadable: raises (the caller plans
        nothing rather than act on a budget it could not read)."""
        return {k[len(ANNOTATION):]: parse_times(v) for k, v in self.notes.read().items() if k.startswith(ANNOTATION)}

    def save(self, loop: str, times: Iterable[float]) -> None:
        # Full precision: json writes a float so that it reads back equal, and Budget.restore
        # matches spends by value (a rounded copy would count as another action).
        value = json.dumps([float(t) for t in times])
        self.notes.update(ANNOTATION + loop, lambda _old: value)
