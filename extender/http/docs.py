"""OpenAPI for the whole service at /openapi.json, FastAPI's Swagger UI at /docs.

FastAPI documents the routes it serves (progress API, job status, debug, health). The three
extender verbs are answered by a raw ASGI handler in front of FastAPI (extender.http.extender_app.ExtenderApp,
for speed), so FastAPI never sees them; their paths and kube-scheduler's extender/v1 shapes
(k8s.io/kube-scheduler/extender/v1/types.go: Go field names, no json tags) are added here by
hand. POST /v1/progress reads its body raw too; its schema is the pydantic model it validates
against. Both pages sit behind the debug gate (extender.http.debug_gate).

Swagger UI's script and stylesheet come from FastAPI's default CDN: a browser without internet
access gets an empty /docs page, but /openapi.json itself is complete and served locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import BaseRoute

from extender.http.debug_gate import debug_router
from extender.http.progress_wire import ReportIn

TITLE = "flowsched"
VERSION = "0.1.0"
DESCRIPTION = (
    "Convergence-aware GPU scheduler extender. kube-scheduler calls the three extender verbs; "
    "training jobs report progress to /v1/progress; operators read /v1/jobs, /debug/* and /ui. "
    "Failures of flowsched itself never block scheduling: the verbs then answer neutrally "
    "(every node passes, equal scores, victims kept)."
)

_OBJ: dict[str, Any] = {"type": "object", "additionalProperties": True}
_NAMES: dict[str, Any] = {"type": "array", "items": {"type": "string"}, "nullable": True}
_NODE_LIST: dict[str, Any] = {"type": "object", "nullable": True, "description": "a v1 NodeList (full-Node mode)",
                              "properties": {"items": {"type": "array", "items": _OBJ}}}
_REASONS: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "node name -> why it failed"}
_META_VICTIMS: dict[str, Any] = {
    "type": "object",
    "properties": {"Pods": {"type": "array", "items": {"type": "object", "properties": {"UID": {"type": "string"}}}},
                   "NumPDBViolations": {"type": "integer"}},
}

VERB_SCHEMAS: dict[str, dict[str, Any]] = {
    "ExtenderArgs": {
        "type": "object", "required": ["Pod"],
        "description": "Names mode (nodeCacheCapable: true) sends NodeNames; full-Node mode sends Nodes. "
                       "Keys are matched case-insensitively, as Go's decoder does.",
        "properties": {"Pod": {**_OBJ, "description": "the v1 Pod being scheduled"},
                       "Nodes": _NODE_LIST, "NodeNames": _NAMES},
    },
    "ExtenderFilterResult": {
        "type": "object",
        "properties": {"Nodes": _NODE_LIST, "NodeNames": _NAMES, "FailedNodes": _REASONS,
                       "FailedAndUnresolvableNodes": _REASONS, "Error": {"type": "string"}},
    },
    "HostPriority": {
        "type": "object", "required": ["Host", "Score"],
        "properties": {"Host": {"type": "string"}, "Score": {"type": "integer", "minimum": 0, "maximum": 10}},
    },
    "HostPriorityList": {"type": "array", "items": {"$ref": "#/components/schemas/HostPriority"}},
    "ExtenderPreemptionArgs": {
        "type": "object", "required": ["Pod"],
        "properties": {
            "Pod": _OBJ,
            "NodeNameToVictims": {"type": "object", "nullable": True, "description": "full victims (v1 Pods)",
                                  "additionalProperties": {"type": "object", "properties": {
                                      "Pods": {"type": "array", "items": _OBJ},
                                      "NumPDBViolations": {"type": "integer"}}}},
            "NodeNameToMetaVictims": {"type": "object", "nullable": True, "additionalProperties": _META_VICTIMS},
        },
    },
    "ExtenderPreemptionResult": {
        "type": "object",
        "properties": {"NodeNameToMetaVictims": {"type": "object", "additionalProperties": _META_VICTIMS}},
    },
    "Error": {"type": "object", "properties": {"error": {"type": "string"}}},
}

# path suffix -> (summary, request schema, reply schema, what a flowsched failure answers)
VERBS: dict[str, tuple[str, str, str, str]] = {
    "filter": ("Filter candidate nodes for a pod", "ExtenderArgs", "ExtenderFilterResult",
               "every candidate passes"),
    # deploy/'s configuration (filter-only mode, docs/hot-path.md): one call per pod.
    "filter-ranked": ("Filter, then keep only the nodes scored within rank_margin of the best (at most "
                      "rank_keep)", "ExtenderArgs", "ExtenderFilterResult", "every candidate passes"),
    "prioritize": ("Score candidate nodes 0-10", "ExtenderArgs", "HostPriorityList",
                   "every candidate scores the neutral score"),
    "preempt": ("Drop preemption victims flowsched wants kept", "ExtenderPreemptionArgs",
                "ExtenderPreemptionResult", "the victims come back unchanged"),
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _verb_operation(verb: str, summary: str, request: str, reply: str, fallback: str) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": _ref("Error")}}}
    return {"post": {
        "tags": ["extender verbs"],
        "summary": summary,
        "operationId": f"extender_{verb.replace('-', '_')}",
        "description": f"Called by kube-scheduler (extender/v1). Served by a raw ASGI handler, not FastAPI. "
                       f"If flowsched itself fails, it answers 200 anyway and {fallback}.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": {"description": "the extender's answer",
                              "content": {"application/json": {"schema": _ref(reply)}}},
                      "400": {"description": "malformed JSON or not extender/v1's shape", **err},
                      "405": {"description": "not POST", **err},
                      "413": {"description": "body over max_body_bytes", **err}},
    }}


def openapi_document(routes: Sequence[BaseRoute], verbs_prefix: str) -> dict[str, Any]:
    """The document: FastAPI's for its routes, plus the verbs and the progress body."""
    doc = get_openapi(title=TITLE, version=VERSION, description=DESCRIPTION, routes=list(routes))
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(VERB_SCHEMAS)
    for verb, (summary, request, reply, fallback) in VERBS.items():
        doc.setdefault("paths", {})[f"{verbs_prefix}/{verb}"] = _verb_operation(verb, summary, request, reply,
                                                                               fallback)
    report = ReportIn.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in report.pop("$defs", {}).items():
        schemas[name] = sub
    schemas["ReportIn"] = report
    doc["components"].setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer",
        "description": "the pod's service-account token (TokenReview) or a static token (progress_auth=static)"}
    post = doc.get("paths", {}).get("/v1/progress", {}).get("post")
    if post is not None:
        post["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref("ReportIn")}}}
    for path, item in doc.get("paths", {}).items():
        if path.startswith("/v1/"):
            for op in item.values():
                op["security"] = [{"bearer": []}]
    return doc


def build_docs_router(app: FastAPI, verbs_prefix: str) -> APIRouter:
    """GET /openapi.json and GET /docs. The document is built on first request, when every
    router is in place, and kept (routes do not change while the service runs)."""
    router = debug_router()
    built: dict[str, dict[str, Any]] = {}

    def document() -> dict[str, Any]:
        if "doc" not in built:
            built["doc"] = openapi_document(app.routes, verbs_prefix)
        return built["doc"]

    @router.get("/openapi.json", include_in_schema=False)
    async def openapi_json() -> Response:
        return JSONResponse(document())

    @router.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{TITLE} API")

    return router


