"""Warnings a client can cause, logged at most once per kind every few seconds with a count:
one client must not be able to fill the log (issue 33, finding 10: 28,767 lines in 10 s)."""

from __future__ import annotations

import logging
import time
from typing import Any


class RateLimitedLog:
    """Logs the first warning of a kind, then at most one every every_s, each with the count so far.
    Used from one event loop (or under the GIL for plain dict updates): no lock."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self.logger = logger
        self.every_s = every_s
        self.last: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def note(self, kind: str, message: str, *args: Any) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) >= self.every_s:
            self.last[kind] = now
            self.logger.warning(message + " (%d so far)", *args, self.counts[kind])
