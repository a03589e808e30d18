"""The resizer: FlowCon's elastic CPU configuration of co-located opted-in jobs, applied with
the pod `resize` subresource (Kubernetes 1.33+; in-place, no restart). See docs/resizer.md.

Per interval, observe(): for every node with opted-in pods (`flowsched.io/resizable: "true"`)
in namespaces the safety rules allow (scoring.safety: excluded namespaces and the opt-out
label, read fresh each interval), read those pods (one LIST per node, fieldSelector
spec.nodeName: the snapshot does not keep annotations or per-container resources) into the
planner's rows. plan(): scoring.resize over the rows with the convergence tracker's phase and
progress, one Action per changed pod, decreases first so the node has room for the raises.
`act` writes the pod's original request and the time into annotations (once / each time), then
PATCHes pods/{name}/resize, and records a FlowschedResized Event. A resize the kubelet reports
as PodResizePending (Infeasible or Deferred; `status.resize` before 1.33) is reported once with
an Event (an unbudgeted notice from plan(), so a dry run writes none) and a metric, and that pod
is left alone while the condition stands: never retried in a loop. GPUs are never resized.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge

from extender.control.errors import PermanentError
from extender.control.events import ObjectRef
from extender.control.kube_actions import map_api_error
from extender.control.loop import Action
from extender.control.runtime import ControlContext
from extender.kube.rest import kube_request
from extender.snapshot.objects import ObjectError, PodInfo, parse_quantity
from scoring.convergence import Phase
from scoring.remedy import resize_targets
from scoring.resize import NodeRows, ResizeSettings, Why, growth_efficiency, plan_node
from scoring.safety import namespace_refusal

log = logging.getLogger("flowsched.resizer")

RESIZABLE = "flowsched.io/resizable"  # "true": CPU may be changed in place
CPU_MIN = "flowsched.io/cpu-min"  # quantity; never lowered below
CPU_MAX = "flowsched.io/cpu-max"  # quantity; never raised above
CPU_SHRINK = "flowsched.io/cpu-shrink"  # "true": may go below what it started with
RESIZE_CONTAINER = "flowsched.io/resize-container"  # which container (default: the first)
CPU_ORIGINAL = "flowsched.io/cpu-original"  # written by flowsched before its first resize
RESIZED_AT = "flowsched.io/cpu-resized-at"  # unix seconds of flowsched's last resize
STRATEGIC = "application/strategic-merge-patch+json"
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
class Row:
    """One opted-in pod on a node, as the planner and act() need it."""

    namespace: str
    name: str
    uid: str
    job: str
    container: str
    request_m: float  # the container's CPU request in effect (status if reported, else spec)
    limit_ratio: float | None  # limit / request to keep (None: no CPU limit)
    original_m: float
    min_m: float
    max_m: float
    may_shrink: bool
    since_resize_s: float
    in_flight: bool  # spec and status differ, or a resize is pending: leave it alone
    pending: tuple[str, str] | None  # (reason, message) of PodResizePending / status.resize
    had_original: bool = False  # flowsched already recorded its original request


@dataclass(frozen=True)
class NodeObserved:
    node: str
    allocatable_m: float
    others_m: float  # CPU requested by the node's pods outside the plan
    rows: list[Row]
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


def pod_row(pod: Mapping[str, Any], job: str, now: float) -> Row | str:
    """The pod's planner row, or why it cannot be one (for /debug/resizes)."""
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
    return Row(
        namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name")), uid=str(meta.get("uid") or ""),
        job=job, container=str(c.get("name")), request_m=st_req if st_req is not None else spec_req,
        limit_ratio=None if spec_lim is None else spec_lim / spec_req,
        original_m=original if original is not None else spec_req,
        min_m=lo or 0.0, max_m=hi if hi is not None else math.inf,
        may_shrink=str(ann.get(CPU_SHRINK, "")).lower() == "true",
        since_resize_s=since, in_flight=in_flight, pending=pending, had_original=CPU_ORIGINAL in ann,
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
    settings: ResizeSettings
    headroom_m: float = 0.0
    pods_on: PodSource | None = None
    name: str = "resizer"
    last_plan: dict[str, Any] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)  # pod uid -> pending reason already reported

    def __post_init__(self) -> None:
        self.metrics = ResizerMetrics.build(self.ctx.registry)
        if self.pods_on is None:
            self.pods_on = self._list_pods

    def _list_pods(self, node: str) -> list[dict[str, Any]]:
        if self.ctx.actions is None:
            return []
        api = self.ctx.actions.api_client
        path = f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"
        try:
            items: list[dict[str, Any]] = kube_request(api, "GET", path, timeout_s=10).get("items") or []
        except Exception as e:
            raise map_api_error(e, f"list pods on {node}") from e
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
            rows: list[Row] = []
            skipped: dict[str, str] = {}
            for pod in self.pods_on(node_name):
                meta = pod.get("metadata") or {}
                uid = str(meta.get("uid") or "")
                key = f"{meta.get('namespace')}/{meta.get('name')}"
                refused = namespace_refusal(str(meta.get("namespace") or "default"), labels, self.ctx.core.safety)
                job = next((p.job for p in on_node if p.uid == uid), "")
                r: Row | str = refused if refused is not None else pod_row(pod, job, now)
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

    # ---- planning (pure: scoring.resize over the observed rows) ----
    def plan(self, observed: Observed, budget_left: int) -> Sequence[Action]:
        estimates = observed.estimates
        notices = self._pending_notices(observed)
        downs: list[Action] = []
        ups: list[Action] = []
        debug: dict[str, Any] = {}
        for nd in observed.nodes:
            rows, node_name = nd.rows, nd.node
            # Pool: allocatable minus every other pod's request on the node, minus headroom.
            pool = nd.allocatable_m - nd.others_m - self.headroom_m
            cur = np.array([r.request_m for r in rows])
            phase = np.array([int(estimates[r.job].phase) if r.job in estimates else int(Phase.UNKNOWN)
                              for r in rows], dtype=np.int64)
            # A pod with a resize in flight or pending is evidence-less for this round: frozen.
            phase = np.where([r.in_flight for r in rows], int(Phase.UNKNOWN), phase)
            progress = np.array([estimates[r.job].progress if r.job in estimates else math.nan for r in rows])
            g = growth_efficiency(progress, cur, pool)
            plan = plan_node(NodeRows.build(
                pool, cur, g, phase, original_m=[r.original_m for r in rows], min_m=[r.min_m for r in rows],
                max_m=[r.max_m for r in rows], may_shrink=[r.may_shrink for r in rows],
                since_resize_s=[r.since_resize_s for r in rows],
            ), self.settings)
            # The bottleneck diagnosis (scoring.remedy): no CPU for a job CPU is not what holds
            # back, CPU for an input-bound one.
            frozen = [r.in_flight or r.since_resize_s < self.settings.cooldown_s for r in rows]
            new_m, diag_why = resize_targets([r.job for r in rows], cur, plan.new_m, [r.max_m for r in rows], pool,
                                             observed.diagnoses, self.ctx.core.bottleneck, frozen=frozen)
            node_debug: dict[str, Any] = {"pool_m": pool, "skipped": nd.skipped, "pods": {}}
            for i, r in enumerate(rows):
                why = diag_why.get(i) or Why(int(plan.why[i])).name
                self.metrics.planned.labels(why.lower()).inc()
                node_debug["pods"][f"{r.namespace}/{r.name}"] = {
                    "job": r.job, "phase": Phase(int(phase[i])).name, "progress": float(progress[i]),
                    "growth": float(g[i]), "current_m": float(cur[i]), "target_m": float(plan.target_m[i]),
                    "new_m": float(new_m[i]), "lo_m": float(plan.lo_m[i]), "hi_m": float(plan.hi_m[i]),
                    "why": why, "pending": r.pending,
                }
                if abs(float(new_m[i]) - float(cur[i])) < 0.5:
                    continue
                new = float(new_m[i])
                hi_txt = "inf" if math.isinf(plan.hi_m[i]) else _fmt_m(plan.hi_m[i])
                reason = (f"cpu {_fmt_m(cur[i])} -> {_fmt_m(new)} ({why.lower()}): phase "
                          f"{Phase(int(phase[i])).name.lower()}, G={g[i]:.3g}, share of node pool "
                          f"{cur[i] / pool:.2f} -> {new / pool:.2f}, pool {_fmt_m(pool)} on {node_name}, "
                          f"bounds [{_fmt_m(plan.lo_m[i])}, {hi_txt}]")
                action = Action(key=f"{r.namespace}/{r.name}", kind="resize-up" if new > cur[i] else "resize-down",
                                target=f"{r.namespace}/{r.name}", reason=reason,
                                detail={"uid": r.uid, "container": r.container, "from_m": float(cur[i]),
                                        "to_m": new, "limit_ratio": r.limit_ratio, "original_m": r.original_m,
                                        "had_original": r.had_original, "node": node_name})
                (ups if new > cur[i] else downs).append(action)
            self.metrics.cpu_requested.labels(node_name).set(float(new_m.sum()))
            debug[node_name] = node_debug
        self.last_plan = {"at": observed.now, "nodes": debug}
        return [*notices, *downs, *ups]

    def _pending_notices(self, observed: Observed) -> list[Action]:
        """One notice (an Event, no budget) and one count per pod and pending reason; nothing is
        retried meanwhile. Returned as unbudgeted actions, so the loop sends them only when it
        acts: a dry run writes nothing (they show as dry_run at /debug/resizes)."""
        out: list[Action] = []
        for r in (r for nd in observed.nodes for r in nd.rows):
            if r.pending is None:
                self.reported.pop(r.uid, None)
                continue
            reason, message = r.pending
            if self.reported.get(r.uid) == reason:
                continue
            self.reported[r.uid] = reason
            self.metrics.pending.labels(reason).inc()
            out.append(Action(
                key=f"pending/{r.namespace}/{r.name}", kind="resize_pending", target=f"{r.namespace}/{r.name}",
                budgeted=False, reason=(
                    f"the kubelet holds the CPU resize of container {r.container} back ({reason}): "
                    f"{message or 'no message'}; flowsched leaves this pod alone until the condition clears"),
                detail={"uid": r.uid, "pending": reason}))
        return out

    # ---- acting ----
    def act(self, action: Action, now: float) -> str:
        if self.ctx.actions is None:
            raise PermanentError("no cluster: resizes are dry-run only")
        ns, name = action.target.split("/", 1)
        d = action.detail
        if action.kind == "resize_pending":
            reason = str(d["pending"])
            ok = self.ctx.recorder.record(ObjectRef(ns, name, str(d.get("uid") or "")), f"FlowschedResize{reason}",
                                          action.reason, type_="Warning" if reason == "Infeasible" else "Normal",
                                          action="Resize")
            return "recorded" if ok else "not_recorded"
        new = float(d["to_m"])
        ann: dict[str, str | None] = {RESIZED_AT: f"{now:.0f}"}
        if not d.get("had_original"):
            ann[CPU_ORIGINAL] = _fmt_m(float(d["original_m"]))
        if not self.ctx.actions.annotate_pod(ns, name, ann):
            return "gone"
        resources: dict[str, Any] = {"requests": {"cpu": _fmt_m(new)}}
        if d.get("limit_ratio") is not None:
            resources["limits"] = {"cpu": _fmt_m(new * float(d["limit_ratio"]))}
        body = {"spec": {"containers": [{"name": d["container"], "resources": resources}]}}
        try:
            self._patch_resize(ns, name, body)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return "gone"
            raise map_api_error(e, f"resize {ns}/{name}") from e
        self.ctx.recorder.record(ObjectRef(ns, name, str(d.get("uid") or "")), "FlowschedResized", action.reason,
                                 action="Resize")
        return "resized"

    def _patch_resize(self, ns: str, name: str, body: dict[str, Any]) -> None:
        assert self.ctx.actions is not None
        api_client = self.ctx.actions.api_client
        from kubernetes import client  # the client is only needed when acting

        core = client.CoreV1Api(api_client)
        if hasattr(core, "patch_namespaced_pod_resize"):
            core.patch_namespaced_pod_resize(name, ns, body, field_manager="flowsched", _content_type=STRATEGIC,
                                             _request_timeout=self.ctx.actions.write_timeout_s)
        else:  # clients older than v33 have no method for the subresource
            kube_request(api_client, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/resize", body,
                         content_type=STRATEGIC, timeout_s=self.ctx.actions.write_timeout_s)

    def describe(self) -> dict[str, Any]:
        return {"settings": vars(self.settings), "headroom_m": self.headroom_m, "last_plan": self.last_plan,
                "pending_reported": dict(self.reported)}


def build(ctx: ControlContext) -> Resizer:
    cfg = getattr(ctx.settings, "resizer", None)
    if cfg is None:
        return Resizer(ctx, ResizeSettings())
    return Resizer(ctx, ResizeSettings(beta=cfg.beta, min_step_m=cfg.min_step_m, hysteresis=cfg.hysteresis,
                                       cooldown_s=cfg.cooldown_s, min_cpu_m=cfg.min_cpu_m),
                   headroom_m=cfg.headroom_m)


__all__ = ["CPU_MAX", "CPU_MIN", "CPU_SHRINK", "RESIZABLE", "Resizer", "build", "pod_row", "resize_pending"]
