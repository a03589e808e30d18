"""Eviction marks that outlive the evicted pods (extender/control/mark_store.py): what is saved and
pruned, how a replica takes them into its state, that the rounds read them once, the first round
they lead, and that an eviction saves its mark only once a pod carrying it went. The Lease itself
is tested against the real apiserver in test_control_leader.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.control.events import LogRecorder
from extender.control.eviction import evict_job
from extender.control.loop import ControlLoop, ControlMetrics, ControlRounds, PodRef
from extender.control.mark_store import ANNOTATION, decode, merged
from extender.control.runtime import _factory
from extender.kube.errors import TemporaryError
from extender.snapshot.objects import MigrationMark, parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring.settings import CoreSettings
from tests.control_fakes import FakeActions, FakeTracker, make_context
from tests.service.control.test_control_rounds import Recording
from tests.service.http.test_migration_origin import mark, node, pod


def entry(at: float, origin: str = "n1", count: int = 1, attained: float | None = 100.0) -> dict[str, Any]:
    return {"from": origin, "at": at, "count": count, "attained": attained}


def test_a_saved_mark_replaces_an_older_one_and_old_or_surplus_marks_are_dropped() -> None:
    saved = merged({}, "ns/a", entry(1000.0))
    saved = merged(saved, "ns/b", entry(2000.0))
    assert merged(saved, "ns/a", entry(900.0, "n9"))["ns/a"]["from"] == "n1"  # an older mark does not win
    assert merged(saved, "ns/a", entry(3000.0, "n2", 2))["ns/a"] == entry(3000.0, "n2", 2)
    # Older than retain_s before the newest: ns/a (at 1000) goes once a mark of 1051 is saved.
    one = {"ns/a": entry(1000.0)}
    assert set(merged(one, "ns/c", entry(1051.0), retain_s=50.0)) == {"ns/c"}
    assert set(merged(one, "ns/c", entry(1040.0), retain_s=50.0)) == {"ns/a", "ns/c"}
    assert set(merged(saved, "ns/c", entry(2500.0), max_marks=2)) == {"ns/b", "ns/c"}  # the newest two
    # Only what a mark is read for is kept (the pods carry the rest), and the JSON stays within
    # max_chars whatever the keys' length: the apiserver refuses annotations past 256 KiB.
    assert merged({}, "ns/d", {**entry(1.0), "preempted_for": "ns/x"})["ns/d"] == entry(1.0)
    big: dict[str, dict[str, Any]] = {}
    for i in range(1000):
        big = merged(big, f"{'n' * 63}/{'j' * 240}-{i:04d}", entry(float(i)), max_chars=20_000)
    assert len(json.dumps(big, separators=(",", ":"))) <= 20_000 and 40 < len(big) < 1000
    assert max(big) == f"{'n' * 63}/{'j' * 240}-0999"  # the newest kept


def test_a_malformed_annotation_or_entry_is_left_out_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="flowsched.marks"):
        assert decode("not json") == {} and decode("[1, 2]") == {} and decode(None) == {}
        good = json.dumps({"ns/a": entry(5.0), "ns/b": {"at": 5.0}, "ns/c": "x", "ns/d": entry(float("nan"))})
        assert decode(good) == {"ns/a": entry(5.0)}
    assert ANNOTATION in caplog.text and "3 malformed entries" in caplog.text


def _state_with_nodes() -> ClusterState:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(parse_node(node(n)))
    state.mark_synced()
    return state


def test_a_seeded_mark_gives_the_replacement_its_attained_service_count_and_origin() -> None:
    # A replica started after the evicted pod was gone: only the replacement (no mark) is seen.
    state = _state_with_nodes()
    state.upsert_pod(parse_pod(pod("train-1", "u2", "n2")))  # started 2025-01-01T00:00:00Z
    started = 1735689600.0
    assert state.read().migration_of("ns/train") is None
    saved = MigrationMark("n1", started - 600.0, 2, 7200.0)
    assert state.seed_migrations({"ns/train": saved}) == 1
    assert state.read().migration_of("ns/train") == saved
    assert state.read().migration_origin("ns/train", started + 60.0) == "n1"
    ctx = make_context(state, FakeTracker({}), FakeActions(), LogRecorder())
    world = _factory("migrator")(ctx).world(started + 100.0)
    job = next(j for j in world.jobs if j.key == "ns/train")
    assert job.attained_gpu_s == pytest.approx(7200.0 + 2 * 100.0)  # its 2 GPUs for 100 s since it restarted
    assert job.migrations == 2


def test_the_pod_watchs_own_record_wins_over_an_older_or_equal_saved_mark() -> None:
    state = _state_with_nodes()
    state.upsert_pod(parse_pod(pod("train-0", "u1", "n1", mark(1000.0, "n2", 3))))
    assert state.seed_migrations({"ns/train": MigrationMark("n1", 900.0, 1)}) == 0
    assert state.seed_migrations({"ns/train": MigrationMark("n1", 1000.0, 1)}) == 0
    assert state.read().migration_of("ns/train").count == 3  # type: ignore[union-attr]
    assert state.seed_migrations({"ns/train": MigrationMark("n2", 1100.0, 4)}) == 1  # newer: a later eviction
    assert state.read().migration_of("ns/train").count == 4  # type: ignore[union-attr]


class MemoryMarks:
    def __init__(self, saved: dict[str, MigrationMark] | None = None, unreadable: int = 0,
                 unwritable: bool = False) -> None:
        self.saved = dict(saved or {})
        self.written: list[tuple[str, dict[str, Any]]] = []
        self.unreadable, self.unwritable, self.loads = unreadable, unwritable, 0

    def load(self) -> dict[str, MigrationMark]:
        self.loads += 1
        if self.unreadable > 0:
            self.unreadable -= 1
            raise OSError("lease unreadable")
        return dict(self.saved)

    def save(self, job: str, m: Any) -> None:
        if self.unwritable:
            raise OSError("lease unwritable")
        self.written.append((job, dict(m)))


class Switch:
    def __init__(self, on: bool) -> None:
        self.is_leader = on


def test_the_rounds_read_the_saved_marks_once_the_first_round_they_lead() -> None:
    state = _state_with_nodes()
    store = MemoryMarks({"ns/train": MigrationMark("n1", 500.0, 1, 60.0)}, unreadable=1)
    leader = Switch(False)
    metrics = ControlMetrics.build(CollectorRegistry())
    loop = ControlLoop(Recording("migrator", []), leader, metrics, interval_s=0.0, dry_run=False, per_interval=1,
                       per_hour=10)
    rounds = ControlRounds([loop], CoreSettings(), leader, metrics, dry_run=False, mark_store=store,
                           seed_marks=state.seed_migrations)
    assert rounds.run_round() == ["migrator"]
    assert store.loads == 0  # not leading: its pod watch is enough until it is
    leader.is_leader = True
    rounds.run_round()  # unreadable: nothing taken, the round goes on, tried again next round
    assert store.loads == 1 and state.read().migration_of("ns/train") is None
    assert not loop.history  # no error recorded: the round went on
    rounds.run_round()
    assert store.loads == 2 and state.read().migration_of("ns/train") == MigrationMark("n1", 500.0, 1, 60.0)
    rounds.run_round()
    assert store.loads == 2  # once


class EvictingActions(FakeActions):
    def __init__(self, refuse: set[str] | None = None) -> None:
        super().__init__()
        self.refuse = refuse or set()
        self.evicted: list[str] = []

    def evict(self, ns: str, name: str, uid: str = "", *, dry_run: bool = False) -> str:
        if name in self.refuse:
            raise TemporaryError("a PodDisruptionBudget refuses", 30.0)
        self.evicted.append(name)
        return "evicted"


def _running_job(state: ClusterState, names: tuple[str, ...]) -> tuple[PodRef, ...]:
    for i, n in enumerate(names):
        state.upsert_pod(parse_pod({**pod(n, f"u{i}", "n1"), "metadata": {
            **pod(n, f"u{i}", "n1")["metadata"], "annotations": {"flowsched.io/checkpointable": "true"}}}))
    return tuple(PodRef("ns", n, f"u{i}", "n1") for i, n in enumerate(names))


def _evict(names: tuple[str, ...], refuse: set[str], the_mark: dict[str, Any] | None, store: MemoryMarks,
           leads_for: int = 1 << 30) -> Any:
    """evict_job over a job of `names`; the replica leads for its first `leads_for` checks."""
    state = _state_with_nodes()
    checks = iter(range(1 << 31))
    return evict_job(state, EvictingActions(refuse), LogRecorder(), "ns/train", _running_job(state, names), the_mark,
                     "r", "FlowschedMigrated", "m", still_leader=lambda: next(checks) < leads_for, marks=store)


def test_an_eviction_saves_its_mark_only_once_a_pod_carrying_it_went(caplog: pytest.LogCaptureFixture) -> None:
    the_mark = entry(1000.0)
    store = MemoryMarks()
    assert len(_evict(("train-0", "train-1"), set(), the_mark, store).evicted) == 2
    assert store.written == [("ns/train", the_mark)]
    store = MemoryMarks()  # refused outright: nothing went, the mark was withdrawn and is not saved
    with pytest.raises(TemporaryError):
        _evict(("train-0",), {"train-0"}, the_mark, store)
    assert store.written == []
    store = MemoryMarks()  # partial (the second pod refused): the evicted pod carries the mark
    assert _evict(("train-0", "train-1"), {"train-1"}, the_mark, store).outcome == "partial"
    assert store.written == [("ns/train", the_mark)]
    store = MemoryMarks()  # no mark (the idle loop gives GPUs back): nothing to save
    _evict(("train-0",), set(), None, store)
    assert store.written == []
    store = MemoryMarks()  # the Lease lost after the first pod (mark, evict, Event): the new leader's
    assert _evict(("train-0", "train-1"), set(), the_mark, store, leads_for=3).outcome == "lost_leadership"
    assert store.written == []  # watch sees the evicted pod's mark; a replica that lost it writes nothing
    store = MemoryMarks(unwritable=True)  # a store that cannot be written: the eviction stands, logged
    with caplog.at_level(logging.WARNING, logger="flowsched.eviction"):
        assert _evict(("train-0",), set(), the_mark, store).outcome == "evicted"
    assert "could not save its migration mark" in caplog.text


def test_the_book_forgets_records_older_than_its_retention_before_the_newest_mark() -> None:
    from extender.snapshot.records import MigrationBook

    book = MigrationBook(retain_s=100.0)
    for job, at in (("a", 0.0), ("b", 150.0), ("c", 120.0)):
        p = pod(f"{job}-0", f"u-{job}", "n1", mark(at))
        p["metadata"]["labels"]["flowsched.io/job"] = job
        book.note(parse_pod(p))
    assert set(book.marks()) == {"ns/b", "ns/c"}  # a (at 0) is older than 150 - 100
    book.seed({"ns/d": MigrationMark("n1", 260.0, 1)})
    assert set(book.marks()) == {"ns/d"}  # b and c are older than 260 - 100
