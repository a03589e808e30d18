"""A raw JSON call in one line, for the control-loop shells not yet written as
build (extender.kube.requests) -> send (client) -> interpret (responses): a GET, POST, PUT or
PATCH of a path with a JSON body, the decoded answer back, a status >= 300 raised as ApiError."""

from __future__ import annotations

from typing import Any

from extender.kube.client import send
from extender.kube.requests import JSON, Request
from extender.kube.responses import json_body


def kube_request(api_client: Any, method: str, path: str, body: Any = None,
                 content_type: str = JSON, timeout_s: float = 30.0) -> dict[str, Any]:
    # A query already in the path goes out as written (already encoded: never split and re-encoded).
    request = Request(method, path, body=body, content_type=content_type)
    return json_body(request, send(api_client, request, timeout_s=timeout_s))
