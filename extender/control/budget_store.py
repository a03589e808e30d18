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

from extender.kube.rest import ApiError, kube_request

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

    def _path(self, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        return f"{base}/{name}" if name else base

    def _get(self) -> dict[str, Any] | None:
        try:
            return kube_request(self.api_client, "GET", self._path(self.name), timeout_s=self.timeout_s)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

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
            try:
                if obj is None:
                    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": self.name, "namespace": self.namespace,
                                         "labels": {"app.kubernetes.io/name": "flowsched"},
                                         "annotations": {ANNOTATION + loop: value}}, "spec": {}}
                    kube_request(self.api_client, "POST", self._path(), body, timeout_s=self.timeout_s)
                else:
                    meta = obj.setdefault("metadata", {})
                    meta.setdefault("annotations", {})[ANNOTATION + loop] = value
                    kube_request(self.api_client, "PUT", self._path(self.name), obj, timeout_s=self.timeout_s)
                return
            except ApiError as e:
                if e.status != 409:
                    raise
        raise RuntimeError(f"budget store {self.namespace}/{self.name}: kept conflicting")

