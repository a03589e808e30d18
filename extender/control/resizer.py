"""The resizer: FlowCon's elastic CPU configuration of co-located opted-in jobs, applied with
the pod `resize` subresource (Kubernetes 1.33+; in-place, no restart). See docs/resizer.md.

Per interval, world(): for every node with opted-in pods (`flowsched.io/resizable: "true"`)
in namespaces the safety rules allow (scoring.safety: excluded namespaces and the opt-out
label, read fresh each interval), read those pods (one LIST per node, fieldSelector
spec.nodeName: the snapshot does not keep annotations or per-container resources) into the
planner's rows. The kernel's resizer plan (scoring.resize_loop over World.resize_nodes, with the
convergence tracker's phase and progress; the pending resizes already reported in its Memory)
gives the actions, decreases first so the node has room for the raises; planned() sets the metrics.
`act` writes the pod's original request and the time into annotations (once / each time), then
PATCHes pods/{name}/resize, and records a FlowschedResized Event. A resize the kubelet reports
as PodResizePending (Infeasible or Deferred; `status.resize` before 1.33) is reported once with
an Event (an unbudgeted notice, so a dry run writes none) and a metric, and that pod
is left alone while the condition stands: never retried in a loop. GPUs are never resized.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from prometheus_client import Counter, Gauge

from extender.control.events import ObjectRef
from extender.control.loop import Action
from extender.control.runtime import ControlContext
from extender.kube import requests
from extender.kube.errors import PermanentError
from extender.kube.responses import classified, json_body, map_api_error, patch_applied
from extender.snapshot.objects import ObjectError, PodInfo, parse_quantity
from scoring.actions import ControlAction, Resize, ResizeHeld
from scoring.convergence import Phase
from scoring.kernel import Plan
from scoring.safety import namespace_refusal
from scoring.world import ResizeNode, ResizeRow, World

log = logging.getLogger("flowsched.resizer")

RESIZABLE = "flowsched.io/resizable"  # "true": CPU may be changed in place
CPU_MIN = "flowsched.io/cpu-min"  # quantity; never lowered below
CPU_MAX = "flowsched.io/cpu-max"  # quantity; never raised above
CPU_SHRINK = "flowsched.io/cpu-shrink"  # "true": may go below what it started with
RESIZE_CONTAINER = "flowsched.io/resize-container"  # which container (default: the first)
CPU_ORIGINAL = "flowsched.io/cpu-original"  # written by flowsched before its first resize
RESIZED_AT = "flowsched.io/cpu-resized-at"  # unix seconds of flowsched's last resize
PENDING_REASONS = ("Infeasible", "Deferred")

PodSource = Callable[[str], list[dict[str, Any]]]  # node name -> pods on it (API JSON)


def _cpu_m(q: Any) -> float | None:
    if q is None:
        return None
    try:
        return parse_quantity(q) * 1000.0
    except ObjectError:
        return None


def _fmt_m(m: float) -> str:
    return f"{round(m)}m"


@dataclass(frozen=True)
class NodeObserved:
    node: str
    allocatable_m: float
    others_m: float  # CPU requested by the node's pods outside the plan
    rows: list[ResizeRow]  # phase, progress and diagnosis not filled yet (world_of fills them)
    skipped: dict[str, str]  # pod -> why it is not a row


@dataclass(frozen=True)
class Observed:
    now: float
    nodes: list[NodeObserved]
    estimates: dict[str, Any]
    diagnoses: dict[str, Any] = field(default_factory=dict)  # job -> scoring.bottleneck.Diagnosis


def resize_pending(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the kubelet holds a resize back: the PodResizePending condition
    (1.33+, reason Infeasible or Deferred) or the older `status.resize` field."""
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "PodResizePending" and c.get("status") == "True":
            return str(c.get("reason") or "Pending"), str(c.get("message") or "")
    old = status.get("resize")
    if old in PENDING_REASONS:
        return str(old), ""
    return None


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = pod.get("spec") or {}
    want = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESIZE_CONTAINER)
    cs = spec.get("containers") or []
    if want:
        return next((c for c in cs if c.get("name") == want), None)
    return cs[0] if cs else None


def pod_row(pod: Mapping[str, Any], job: str, now: float) -> ResizeRow | str:
    """The pod's planner row as the API shows the pod (its job's phase and progress come from the
    tracker in world_of), or why it cannot be one (for /debug/resizes)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ann = meta.get("annotations") or {}
    if str(ann.get(RESIZABLE, "")).lower() != "true":
        return "not opted in"
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return "not running"
    c = _container(pod)
    if c is None:
        return f"no container {ann.get(RESIZE_CONTAINER)!r}"
    for p in c.get("resizePolicy") or []:
        if p.get("resourceName") == "cpu" and p.get("restartPolicy") == "RestartContainer":
            return "cpu resizePolicy RestartContainer: a resize would restart it"
    res = c.get("resources") or {}
    spec_req = _cpu_m((res.get("requests") or {}).get("cpu"))
    spec_lim = _cpu_m((res.get("limits") or {}).get("cpu"))
    if spec_req is None:
        spec_req = spec_lim  # a limit alone is also the request
    if spec_req is None or spec_req <= 0:
        return "no cpu request"
    statuses = status.get("containerStatuses") or []
    cs: Mapping[str, Any] = next((s for s in statuses if s.get("name") == c.get("name")), {})
    st_req = _cpu_m(((cs.get("resources") or {}).get("requests") or {}).get("cpu"))
    pending = resize_pending(pod)
    in_flight = pending is not None or (st_req is not None and abs(st_req - spec_req) >= 0.5)
    original = _cpu_m(ann.get(CPU_ORIGINAL))
    try:
        since = now - float(ann[RESIZED_AT]) if RESIZED_AT in ann else math.inf
    except ValueError:
        since = math.inf
    lo, hi = _cpu_m(ann.get(CPU_MIN)), _cpu_m(ann.get(CPU_MAX))
    return ResizeRow(
        pod=f'{meta.get("namespace") or "default"}/{meta.get("name")}', uid=str(meta.get("uid") or ""),
        job=job, container=str(c.get("name")), request_m=st_req if st_req is not None else spec_req,
        limit_ratio=None if spec_lim is None else spec_lim / spec_req,
        original_m=original if original is not None else spec_req,
        min_m=lo or 0.0, max_m=hi if hi is not None else math.inf,
        may_shrink=str(ann.get(CPU_SHRINK, "")).lower() == "true",
        since_resize_s=since, in_flight=in_flight, pending=pending, had_original=CPU_ORIGINAL in ann,
        phase=Phase.UNKNOWN, progress=math.nan,
    )


@dataclass
class ResizerMetrics:
    pending: Counter
    planned: Counter
    cpu_requested: Gauge

    @classmethod
    def build(cls, registry: Any) -> ResizerMetrics:
        return cls(
            pending=Counter("flowsched_resize_pending", "Resizes the kubelet held back (reported once each)",
                            ["reason"], registry=registry),
            planned=Counter("flowsched_resize_planned", "Planner verdicts per pod and round", ["why"],
                            registry=registry),
            cpu_requested=Gauge("flowsched_resize_cpu_millicores", "CPU requested by opted-in pods after resizes",
                                ["node"], registry=registry),
        )


@dataclass
class Resizer:
    ctx: ControlContext
    pods_on: PodSource | None = None
    name: str = "resizer"
    last_plan: dict[str, Any] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)  # pod uid -> pending reason reported (the kernel's memory)

    def __post_init__(self) -> None:
        self.metrics = ResizerMetrics.build(self.ctx.registry)
        if self.pods_on is None:
            self.pods_on = self._list_pods

    def _list_pods(self, node: str) -> list[dict[str, Any]]:
        if self.ctx.actions is None:
            return []
        what = f"list pods on {node}"
        req = requests.list_pods_on_node(node)
        actions = self.ctx.actions
        resp = classified(req, actions.send(req, what, timeout_s=10), what, actions.retry_s)
        try:
            items: list[dict[str, Any]] = json_body(req, resp).get("items") or []
        except ValueError as e:  # a garbled answer: as unreadable as none; the interval is skipped
            raise map_api_error(e, what, actions.retry_s) from e
        return items

    # ---- observing (the shell's reads) ----
    def _nodes_with_candidates(self, pods: tuple[PodInfo, ...], known: Mapping[str, Any]) -> list[str]:
        # Only nodes holding an opted-in pod are listed: one LIST per such node per interval.
        return sorted({p.node for p in pods
                       if p.node and p.resizable and p.phase == "Running" and not p.terminating and p.job in known})

    def observe(self, now: float) -> Observed:
        """Per node with candidates: its pods as the API has them (annotations and per-container
        resources are not in the snapshot), each pod's job, the CPU the other pods request."""
        assert self.pods_on is not None
        estimates = self.ctx.tracker.snapshot()
        pods, nodes, _ = self.ctx.state.read().control_view()
        by_name = {n.name: n for n in nodes}
        labels = self.ctx.world.namespace_labels()
        out: list[NodeObserved] = []
        for node_name in self._nodes_with_candidates(pods, estimates):
            node = by_name.get(node_name)
            if node is None:
                continue
            on_node = [p for p in pods if p.node == node_name]
            rows: list[ResizeRow] = []
            skipped: dict[str, str] = {}
            for pod in self.pods_on(node_name):
                meta = pod.get("metadata") or {}
                uid = str(meta.get("uid") or "")
                key = f"{meta.get('namespace')}/{meta.get('name')}"
                refused = namespace_refusal(str(meta.get("namespace") or "default"), labels, self.ctx.core.safety)
                job = next((p.job for p in on_node if p.uid == uid), "")
                r: ResizeRow | str = refused if refused is not None else pod_row(pod, job, now)
                if isinstance(r, str):
                    skipped[key] = r
                    continue
                rows.append(r)
            if not rows:
                continue
            ours = {r.uid for r in rows}
            others = sum(p.requests.cpu_m for p in on_node if p.holds_resources and p.uid not in ours)
            out.append(NodeObserved(node_name, node.allocatable.cpu_m, others, rows, skipped))
        diagnoses = self.ctx.world.diagnoses() if self.ctx.world.diagnoses is not None else {}
        return Observed(now, out, dict(estimates), dict(diagnoses))

    # ---- the World (the kernel plans from it: scoring.resize_loop) ----
    def world_of(self, observed: Observed) -> World:
        """The World the kernel plans the resizer from: each node's rows as plain data."""
        est, diag = observed.estimates, observed.diagnoses
        nodes = tuple(ResizeNode(nd.node, nd.allocatable_m, nd.others_m, tuple(
            replace(r, phase=est[r.job].phase if r.job in est else Phase.UNKNOWN,
                    progress=est[r.job].progress if r.job in est else math.nan, diagnosis=diag.get(r.job))
            for r in nd.rows), dict(nd.skipped)) for nd in observed.nodes)
        return World(observed.now, (), (), (), resize_nodes=nodes)

    def world(self, now: float) -> World:
        return self.world_of(self.observe(now))

    def bind(self, action: ControlAction) -> Action:
        return Action.of(action)

    def planned(self, plan: Plan) -> None:
        """The metrics and the /debug view, from the kernel's plan (the kernel sets none)."""
        self.reported = dict(plan.memory.resize_reported)
        for a in plan.actions:
            if isinstance(a, ResizeHeld):
                self.metrics.pending.labels(a.pending).inc()
        nodes = plan.view.get("nodes", {})
        for node_name, nd in nodes.items():
            for pod in nd["pods"].values():
                self.metrics.planned.labels(str(pod["why"]).lower()).inc()
            self.metrics.cpu_requested.labels(node_name).set(float(nd["requested_m"]))
        self.last_plan = {"at": plan.view.get("at"), "nodes": {k: {x: y for x, y in v.items() if x != "requested_m"}
                                                               for k, v in nodes.items()}}

    # ---- acting ----
    def act(self, action: Action, now: float) -> str:
        if self.ctx.actions is None:
            raise PermanentError("no cluster: resizes are dry-run only")
        ns, name = action.target.split("/", 1)
        a = action.plan
        if isinstance(a, ResizeHeld):
            ok = self.ctx.recorder.record(ObjectRef(ns, name, a.uid), f"FlowschedResize{a.pending}",
                                          action.reason, type_="Warning" if a.pending == "Infeasible" else "Normal",
                                          action="Resize")
            return "recorded" if ok else "not_recorded"
        if not isinstance(a, Resize):
            raise PermanentError(f"the resizer cannot carry out {action.kind}")
        ann: dict[str, str | None] = {RESIZED_AT: f"{now:.0f}"}
        if not a.had_original:
            ann[CPU_ORIGINAL] = _fmt_m(a.original_m)
        if not self.ctx.actions.annotate_pod(ns, name, ann):
            return "gone"
        resources: dict[str, Any] = {"requests": {"cpu": _fmt_m(a.to_m)}}
        if a.limit_ratio is not None:
            resources["limits"] = {"cpu": _fmt_m(a.to_m * a.limit_ratio)}
        if not self._patch_resize(ns, name, a.container, resources):
            return "gone"
        self.ctx.recorder.record(ObjectRef(ns, name, a.uid), "FlowschedResized", action.reason, action="Resize")
        return "resized"

    def _patch_resize(self, ns: str, name: str, container: str, resources: dict[str, Any]) -> bool:
        """The pod's resize subresource; False when the pod is gone."""
        assert self.ctx.actions is not None
        what = f"resize {ns}/{name}"
        req = requests.resize_pod(ns, name, container, resources)
        actions = self.ctx.actions
        return patch_applied(req, actions.send(req, what), what=what, retry_s=actions.retry_s)

    def describe(self) -> dict[str, Any]:
        return {"settings": asdict(self.ctx.core.resizer), "last_plan": self.last_plan,
                "pending_reported": dict(self.reported)}


def build(ctx: ControlContext) -> Resizer:
    return Resizer(ctx)


__all__ = ["CPU_MAX", "CPU_MIN", "CPU_SHRINK", "RESIZABLE", "Resizer", "build", "pod_row", "resize_pending"]
