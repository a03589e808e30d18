"""The few writes the control loops make, with API failures mapped to TemporaryError /
PermanentError so loops never interpret HTTP statuses themselves.

    actions = KubeActions(api_client)
    actions.evict("team-a", "train-0", uid)      # "evicted" | "gone"; 429 -> TemporaryError
    actions.annotate_pod("team-a", "train-0", {"flowsched.io/evicted-from": "gpu-3"})
"""

from __future__ import annotations

import json
import logging
from typing import Any

from extender.control.errors import PermanentError, TemporaryError
from extender.kube.rest import kube_request

log = logging.getLogger("flowsched.actions")

EVICTED = "evicted"
GONE = "gone"
MERGE_PATCH = "application/merge-patch+json"


def _status(e: Exception) -> int | None:
    s = getattr(e, "status", None)
    return int(s) if isinstance(s, int) else None


def _retry_after(e: Exception, default: float) -> float:
    headers = getattr(e, "headers", None) or {}
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
        return float(value) if value is not None else default
    except (TypeError, ValueError, AttributeError):
        return default


def _message(e: Exception) -> str:
    body = getattr(e, "body", None)
    if body:
        try:
            return str(json.loads(body).get("message", body))[:300]
        except (ValueError, AttributeError):
            return str(body)[:300]
    return str(e)[:300]


def map_api_error(e: Exception, what: str, retry_s: float = 30.0) -> Exception:
    """An API exception -> TemporaryError (retry later) or PermanentError. Non-API errors
    (connection refused, timeouts) are temporary."""
    status = _status(e)
    msg = f"{what}: {status or type(e).__name__} {_message(e)}"
    if status is None or status in (408, 409, 429) or (status >= 500 and status != 501):
        # 500 from the eviction endpoint can also mean several PDBs cover the pod: an operator
        # must fix that, but retrying slowly costs nothing and is what kubectl drain does.
        return TemporaryError(msg, max(_retry_after(e, retry_s), retry_s))
    return PermanentError(msg)


class KubeActions:
    """write_timeout_s bounds each write. A loop checks leadership before every write, so the
    longest a replica can write after losing the Lease is one write; with write_timeout_s at most
    lease_duration_s - renew_deadline_s (5 s by default), even that write lands before another
    replica may take the Lease over (the service passes exactly that)."""

    def __init__(self, api_client: Any, retry_s: float = 30.0, write_timeout_s: float = 5.0) -> None:
        self.api_client = api_client
        self.retry_s = retry_s
        self.write_timeout_s = write_timeout_s

    def evict(self, namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> str:
        """policy/v1 Eviction (PodDisruptionBudgets apply). With uid, only that incarnation of
        the pod is evicted (a replacement with the same name is left alone: 409 -> gone). With
        dry_run, the apiserver only says whether it would evict it now (`?dryRun=All`: the PDB
        check, nothing deleted or counted)."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction" + ("?dryRun=All" if dry_run else "")
        try:
            kube_request(self.api_client, "POST", path, body, timeout_s=self.write_timeout_s)
        except Exception as e:
            status = _status(e)
            if status == 404:
                return GONE
            if status == 409 and uid and "precondition" in _message(e).lower():
                return GONE  # a different pod of the same name now
            what = f"evict{' (dry run)' if dry_run else ''} {namespace}/{name}"
            raise map_api_error(e, what, self.retry_s) from e
        return EVICTED

    def check_evictable(self, namespace: str, name: str, uid: str = "") -> str:
        """Whether the pod may be evicted now: a dry-run eviction ("evicted": it would be,
        "gone"; a refusal raises as evict() does). Writes nothing."""
        return self.evict(namespace, name, uid, dry_run=True)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> bool:
        """Merge-patch annotations (None deletes one). False when the pod is gone."""
        try:
            kube_request(self.api_client, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                         {"metadata": {"annotations": annotations}}, content_type=MERGE_PATCH,
                         timeout_s=self.write_timeout_s)
        except Exception as e:
            if _status(e) == 404:
                return False
            raise map_api_error(e, f"annotate {namespace}/{name}", self.retry_s) from e
        return True

    def set_scheduling_gates(self, namespace: str, name: str, gates: list[str]) -> bool:
        """Leave the pod with exactly these scheduling gates (gates can only be removed, which is
        all this is used for). False when the pod is gone."""
        body = {"spec": {"schedulingGates": [{"name": g} for g in gates] or None}}
        try:
            kube_request(self.api_client, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body,
                         content_type=MERGE_PATCH, timeout_s=self.write_timeout_s)
        except Exception as e:
            if _status(e) == 404:
                return False
            raise map_api_error(e, f"remove the scheduling gate of {namespace}/{name}", self.retry_s) from e
        return True

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """Every namespace's labels, read now (one LIST). Unreadable -> TemporaryError: the
        loops then plan nothing this interval rather than guess which namespaces opted out."""
        from extender.control.world_builder import labels_from_namespace_list

        try:
            body = kube_request(self.api_client, "GET", "/api/v1/namespaces", timeout_s=10)
        except Exception as e:
            raise map_api_error(e, "list namespaces", self.retry_s) from e
        return labels_from_namespace_list(body)
