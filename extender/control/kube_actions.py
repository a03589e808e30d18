"""The few writes the control loops make, each built (extender.kube.requests), sent
(extender.kube.client) and read (extender.kube.responses) so that loops never interpret HTTP
statuses themselves: failures arrive as TemporaryError / PermanentError.

    actions = KubeActions(api_client)
    actions.evict("team-a", "train-0", uid)      # "evicted" | "gone"; 429 -> TemporaryError
    actions.annotate_pod("team-a", "train-0", {"flowsched.io/evicted-from": "gpu-3"})
"""

from __future__ import annotations

import logging
from typing import Any

from extender.kube import requests, responses
from extender.kube.client import send
from extender.kube.requests import Request
from extender.kube.responses import Response, map_api_error

log = logging.getLogger("flowsched.actions")

EVICTED = "evicted"
GONE = "gone"


class KubeActions:
    """write_timeout_s bounds each write. A loop checks leadership before every write, so the
    longest a replica can write after losing the Lease is one write; with write_timeout_s at most
    lease_duration_s - renew_deadline_s (5 s by default), even that write lands before another
    replica may take the Lease over (the service passes exactly that)."""

    def __init__(self, api_client: Any, retry_s: float = 30.0, write_timeout_s: float = 5.0) -> None:
        self.api_client = api_client
        self.retry_s = retry_s
        self.write_timeout_s = write_timeout_s

    def send(self, request: Request, what: str, timeout_s: float | None = None) -> Response:
        """The answer, whatever its status; a call that got none (refused, timed out) raises
        TemporaryError after retry_s. Every loop's reads and writes go through here, so that one
        setting (control.retry_after_s) paces them all. timeout_s defaults to write_timeout_s."""
        timeout_s = self.write_timeout_s if timeout_s is None else timeout_s
        try:
            return send(self.api_client, request, timeout_s=timeout_s)
        except Exception as e:
            raise map_api_error(e, what, self.retry_s) from e

    def evict(self, namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> str:
        """policy/v1 Eviction (PodDisruptionBudgets apply). With uid, only that incarnation of
        the pod is evicted (a replacement with the same name is left alone: 409 -> gone). With
        dry_run, the apiserver only says whether it would evict it now (`?dryRun=All`: the PDB
        check, nothing deleted or counted)."""
        what = f"evict{' (dry run)' if dry_run else ''} {namespace}/{name}"
        req = requests.evict_pod(namespace, name, uid, dry_run=dry_run)
        resp = self.send(req, what, self.write_timeout_s)
        return EVICTED if responses.eviction_accepted(req, resp, uid=uid, what=what, retry_s=self.retry_s) else GONE

    def check_evictable(self, namespace: str, name: str, uid: str = "") -> str:
        """Whether the pod may be evicted now: a dry-run eviction ("evicted": it would be,
        "gone"; a refusal raises as evict() does). Writes nothing."""
        return self.evict(namespace, name, uid, dry_run=True)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> bool:
        """Merge-patch annotations (None deletes one). False when the pod is gone."""
        what = f"annotate {namespace}/{name}"
        req = requests.patch_pod_metadata(namespace, name, annotations=annotations)
        return responses.patch_applied(req, self.send(req, what, self.write_timeout_s), what=what,
                                       retry_s=self.retry_s)

    def set_scheduling_gates(self, namespace: str, name: str, gates: list[str]) -> bool:
        """Leave the pod with exactly these scheduling gates (gates can only be removed, which is
        all this is used for). False when the pod is gone."""
        what = f"remove the scheduling gate of {namespace}/{name}"
        req = requests.set_pod_scheduling_gates(namespace, name, gates)
        return responses.patch_applied(req, self.send(req, what, self.write_timeout_s), what=what,
                                       retry_s=self.retry_s)

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """Every namespace's labels, read now (one LIST). Unreadable -> TemporaryError: the
        loops then plan nothing this interval rather than guess which namespaces opted out."""
        from extender.control.world_builder import labels_from_namespace_list

        what = "list namespaces"
        req = requests.list_namespaces()
        resp = responses.classified(req, self.send(req, what, 10), what, self.retry_s)
        try:
            body = responses.json_body(req, resp)
        except ValueError as e:  # a garbled answer: as unreadable as none
            raise map_api_error(e, what, self.retry_s) from e
        return labels_from_namespace_list(body)
