"""Outcomes of a control-loop action that is not a plain success (kopf's convention).

- TemporaryError(delay_s): try again later, not before delay_s (a 429 from a PodDisruptionBudget,
  a 5xx, a conflict, the apiserver unreachable). The loop backs that key off; it never forces.
- PermanentError: retrying will not help (403 forbidden, 400/422 invalid); the loop records the
  failure and leaves the key alone for `permanent_backoff_s`.
"""

from __future__ import annotations


class ControlError(Exception):
    """Base of the errors a controller's act() may raise."""


class TemporaryError(ControlError):
    def __init__(self, message: str, delay_s: float = 30.0) -> None:
        super().__init__(message)
        self.delay_s = max(0.0, float(delay_s))


class PermanentError(ControlError):
    pass
