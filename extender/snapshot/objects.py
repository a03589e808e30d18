"""Plain-dict Kubernetes objects into the few facts flowsched needs (sans I/O).

Objects arrive as JSON dicts from watches and from kube-scheduler; parsing them here once
keeps the request path and the snapshot free of deep dict walks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from extender.snapshot.annotations import ProgressSpec, parse_progress_spec

GPU_RESOURCE = "nvidia.com/gpu"
JOB_LABEL = "flowsched.io/job"
KUBEFLOW_JOB_LABEL = "training.kubeflow.org/job-name"
CHECKPOINTABLE = "flowsched.io/checkpointable"
ELASTIC = "flowsched.io/elastic"
WORKLOAD = "flowsched.io/workload"
RECLAIM_IDLE = "flowsched.io/reclaim-idle"  # opt-in reclamation of an idle notebook after this long
MIGRATED_FROM = "flowsched.io/migrated-from"
RESIZABLE = "flowsched.io/resizable"
MODEL_CLASS = "flowsched.io/model-class"  # vision | language | recommendation | other: the GPU-type prior's class
GPU_PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery's node label (DESIGN §10)
# Set by the migrator on a pod just before evicting it: {"from": node, "at": unix s, "count": n}.
MIGRATION = "flowsched.io/migration"
ELASTIC_PLAN = "flowsched.io/elastic-plan"  # the elastic optimizer's plan, JSON with "at"
EVICTED_FROM = "flowsched.io/evicted-from"  # the same origin, readable, for humans

_SUFFIX = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


class ObjectError(ValueError):
    """A Kubernetes object that does not have the shape the API guarantees."""


_PARSED: dict[str, float] = {}  # quantity text -> value: pods repeat a handful of texts
_PARSED_MAX = 4096


def parse_quantity(value: object) -> float:
    """A resource.Quantity ('100m', '2Gi', '1e3', 4) as a float in base units; never negative."""
    if type(value) is str:
        q = _PARSED.get(value)
        if q is not None:
            return q
    if isinstance(value, bool):
        raise ObjectError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        q = float(value)
    elif isinstance(value, str):
        m = _QUANTITY.match(value.strip())
        if not m or m.group(2) not in _SUFFIX:
            raise ObjectError(f"not a quantity: {value!r}")
        q = float(m.group(1)) * _SUFFIX[m.group(2)]
    else:
        raise ObjectError(f"not a quantity: {value!r}")
    if not math.isfinite(q):
        raise ObjectError(f"not a finite quantity: {value!r}")
    if q < 0:
        # Every quantity read here (requests, limits, overhead, capacity, allocatable) is one the
        # apiserver keeps non-negative; a negative one is a malformed call, not a zero request.
        raise ObjectError(f"negative quantity: {value!r}")
    if type(value) is str:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[value] = q
    return q


@dataclass(frozen=True)
class Resources:
    gpus: float = 0.0
    cpu_m: float = 0.0  # millicores
    mem: float = 0.0  # bytes

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpu_m + other.cpu_m, self.mem + other.mem)

    def __neg__(self) -> Resources:
        return Resources(-self.gpus, -self.cpu_m, -self.mem)


def resources_of(rl: Mapping[str, Any] | None, gpu_resource: str = GPU_RESOURCE) -> Resources:
    if not rl:
        return Resources()
    return Resources(
        gpus=parse_quantity(rl.get(gpu_resource, 0)),
        cpu_m=parse_quantity(rl.get("cpu", 0)) * 1000.0,
        mem=parse_quantity(rl.get("memory", 0)),
    )


def _dict(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = obj.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ObjectError(f"{key} must be an object")
    return v


def _container_requests(c: Mapping[str, Any], gpu_resource: str) -> tuple[float, float, float]:
    """A container's (gpus, millicores, bytes): its requests, else its limits."""
    res = _dict(c, "resources")
    limits, requests = _dict(res, "limits"), _dict(res, "requests")

    def q(key: str) -> float:
        return parse_quantity(requests[key] if key in requests else limits.get(key, 0))

    return q(gpu_resource), q("cpu") * 1000.0, q("memory")


def pod_requests(spec: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE) -> Resources:
    """Effective requests as kube-scheduler computes them: max(sum of containers, each init
    container) plus overhead. A container with a limit but no request requests the limit.
    (Plain floats until the end: every pod of a watch and every verb call comes through here.)"""
    gpus = cpu = mem = 0.0
    for c in spec.get("containers") or []:
        g, cp, m = _container_requests(c, gpu_resource)
        gpus, cpu, mem = gpus + g, cpu + cp, mem + m
    init_gpus = init_cpu = init_mem = 0.0
    for c in spec.get("initContainers") or []:
        g, cp, m = _container_requests(c, gpu_resource)
        init_gpus, init_cpu, init_mem = max(init_gpus, g), max(init_cpu, cp), max(init_mem, m)
    over = resources_of(_dict(spec, "overhead"), gpu_resource)
    return Resources(max(gpus, init_gpus) + over.gpus, max(cpu, init_cpu) + over.cpu_m,
                     max(mem, init_mem) + over.mem)


def pod_claim_names(spec: Mapping[str, Any], status: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """The ResourceClaims a pod uses, by name in its namespace; None when it names none (the
    device-plugin path: one dict lookup). A claim from a template is known once the resourceclaim
    controller has written `status.resourceClaimStatuses` (kube-scheduler waits for that too);
    before then it is left out."""
    entries = spec.get("resourceClaims")
    if not entries:
        return None
    generated: dict[str, str] = {}
    st = status or {}
    for s in st.get("resourceClaimStatuses") or ():
        if isinstance(s, Mapping) and isinstance(s.get("resourceClaimName"), str):
            generated[str(s.get("name"))] = s["resourceClaimName"]
    names: list[str] = []
    for e in entries if isinstance(entries, list) else ():
        if not isinstance(e, Mapping):
            continue
        claim = e.get("resourceClaimName")
        if isinstance(claim, str) and claim:
            names.append(claim)
        elif str(e.get("name")) in generated:
            names.append(generated[str(e.get("name"))])
    return tuple(names)


def awaits_template_claim(spec: Mapping[str, Any], claims: tuple[str, ...] | None) -> bool:
    """Whether one of the pod's claims comes from a template the resourceclaim controller has not
    made yet (pod_claim_names left it out): what it asks for is not known until then."""
    entries = spec.get("resourceClaims")
    if not isinstance(entries, list) or claims is None:
        return False
    named = sum(1 for e in entries
                if isinstance(e, Mapping) and (e.get("resourceClaimName") or e.get("resourceClaimTemplateName")))
    return len(claims) < named


def named_requests(spec: Mapping[str, Any], names: frozenset[str], skip: str = "") -> float:
    """A pod's effective request of the extended resources `names` (but `skip`), summed, as
    kube-scheduler computes it: max(sum of containers, each init container); a container with a
    limit but no request requests the limit. (Overhead never names an extended resource.)"""
    def of(c: Any) -> float:
        res = c.get("resources") if isinstance(c, Mapping) else None
        if not res:
            return 0.0
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        q = 0.0
        for n in names:
            if n in requests and n != skip:
                q += parse_quantity(requests[n])
            elif n in limits and n != skip:
                q += parse_quantity(limits[n])
        return q

    total = sum(map(of, spec.get("containers") or ()))
    return max(total, max(map(of, spec.get("initContainers") or ()), default=0.0))


@dataclass(frozen=True)
class MigrationMark:
    origin: str
    at: float
    count: int
    attained_gpu_s: float = math.nan  # the job's attained service when it was evicted


def parse_migration_mark(value: object) -> MigrationMark | None:
    """The flowsched.io/migration annotation; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return migration_mark_of(json.loads(value))
    except ValueError:
        return None


def migration_mark_of(d: object) -> MigrationMark | None:
    """A mark's JSON object, decoded (the annotation's, or one kept in the marks Lease); None when
    malformed."""
    if not isinstance(d, dict):
        return None
    try:
        # null: the loop did not know it (it writes None for a NaN); the rest of the mark holds.
        attained = float(d["attained"]) if d.get("attained") is not None else math.nan
        mark = MigrationMark(str(d["from"]), float(d["at"]), int(d.get("count", 1)),
                             attained if math.isfinite(attained) and attained >= 0 else math.nan)
    except (ValueError, TypeError, KeyError, OverflowError):  # "count": 1e999 is a float int() cannot take
        return None
    return mark if mark.origin and math.isfinite(mark.at) else None


PLAN_MAX_CHARS = 4096  # a longer flowsched.io/elastic-plan is not read (the elastic loop writes none)


def parse_plan(value: object) -> dict[str, Any] | None:
    """The flowsched.io/elastic-plan annotation (a JSON object with a finite "at"); None when
    absent or malformed."""
    if not isinstance(value, str) or not value or len(value) > PLAN_MAX_CHARS:
        return None
    try:
        plan = json.loads(value)
        at = float(plan["at"])
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    return plan if isinstance(plan, dict) and math.isfinite(at) else None


def parse_time(value: object) -> float | None:
    """An RFC 3339 timestamp ('2025-01-02T03:04:05Z') as unix seconds; None if absent or bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str  # "" while unbound
    phase: str
    requests: Resources
    job: str  # "namespace/key"
    priority: int
    checkpointable: bool
    elastic: str | None
    workload: str | None
    migrated_from: str | None
    terminating: bool
    resizable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    started_at: float | None = None  # status.startTime, unix seconds
    created_at: float | None = None  # metadata.creationTimestamp, unix seconds
    migration: MigrationMark | None = None
    elastic_plan: Mapping[str, Any] | None = None  # the elastic optimizer's latest plan for its job
    scheduling_gates: tuple[str, ...] = ()  # spec.schedulingGates names: kube-scheduler ignores it while any
    progress: ProgressSpec | None = None  # flowsched.io/progress: logs | prometheus (issue 17)
    owner_kind: str = ""  # kind of the controlling ownerReference ("" none): workload class default
    reclaim_idle: str | None = None  # flowsched.io/reclaim-idle (annotation, else label), raw
    # The ResourceClaims it uses (DRA; extender/snapshot/dra.py), by name in its namespace; None
    # when its spec names none. Their GPUs are counted from the claims, not from `requests`.
    claims: tuple[str, ...] | None = None
    # A claim it uses is not in the snapshot yet (a template claim not made yet: set here; a named
    # claim the claim watch has not delivered: set by the control view, dra_control.py). Its GPUs
    # are unknown, so admission must not release it as a pod that asks for none.
    claims_unseen: bool = False
    model_class: str = ""  # flowsched.io/model-class (annotation, else label): the GPU-type prior's class

    @property
    def elastic_resized_at(self) -> float | None:
        """When the elastic optimizer last changed the job's GPU count: the plan's "resized_at"
        (a plan that changed only the batch keeps the one before), else its "at" (finite: parse_plan)."""
        if self.elastic_plan is None:
            return None
        at = float(self.elastic_plan["at"])
        try:
            r = float(self.elastic_plan.get("resized_at", at))
        except (TypeError, ValueError):
            return at
        return r if math.isfinite(r) else at

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holds_resources(self) -> bool:
        """Counted against its node, as kube-scheduler counts it (terminating pods still hold)."""
        return bool(self.node) and self.phase not in ("Succeeded", "Failed")


def job_key(meta: Mapping[str, Any]) -> str:
    """DESIGN.md §3: flowsched label, else Kubeflow job name, else controller, else the pod."""
    ns = meta.get("namespace") or "default"
    labels = meta.get("labels") or {}
    if labels.get(JOB_LABEL):
        return f"{ns}/{labels[JOB_LABEL]}"
    if labels.get(KUBEFLOW_JOB_LABEL):
        return f"{ns}/{labels[KUBEFLOW_JOB_LABEL]}"
    refs = meta.get("ownerReferences") or []
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return f"{ns}/{str(ref.get('kind', '')).lower()}-{ref.get('name', '')}"
    return f"{ns}/{meta.get('name', '')}"


def parse_pod(obj: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE) -> PodInfo:
    if not isinstance(obj, Mapping):
        raise ObjectError("pod must be an object")
    meta, spec, status = _dict(obj, "metadata"), _dict(obj, "spec"), _dict(obj, "status")
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("metadata.name missing")
    return PodInfo(
        uid=str(meta.get("uid") or f"{meta.get('namespace') or 'default'}/{name}"),
        namespace=str(meta.get("namespace") or "default"),
        name=name,
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        requests=pod_requests(spec, gpu_resource),
        job=job_key(meta),
        priority=int(spec.get("priority") or 0),
        checkpointable=str(ann.get(CHECKPOINTABLE, "")).lower() == "true",
        elastic=ann.get(ELASTIC),
        workload=ann.get(WORKLOAD) or labels.get(WORKLOAD),
        migrated_from=ann.get(MIGRATED_FROM),
        terminating=bool(meta.get("deletionTimestamp")),
        resizable=str(ann.get(RESIZABLE, "")).lower() == "true",
        labels=dict(labels),
        started_at=parse_time(status.get("startTime")),
        created_at=parse_time(meta.get("creationTimestamp")),
        migration=parse_migration_mark(ann.get(MIGRATION)),
        elastic_plan=parse_plan(ann.get(ELASTIC_PLAN)),
        scheduling_gates=tuple(str(g.get("name")) for g in spec.get("schedulingGates") or []
                               if isinstance(g, Mapping) and g.get("name")),
        progress=parse_progress_spec(meta, spec, status),
        owner_kind=controller_kind(meta),
        reclaim_idle=_text(ann.get(RECLAIM_IDLE) or labels.get(RECLAIM_IDLE)),
        model_class=_text(ann.get(MODEL_CLASS) or labels.get(MODEL_CLASS)) or "",
        claims=(claims := pod_claim_names(spec, status)),
        claims_unseen=awaits_template_claim(spec, claims),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def controller_kind(meta: Mapping[str, Any]) -> str:
    """The kind of the controlling ownerReference; "" when none."""
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("kind") or "")
    return ""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    allocatable: Resources
    ready: bool
    unschedulable: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    # status.allocatable as served (raw quantities): extender/snapshot/sharing.py reads the sharing
    # resources (replicas, MIG slices, HAMi vGPU memory and cores) from it.
    allocatable_raw: Mapping[str, Any] = field(default_factory=dict)
    # Its GPUs' product: GPU feature discovery's nvidia.com/gpu.product label, else (control view
    # only, extender/snapshot/dra_control.py) its DRA devices' productName; "" unknown.
    gpu_product: str = ""


def parse_node(obj: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE) -> NodeInfo:
    if not isinstance(obj, Mapping):
        raise ObjectError("node must be an object")
    meta, spec, status = _dict(obj, "metadata"), _dict(obj, "spec"), _dict(obj, "status")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("metadata.name missing")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return NodeInfo(
        name=name,
        allocatable=resources_of(_dict(status, "allocatable"), gpu_resource),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        labels=dict(meta.get("labels") or {}),
        allocatable_raw=dict(_dict(status, "allocatable")),
        gpu_product=str((meta.get("labels") or {}).get(GPU_PRODUCT) or ""),
    )
