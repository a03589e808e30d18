"""The API front's own refusals (429, 503, 413, 404), carried to the verbs' process's /metrics.

The front answers these itself, so the verbs' process never saw them and a platform engineer
could not tell that tenant calls were being turned away. The front counts them by (code, reason)
and, about once a second, writes what it counted since the last write as one JSON line to a pipe
its parent gave it; the parent reads the pipe on its loop's tick and adds the counts to
`flowsched_api_front_refusals_total`. A line that does not fit the pipe now is kept and sent
with the next (counts are added up, never dropped); a restarted front starts from zero, which
the parent's counter does not see.

No FastAPI or prometheus_client here: the front imports this.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os

import orjson

log = logging.getLogger("flowsched.front")

Key = tuple[str, str]  # (HTTP status, reason)


class RefusalTally:
    """The front's side: counts since the last flush."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.pending: collections.Counter[Key] = collections.Counter()
        if fd is not None:
            os.set_blocking(fd, False)  # a parent that stops reading must not stop the front

    def note(self, code: int, reason: str) -> None:
        self.pending[(str(code), reason)] += 1

    def flush(self) -> None:
        if self.fd is None or not self.pending:
            return
        line = orjson.dumps({f"{code}/{reason}": n for (code, reason), n in self.pending.items()}) + b"\n"
        try:
            # A few dozen bytes, well under PIPE_BUF: written whole or not at all.
            os.write(self.fd, line)
        except BlockingIOError:
            return  # the pipe is full: kept for the next flush
        except OSError:
            self.fd = None  # the parent is gone; the front exits on its next tick
            return
        self.pending.clear()

    def close(self) -> None:
        self.flush()
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class RefusalReader:
    """The parent's side: what the front has written so far, read without blocking."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.buffer = b""
        os.set_blocking(fd, False)

    def drain(self) -> dict[Key, int]:
        counts: collections.Counter[Key] = collections.Counter()
        while self.fd is not None:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:  # the front closed its end (exited)
                self.close()
                break
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            try:
                for key, n in orjson.loads(line).items():
                    code, reason = key.split("/", 1)
                    counts[(code, reason)] += int(n)
            except (orjson.JSONDecodeError, AttributeError, ValueError) as e:
                log.error("the API front's refusal counts could not be read: %s", e)
        return dict(counts)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
