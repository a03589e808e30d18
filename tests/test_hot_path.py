"""The hot path's shortcuts must not change a byte kube-scheduler reads."""

from __future__ import annotations

import copy
import string

import numpy as np
import orjson
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from extender import wire
from extender.app import build_app
from extender.decide import Policy, ScoreMemo, decide_filter, decide_prioritize
from extender.k8s_objects import parse_node, parse_pod
from extender.metrics import build_metrics
from extender.settings import Settings
from extender.state import ClusterState
from tests.k8s_factories import node, pod

DNS = st.text(alphabet=string.ascii_lowercase + string.digits + ".-", min_size=1, max_size=63)


@given(st.lists(st.tuples(st.one_of(DNS, st.text(min_size=1)), st.integers(0, 10)), max_size=60))
def test_priority_list_encoding_is_byte_identical(items: list[tuple[str, int]]) -> None:
    names = [n for n, _ in items]
    scores = [s for _, s in items]
    assert wire.encode_host_priority_list(names, scores) == orjson.dumps(wire.host_priority_list(names, scores))


def test_names_mode_replies_byte_for_byte() -> None:
    state = ClusterState()
    for name, gpus in (("a", 4), ("b", 1), ("c", 8)):
        state.upsert_node(parse_node(node(name, gpus=gpus)))
    state.synced = {"nodes": True, "pods": True}
    client = TestClient(build_app(Settings(kube=False), state, build_metrics(), clock=lambda: 0.0))
    body = {"Pod": pod("p", gpus=2), "Nodes": None, "NodeNames": ["a", "b", "c", "zz"]}
    f = client.post("/filter", json=body)
    assert f.content == (b'{"Nodes":null,"NodeNames":["a","c","zz"],'
                         b'"FailedNodes":{"b":"flowsched: insufficient nvidia.com/gpu"},'
                         b'"FailedAndUnresolvableNodes":{},"Error":""}')
    body["NodeNames"] = ["a", "c", "zz"]
    p = client.post("/prioritize", json=body)
    scores = orjson.loads(p.content)
    assert p.content == orjson.dumps([{"Host": h["Host"], "Score": h["Score"]} for h in scores])
    assert [h["Host"] for h in scores] == ["a", "c", "zz"] and scores[2]["Score"] == 5


def _state(n: int = 40) -> ClusterState:
    rng = np.random.default_rng(3)
    s = ClusterState()
    for i in range(n):
        s.upsert_node(parse_node(node(f"n{i}", gpus=int(rng.integers(1, 9)))))
        s.set_node_telemetry(f"n{i}", list(rng.random(8) * 100), [], 0.0)
    for i in range(n):
        s.upsert_pod(parse_pod(pod(f"r{i}", gpus=1, node_name=f"n{int(rng.integers(n))}", phase="Running")))
    return s


def test_prioritize_from_memo_equals_a_fresh_computation() -> None:
    state, policy = _state(), Policy(Settings(kube=False).placement, 60.0)
    names = [f"n{i}" for i in range(40)]
    for gpus in (1, 2, 4):
        raw = pod(f"p{gpus}", gpus=gpus)
        raw["metadata"]["resourceVersion"] = "7"
        args = wire.parse_extender_args({"Pod": raw, "NodeNames": names})
        memo = ScoreMemo()
        passed = decide_filter(state, args, policy, 1.0, memo).passed
        sub = wire.parse_extender_args({"Pod": raw, "NodeNames": passed[::-1]})
        remembered = decide_prioritize(state, sub, policy, 1.0, memo)
        fresh = decide_prioritize(state, sub, policy, 1.0)
        assert memo.hits == 1 and remembered.scores == fresh.scores


def test_memo_is_not_used_for_a_changed_pod_an_unknown_node_or_a_late_call() -> None:
    state, policy = _state(), Policy(Settings(kube=False).placement, 60.0)
    raw = pod("p", gpus=1)
    raw["metadata"]["resourceVersion"] = "1"
    memo = ScoreMemo(ttl_s=2.0)
    names = [f"n{i}" for i in range(40)]
    passed = decide_filter(state, wire.parse_extender_args({"Pod": raw, "NodeNames": names}), policy, 0.0, memo).passed
    rejected = sorted(set(names) - set(passed))
    assert passed and rejected
    changed = copy.deepcopy(raw)
    changed["metadata"]["resourceVersion"] = "2"
    decide_prioritize(state, wire.parse_extender_args({"Pod": changed, "NodeNames": passed}), policy, 0.0, memo)
    outside = [passed[0], rejected[0]]  # a node filter did not pass: not in the memo
    decide_prioritize(state, wire.parse_extender_args({"Pod": raw, "NodeNames": outside}), policy, 0.0, memo)
    decide_prioritize(state, wire.parse_extender_args({"Pod": raw, "NodeNames": passed}), policy, 5.0, memo)
    assert memo.hits == 0
    decide_prioritize(state, wire.parse_extender_args({"Pod": raw, "NodeNames": passed[:3]}), policy, 1.0, memo)
    assert memo.hits == 1
