import math

import numpy as np
import pytest

from extender.snapshot.objects import ObjectError, parse_node, parse_pod, parse_quantity
from extender.snapshot.state import ClusterState, JobConvergence, NodeRow, total_used
from scoring.convergence import Phase
from tests.k8s_factories import node, pod


@pytest.mark.parametrize(("text", "value"), [
    ("100m", 0.1), ("2", 2.0), ("2Gi", 2 * 2**30), ("1e3", 1000.0), ("1.5k", 1500.0), (4, 4.0), ("512Mi", 2**29),
])
def test_quantities(text: object, value: float) -> None:
    assert math.isclose(parse_quantity(text), value)


@pytest.mark.parametrize("bad", ["", "abc", "1Zi", None, True, "nan", [1]])
def test_bad_quantities_raise(bad: object) -> None:
    with pytest.raises(ObjectError):
        parse_quantity(bad)


@pytest.mark.parametrize("negative", ["-4", "-1000m", "-2Gi", -1, -0.5, "-1e3"])
def test_negative_quantities_raise(negative: object) -> None:
    # The regex allows a sign; a negative request used to parse as a valid (smaller than zero) demand.
    with pytest.raises(ObjectError, match="negative"):
        parse_quantity(negative)
    with pytest.raises(ObjectError, match="negative"):  # never remembered as valid either
        parse_quantity(negative)
    assert parse_quantity("+4") == 4.0 and parse_quantity("-0") == 0.0


def test_remembered_quantities_stay_exact_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.snapshot import objects as k8s_objects

    monkeypatch.setattr(k8s_objects, "_PARSED", {})
    monkeypatch.setattr(k8s_objects, "_PARSED_MAX", 3)
    for _ in range(2):  # the second round is answered from memory
        assert [parse_quantity(t) for t in ("100m", "2Gi", " 3 ")] == [0.1, 2.0 * 2**30, 3.0]
    with pytest.raises(ObjectError):  # a bad text is refused every time, never remembered
        parse_quantity("1Zi")
    with pytest.raises(ObjectError):
        parse_quantity("1Zi")
    parse_quantity("7")  # at the bound the memory starts over
    assert k8s_objects._PARSED == {"7": 7.0}


def test_pod_requests_follow_kube_scheduler_rules() -> None:
    p = pod("a", gpus=2, cpu="1500m")
    p["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "500m"}}})
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]
    p["spec"]["overhead"] = {"cpu": "100m"}
    info = parse_pod(p)
    assert info.requests.gpus == 2  # limit-only GPU counts as request
    assert info.requests.cpu_m == pytest.approx(3000 + 100)  # init container dominates the 2000m sum
    assert info.requests.mem == pytest.approx(4 * 2**30)
    # A request wins over its limit, even a zero one; a null request is not a quantity.
    q = pod("b", gpus=0, cpu="2")
    q["spec"]["containers"][0]["resources"]["limits"] = {"cpu": "4", "memory": "8Gi"}
    q["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "0", "memory": "1Gi"}
    assert (parse_pod(q).requests.cpu_m, parse_pod(q).requests.mem) == (0.0, 2**30)
    q["spec"]["containers"][0]["resources"]["requests"]["cpu"] = None
    with pytest.raises(ObjectError):
        parse_pod(q)


def test_job_grouping_rules() -> None:
    assert parse_pod(pod("w0", labels={"flowsched.io/job": "bert"})).job == "default/bert"
    kf = pod("w1", labels={"training.kubeflow.org/job-name": "resnet"}, namespace="ml")
    assert parse_pod(kf).job == "ml/resnet"
    both = pod("w2", labels={"flowsched.io/job": "a", "training.kubeflow.org/job-name": "b"})
    assert parse_pod(both).job == "default/a"
    assert parse_pod(pod("w3", owner=("Job", "train-7"))).job == "default/job-train-7"
    assert parse_pod(pod("solo")).job == "default/solo"


def _state_with(nodes: int = 3) -> ClusterState:
    s = ClusterState(initial_capacity=2)  # tiny, so adding nodes exercises growth
    for i in range(nodes):
        s.upsert_node(parse_node(node(f"n{i}", gpus=4)))
    return s


def _row(s: ClusterState, name: str) -> NodeRow:
    r = s.read().node_row(name)
    assert r is not None
    return r


def _columns_match(s: ClusterState) -> None:
    for name in s.read().node_names():
        r = _row(s, name)
        ref = total_used(s.read().pods(), name)
        assert r.gpu_used == pytest.approx(ref.gpus)
        assert r.cpu_used == pytest.approx(ref.cpu_m)
        assert r.mem_used == pytest.approx(ref.mem)


def test_pod_added_bound_finished_deleted() -> None:
    s = _state_with()
    p = pod("a", gpus=2)
    s.upsert_pod(parse_pod(p))  # pending: holds nothing
    assert _row(s, "n0").gpu_used == 0
    p["spec"]["nodeName"] = "n0"
    s.upsert_pod(parse_pod(p))  # bound
    assert _row(s, "n0").gpu_used == 2
    _columns_match(s)
    p["status"]["phase"] = "Succeeded"
    s.upsert_pod(parse_pod(p))
    assert _row(s, "n0").gpu_used == 0
    p["status"]["phase"] = "Running"
    s.upsert_pod(parse_pod(p))
    s.delete_pod(p["metadata"]["uid"])
    assert _row(s, "n0").gpu_used == 0
    assert "default/a" not in s.read().job_keys()
    _columns_match(s)


def test_terminating_pod_still_holds_its_gpus() -> None:
    s = _state_with()
    p = pod("a", gpus=1, node_name="n1", phase="Running")
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    s.upsert_pod(parse_pod(p))
    assert _row(s, "n1").gpu_used == 1


def test_pods_seen_before_their_node_are_counted_when_it_arrives() -> None:
    s = _state_with(0)
    s.upsert_pod(parse_pod(pod("a", gpus=3, node_name="late", phase="Running")))
    s.upsert_node(parse_node(node("late", gpus=8)))
    assert _row(s, "late").gpu_used == 3


def test_node_allocatable_changes_and_deletion_reuses_slot() -> None:
    s = _state_with(2)
    s.upsert_node(parse_node(node("n0", gpus=8)))
    assert _row(s, "n0").gpu_alloc == 8
    s.upsert_node(parse_node(node("n0", gpus=8, ready=False)))
    assert _row(s, "n0").gpu_alloc == 0  # a NotReady node offers nothing
    old = s.read().slot_of("n1")
    s.delete_node("n1")
    assert s.read().slot_of("n1") == -1
    s.upsert_node(parse_node(node("n9", gpus=2)))
    assert s.read().slot_of("n9") == old
    assert _row(s, "n9").gpu_used == 0 and np.isnan(_row(s, "n9").gpu_util).all()


def test_many_nodes_grow_columns() -> None:
    s = _state_with(300)
    for i in range(300):
        s.upsert_pod(parse_pod(pod(f"p{i}", gpus=1 + i % 4, node_name=f"n{i}", phase="Running")))
    _columns_match(s)
    assert sum(_row(s, n).gpu_used for n in s.read().node_names()) == sum(1 + i % 4 for i in range(300))


def test_relist_replaces_everything() -> None:
    s = _state_with(3)
    s.upsert_pod(parse_pod(pod("gone", gpus=1, node_name="n0", phase="Running")))
    s.replace_all("nodes", [parse_node(node("n0")), parse_node(node("n5"))])
    s.replace_all("pods", [parse_pod(pod("new", gpus=2, node_name="n5", phase="Running"))])
    assert set(s.read().node_names()) == {"n0", "n5"}
    assert set(p.name for p in s.read().pods()) == {"new"}
    _columns_match(s)
    assert s.read().ready


def test_relabelled_pod_moves_between_jobs() -> None:
    s = _state_with()
    p = pod("a", labels={"flowsched.io/job": "one"}, node_name="n0", phase="Running")
    s.upsert_pod(parse_pod(p))
    p["metadata"]["labels"]["flowsched.io/job"] = "two"
    s.upsert_pod(parse_pod(p))
    assert "default/one" not in s.read().job_keys()
    assert {q.uid for q in s.read().job_pods(["default/two"])["default/two"]} == {p["metadata"]["uid"]}


def test_completing_jobs_counted_per_node() -> None:
    s = _state_with()
    s.upsert_pod(parse_pod(pod("a", gpus=2, node_name="n0", phase="Running", labels={"flowsched.io/job": "j"})))
    s.upsert_pod(parse_pod(pod("b", gpus=1, node_name="n0", phase="Running")))
    view = s.read().view(["n0"], now=0.0, stale_after_s=60)
    assert np.isnan(view.arrays.completing_gpus[0])  # no progress data yet: unknown, not zero
    s.set_job_convergence("default/j", JobConvergence(Phase.COMPLETING, float("nan"), 0.0))
    assert s.read().view(["n0"], 0.0, 60).arrays.completing_gpus[0] == 2
    s.set_job_convergence("default/j", JobConvergence(Phase.GROWING, 5000.0, 0.0))
    assert s.read().view(["n0"], 0.0, 60).arrays.completing_gpus[0] == 0
    s.set_job_convergence("default/j", JobConvergence(Phase.GROWING, 60.0, 0.0))  # finishes within horizon
    assert s.read().view(["n0"], 0.0, 60).arrays.completing_gpus[0] == 2


def test_stale_telemetry_is_unknown_in_views() -> None:
    s = _state_with()
    assert s.set_node_telemetry("n0", [95, 95, 95, 95], [100, 100, 100, 100], sampled_at=100.0)
    assert not s.set_node_telemetry("nope", [1], [1], 100.0)
    fresh = s.read().view(["n0", "n1"], now=110.0, stale_after_s=60)
    assert fresh.arrays.gpu_util[0, 0] == 95 and np.isnan(fresh.arrays.gpu_util[1]).all()
    stale = s.read().view(["n0"], now=200.0, stale_after_s=60)
    assert np.isnan(stale.arrays.gpu_util).all()
    assert _row(s, "n0").gpu_util[0] == 95  # the view masks; the stored sample is untouched


def test_pod_times_for_the_migrator() -> None:
    p = parse_pod({"metadata": {"name": "a", "namespace": "ns", "creationTimestamp": "2025-01-02T03:04:05Z"},
                "spec": {}, "status": {"startTime": "2025-01-02T03:05:05Z"}})
    assert p.created_at is not None and p.started_at is not None and p.started_at - p.created_at == 60.0
    q = parse_pod({"metadata": {"name": "b"}, "spec": {}, "status": {}})
    assert q.created_at is None and q.started_at is None


def test_watch_defers_its_events_while_a_verb_is_answered_and_still_applies_them() -> None:
    """The pod watch waits for quiet (no verb being answered, at most DEFER_MAX_S) before each
    event, then applies every event in order."""
    import time

    import orjson

    from extender.metrics import build_metrics
    from extender.snapshot.watcher import Watcher

    lines = [orjson.dumps({"type": "ADDED", "object": pod(f"p{i}", node_name="n1", gpus=1)}) for i in range(3)]

    class Resp:
        def stream(self, *_a: object, **_k: object) -> list[bytes]:
            return [b"\n".join(lines) + b"\n"]

        def release_conn(self) -> None:
            pass

    def no_list(*_a: object) -> object:
        raise AssertionError("the test watches only")

    waits: list[float] = []

    def always_busy(timeout_s: float) -> None:  # a verb always in flight: every event waits it out
        waits.append(timeout_s)
        time.sleep(timeout_s)

    state = ClusterState()
    w = Watcher("pods", no_list, lambda *_a: Resp(), state, build_metrics(), gpu_resource="nvidia.com/gpu", resync_s=60,
                watch_timeout_s=10, backoff_max_s=1, quiet=always_busy)
    w._watch("1", until=time.monotonic() + 60)
    assert state.read().counts()["pods"] == 3 and waits == [Watcher.DEFER_MAX_S] * 3  # each event waited, none dropped
    quiet = Watcher("pods", no_list, lambda *_a: Resp(), ClusterState(), build_metrics(), gpu_resource="nvidia.com/gpu",
                    resync_s=60, watch_timeout_s=10, backoff_max_s=1, quiet=None)
    quiet._watch("1", until=time.monotonic() + 60)
    assert quiet.state.read().counts()["pods"] == 3

    # A deletion is applied at once, never held: it frees GPUs kube-scheduler may be placing on.
    lines.append(orjson.dumps({"type": "DELETED", "object": pod("p0", node_name="n1", gpus=1)}))
    waits.clear()
    w._watch("1", until=time.monotonic() + 60)
    assert state.read().counts()["pods"] == 2 and waits == [Watcher.DEFER_MAX_S] * 3
