"""The sans-I/O Kubernetes layer on plain values: what each builder asks the apiserver, and what
each answer means (the control loops' TemporaryError / PermanentError contract)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extender.kube import requests as rq
from extender.kube import responses as rs
from extender.kube.errors import ApiError, PermanentError, TemporaryError


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> rs.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body if body is not None else {}).encode()
    return rs.Response(status, raw, headers or {})


# ---- builders ----
def test_eviction_is_policy_v1_with_the_uid_precondition_and_an_optional_dry_run() -> None:
    r = rq.evict_pod("team-a", "train-0", "u1")
    assert (r.method, r.path, r.query) == ("POST", "/api/v1/namespaces/team-a/pods/train-0/eviction", ())
    assert r.body == {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": "train-0", "namespace": "team-a"},
                      "deleteOptions": {"preconditions": {"uid": "u1"}}}
    dry = rq.evict_pod("team-a", "train-0", dry_run=True)
    assert dry.query == (("dryRun", "All"),) and "deleteOptions" not in dry.body
    assert dry.target == "/api/v1/namespaces/team-a/pods/train-0/eviction?dryRun=All"


def test_pod_patches_are_merge_patches_where_none_deletes() -> None:
    r = rq.patch_pod_metadata("t", "p", annotations={"a": "1", "b": None})
    assert (r.method, r.path, r.content_type) == ("PATCH", "/api/v1/namespaces/t/pods/p", rq.MERGE_PATCH)
    assert r.body == {"metadata": {"annotations": {"a": "1", "b": None}}}
    assert rq.patch_pod_metadata("t", "p", labels={"x": "y"}).body == {"metadata": {"labels": {"x": "y"}}}
    assert rq.set_pod_scheduling_gates("t", "p", ["g1"]).body == {"spec": {"schedulingGates": [{"name": "g1"}]}}
    # No gate left: the field itself goes.
    assert rq.set_pod_scheduling_gates("t", "p", []).body == {"spec": {"schedulingGates": None}}


def test_resize_patches_the_subresource_as_flowsched() -> None:
    r = rq.resize_pod("t", "p", "main", {"requests": {"cpu": "1500m"}, "limits": {"cpu": "3"}})
    assert (r.method, r.path, r.content_type) == ("PATCH", "/api/v1/namespaces/t/pods/p/resize",
                                                  rq.STRATEGIC_MERGE_PATCH)
    assert r.query == (("fieldManager", "flowsched"),)
    assert r.body == {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1500m"},
                                                                             "limits": {"cpu": "3"}}}]}}


def test_leases_events_and_namespaces() -> None:
    lease = {"metadata": {"name": "l", "resourceVersion": "7"}, "spec": {}}
    assert rq.get_lease("fs", "l").path == "/apis/coordination.k8s.io/v1/namespaces/fs/leases/l"
    assert (rq.create_lease("fs", lease).method, rq.create_lease("fs", lease).path) == (
        "POST", "/apis/coordination.k8s.io/v1/namespaces/fs/leases")
    put = rq.replace_lease("fs", "l", lease)
    assert (put.method, put.path, put.body) == ("PUT", "/apis/coordination.k8s.io/v1/namespaces/fs/leases/l", lease)
    ev = rq.create_event("t", {"kind": "Event"})
    assert (ev.method, ev.path, ev.body) == ("POST", "/api/v1/namespaces/t/events", {"kind": "Event"})
    assert (rq.list_namespaces().method, rq.list_namespaces().path) == ("GET", "/api/v1/namespaces")


def test_pytorchjob_patch_carries_the_plan_and_optionally_the_worker_count() -> None:
    assert rq.get_pytorchjob("t", "j").path == "/apis/kubeflow.org/v1/namespaces/t/pytorchjobs/j"
    only_plan = rq.patch_pytorchjob("t", "j", annotations={"flowsched.io/plan": "{}"})
    assert only_plan.body == {"metadata": {"annotations": {"flowsched.io/plan": "{}"}}}
    assert only_plan.content_type == rq.MERGE_PATCH
    scaled = rq.patch_pytorchjob("t", "j", annotations={"p": "x"}, worker_replicas=3)
    assert scaled.body["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}


def test_token_review_and_reads() -> None:
    r = rq.token_review("tok", ["flowsched"])
    assert (r.method, r.path) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
    assert r.body["spec"] == {"token": "tok", "audiences": ["flowsched"]}
    assert "audiences" not in rq.token_review("tok").body["spec"]
    log = rq.follow_pod_log("t", "p", "c", since="2026-01-01T00:00:00Z")
    assert log.path == "/api/v1/namespaces/t/pods/p/log" and log.accept == "*/*"
    assert dict(log.query) == {"container": "c", "follow": "true", "timestamps": "true",
                               "sinceTime": "2026-01-01T00:00:00Z"}
    assert rq.list_pods_on_node("n1").query == (("fieldSelector", "spec.nodeName=n1"),)
    assert rq.list_pods(namespace="gpu", label_selector="app=x").path == "/api/v1/namespaces/gpu/pods"
    page = rq.list_objects("nodes", limit=500, continue_="c1")
    assert (page.path, page.query) == ("/api/v1/nodes", (("continue", "c1"), ("limit", "500")))
    watch = dict(rq.watch_objects("pods", "42", 300).query)
    assert watch == {"watch": "true", "resourceVersion": "42", "allowWatchBookmarks": "true",
                     "timeoutSeconds": "300"}
    with pytest.raises(ValueError):
        rq.list_objects("secrets")


# ---- interpretation ----
EVICT = rq.evict_pod("t", "p", "u1")


@pytest.mark.parametrize(("status", "kind"), [
    (408, TemporaryError), (409, TemporaryError), (429, TemporaryError), (500, TemporaryError),
    (503, TemporaryError), (501, PermanentError), (400, PermanentError), (403, PermanentError),
    (422, PermanentError),
])
def test_refusals_are_classified(status: int, kind: type) -> None:
    with pytest.raises(kind):
        rs.classified(EVICT, answer(status, {"message": "no"}), "evict t/p", retry_s=5.0)


def test_retry_after_is_honoured_above_our_least_delay() -> None:
    with pytest.raises(TemporaryError) as e:
        rs.classified(EVICT, answer(429, {"message": "pdb"}, {"Retry-After": "17"}), "evict t/p", retry_s=5.0)
    assert e.value.delay_s == 17.0 and "evict t/p: 429 pdb" in str(e.value)
    with pytest.raises(TemporaryError) as e:
        rs.classified(EVICT, answer(503, {}, {"Retry-After": "1"}), "evict t/p", retry_s=5.0)
    assert e.value.delay_s == 5.0


def test_a_call_without_an_answer_is_temporary() -> None:
    mapped = rs.map_api_error(TimeoutError("read timed out"), "evict t/p", retry_s=3.0)
    assert isinstance(mapped, TemporaryError) and mapped.delay_s == 3.0 and "TimeoutError" in str(mapped)


def test_eviction_outcomes() -> None:
    assert rs.eviction_accepted(EVICT, answer(201), uid="u1", what="e") is True
    assert rs.eviction_accepted(EVICT, answer(404), uid="u1", what="e") is False
    # Another pod of the same name now: the precondition fails, ours is gone.
    gone = answer(409, {"message": "Precondition failed: UID in precondition: u1, UID in object meta: u2"})
    assert rs.eviction_accepted(EVICT, gone, uid="u1", what="e") is False
    with pytest.raises(TemporaryError):  # a 409 of another kind is a conflict to retry
        rs.eviction_accepted(EVICT, answer(409, {"message": "conflict"}), uid="u1", what="e")
    with pytest.raises(TemporaryError):  # without a uid there is no precondition to fail
        rs.eviction_accepted(EVICT, gone, uid="", what="e")
    with pytest.raises(TemporaryError):
        rs.eviction_accepted(EVICT, answer(429, {"message": "Cannot evict pod: disruption budget"}), uid="u1",
                             what="e")


def test_patch_and_read_outcomes() -> None:
    patch = rq.patch_pod_metadata("t", "p", annotations={"a": None})
    assert rs.patch_applied(patch, answer(200), what="annotate") is True
    assert rs.patch_applied(patch, answer(404), what="annotate") is False
    with pytest.raises(PermanentError):
        rs.patch_applied(patch, answer(403, {"message": "forbidden"}), what="annotate")
    get = rq.get_lease("fs", "l")
    assert rs.json_or_none(get, answer(404)) is None
    assert rs.json_or_none(get, answer(200, {"spec": {}})) == {"spec": {}}
    assert rs.json_body(get, rs.Response(200, b"")) == {}
    with pytest.raises(ApiError) as e:
        rs.json_body(get, answer(403, {"reason": "Forbidden", "message": "leases is forbidden"}))
    assert e.value.status == 403 and e.value.reason == "Forbidden"
    assert str(e.value).startswith("GET /apis/coordination.k8s.io/v1/namespaces/fs/leases/l -> 403 Forbidden")


def test_token_review_status() -> None:
    req = rq.token_review("tok")
    ok = answer(201, {"status": {"authenticated": True, "user": {"username": "system:serviceaccount:a:b"}}})
    assert rs.token_review_status(req, ok) == rs.TokenReviewStatus(True, "system:serviceaccount:a:b", "")
    assert rs.token_review_status(req, answer(201, {"status": {"error": "expired"}})) == rs.TokenReviewStatus(
        False, "", "expired")
    assert rs.token_review_status(req, answer(201, {})) == rs.TokenReviewStatus(False, "", "no status")
    with pytest.raises(ApiError):
        rs.token_review_status(req, answer(403))
