"""List+watch of Nodes and Pods (and DRA's ResourceSlices, DeviceClasses, ResourceClaims) into
ClusterState.

`apply_event` is the pure part (one decoded watch event in, state changed, new
resourceVersion out); `Watcher` is the thin shell: list (paginated), watch from the list's
resourceVersion, relist on 410 Gone and every resync period, reconnect with capped
exponential backoff. One daemon thread per kind; the request path never waits on it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender.kube import client, requests
from extender.kube.errors import ApiError
from extender.kube.requests import Request
from extender.kube.responses import Response, checked
from extender.metrics import Metrics
from extender.periodic import PeriodicRunner
from extender.snapshot.dra import DRA_KINDS, parse_device_class, parse_resource_claim, parse_resource_slice
from extender.snapshot.objects import ObjectError, parse_node, parse_pod
from extender.snapshot.state import ClusterState

log = logging.getLogger("flowsched.watch")


class WatchExpired(Exception):
    """The server no longer has our resourceVersion (410 Gone): relist."""


def parse_object(kind: str, obj: Any, gpu_resource: str) -> Any:
    """One listed or watched object of kind, parsed for ClusterState."""
    if kind == "nodes":
        return parse_node(obj, gpu_resource)
    if kind == "pods":
        return parse_pod(obj, gpu_resource)
    if kind == "resourceslices":
        return parse_resource_slice(obj)
    if kind == "deviceclasses":
        return parse_device_class(obj)
    if kind == "resourceclaims":
        return parse_resource_claim(obj)
    raise ValueError(f"unknown kind {kind!r}")


def _delete_key(kind: str, meta: dict[str, Any]) -> str:
    if kind == "resourceclaims":
        return f"{meta.get('namespace') or 'default'}/{meta['name']}"
    return str(meta["name"])


def apply_event(state: ClusterState, kind: str, event: dict[str, Any], gpu_resource: str) -> str | None:
    etype = event.get("type")
    obj = event.get("object") or {}
    if etype == "ERROR":
        if obj.get("code") == 410:
            raise WatchExpired(obj.get("message", "410 Gone"))
        raise RuntimeError(f"watch error: {obj.get('message', obj)}")
    rv: str | None = (obj.get("metadata") or {}).get("resourceVersion")
    if etype == "BOOKMARK":
        return rv
    try:
        if kind in DRA_KINDS:
            if etype == "DELETED":
                state.delete_dra(kind, _delete_key(kind, obj["metadata"]))
            else:
                state.upsert_dra(parse_object(kind, obj, gpu_resource))
        elif kind == "nodes":
            if etype == "DELETED":
                state.delete_node(obj["metadata"]["name"])
            else:
                state.upsert_node(parse_node(obj, gpu_resource))
        elif etype == "DELETED":
            state.delete_pod(obj["metadata"]["uid"])
        else:
            state.upsert_pod(parse_pod(obj, gpu_resource))
    except (ObjectError, KeyError, TypeError, ValueError, ArithmeticError) as e:
        name = (obj.get("metadata") or {}).get("name", "?")
        log.warning("skipping malformed %s %s in watch event: %s", kind[:-1], name, e)
    return rv


def iter_lines(resp: Any) -> Iterator[bytes]:
    buf = b""
    for chunk in resp.stream(65536, decode_content=False):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


# A list page: request, timeout_s -> the answer (kube.client.send bound to an ApiClient).
Fetch = Callable[[Request, float], Response]
# A watch: request, connect_timeout_s, read_timeout_s -> the open streaming response (stream(),
# release_conn(), shutdown()); a refusal raises (kube.client.open_stream bound to an ApiClient).
OpenStream = Callable[[Request, float, float], Any]


@dataclass
class WatchStatus:
    listed_at: float | None = None
    last_event_at: float | None = None
    relists: int = 0
    errors: int = 0
    last_error: str | None = None
    connected: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Watcher:
    def __init__(
        self,
        kind: str,  # "nodes", "pods", or one of DRA_KINDS
        fetch: Fetch,
        open_stream: OpenStream,
        state: ClusterState,
        metrics: Metrics,
        *,
        gpu_resource: str,
        resync_s: float,
        watch_timeout_s: int,
        backoff_max_s: float,
        clock: Callable[[], float] = time.monotonic,
        quiet: Callable[[float], None] | None = None,
    ) -> None:
        self.kind, self.fetch, self.open_stream, self.state, self.metrics = kind, fetch, open_stream, state, metrics
        # Returns once no verb is being answered (or after its timeout): each event waits for it,
        # at most DEFER_MAX_S, so that decoding and applying the event does not take the
        # interpreter from an answer kube-scheduler is waiting for (a binding's event arrives as
        # the next pod's call does). The events stay in order, applied at most that much later.
        self.quiet = quiet
        self.gpu_resource = gpu_resource
        self.resync_s, self.watch_timeout_s, self.backoff_max_s = resync_s, watch_timeout_s, backoff_max_s
        self.clock = clock
        self.status = WatchStatus()
        self._resp: Any = None
        # One watch session a step (relisting first when due), back to back; after a failure the
        # next waits a capped exponential back-off with jitter (`_retry_in`).
        self._rv: str | None = None
        self._next_resync = 0.0
        self._backoff = 0.5
        self._retry_in = 0.0
        self._runner = PeriodicRunner(f"watch-{kind}", self._session, lambda _took: self._retry_in, logger=log,
                                      os_thread_name=True, clock=clock)

    def relist(self) -> str:
        items: list[Any] = []
        cont: str | None = None
        while True:
            req = requests.list_objects(self.kind, limit=500, continue_=cont)
            body = orjson.loads(checked(req, self.fetch(req, 60)).body)
            for obj in body.get("items") or []:
                try:
                    items.append(parse_object(self.kind, obj, self.gpu_resource))
                except (ObjectError, KeyError, TypeError, ValueError, ArithmeticError) as e:
                    log.warning("skipping malformed %s in list: %s", self.kind[:-1], e)
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                rv = str(meta.get("resourceVersion", ""))
                break
        self.state.replace_all(self.kind, items)
        # Move the listed objects out of the collector's sight: a full collection walking a
        # 50,000-pod heap stalled requests by ~100 ms (benchmarks/extender_latency --gc-freeze).
        # They hold no reference cycles, so nothing frozen is ever garbage the collector owed.
        gc.freeze()
        self.status.listed_at = time.time()
        self.status.relists += 1
        self.status.extra.pop("absent", None)
        log.info("listed %d %s at resourceVersion %s", len(items), self.kind, rv)
        return rv

    def _watch(self, rv: str, until: float) -> str:
        timeout = max(1, min(self.watch_timeout_s, int(until - self.clock()) + 1))
        self._resp = self.open_stream(requests.watch_objects(self.kind, rv, timeout), 10, timeout + 30)
        self.status.connected = True
        try:
            for line in iter_lines(self._resp):
                if self._runner.stopping:
                    break
                # A deletion is never held: it frees capacity kube-scheduler (told by its own
                # watch) may be placing a pod on in the very call the hold would wait for.
                if self.quiet is not None and not line.startswith(b'{"type":"DELETED"'):
                    self.quiet(self.DEFER_MAX_S)
                event = orjson.loads(line)
                new_rv = apply_event(self.state, self.kind, event, self.gpu_resource)
                self.metrics.watch_events.labels(self.kind, str(event.get("type"))).inc()
                self.status.last_event_at = time.time()
                if new_rv:
                    rv = new_rv
                if self.clock() >= until:
                    break
        finally:
            self.status.connected = False
            self._resp.release_conn()
            self._resp = None
        return rv

    DEFER_MAX_S = 0.002

    def _session(self) -> None:
        self._retry_in = 0.0
        try:
            if self._rv is None or self.clock() >= self._next_resync:
                self._rv = self.relist()
                self._next_resync = self.clock() + self.resync_s
            self._rv = self._watch(self._rv, self._next_resync)
            self._backoff = 0.5
        except ApiError as e:
            if self._runner.stopping:
                return
            if self.kind in DRA_KINDS and e.status == 404:
                # No resource.k8s.io/v1 (Kubernetes before 1.34, or DRA turned off): nothing to
                # watch; look again now and then, quietly (the cluster may be upgraded).
                if not self.status.extra.get("absent"):
                    log.info("%s: not served by this apiserver (no DRA); checking again every %.0fs",
                             self.kind, self.backoff_max_s)
                self.status.extra["absent"] = True
                self.state.replace_all(self.kind, [])  # served no more: what it held has gone
                self._rv = None
                self._retry_in = self.backoff_max_s
                return
            self._failed(e)
        except WatchExpired as e:
            log.info("%s watch expired (%s); relisting", self.kind, e)
            self.metrics.watch_restarts.labels(self.kind, "expired").inc()
            self._rv = None
        except Exception as e:
            if self._runner.stopping:
                return
            self._failed(e)

    def _failed(self, e: Exception) -> None:
        self.status.errors += 1
        self.status.last_error = f"{type(e).__name__}: {e}"[:300]
        self.metrics.watch_restarts.labels(self.kind, "error").inc()
        self._retry_in = self._backoff * (1 + random.random() / 2)
        log.warning("%s watch failed (%s); retrying in %.1fs", self.kind, self.status.last_error, self._retry_in)
        self._backoff = min(self._backoff * 2, self.backoff_max_s)
        # Keep _rv: a reconnect resumes the watch; if it is too old the server says 410.

    def start(self) -> None:
        self._runner.start()

    def stop(self) -> None:
        self._runner.stop()
        resp = self._resp
        if resp is not None:
            # Closing a dying socket may raise; we are leaving anyway.
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()


def start_watchers(api_client: Any, state: ClusterState, metrics: Metrics, *, gpu_resource: str,
                   resync_s: float, watch_timeout_s: int, backoff_max_s: float,
                   quiet: Callable[[float], None] | None = None,
                   kinds: tuple[str, ...] = ("nodes", "pods", *DRA_KINDS)) -> list[Watcher]:
    """One watcher per kind, started. The DRA kinds are watched on every cluster: where the API is
    not served they cost one list every backoff_max_s (see Watcher._session)."""
    def fetch(request: Request, timeout_s: float) -> Response:
        return client.send(api_client, request, timeout_s=timeout_s)

    def open_stream(request: Request, connect_timeout_s: float, read_timeout_s: float) -> Any:
        return client.open_stream(api_client, request, connect_timeout_s=connect_timeout_s,
                                  read_timeout_s=read_timeout_s)

    watchers = [Watcher(kind, fetch, open_stream, state, metrics, gpu_resource=gpu_resource, resync_s=resync_s,
                        watch_timeout_s=watch_timeout_s, backoff_max_s=backoff_max_s, quiet=quiet)
                for kind in kinds]
    for w in watchers:
        w.start()
    return watchers
