"""A reader iterating StateView while the writer applies events never sees a dict change size.

Before the split, /debug and the status page iterated ClusterState's live dicts without its lock,
and a watch event landing mid-iteration raised "dictionary changed size during iteration".
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from extender.http.debug import SnapshotQuery, describe_unlocked, snapshot_page
from extender.http.status_view import job_phase_counts
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState, JobConvergence
from scoring.convergence import Phase
from tests.k8s_factories import node, pod

UPDATES = 2000
NODES = 8


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every few µs, so the reader is interrupted mid-iteration many times."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _write(state: ClusterState, done: threading.Event) -> None:
    """UPDATES events that add and remove pods, jobs, nodes and convergence estimates."""
    try:
        for i in range(UPDATES):
            n = f"n{i % NODES}"
            p = parse_pod(pod(f"p{i}", gpus=1, node_name=n, phase="Running", labels={"flowsched.io/job": f"j{i}"}))
            state.upsert_pod(p)
            state.set_job_convergence(f"default/j{i}", JobConvergence(Phase.GROWING, 100.0, float(i)))
            state.set_node_telemetry(n, [float(i % 100)], [1000.0], float(i))
            state.set_pod_gpu_util({f"default/p{i}": [50.0]}, float(i))
            if i % 3 == 0:
                state.delete_pod(p.uid)
            if i % 50 == 0:
                state.upsert_node(parse_node(node(f"extra{i}", gpus=4)))
            if i % 50 == 25:
                state.delete_node(f"extra{i - 25}")
    finally:
        done.set()


def test_readers_iterate_the_view_while_the_writer_updates(fast_switching: None) -> None:
    state = ClusterState()
    for k in range(NODES):
        state.upsert_node(parse_node(node(f"n{k}", gpus=8)))
    state.mark_synced()
    done = threading.Event()
    writer = threading.Thread(target=_write, args=(state, done), daemon=True)
    errors: list[BaseException] = []
    reads = 0
    writer.start()
    try:
        while not done.is_set() or reads == 0:
            read = state.read()
            sum(p.requests.gpus for p in read.pods())
            for job in read.job_keys():
                read.convergence(job)
            dict(read.convergences())
            for name in read.node_names():
                read.node_row(name)
            dict(read.shared())
            read.pod_gpu_samples(float(UPDATES), 1e9)
            read.control_view()
            read.count_telemetry_unknown(float(UPDATES), 1e9)
            snapshot_page(state, SnapshotQuery(limit=50), float(UPDATES), 60.0)
            describe_unlocked(state, float(UPDATES), 60.0)
            job_phase_counts(state)
            reads += 1
    except RuntimeError as e:  # "dictionary changed size during iteration" and the set twin
        errors.append(e)
    finally:
        writer.join(timeout=60)
    assert not writer.is_alive(), "the writer did not finish within 60 s"
    assert not errors, f"a reader failed while the writer updated: {errors[0]!r}"
    assert reads > 0
    final = state.read().counts()
    assert final["pods"] == UPDATES - len(range(0, UPDATES, 3))
    assert final["nodes"] == NODES  # every extra node was deleted again
