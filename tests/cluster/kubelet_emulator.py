"""KubeletEmulator: plays the kubelet's part of the pod lifecycle for nodes that have none.

It is an emulator, not a kubelet: no containers run. It watches all pods and
- marks a pod bound to a node Running (status subresource: phase, conditions, container
  statuses with the allocated resources), as a kubelet would once its containers started;
- force-deletes a pod that is terminating (deletionTimestamp set), as a kubelet does after
  killing its containers (grace 0) -- otherwise preemption victims and deleted pods would stay
  Terminating forever;
- acknowledges in-place resizes: when a container's spec resources differ from what its status
  reports, it copies them into status (`resources`, `allocatedResources`), clears the
  PodResizePending/PodResizeInProgress conditions and records observedGeneration; a
  `resize_verdict` hook may instead leave the resize pending (Infeasible/Deferred);
- can finish a pod (Succeeded/Failed) on request.

Test knobs, as pod annotations (so a test states them where it creates the pod):
- `kubelet-emulator.flowsched.io/started-seconds-ago: "3600"` backdates status.startTime
  (kube-scheduler's preemption prefers nodes whose victims started most recently);
- `kubelet-emulator.flowsched.io/hold: "true"` keeps a bound pod Pending.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx

from tests.cluster.kubeapi import JSON, Kube, KubeError, pod_path, pods_path

log = logging.getLogger(__name__)

STARTED_AGO = "kubelet-emulator.flowsched.io/started-seconds-ago"
HOLD = "kubelet-emulator.flowsched.io/hold"
RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")

ResizeVerdict = Callable[[JSON], tuple[str, str] | None]  # None: accept; else (reason, message)


def _ts(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _container_resources(c: JSON) -> JSON:
    r = c.get("resources") or {}
    return {k: dict(v) for k, v in r.items() if k in ("requests", "limits") and v}


class KubeletEmulator:
    def __init__(self, kube: Kube, resize_verdict: ResizeVerdict | None = None) -> None:
        self.kube = kube.clone()  # own connection pool: this runs in its own thread
        self.resize_verdict = resize_verdict
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.counts = {"started": 0, "force_deleted": 0, "resized": 0, "resize_pending": 0,
                       "relists": 0, "errors": 0}
        self.synced = threading.Event()

    # ---- lifecycle ----
    def start(self) -> KubeletEmulator:
        self._thread = threading.Thread(target=self._run, name="kubelet-emulator", daemon=True)
        self._thread.start()
        if not self.synced.wait(30):
            raise RuntimeError("KubeletEmulator did not list pods within 30s")
        return self

    def stop(self) -> None:
        self._stop.set()
        # The watch returns within its short server-side timeout; the thread is a daemon, so
        # an apiserver that hangs cannot block the session's exit.
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.kube.close()

    def _bump(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = self.kube.get(pods_path())
                    self._bump("relists")
                    for pod in listed["items"]:
                        self._handle(pod)
                    rv = listed["metadata"]["resourceVersion"]
                    self.synced.set()
                for typ, obj in self.kube.watch(pods_path(), rv, timeout_s=5):
                    if self._stop.is_set():
                        return
                    if typ == "ERROR":
                        # 410 Gone (or any error event): the only safe resume point is a relist.
                        rv = ""
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if typ in ("ADDED", "MODIFIED"):
                        self._handle(obj)
            except KubeError as e:
                rv = "" if e.status == 410 else rv
                self._bump("errors")
                time.sleep(0.2)
            except (httpx.HTTPError, OSError):
                # The apiserver restarts in one test: retry, relisting to be safe.
                rv = ""
                self._bump("errors")
                time.sleep(0.3)

    # ---- reactions ----
    def _handle(self, pod: JSON) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        try:
            if meta.get("deletionTimestamp"):
                self.kube.delete(pod_path(meta["namespace"], meta["name"]), grace_period_s=0)
                self._bump("force_deleted")
            elif not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                return
            elif status.get("phase", "Pending") == "Pending":
                if (meta.get("annotations") or {}).get(HOLD) != "true":
                    self._mark_running(pod)
            elif status.get("phase") == "Running" and self._resize_wanted(pod):
                self._ack_resize(pod)
        except KubeError as e:
            if e.status not in (404, 409):  # gone meanwhile / a newer version will come by
                log.warning("kubelet emulator: %s", e)
                self._bump("errors")

    def _container_statuses(self, pod: JSON, state: JSON, ready: bool) -> list[JSON]:
        out = []
        for c in pod["spec"]["containers"]:
            res = _container_resources(c)
            cs: JSON = {
                "name": c["name"], "image": c.get("image", ""), "imageID": "",
                "containerID": f"emulated://{pod['metadata']['uid']}/{c['name']}",
                "ready": ready, "started": ready, "restartCount": 0, "state": state,
            }
            if res:
                cs["resources"] = res
                if res.get("requests"):
                    cs["allocatedResources"] = dict(res["requests"])
            out.append(cs)
        return out

    def _mark_running(self, pod: JSON) -> None:
        meta = pod["metadata"]
        ago = float((meta.get("annotations") or {}).get(STARTED_AGO, "0"))
        started = _ts(datetime.now(UTC) - timedelta(seconds=ago))
        conds = [{"type": t, "status": "True", "lastTransitionTime": started}
                 for t in ("PodScheduled", "Initialized", "PodReadyToStartContainers", "ContainersReady", "Ready")]
        patch = {"status": {
            "phase": "Running", "startTime": started, "conditions": conds,
            "observedGeneration": meta.get("generation", 1),
            "containerStatuses": self._container_statuses(pod, {"running": {"startedAt": started}}, True),
        }}
        self.kube.merge_patch(pod_path(meta["namespace"], meta["name"]) + "/status", patch)
        self._bump("started")

    @staticmethod
    def _resize_wanted(pod: JSON) -> bool:
        have = {cs["name"]: cs.get("resources") or {} for cs in (pod.get("status") or {}).get("containerStatuses", [])}
        return any(_container_resources(c) != have.get(c["name"], {}) for c in pod["spec"]["containers"])

    def _ack_resize(self, pod: JSON) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        now = _ts(datetime.now(UTC))
        conds = [c for c in status.get("conditions", []) if c["type"] not in RESIZE_CONDITIONS]
        verdict = self.resize_verdict(pod) if self.resize_verdict else None
        patch: JSON
        if verdict is not None:
            reason, message = verdict
            pending = {"type": "PodResizePending", "status": "True", "reason": reason, "message": message,
                       "lastTransitionTime": now, "observedGeneration": meta.get("generation", 1)}
            if any(c["type"] == "PodResizePending" and c.get("reason") == reason
                   for c in status.get("conditions", [])):
                return  # already reported
            patch = {"status": {"conditions": [*conds, pending]}}
            self._bump("resize_pending")
        else:
            running = {"running": {"startedAt": status.get("startTime", now)}}
            patch = {"status": {
                "conditions": conds, "observedGeneration": meta.get("generation", 1),
                "containerStatuses": self._container_statuses(pod, running, True),
            }}
            self._bump("resized")
        self.kube.merge_patch(pod_path(meta["namespace"], meta["name"]) + "/status", patch)

    # ---- test-driven transitions ----
    def finish(self, namespace: str, name: str, succeeded: bool = True) -> JSON:
        """End a pod as its containers exiting would: phase Succeeded (exit 0) or Failed (1)."""
        pod = self.kube.get(pod_path(namespace, name))
        now = _ts(datetime.now(UTC))
        code = 0 if succeeded else 1
        state = {"terminated": {"exitCode": code, "reason": "Completed" if succeeded else "Error",
                                "startedAt": pod["status"].get("startTime", now), "finishedAt": now}}
        conds = [c for c in pod["status"].get("conditions", []) if c["type"] not in ("Ready", "ContainersReady")]
        conds += [{"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                  for t in ("Ready", "ContainersReady")]
        patch = {"status": {"phase": "Succeeded" if succeeded else "Failed", "conditions": conds,
                            "containerStatuses": self._container_statuses(pod, state, False)}}
        return self.kube.merge_patch(pod_path(namespace, name) + "/status", patch)

    def snapshot_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def wait_running(kube: Kube, namespace: str, name: str, timeout_s: float = 10.0) -> JSON:
    deadline = time.monotonic() + timeout_s
    pod: JSON = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(KubeError):
            pod = kube.get(pod_path(namespace, name))
            if (pod.get("status") or {}).get("phase") == "Running":
                return pod
        time.sleep(0.05)
    raise TimeoutError(f"pod {namespace}/{name} not Running after {timeout_s}s: {pod.get('status')}")

