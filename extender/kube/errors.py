"""The failures a Kubernetes call can end in, as values the callers branch on.

- ApiError: the apiserver answered with a status >= 300 (raw: status, body, headers).
- TemporaryError(delay_s): try again later, not before delay_s (a 429 from a PodDisruptionBudget,
  a 5xx, a conflict, the apiserver unreachable). The control loop backs that key off; it never
  forces.
- PermanentError: retrying will not help (403 forbidden, 400/422 invalid); the loop records the
  failure and leaves the key alone for `permanent_backoff_s`.
- LostLeadership: a TemporaryError raised when a replica stops being the leader part-way through
  an action (control.errors.LeaderGuard raises it before the next write).

They live at the bottom (kube) so that responses.py can classify an answer into them; the
control loops (kopf's convention) use them under the same names.
"""

from __future__ import annotations

import json


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str, headers: dict[str, str]) -> None:
        self.status, self.body, self.headers = status, body, headers
        try:
            parsed = json.loads(body)
            self.reason = str(parsed.get("reason", ""))
            self.message = str(parsed.get("message", body))
        except (ValueError, AttributeError):
            self.reason, self.message = "", body
        super().__init__(f"{method} {path} -> {status} {self.reason}: {self.message[:300]}")


class ControlError(Exception):
    """Base of the errors a controller's act() may raise (the outcomes of a write that is not a
    plain success)."""


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
