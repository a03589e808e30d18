"""The mutating admission webhook that puts flowsched's scheduling gate on new pods.

kube-apiserver POSTs an `admission.k8s.io/v1` AdmissionReview for every pod CREATE the
MutatingWebhookConfiguration selects (docs/admission.md "Opting in": failurePolicy Ignore, so pods are
created ungated when flowsched is down, never refused). A pod whose `spec.schedulerName` is one
of flowsched's schedulers, that has no GPU-less opt-out and does not carry the gate yet, gets a
JSONPatch appending `{"name": "flowsched.io/admission"}` to `spec.schedulingGates`; every other
request is allowed unchanged. Sans-I/O: `review_response(body) -> dict`; the route only reads
the body and sends the answer.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from extender.http.body import BodyTooLarge, read_body

log = logging.getLogger("flowsched.webhook")

OPT_OUT = "flowsched.io/admission"  # annotation "skip": never gated (e.g. system pods)


REVIEW_VERSIONS = frozenset({"admission.k8s.io/v1", "admission.k8s.io/v1beta1"})


class ReviewError(ValueError):
    pass


def gate_patch(pod: Mapping[str, Any], gate: str, schedulers: Iterable[str]) -> list[dict[str, Any]] | None:
    """The JSONPatch that gates `pod`, or None when it is not flowsched's to gate.

    A pod whose fields have the wrong JSON types (which the apiserver never sends) is left alone,
    as one with no spec is: an ungated pod is still scheduled, only without the gate's ordering.
    """
    spec = pod.get("spec")
    meta = pod.get("metadata") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        return None
    name = spec.get("schedulerName")
    if not isinstance(name, str) or name not in set(schedulers):
        return None
    if spec.get("nodeName"):
        return None  # bound at creation: there is nothing to schedule
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return None  # its opt-out cannot be read: do not gate what may have opted out
    opt_out = annotations.get(OPT_OUT, "")
    if not isinstance(opt_out, str) or opt_out.lower() == "skip":
        return None  # a value that is not text (the apiserver sends none) is read as an opt-out
    gates = spec.get("schedulingGates")
    if isinstance(gates, list):
        if any(isinstance(g, Mapping) and g.get("name") == gate for g in gates):
            return None
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]}]


def review_response(review: Any, gate: str, schedulers: Iterable[str]) -> dict[str, Any]:
    """AdmissionReview request -> AdmissionReview response (always allowed)."""
    if not isinstance(review, Mapping) or review.get("kind") != "AdmissionReview":
        raise ReviewError("body is not an AdmissionReview")
    req = review.get("request")
    if not isinstance(req, Mapping) or not isinstance(req.get("uid"), str):
        raise ReviewError("request.uid missing")
    resp: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    obj = req.get("object")
    kind = (req.get("kind") or {}).get("kind") if isinstance(req.get("kind"), Mapping) else None
    if req.get("operation") == "CREATE" and kind == "Pod" and isinstance(obj, Mapping):
        patch = gate_patch(obj, gate, schedulers)
        if patch is not None:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    # Echoed only as one of the versions the apiserver speaks: a client's nested value here made
    # the reply's encoding fail (issue 33, finding 9: a 500).
    version = review.get("apiVersion")
    return {"apiVersion": version if isinstance(version, str) and version in REVIEW_VERSIONS else "admission.k8s.io/v1",
            "kind": "AdmissionReview", "response": resp}


MAX_BODY_BYTES = 4 << 20  # an AdmissionReview of one pod; the apiserver caps objects at 3 MiB


def build_webhook_router(gate: str, schedulers: Iterable[str], max_body_bytes: int = MAX_BODY_BYTES) -> APIRouter:
    """POST /webhook/gate: the AdmissionReview endpoint (served on flowsched's TLS listener)."""
    names = tuple(schedulers)
    router = APIRouter()

    @router.post("/webhook/gate")
    async def gate_pods(request: Request) -> Response:
        try:
            raw = await read_body(request, max_body_bytes)
            answer = review_response(orjson.loads(raw), gate, names)
        except BodyTooLarge:
            return Response(orjson.dumps({"error": f"body over {max_body_bytes} bytes"}), status_code=413,
                            media_type="application/json")
        except (orjson.JSONDecodeError, ReviewError, RecursionError) as e:  # nesting past Python's stack
            log.info("webhook: bad AdmissionReview: %s", e)
            return Response(orjson.dumps({"error": f"bad AdmissionReview: {e}"}), status_code=400,
                            media_type="application/json")
        return Response(orjson.dumps(answer), media_type="application/json")

    return router
