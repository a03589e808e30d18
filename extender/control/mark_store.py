"""Where the eviction marks outlive the evicted pods: one annotation on a Lease beside the leader
Lease (`<lease_name>-marks`, lease_notes.py) holding each job's newest mark, as the pods carried it.

The mark on an evicted pod (flowsched.io/migration: origin, time, count, attained service) reaches
every replica through its pod watch, but only while that pod exists. A replica that starts after
the pod was deleted (an upgrade, a crash, a new leader on a fresh node) never saw it: the job's
replacement came back with its attained service, restart count and origin forgotten, so least
attained service put it first again and its per-job cooldown and move cap started afresh. The
leader saves each mark here once the eviction went through (evict_job), and reads them back into
ClusterState the first round it leads (ControlRounds); a record the pod watch holds already, or
a newer one, wins (MigrationBook.seed).

Bounded: marks older than `retain_s` (7 days, the progress store's idle horizon) are dropped at
each save, and at most `max_marks` (the newest) are kept, within MAX_CHARS of JSON (a job key may
be 300 characters long): the apiserver refuses an object whose annotations pass 256 KiB, and a
store that had grown past it could never be written again.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

from extender.control.lease_notes import LeaseNotes
from extender.snapshot.objects import MigrationMark, migration_mark_of

log = logging.getLogger("flowsched.marks")

ANNOTATION = "flowsched.io/marks"
RETAIN_S = 7 * 86400.0
MAX_MARKS = 1000
MAX_CHARS = 160_000
FIELDS = ("from", "at", "count", "attained")  # what MigrationMark reads; the rest stays on the pods


class MarkStore(Protocol):
    def load(self) -> Mapping[str, MigrationMark]: ...

    def save(self, job: str, mark: Mapping[str, Any]) -> None: ...


def decode(value: str | None) -> dict[str, dict[str, Any]]:
    """The annotation's job -> mark objects; anything malformed (the whole value or one entry) is
    left out, and said in the log."""
    if not value:
        return {}
    try:
        raw = json.loads(value)
    except ValueError:
        log.warning("%s is not JSON; the saved marks are ignored", ANNOTATION)
        return {}
    if not isinstance(raw, dict):
        log.warning("%s is not a JSON object; the saved marks are ignored", ANNOTATION)
        return {}
    out = {j: m for j, m in raw.items() if isinstance(j, str) and migration_mark_of(m) is not None}
    if len(out) < len(raw):
        log.warning("%d malformed entries of %s ignored", len(raw) - len(out), ANNOTATION)
    return out


def merged(saved: Mapping[str, dict[str, Any]], job: str, mark: Mapping[str, Any], retain_s: float = RETAIN_S,
           max_marks: int = MAX_MARKS, max_chars: int = MAX_CHARS) -> dict[str, dict[str, Any]]:
    """`saved` with the job's mark set (its FIELDS; unless a newer one is saved already: two leaders
    for a moment), those older than retain_s before the newest dropped, and only the newest kept
    that fit max_marks and max_chars of JSON."""
    out = dict(saved)
    old = out.get(job)
    if old is None or float(old.get("at", -math.inf)) <= float(mark["at"]):
        out[job] = {k: mark[k] for k in FIELDS if k in mark}
    newest = max(float(m["at"]) for m in out.values())
    kept: list[tuple[str, dict[str, Any]]] = []
    chars = 2  # the braces
    for j, m in sorted(out.items(), key=lambda jm: -float(jm[1]["at"])):
        size = len(json.dumps({j: m}, separators=(",", ":"))) - 1  # the entry and its comma
        if float(m["at"]) < newest - retain_s or len(kept) >= max_marks or chars + size > max_chars:
            break
        kept.append((j, m))
        chars += size
    return dict(sorted(kept))


class LeaseMarkStore:
    def __init__(self, api_client: Any, namespace: str, name: str, timeout_s: float = 5.0,
                 retain_s: float = RETAIN_S, max_marks: int = MAX_MARKS) -> None:
        self.notes = LeaseNotes(api_client, namespace, name, timeout_s)
        self.retain_s, self.max_marks = retain_s, max_marks

    def load(self) -> dict[str, MigrationMark]:
        """Job -> its saved mark; nothing saved yet -> {}. Unreadable: raises."""
        marks = {j: migration_mark_of(m) for j, m in decode(self.notes.read().get(ANNOTATION)).items()}
        return {j: m for j, m in marks.items() if m is not None}

    def save(self, job: str, mark: Mapping[str, Any]) -> None:
        """The job's mark as its pods carry it (a JSON object with "from" and "at"). Raises
        ValueError for a mark the pods' parser would not read back."""
        if migration_mark_of(dict(mark)) is None:
            raise ValueError(f"not a migration mark: {dict(mark)!r}")
        self.notes.update(ANNOTATION, lambda old: json.dumps(
            merged(decode(old), job, mark, self.retain_s, self.max_marks), separators=(",", ":")))
