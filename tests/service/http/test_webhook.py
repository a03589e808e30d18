"""The gate webhook's AdmissionReview handling (the e2e test runs it behind the real apiserver)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from extender.http.webhook import ReviewError, build_webhook_router, review_response

GATE = "flowsched.io/admission"


def review(pod: dict[str, Any], op: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind}, "operation": op,
                        "object": pod}}


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    resp = answer["response"]
    assert resp["uid"] == "u-1" and resp["allowed"] is True
    return json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else None


def pod(scheduler: str = "flowsched", gates: list[str] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c"}]}
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"metadata": {"name": "p", **meta}, "spec": spec}


def test_flowsched_pods_get_the_gate_and_others_do_not() -> None:
    assert patch_of(review_response(review(pod()), GATE, ["flowsched"])) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    assert patch_of(review_response(review(pod(gates=["other"])), GATE, ["flowsched"])) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]
    for untouched in (pod(scheduler="default-scheduler"), pod(gates=[GATE]),
                      pod(annotations={"flowsched.io/admission": "skip"})):
        assert patch_of(review_response(review(untouched), GATE, ["flowsched"])) is None
    assert patch_of(review_response(review(pod(), op="UPDATE"), GATE, ["flowsched"])) is None
    assert patch_of(review_response(review(pod(), kind="Deployment"), GATE, ["flowsched"])) is None


def test_bad_reviews_are_errors_not_crashes() -> None:
    for bad in ({}, {"kind": "AdmissionReview"}, {"kind": "AdmissionReview", "request": {"uid": 3}}, [1]):
        with pytest.raises(ReviewError):
            review_response(bad, GATE, ["flowsched"])
    app = FastAPI()
    app.include_router(build_webhook_router(GATE, ["flowsched"], max_body_bytes=2048))
    http = TestClient(app)
    assert http.post("/webhook/gate", content=b"{not json").status_code == 400
    assert http.post("/webhook/gate", json={"kind": "Nope"}).status_code == 400
    assert http.post("/webhook/gate", content=b"x" * 5000).status_code == 413
    ok = http.post("/webhook/gate", json=review(pod()))
    assert ok.status_code == 200 and patch_of(ok.json()) is not None


def test_wrong_typed_pod_fields_are_left_alone_not_500() -> None:
    # An unhashable schedulerName (x in set(...)) or a list where metadata or annotations belong
    # (.get on a list) raised out of the route: 500. Like a pod with no spec, such a pod is not
    # gated and is allowed unchanged.
    app = FastAPI()
    app.include_router(build_webhook_router(GATE, ["flowsched"]))
    http = TestClient(app, raise_server_exceptions=False)
    odd: list[dict[str, Any]] = [
        {"metadata": {"name": "p"}, "spec": {"schedulerName": ["flowsched"]}},
        {"metadata": {"name": "p"}, "spec": {"schedulerName": {}}},
        {"metadata": ["p"], "spec": {"schedulerName": "flowsched"}},
        {"metadata": {"annotations": ["x"]}, "spec": {"schedulerName": "flowsched"}},
        {"metadata": "p", "spec": {"schedulerName": "flowsched"}},
    ]
    for obj in odd:
        r = http.post("/webhook/gate", json=review(obj))
        assert r.status_code == 200, (obj, r.text)
        assert patch_of(r.json()) is None
    # metadata null or without annotations is still gated
    for obj in ({"metadata": None, "spec": {"schedulerName": "flowsched"}},
                {"metadata": {"annotations": None}, "spec": {"schedulerName": "flowsched"}}):
        assert patch_of(http.post("/webhook/gate", json=review(obj)).json()) is not None
