"""The log follower's own logic: reconnects without duplicates, restarts, bounds, leadership.

The transport here is ScriptedLogEmulator, an in-process stand-in for the apiserver's pods/log
stream (lines with kubelet timestamps, sinceTime honoured at whole seconds as the API does);
the path through the real apiserver is tests/e2e/test_log_progress_e2e.py. The store is the
real SQLite store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from extender.progress.log_follower import (
    LogFollower,
    LogSourceSettings,
    pick_targets,
    since_time,
    split_timestamp,
)
from extender.progress.store import ProgressStore, ProgressStoreSettings
from extender.snapshot.objects import PodInfo, parse_pod
from tests.cluster.kubelet_log_emulator import kubelet_ts


@dataclass
class ScriptedLogEmulator:
    """Per (pod, container): lines with times. A call streams those at/after sinceTime, then ends
    (`end_after`=True, as a container exit or the apiserver closing the stream) or raises."""

    lines: dict[tuple[str, str], list[tuple[float, str]]] = field(default_factory=dict)
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    fail: bool = False
    hold: threading.Event | None = None  # set: streams stay open (a quiet follow) until it is cleared
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, namespace: str, pod: str, container: str, since: str | None,
                 read_timeout_s: float) -> Iterator[bytes]:
        with self.lock:
            self.calls.append((pod, since))
        if self.fail:
            raise ConnectionError("apiserver unreachable")
        floor = split_timestamp(since + " x")[0] if since else None
        for ts, text in list(self.lines.get((pod, container), [])):
            if floor is None or ts >= floor:
                yield f"{kubelet_ts(ts)} {text}".encode()
        while self.hold is not None and self.hold.is_set():
            time.sleep(0.01)


def pod(name: str, job: str = "j", restarts: int = 0, phase: str = "Running", running: bool = True,
        annotations: dict[str, str] | None = None) -> PodInfo:
    return parse_pod({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"flowsched.io/job": job},
                     "annotations": {"flowsched.io/progress": "logs", **(annotations or {})}},
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": phase, "containerStatuses": [
            {"name": "main", "restartCount": restarts, "state": {"running": {}} if running else {"waiting": {}}}]},
    })


FAST = LogSourceSettings(min_point_interval_s=0, flush_s=0, reconnect_min_s=0.05, reconnect_max_s=0.2)


def run_until(follower: LogFollower, pred: object, timeout_s: float = 5.0) -> None:
    assert callable(pred)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        follower.reconcile()
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"not reached; status {follower.status()}")


@pytest.fixture
def store() -> Iterator[ProgressStore]:
    s = ProgressStore(ProgressStoreSettings(path=":memory:"))
    yield s
    s.close()


def steps_of(store: ProgressStore, job: str = "j") -> list[int]:
    h = store.history("ns", job)
    return [] if h is None else [int(x) for x in h.steps]


def test_reconnect_reads_each_line_once_even_with_shared_timestamps(store: ProgressStore) -> None:
    t0 = float(int(time.time())) + 0.25
    em = ScriptedLogEmulator()
    # Three lines of one write share a timestamp; sinceTime re-sends the whole second.
    em.lines[("p-0", "main")] = [(t0, "step=1 loss=1.0"), (t0 + 0.5, "step=2 loss=0.9"),
                                 (t0 + 0.5, "step=3 loss=0.8"), (t0 + 0.5, "step=4 loss=0.7")]
    pods = [pod("p-0")]
    f = LogFollower(lambda: pods, store, em, FAST)
    run_until(f, lambda: steps_of(store) == [1, 2, 3, 4])
    # The stream ended (apiserver closed it); one more line arrives with the same timestamp.
    em.lines[("p-0", "main")].append((t0 + 0.5, "step=5 loss=0.6"))
    em.lines[("p-0", "main")].append((t0 + 1.5, "step=6 loss=0.5"))
    run_until(f, lambda: steps_of(store)[-1:] == [6])
    assert steps_of(store) == [1, 2, 3, 4, 5, 6]
    assert em.calls[0] == ("p-0", None)
    assert all(since == since_time(t0 + 0.5) for _, since in em.calls[1:2])
    f.stop()


def test_new_container_instance_is_read_from_its_start_with_a_fresh_parser(store: ProgressStore) -> None:
    t0 = time.time() - 100
    em = ScriptedLogEmulator()
    em.lines[("p-0", "main")] = [(t0 + i, f"step={i * 10} loss={1 - i / 100}") for i in range(1, 6)]
    pods = [pod("p-0")]
    f = LogFollower(lambda: pods, store, em, FAST)
    run_until(f, lambda: steps_of(store)[-1:] == [50])
    # Restart from checkpoint at step 30: a new instance whose log starts over.
    em.lines[("p-0", "main")] = [(t0 + 50 + i, f"step={20 + i * 10} loss={0.9 - i / 100}") for i in range(1, 4)]
    pods[0] = pod("p-0", restarts=1)
    run_until(f, lambda: steps_of(store)[-1:] == [50] and len(steps_of(store)) == 8)
    assert steps_of(store) == [10, 20, 30, 40, 50, 30, 40, 50]
    assert f.status()["streams"]["ns/j"]["restarts"] == 1
    f.stop()


def test_a_takeover_does_not_reread_what_the_store_has(store: ProgressStore) -> None:
    t0 = time.time() - 100
    em = ScriptedLogEmulator()
    em.lines[("p-0", "main")] = [(t0 + i, f"step={i} loss={1 / i}") for i in range(1, 11)]
    pods = [pod("p-0")]
    first = LogFollower(lambda: pods, store, em, FAST)
    run_until(first, lambda: len(steps_of(store)) == 10)
    first.stop()
    em.lines[("p-0", "main")].append((t0 + 11, "step=11 loss=0.09"))
    second = LogFollower(lambda: pods, store, em, FAST)  # another replica, same (shared) store
    run_until(second, lambda: len(steps_of(store)) >= 11)
    time.sleep(0.1)
    second.reconcile()
    assert steps_of(store) == list(range(1, 12))  # step 10 and before not stored twice
    second.stop()


def test_one_stream_per_job_first_pod_by_name_and_problems_reported() -> None:
    pods = [pod("w-1"), pod("w-0"), pod("x-0", job="k", running=False), pod("y-0", job="m", phase="Pending"),
            pod("z-0", job="z", annotations={"flowsched.io/progress-container": "nope"})]
    targets, problems = pick_targets(pods)
    assert {k: t.pod for k, t in targets.items()} == {"ns/j": "w-0"}
    assert problems == {"ns/z-0": "no container named 'nope' to read the log of"}


def test_at_most_max_streams_open(store: ProgressStore) -> None:
    em = ScriptedLogEmulator(hold=threading.Event())
    assert em.hold is not None
    em.hold.set()
    pods = [pod(f"p-{i}", job=f"j{i}") for i in range(5)]
    f = LogFollower(lambda: pods, store, em, LogSourceSettings(max_streams=2, connects_per_s=1000))
    for _ in range(5):
        f.reconcile()
    assert len(em.calls) == 2 and f.waiting == 3
    em.hold.clear()
    f.stop()


def test_backoff_on_failure(store: ProgressStore) -> None:
    em = ScriptedLogEmulator(fail=True)
    pods = [pod(f"p-{i}", job=f"j{i}") for i in range(3)]
    settings = LogSourceSettings(connects_per_s=1000, reconnect_min_s=0.2, reconnect_max_s=0.4)
    f = LogFollower(lambda: pods, store, em, settings)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        f.reconcile()
        time.sleep(0.01)
    # ~100 rounds in 1 s, but each failing job retries only after its back-off (0.2, 0.4, 0.4 s).
    per_job = {p: sum(1 for c, _ in em.calls if c == p) for p in {c for c, _ in em.calls}}
    assert len(per_job) == 3 and max(per_job.values()) <= 4, per_job
    assert all(st["errors"] >= 1 and "unreachable" in st["last_error"] for st in f.status()["streams"].values())
    f.stop()


def test_connect_rate_is_a_token_bucket(store: ProgressStore) -> None:
    em = ScriptedLogEmulator()
    pods = [pod(f"p-{i}", job=f"j{i}") for i in range(10)]
    f = LogFollower(lambda: pods, store, em, LogSourceSettings(connects_per_s=2))
    f.reconcile()
    assert len(em.calls) == 2 and f.waiting == 8
    f.stop()


def test_not_leader_closes_everything_and_opens_nothing(store: ProgressStore) -> None:
    leader = {"on": False}
    em = ScriptedLogEmulator()
    em.lines[("p-0", "main")] = [(time.time(), "step=1 loss=1")]
    f = LogFollower(lambda: [pod("p-0")], store, em, FAST, is_leader=lambda: leader["on"])
    f.reconcile()
    assert em.calls == [] and f.streams == {}
    leader["on"] = True
    run_until(f, lambda: steps_of(store) == [1])
    leader["on"] = False
    f.reconcile()
    assert f.streams == {} and f.status()["streams"] == {}
    f.stop()


def test_thinning_keeps_the_newest_point_per_window(store: ProgressStore) -> None:
    t0 = time.time() - 100
    em = ScriptedLogEmulator()
    # 10 lines per second of log time for 3 s; windows of 1 s keep one point each (the newest).
    em.lines[("p-0", "main")] = [(t0 + i / 10, f"step={i} loss={1 / (i + 1)}") for i in range(30)]
    f = LogFollower(lambda: [pod("p-0")], store, em,
                    LogSourceSettings(min_point_interval_s=1.0, flush_s=0, reconnect_min_s=5))
    run_until(f, lambda: len(steps_of(store)) >= 3)
    assert steps_of(store) == [9, 19, 29]
    f.stop()


def test_timestamps_parse_to_the_microsecond() -> None:
    ts, rest = split_timestamp("2026-11-22T20:50:00.123456789Z step=1 loss=2")
    assert rest == "step=1 loss=2" and ts == pytest.approx(1795380600.123456, abs=1e-6)
    assert split_timestamp("no stamp here") == (None, "no stamp here")
