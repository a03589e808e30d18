"""Raw JSON requests through the kubernetes client's ApiClient (its auth, TLS and pool), without
the generated models: bodies go out as the API documents them and come back as dicts."""

from __future__ import annotations

import json
from typing import Any


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str, headers: dict[str, str]) -> None:
        self.status, self.body, self.headers = status, body, headers
        try:
            parsed = json.loads(body)
            self.reason = str(parsed.get("reason", ""))
            self.message = str(parsed.get("message", body))
        except (ValueError, AttributeError):
            self.reason, self.message = "", body
        super().__init__(f"{method} {path} -> {status} {self.reason}: {self.message[:300]}")


def kube_request(api_client: Any, method: str, path: str, body: Any = None,
                 content_type: str = "application/json", timeout_s: float = 30.0) -> dict[str, Any]:
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    m, url, hdrs, b, _ = api_client.param_serialize(method=method, resource_path=path, header_params=headers,
                                                    body=body, auth_settings=["BearerToken"])
    resp = api_client.call_api(m, url, header_params=hdrs, body=b, _request_timeout=timeout_s)
    data = resp.read()
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data or "")
    if resp.status >= 300:
        raw_headers = resp.getheaders() if hasattr(resp, "getheaders") else {}
        raise ApiError(method, path, int(resp.status), text, {str(k): str(v) for k, v in dict(raw_headers).items()})
    out: dict[str, Any] = json.loads(text) if text else {}
    return out
