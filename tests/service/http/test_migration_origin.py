"""The migrator's pod mark -> ClusterState's record -> the extender scores the origin node down
for the job's replacement pod (which carries no annotation of ours)."""

from __future__ import annotations

import json
import math
from typing import Any

from extender.http.verbs import Policy, decide_prioritize
from extender.http.wire import parse_extender_args
from extender.snapshot.objects import MIGRATION, parse_migration_mark, parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring.placement import PlacementSettings


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "32",
                                                                     "memory": "64Gi"},
                                                     "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, uid: str, node_name: str = "", ann: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {"flowsched.io/job": "train"},
                         "annotations": ann or {}},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {
                "requests": {"nvidia.com/gpu": "2", "cpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": "Running" if node_name else "Pending", "startTime": "2025-01-01T00:00:00Z"}}


def mark(at: float, origin: str = "n1", count: int = 1) -> dict[str, str]:
    return {MIGRATION: json.dumps({"from": origin, "at": at, "count": count})}


def scores(state: ClusterState, p: dict[str, Any], now: float) -> dict[str, int]:
    args = parse_extender_args({"Pod": p, "NodeNames": ["n1", "n2"]})
    ans = decide_prioritize(state, args, Policy(PlacementSettings(origin_penalty=3.0), 60.0), now)
    return dict(zip(ans.names, ans.scores, strict=True))


def test_mark_parsing() -> None:
    assert parse_migration_mark('{"from": "n1", "at": 5, "count": 2}').count == 2  # type: ignore[union-attr]
    # The loops write "attained": null when they do not know it; such a mark was read as none at
    # all (no origin penalty, no count, no cooldown for the job).
    unknown = parse_migration_mark('{"from": "n1", "at": 5, "count": 2, "attained": null}')
    assert unknown is not None and unknown.count == 2 and math.isnan(unknown.attained_gpu_s)
    assert parse_migration_mark('{"from": "n1", "at": 5, "attained": 7.5}').attained_gpu_s == 7.5  # type: ignore[union-attr]
    # A count no int() takes raised OverflowError out of parse_pod: one pod annotated so by any
    # user stopped the whole pod list (the service never synced).
    assert parse_migration_mark('{"from": "n1", "at": 5, "count": 1e999}') is None
    assert parse_pod(pod("b", "u9", "n1", {MIGRATION: '{"from": "n1", "at": 5, "count": 1e999}'})).migration is None
    for bad in ("", "nope", '{"at": 5}', '{"from": "", "at": 5}', '{"from": "n", "at": "x"}', "[]"):
        assert parse_migration_mark(bad) is None
    p = parse_pod(pod("a", "u1", "n1"))
    assert p.started_at == 1735689600.0 and p.migration is None


def test_replacement_pod_scored_off_origin_until_ttl() -> None:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(parse_node(node(n)))
    replacement = pod("train-replacement", "u2")
    before = scores(state, replacement, now=1000.0)
    assert before["n1"] == before["n2"]  # identical empty nodes
    state.upsert_pod(parse_pod(pod("train-0", "u1", "n1", mark(1000.0))))
    state.delete_pod("u1")  # evicted and gone: the record stays
    assert state.read().migration_of("ns/train") is not None
    after = scores(state, replacement, now=1010.0)
    assert after["n1"] < after["n2"]
    state.set_migration_ttl(60.0)
    assert scores(state, replacement, now=1061.0) == before  # expired


def test_withdrawn_mark_forgets_the_record() -> None:
    state = ClusterState()
    state.upsert_pod(parse_pod(pod("train-0", "u1", "n1", mark(1000.0))))
    assert state.read().migration_origin("ns/train", 1000.0) == "n1"
    state.upsert_pod(parse_pod(pod("train-0", "u1", "n1")))  # the eviction was refused, mark removed
    assert state.read().migration_of("ns/train") is None
    # A newer mark from another pod of the job wins; an older one does not replace it.
    state.upsert_pod(parse_pod(pod("train-1", "u3", "n2", mark(2000.0, "n2", 2))))
    state.upsert_pod(parse_pod(pod("train-2", "u4", "n1", mark(1500.0, "n1", 1))))
    m = state.read().migration_of("ns/train")
    assert m is not None and m.origin == "n2" and m.count == 2


def test_a_partly_refused_eviction_keeps_the_record_of_the_pods_that_went() -> None:
    state = ClusterState()
    state.upsert_pod(parse_pod(pod("train-0", "u0", "n1", mark(1000.0, "n0", 1))))  # an earlier move
    state.delete_pod("u0")
    state.upsert_pod(parse_pod(pod("train-a", "ua", "n1")))
    state.upsert_pod(parse_pod(pod("train-b", "ub", "n1")))
    state.upsert_pod(parse_pod(pod("train-a", "ua", "n1", mark(2000.0, "n1", 2))))  # marked, then evicted
    state.upsert_pod(parse_pod(pod("train-b", "ub", "n1", mark(2000.0, "n1", 2))))  # marked ...
    state.upsert_pod(parse_pod(pod("train-b", "ub", "n1")))  # ... refused: its mark withdrawn
    m = state.read().migration_of("ns/train")
    assert m is not None and (m.at, m.count) == (2000.0, 2)  # train-a went with it: the move stands
    state.delete_pod("ua")
    assert state.read().migration_of("ns/train") == m
    # A move refused for every pod leaves the job's earlier record, not none.
    state.upsert_pod(parse_pod(pod("train-b", "ub", "n1", mark(3000.0, "n1", 3))))
    state.upsert_pod(parse_pod(pod("train-b", "ub", "n1")))
    assert state.read().migration_of("ns/train") == m


def test_a_pod_whose_parse_overflows_is_skipped_not_the_whole_watch(monkeypatch: Any) -> None:
    # Defence in depth beside the parsers' own checks: an arithmetic error out of any parser skips
    # that object, as a KeyError or ValueError does, instead of stopping the watch.
    import extender.snapshot.watcher as watcher

    def overflow(obj: Any, gpu_resource: str) -> Any:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(watcher, "parse_pod", overflow)
    state = ClusterState()
    watcher.apply_event(state, "pods", {"type": "ADDED", "object": pod("a", "u1", "n1")}, "nvidia.com/gpu")
    assert state.read().pod("u1") is None
