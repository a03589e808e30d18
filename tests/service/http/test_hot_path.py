"""The hot path's shortcuts must not change a byte kube-scheduler reads."""

from __future__ import annotations

import copy
import string
from collections import Counter

import numpy as np
import orjson
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from extender.http import wire
from extender.http.app import build_app
from extender.http.verbs import Policy, ScoreMemo, decide_filter, decide_filter_ranked, decide_prioritize
from extender.metrics import build_metrics
from extender.settings import Settings
from extender.snapshot.objects import MIGRATED_FROM, parse_node, parse_pod
from extender.snapshot.state import ClusterState
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
    state.mark_synced()
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


def test_prioritize_from_memo_counts_unknown_nodes_like_a_fresh_computation() -> None:
    # The memo path answered unknown=0: flowsched_unknown_nodes{verb="prioritize"} and the warning
    # missed every unknown candidate whenever prioritize followed filter (kube-scheduler's order).
    state, policy = _state(), Policy(Settings(kube=False).placement, 60.0)
    raw = pod("p", gpus=1)
    raw["metadata"]["resourceVersion"] = "7"
    names = ["n0", "ghost-1", "n1", "ghost-2"]
    memo = ScoreMemo()
    passed = decide_filter(state, wire.parse_extender_args({"Pod": raw, "NodeNames": names}), policy, 1.0,
                           memo).passed
    assert "ghost-1" in passed and "ghost-2" in passed  # unknown nodes pass, neutral
    sub = wire.parse_extender_args({"Pod": raw, "NodeNames": passed})
    remembered = decide_prioritize(state, sub, policy, 1.0, memo)
    fresh = decide_prioritize(state, sub, policy, 1.0)
    assert memo.hits == 1 and remembered.scores == fresh.scores
    assert remembered.unknown == fresh.unknown == 2

    metrics = build_metrics()
    client = TestClient(build_app(Settings(kube=False), state, metrics, clock=lambda: 1.0))
    for verb in ("/filter", "/prioritize", "/prioritize"):
        client.post(verb, json={"Pod": raw, "NodeNames": names})
    text = client.get("/metrics").text
    assert 'flowsched_unknown_nodes_total{verb="prioritize"} 4.0' in text


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


def test_ranked_filter_passes_the_best_scored_nodes_of_what_filter_passes() -> None:
    state = _state()
    names = [f"n{i}" for i in range(40)] + ["unknown-node"]
    for margin in (0, 1, 3, 10):
        policy = Policy(Settings(kube=False).placement, 60.0, rank_margin=margin)
        for gpus, origin in ((1, None), (2, None), (4, None), (1, "n5"), (2, "n7")):
            raw = pod(f"p{gpus}", gpus=gpus)
            if origin:  # the migrated job's origin node is scored down, in both modes alike
                raw["metadata"]["annotations"] = {MIGRATED_FROM: origin}
            args = wire.parse_extender_args({"Pod": raw, "NodeNames": names})
            plain = decide_filter(state, args, policy, 1.0)
            ranked = decide_filter_ranked(state, args, policy, 1.0)
            scores = dict(zip(plain.passed, decide_prioritize(
                state, wire.parse_extender_args({"Pod": args.pod, "NodeNames": plain.passed}), policy, 1.0).scores,
                strict=True))
            best = max(scores.values())
            assert ranked.passed == [n for n in plain.passed if scores[n] >= best - margin]
            # A node passes, so rejections are counted, not listed (kube-scheduler would not read them).
            assert ranked.passed and ranked.failed == ranked.unresolvable == {}
            assert ranked.rejected == plain.rejected == dict(Counter((*plain.failed.values(),
                                                                      *plain.unresolvable.values())))
            assert ranked.unknown == plain.unknown == 1
            if margin == 10:
                assert ranked.passed == plain.passed
    # Something is cut at margin 0 here, or the test would not tell the modes apart.
    policy = Policy(Settings(kube=False).placement, 60.0)
    args = wire.parse_extender_args({"Pod": pod("p", gpus=1), "NodeNames": names})
    plain, ranked = decide_filter(state, args, policy, 1.0), decide_filter_ranked(state, args, policy, 1.0)
    assert len(ranked.passed) < len(plain.passed) and plain.failed


def test_ranked_filter_with_no_feasible_node_reports_every_rejection() -> None:
    state = ClusterState()
    for name in ("a", "b"):
        state.upsert_node(parse_node(node(name, gpus=1)))
    state.upsert_pod(parse_pod(pod("r", gpus=1, node_name="a", phase="Running")))
    state.set_node_telemetry("b", [100.0], [], 0.0)
    policy = Policy(Settings(kube=False).placement, 60.0)
    ans = decide_filter_ranked(state, wire.parse_extender_args({"Pod": pod("p", gpus=1), "NodeNames": ["a", "b"]}),
                               policy, 1.0)
    assert ans.passed == [] and ans.failed == {"a": "flowsched: insufficient nvidia.com/gpu"}
    assert ans.unresolvable == {"b": "flowsched: GPUs saturated"}
    assert ans.rejected == {"flowsched: insufficient nvidia.com/gpu": 1, "flowsched: GPUs saturated": 1}


def test_filter_ranked_verb_over_http() -> None:
    state = ClusterState()
    for name, gpus in (("a", 4), ("b", 1), ("c", 8)):
        state.upsert_node(parse_node(node(name, gpus=gpus)))
    state.upsert_pod(parse_pod(pod("r", gpus=3, node_name="a", phase="Running")))
    state.mark_synced()
    client = TestClient(build_app(Settings(kube=False, rank_keep=0), state, build_metrics(), clock=lambda: 0.0))
    body = {"Pod": pod("p", gpus=1), "Nodes": None, "NodeNames": ["a", "b", "c"]}
    # a: 1 of 4 GPUs free, the best fit (packing); c: 8 free; b: 1 free too, but a 1-GPU node.
    scores = {h["Host"]: h["Score"] for h in client.post("/prioritize", json=body).json()}
    best = max(scores.values())
    r = client.post("/filter-ranked", json=body)
    assert r.status_code == 200
    assert r.json() == {"Nodes": None, "NodeNames": [n for n in "abc" if scores[n] == best],
                        "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    assert scores["c"] < best
    # A rejected node is not listed while another passes, but it is counted.
    state.upsert_node(parse_node(node("d", gpus=1)))
    state.upsert_pod(parse_pod(pod("r2", gpus=1, node_name="d", phase="Running")))
    r = client.post("/filter-ranked", json={**body, "NodeNames": ["a", "d"]})
    assert r.json()["NodeNames"] == ["a"] and r.json()["FailedNodes"] == {}
    assert 'flowsched_filter_rejections_total{reason="flowsched: insufficient nvidia.com/gpu"} 1.0' \
        in client.get("/metrics").text


def test_rank_margin_setting_reaches_the_ranked_filter() -> None:
    state = ClusterState()
    for name, gpus in (("a", 4), ("c", 8)):
        state.upsert_node(parse_node(node(name, gpus=gpus)))
    state.upsert_pod(parse_pod(pod("r", gpus=3, node_name="a", phase="Running")))
    state.mark_synced()
    body = {"Pod": pod("p", gpus=1), "Nodes": None, "NodeNames": ["a", "c"]}
    passed = {}
    for margin in (0, 10):
        app = build_app(Settings(kube=False, rank_margin=margin, rank_keep=0), state, build_metrics(),
                        clock=lambda: 0.0)
        passed[margin] = TestClient(app).post("/filter-ranked", json=body).json()["NodeNames"]
    assert passed == {0: ["a"], 10: ["a", "c"]}


def test_ranked_filter_keeps_the_best_nodes_first_and_ties_in_the_request_order() -> None:
    state = _state()
    names = [f"n{i}" for i in range(40)] + ["unknown-node"]
    seen_ties = seen_margin = False
    for margin in (0, 2, 10):
        every = Policy(Settings(kube=False).placement, 60.0, rank_margin=margin, rank_keep=0)
        for gpus in (1, 2, 4):
            for order in (names, names[::-1]):
                args = wire.parse_extender_args({"Pod": pod(f"p{gpus}", gpus=gpus), "NodeNames": order})
                all_of = decide_filter_ranked(state, args, every, 1.0)
                scores = dict(zip(all_of.passed, decide_prioritize(state, wire.parse_extender_args(
                    {"Pod": args.pod, "NodeNames": all_of.passed}), every, 1.0).scores, strict=True))
                # The reference: the best first (stable, so ties keep the request's order), then cut.
                ranked = sorted(all_of.passed, key=lambda n: -scores[n])
                for keep in (1, 2, 5):
                    policy = Policy(every.placement, 60.0, rank_margin=margin, rank_keep=keep)
                    got = decide_filter_ranked(state, args, policy, 1.0)
                    assert set(got.passed) == set(ranked[:keep])
                    assert got.passed == [n for n in order if n in set(got.passed)]  # in the request's order
                    assert got.rejected == all_of.rejected and got.unknown == all_of.unknown
                seen_ties |= margin == 0 and len(all_of.passed) > 1
                seen_margin |= margin > 0 and len(set(scores.values())) > 1
    assert seen_ties and seen_margin  # both cuts were exercised


def test_rank_keep_one_by_default_leaves_kube_scheduler_a_single_node() -> None:
    state = ClusterState()
    for name in ("a", "b", "c"):
        state.upsert_node(parse_node(node(name, gpus=8)))
    state.mark_synced()
    body = {"Pod": pod("p", gpus=1), "Nodes": None, "NodeNames": ["b", "c", "a"]}  # three equal nodes
    passed = {}
    for keep in (None, 0):
        settings = Settings(kube=False) if keep is None else Settings(kube=False, rank_keep=keep)
        app = build_app(settings, state, build_metrics(), clock=lambda: 0.0)
        passed[keep] = TestClient(app).post("/filter-ranked", json=body).json()["NodeNames"]
    assert passed == {None: ["b"], 0: ["b", "c", "a"]}


def test_watches_wait_for_the_verb_in_flight_and_are_woken_when_it_is_answered() -> None:
    import threading
    import time

    app = build_app(Settings(kube=False), ClusterState(), build_metrics())
    t0 = time.monotonic()
    app.wait_quiet(5.0)  # nothing in flight: at once
    assert time.monotonic() - t0 < 0.5
    assert app.direct_begin("/filter-ranked", []) is None  # a verb admitted: in flight
    done = threading.Event()

    def watch() -> None:
        app.wait_quiet(5.0)
        done.set()

    waiter = threading.Thread(target=watch)
    waiter.start()
    time.sleep(0.1)
    assert not done.is_set()  # held while the verb is in flight
    app.direct_abort("/filter-ranked")
    assert done.wait(2.0)  # woken when it ends, long before its 5 s bound
    waiter.join()
    assert app.verbs_in_flight == 0 and app.in_flight == 0


def test_throughput_bench_runs_the_service_defaults_unless_told_otherwise() -> None:
    # The bench once wrote its own --rank-keep default (0) into flowsched's config, so the
    # issue's command measured every tied node passed instead of deploy/'s one node.
    from benchmarks.kube_scheduler_throughput import flowsched_settings

    base, this = flowsched_settings(None, None)
    assert base == this == {}
    assert Settings.model_validate(this).rank_keep == 1 and Settings.model_validate(this).rank_margin == 0
    base, this = flowsched_settings(2, 0)
    assert base == {"rank_margin": 2} and this == {"rank_margin": 2, "rank_keep": 0}
    assert Settings.model_validate(this).rank_keep == 0
