"""Where the loops' hourly budgets outlive the leader: a small Lease object beside the leader
Lease (`<lease_name>-budgets`; the RBAC for Leases is already there), one annotation per loop
holding the times of its real actions in the sliding hour.

Without it a restart, a crash loop or a change of leader started every budget afresh: a leader
restarting five times in an hour could evict 36 jobs against a limit of 6. The leader loads
them before every plan (ControlLoop: the Lease may have changed hands since its last tick); each
real action saves its loop's times. Dry-run spends are never saved: switching to --act must not
find the hour already spent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from extender.kube import requests
from extender.kube.client import send
from extender.kube.requests import Request
from extender.kube.responses import Response, json_body, json_or_none

ANNOTATION = "flowsched.io/spent-"  # + loop name


class BudgetStore(Protocol):
    def load(self) -> Mapping[str, list[float]]: ...

    def save(self, loop: str, times: Iterable[float]) -> None: ...


def parse_times(value: str) -> list[float]:
    """An annotation's JSON list -> the finite times in it (anything else: none)."""
    try:
        raw = json.loads(value)
    except ValueError:
        return []
    if not isinstance(raw, list):
        return []
    return [float(t) for t in raw if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)]


class LeaseBudgetStore:
    def __init__(self, api_client: Any, namespace: str, name: str, timeout_s: float = 5.0) -> None:
        self.api_client, self.namespace, self.name, self.timeout_s = api_client, namespace, name, timeout_s

    def _send(self, request: Request) -> Response:
        return send(self.api_client, request, timeout_s=self.timeout_s)

    def _get(self) -> dict[str, Any] | None:
        req = requests.get_lease(self.namespace, self.name)
        return json_or_none(req, self._send(req))

    def load(self) -> dict[str, list[float]]:
        """Loop -> its saved times; nothing saved yet -> {}. Unreadable: raises (the caller plans
        nothing rather than act on a budget it could not read)."""
        obj = self._get()
        annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        return {k[len(ANNOTATION):]: parse_times(v) for k, v in annotations.items()
                if isinstance(k, str) and k.startswith(ANNOTATION) and isinstance(v, str)}

    def save(self, loop: str, times: Iterable[float]) -> None:
        # Full precision: json writes a float so that it reads back equal, and Budget.restore
        # matches spends by value (a rounded copy would count as another action).
        value = json.dumps([float(t) for t in times])
        for _ in range(3):  # a conflicting writer (a second leader for a moment): read again
            obj = self._get()
            if obj is None:
                req = requests.create_lease(self.namespace, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/name": "flowsched"},
                                 "annotations": {ANNOTATION + loop: value}}, "spec": {}})
            else:
                meta = obj.setdefault("metadata", {})
                meta.setdefault("annotations", {})[ANNOTATION + loop] = value
                req = requests.replace_lease(self.namespace, self.name, obj)
            resp = self._send(req)
            if resp.status != 409:
                json_body(req, resp)  # raises ApiError for any other refusal
                return
        raise RuntimeError(f"budget store {self.namespace}/{self.name}: kept conflicting")

