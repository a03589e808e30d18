"""Every call flowsched makes to the apiserver, as a value: method, path, query, body and content
type, built here with no I/O (lightkube's shape). extender.kube.client sends one; what came back
is read by extender.kube.responses. Bodies are plain JSON as the API documents them (no
generated models).

    req = evict_pod("team-a", "train-0", uid, dry_run=True)
    resp = client.send(api_client, req, timeout_s=5)
    responses.eviction_accepted(req, resp, uid=uid, what="evict team-a/train-0")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
FIELD_MANAGER = "flowsched"

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
PYTORCHJOB = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/{name}"


@dataclass(frozen=True)
class Request:
    """One apiserver call. body None: none is sent (and no Content-Type)."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: Any = None
    content_type: str = JSON
    accept: str = JSON

    @property
    def target(self) -> str:
        """Path and query as one string, for messages."""
        return f"{self.path}?{urlencode(self.query)}" if self.query else self.path


def _pod(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


# ---- pods ----
def evict_pod(namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> Request:
    """policy/v1 Eviction (PodDisruptionBudgets apply). With uid, only that incarnation of the pod
    (a replacement of the same name is refused with a 409 precondition failure). dry_run: the
    apiserver only says whether it would evict now (`dryRun=All`: the PDB check, nothing deleted)."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": namespace}}
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return Request("POST", _pod(namespace, name) + "/eviction", (("dryRun", "All"),) if dry_run else (), body)


def patch_pod_metadata(namespace: str, name: str, *, annotations: Mapping[str, str | None] | None = None,
                       labels: Mapping[str, str | None] | None = None) -> Request:
    """A merge patch of the pod's annotations and/or labels (a None value deletes that key)."""
    meta: dict[str, Any] = {}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    return Request("PATCH", _pod(namespace, name), body={"metadata": meta}, content_type=MERGE_PATCH)


def set_pod_scheduling_gates(namespace: str, name: str, gates: Sequence[str]) -> Request:
    """Leave the pod with exactly these scheduling gates (the API only lets gates be removed);
    none: the field is deleted."""
    body = {"spec": {"schedulingGates": [{"name": g} for g in gates] or None}}
    return Request("PATCH", _pod(namespace, name), body=body, content_type=MERGE_PATCH)


def resize_pod(namespace: str, name: str, container: str, resources: Mapping[str, Any]) -> Request:
    """The pod's `resize` subresource (in-place resize, Kubernetes 1.33+): one container's
    resources ({"requests": {"cpu": "1500m"}, "limits": {...}}), as a strategic merge patch."""
    body = {"spec": {"containers": [{"name": container, "resources": dict(resources)}]}}
    return Request("PATCH", _pod(namespace, name) + "/resize", (("fieldManager", FIELD_MANAGER),), body,
                   content_type=STRATEGIC_MERGE_PATCH)


def list_pods(*, namespace: str | None = None, label_selector: str | None = None, field_selector: str | None = None,
              limit: int | None = None, continue_: str | None = None) -> Request:
    """All namespaces' pods, or one namespace's; optionally selected and paginated."""
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    return Request("GET", path, _list_query(label_selector, field_selector, limit, continue_))


def list_pods_on_node(node: str) -> Request:
    return list_pods(field_selector=f"spec.nodeName={node}")


def follow_pod_log(namespace: str, pod: str, container: str, since: str | None = None) -> Request:
    """pods/log, followed, each line prefixed with its timestamp; since: RFC 3339 (sinceTime,
    which the generated client's read_namespaced_pod_log lacks)."""
    query = [("container", container), ("follow", "true"), ("timestamps", "true")]
    if since:
        query.append(("sinceTime", since))
    return Request("GET", _pod(namespace, pod) + "/log", tuple(query), accept="*/*")


# ---- list + watch (nodes, pods, and DRA's resource.k8s.io/v1 kinds) ----
# Every kind the snapshot watches, cluster-wide: DRA's (Kubernetes 1.34+) beside the core two.
WATCHED = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "deviceclasses": "/apis/resource.k8s.io/v1/deviceclasses",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
}


def list_objects(kind: str, *, limit: int | None = None, continue_: str | None = None) -> Request:
    """A page of every object of a watched kind (WATCHED: "nodes", "pods", "resourceslices", ...),
    cluster-wide."""
    return Request("GET", _path(kind), _list_query(None, None, limit, continue_))


def watch_objects(kind: str, resource_version: str, timeout_s: int) -> Request:
    """A watch of every object of a watched kind from resource_version, with bookmarks; the server
    ends it after timeout_s."""
    return Request("GET", _path(kind), (
        ("allowWatchBookmarks", "true"), ("resourceVersion", resource_version),
        ("timeoutSeconds", str(int(timeout_s))), ("watch", "true")))


def _path(kind: str) -> str:
    path = WATCHED.get(kind)
    if path is None:
        raise ValueError(f"kind must be one of {', '.join(WATCHED)}, not {kind!r}")
    return path


def _list_query(label_selector: str | None, field_selector: str | None, limit: int | None,
                continue_: str | None) -> tuple[tuple[str, str], ...]:
    query: list[tuple[str, str]] = []
    if continue_:
        query.append(("continue", continue_))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    if label_selector:
        query.append(("labelSelector", label_selector))
    if limit is not None:
        query.append(("limit", str(int(limit))))
    return tuple(query)


# ---- namespaces, events ----
def list_namespaces() -> Request:
    return Request("GET", "/api/v1/namespaces")


def create_event(namespace: str, event: Mapping[str, Any]) -> Request:
    """A core/v1 Event (extender.control.events.event_body builds one)."""
    return Request("POST", f"/api/v1/namespaces/{namespace}/events", body=dict(event))


# ---- coordination.k8s.io/v1 Leases (leader election, the budget store) ----
def get_lease(namespace: str, name: str) -> Request:
    return Request("GET", f"{LEASES.format(ns=namespace)}/{name}")


def create_lease(namespace: str, lease: Mapping[str, Any]) -> Request:
    return Request("POST", LEASES.format(ns=namespace), body=dict(lease))


def replace_lease(namespace: str, name: str, lease: Mapping[str, Any]) -> Request:
    """A PUT of the whole object; with metadata.resourceVersion set, a concurrent writer's change
    makes it fail with 409."""
    return Request("PUT", f"{LEASES.format(ns=namespace)}/{name}", body=dict(lease))


# ---- Kubeflow PyTorchJobs ----
def get_pytorchjob(namespace: str, name: str) -> Request:
    return Request("GET", PYTORCHJOB.format(ns=namespace, name=name))


def patch_pytorchjob(namespace: str, name: str, *, annotations: Mapping[str, str | None] | None = None,
                     worker_replicas: int | None = None) -> Request:
    """A merge patch of the job's annotations and/or its Worker replica count."""
    body: dict[str, Any] = {}
    if annotations is not None:
        body["metadata"] = {"annotations": dict(annotations)}
    if worker_replicas is not None:
        body["spec"] = {"pytorchReplicaSpecs": {"Worker": {"replicas": int(worker_replicas)}}}
    return Request("PATCH", PYTORCHJOB.format(ns=namespace, name=name), body=body, content_type=MERGE_PATCH)


# ---- authentication.k8s.io/v1 ----
def token_review(token: str, audiences: Sequence[str] | None = None) -> Request:
    spec: dict[str, Any] = {"token": token}
    if audiences is not None:
        spec["audiences"] = list(audiences)
    return Request("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                   body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
