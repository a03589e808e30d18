"""Annotations on a small Lease beside the leader Lease: where what the loops must not forget
outlives the leader (budget_store.py: the hourly budgets; mark_store.py: the eviction marks).
The RBAC for Leases is already there, and nobody holds these Leases (no spec.holderIdentity).

    notes = LeaseNotes(api_client, "flowsched", "flowsched-leader-budgets")
    notes.read()                                    # {} when the Lease does not exist yet
    notes.update("flowsched.io/spent-migrator", lambda old: new_value_from(old))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from extender.kube import requests
from extender.kube.client import send
from extender.kube.requests import Request
from extender.kube.responses import Response, json_body, json_or_none

CONFLICT_RETRIES = 3


class LeaseNotes:
    def __init__(self, api_client: Any, namespace: str, name: str, timeout_s: float = 5.0) -> None:
        self.api_client, self.namespace, self.name, self.timeout_s = api_client, namespace, name, timeout_s

    def _send(self, request: Request) -> Response:
        return send(self.api_client, request, timeout_s=self.timeout_s)

    def _get(self) -> dict[str, Any] | None:
        req = requests.get_lease(self.namespace, self.name)
        return json_or_none(req, self._send(req))

    def read(self) -> dict[str, str]:
        """The Lease's string annotations; {} when it does not exist. Unreadable: raises."""
        annotations = ((self._get() or {}).get("metadata") or {}).get("annotations") or {}
        return {k: v for k, v in annotations.items() if isinstance(k, str) and isinstance(v, str)}

    def update(self, key: str, value: Callable[[str | None], str]) -> None:
        """Sets annotation `key` to value(its current value, None when unset): read, modify,
        write, read again on a conflict (another writer in between, a second leader for a moment),
        so that no writer's change to another key, or to this one, is lost. Raises ApiError for
        any other refusal, RuntimeError when the conflicts go on."""
        for _ in range(CONFLICT_RETRIES):
            obj = self._get()
            if obj is None:
                req = requests.create_lease(self.namespace, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/name": "flowsched"},
                                 "annotations": {key: value(None)}}, "spec": {}})
            else:
                annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
                old = annotations.get(key)
                annotations[key] = value(old if isinstance(old, str) else None)
                req = requests.replace_lease(self.namespace, self.name, obj)
            resp = self._send(req)
            if resp.status != 409:
                json_body(req, resp)  # raises ApiError for any other refusal
                return
        raise RuntimeError(f"lease {self.namespace}/{self.name}: kept conflicting")
