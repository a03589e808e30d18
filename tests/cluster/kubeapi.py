"""A thin JSON client for the test harness, straight over the Kubernetes REST API.

Raw requests keep every detail visible in the tests (the patch content type, dryRun, the
status subresource, a watch's resourceVersion) instead of hiding it behind generated models.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            self.reason = str(json.loads(body).get("reason", ""))
            self.message = str(json.loads(body).get("message", body))
        except ValueError:
            self.reason, self.message = "", body
        super().__init__(f"{method} {path} -> {status} {self.reason}: {self.message}")


class Kube:
    def __init__(self, server: str, token: str, ssl_context: ssl.SSLContext, timeout_s: float = 15.0) -> None:
        self.server = server
        self._token = token
        self._ssl = ssl_context
        self.http = httpx.Client(base_url=server, verify=ssl_context, timeout=timeout_s,
                                 headers={"Authorization": f"Bearer {token}"})

    def clone(self) -> Kube:
        """A separate connection pool, for another thread."""
        return Kube(self.server, self._token, self._ssl)

    def close(self) -> None:
        self.http.close()

    # ---- plain verbs ----
    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                content_type: str = "application/json") -> JSON:
        content = None
        if body is not None:
            content = body if isinstance(body, str | bytes) else json.dumps(body)
        r = self.http.request(method, path, content=content, params=params,
                              headers={"Content-Type": content_type} if content is not None else None)
        if r.status_code >= 300:
            raise KubeError(method, path, r.status_code, r.text)
        return r.json() if r.content else {}

    def get(self, path: str, **params: Any) -> JSON:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, obj: JSON, **params: Any) -> JSON:
        return self.request("POST", path, obj, params=params or None)

    def merge_patch(self, path: str, patch: JSON, **params: Any) -> JSON:
        return self.request("PATCH", path, patch, params=params or None, content_type=MERGE_PATCH)

    def delete(self, path: str, grace_period_s: int | None = None, missing_ok: bool = True) -> JSON:
        body = None if grace_period_s is None else {"gracePeriodSeconds": grace_period_s}
        try:
            return self.request("DELETE", path, body)
        except KubeError as e:
            if e.status == 404 and missing_ok:
                return {}
            raise

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True

    def watch(self, path: str, resource_version: str, timeout_s: int = 30,
              **params: Any) -> Iterator[tuple[str, JSON]]:
        """Yield (type, object) from a watch until the server closes it (after timeout_s)."""
        q = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_s),
             "allowWatchBookmarks": "true", **params}
        with self.http.stream("GET", path, params=q, timeout=httpx.Timeout(timeout_s + 10)) as r:
            if r.status_code >= 300:
                raise KubeError("WATCH", path, r.status_code, r.read().decode(errors="replace"))
            for line in r.iter_lines():
                if line:
                    ev = json.loads(line)
                    yield ev["type"], ev["object"]


# ---- paths ----
def pods_path(ns: str | None = None) -> str:
    return f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"


def pod_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}"


def node_path(name: str = "") -> str:
    return f"/api/v1/nodes/{name}" if name else "/api/v1/nodes"
