"""The elastic controller: GPU counts for jobs that declare elasticity, planned by
scoring.elastic.plan_elastic and published for their job controllers. See docs/elastic.md.

world(): the snapshot -> scoring.world.World. The kernel's elastic plan (scoring.control.plan_elastic_for:
opt-ins, namespace rules and composition with the migrator included; the same function the
simulator runs, through scoring.kernel.run_round) gives one Scale per job whose size or batch
changes; planned() sets the gauges from it.
The core plans within the GPUs the elastic jobs may use (allocatable GPUs of ready
nodes, minus those held by other jobs, minus, with reserve_pending, those asked for by waiting
non-elastic pods); a job rescaled within `cooldown_s` (read from its pods' plan annotation, so
any replica knows), or with pods terminating, is held at its size.

Throughput: from the job's measured step times (kept per GPU count while it runs at a steady
size) over a prior (fixed and per-sample compute, a sync share and one per added GPU:
`compute_fraction`, `sync_fraction`, `sync_per_gpu_fraction` of a 1-GPU step).
Weight: its convergence phase and attained service (las_power). Batch size: chosen too when
the job reports its batch range and gradient statistics (the progress API's optional fields);
otherwise the job's own.

act(): writes `flowsched.io/elastic-plan` = {"gpus", "replicas", "batch_size", "at", "reason",
"measured": the job's step times so far (measured_note.py)}
on the job's pods (and on its PyTorchJob), and for a Kubeflow PyTorchJob with an elasticPolicy
merge-patches spec.pytorchReplicaSpecs.Worker.replicas within the policy's and the
annotation's bounds. Events: FlowschedElasticPlan on the pods (the plan), FlowschedScaled on the
PyTorchJob (the replicas patched). Metrics: flowsched_elastic_plans_total{outcome},
flowsched_elastic_planned_gpus{job}.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from prometheus_client import Counter, Gauge

from extender.control.errors import LeaderGuard
from extender.control.events import ObjectRef
from extender.control.job_loop import JobLoop
from extender.control.loop import Action, PodRef
from extender.control.measured_note import note as note_measured
from extender.control.runtime import ControlContext
from extender.control.world_builder import PodsOf, parse_range
from extender.kube import requests
from extender.kube.errors import PermanentError
from extender.kube.responses import json_or_none, map_api_error, patch_applied
from extender.snapshot.objects import ELASTIC_PLAN, KUBEFLOW_JOB_LABEL, PLAN_MAX_CHARS
from scoring.actions import ControlAction, Scale
from scoring.control import ElasticLoopPlan
from scoring.kernel import Plan
from scoring.settings import ElasticLoopSettings

log = logging.getLogger("flowsched.elastic")

PLAN = ELASTIC_PLAN
REASON_PLAN = "FlowschedElasticPlan"
REASON_SCALED = "FlowschedScaled"


@dataclass
class ElasticMetrics:
    plans: Counter
    planned: Gauge

    @classmethod
    def build(cls, registry: Any) -> ElasticMetrics:
        return cls(
            plans=Counter("flowsched_elastic_plans", "Elastic plans applied, by outcome", ["outcome"],
                          registry=registry),
            planned=Gauge("flowsched_elastic_planned_gpus", "GPUs the elastic optimizer plans per job", ["job"],
                          registry=registry),
        )


@dataclass
class Elastic(JobLoop):
    gpu_pods_only: ClassVar[bool] = True
    ctx: ControlContext
    cfg: ElasticLoopSettings
    name: str = "elastic"
    last: dict[str, Any] = field(default_factory=dict)
    pods_of: PodsOf = field(default_factory=dict)  # each job's pods, as the latest World had them

    def __post_init__(self) -> None:
        self.metrics = ElasticMetrics.build(self.ctx.registry)

    # ---- Controller ----
    def bind(self, action: ControlAction) -> Action:
        pods = self.pods_of.get(action.key, []) if isinstance(action, Scale) else []
        return Action.of(action, tuple(PodRef(p.namespace, p.name, p.uid, p.node) for p in pods if not p.terminating))

    def planned(self, plan: Plan) -> None:
        """The /debug view and the planned-GPUs gauge, from the kernel's plan."""
        self.last = dict(plan.view)
        ep = plan.detail
        if isinstance(ep, ElasticLoopPlan) and ep.plan is not None:
            for j, d in zip(ep.jobs, ep.plan.decisions, strict=True):
                self.metrics.planned.labels(j.key).set(d.gpus)

    def _kubeflow(self, action: Action) -> str | None:
        """The Kubeflow job the pods belong to (their job-name label), as the snapshot has them now."""
        for ref in action.pods:
            pod = self.ctx.state.read().pod(ref.uid)
            if pod is not None and pod.labels.get(KUBEFLOW_JOB_LABEL):
                return str(pod.labels[KUBEFLOW_JOB_LABEL])
        return None

    def act(self, action: Action, now: float) -> str:
        actions = self.ctx.actions
        if actions is None:
            raise PermanentError("no cluster: the elastic optimizer can only plan")
        sc = action.plan
        if not isinstance(sc, Scale):
            raise PermanentError(f"the elastic optimizer cannot carry out {action.kind}")
        ns = sc.job.split("/", 1)[0]
        # The last line of defence: every pod still opted in, and the plan within its range.
        for p in action.pods:
            cur = self.ctx.state.read().pod(p.uid)
            if cur is not None and parse_range(cur.elastic) is None:
                raise PermanentError(f"{cur.key} is not annotated flowsched.io/elastic")
        if not (sc.lo <= sc.gpus <= sc.hi):
            raise PermanentError(f"plan of {sc.gpus} GPUs outside {sc.lo}-{sc.hi}")
        attained = round(sc.attained_gpu_s, 3) if math.isfinite(sc.attained_gpu_s) else None
        body = {"gpus": sc.gpus, "replicas": sc.replicas, "batch_size": sc.batch_size or None,
                "at": round(now, 3), "resized_at": self._resized_at(action, now), "attained": attained,
                "reason": action.reason[:300]}
        if sc.gpu_type:  # a typed plan: the extender's filter keeps the job's pods on this type
            body["gpu_type"] = sc.gpu_type
        measured = note_measured(self.ctx.world.measured.get(sc.job), sc.gpus)
        plan_json = json.dumps({**body, "measured": measured} if measured else body, separators=(",", ":"))
        if len(plan_json) > PLAN_MAX_CHARS:  # the step times are a convenience; the plan must be read
            plan_json = json.dumps(body, separators=(",", ":"))
        outcome = "planned"
        kf = self._kubeflow(action)
        guard = LeaderGuard(self.ctx.still_leader)  # before every write: the action is many API calls
        if kf and self.cfg.patch_pytorchjobs:
            outcome = self._scale_pytorchjob(ns, kf, sc.gpus, sc.per_pod, plan_json, action, guard)
        annotated = 0
        for p in action.pods:
            guard(f"annotating {ns}/{p.name}")
            if actions.annotate_pod(ns, p.name, {PLAN: plan_json}):
                annotated += 1
                guard(f"the {REASON_PLAN} Event of {ns}/{p.name}")
                self.ctx.recorder.record(ObjectRef(ns, p.name, p.uid), REASON_PLAN, action.reason,
                                         action="Scale")
        if not annotated and outcome == "planned":
            outcome = "gone"
        self.metrics.plans.labels(outcome).inc()
        log.info("elastic %s: %s (%s)", action.key, outcome, action.reason)
        return outcome

    def _resized_at(self, action: Action, now: float) -> float:
        """When the job's GPU count last changed: now, unless this plan changes only its batch (the
        cooldown and the hold before a preemption count from a rescale, which restarts the job)."""
        if action.kind != "rebatch":
            return round(now, 3)
        before = [pod.elastic_resized_at for p in action.pods
                  if (pod := self.ctx.state.read().pod(p.uid)) is not None and pod.elastic_resized_at is not None]
        return max(before) if before else round(now, 3)

    def _scale_pytorchjob(self, ns: str, name: str, gpus: int, per_pod: int, plan_json: str, action: Action,
                          guard: LeaderGuard) -> str:
        """Worker replicas within elasticPolicy; "scaled", "planned" (no elasticPolicy: annotated
        only) or "gone". The Master (if any) keeps its pods; Workers take the rest."""
        actions = self.ctx.actions
        assert actions is not None
        what = f"pytorchjob {ns}/{name}"
        get = requests.get_pytorchjob(ns, name)
        # None: not a PyTorchJob (or the CRD is absent): the pods carry the plan.
        resp = actions.send(get, f"read {what}", timeout_s=10)
        try:
            job = json_or_none(get, resp)
        except Exception as e:  # a refusal or a garbled body: retried later or parked
            raise map_api_error(e, f"read {what}", actions.retry_s) from e
        if job is None:
            return "planned"
        spec = job.get("spec") or {}
        specs = spec.get("pytorchReplicaSpecs") or {}
        policy = spec.get("elasticPolicy")
        workers = None
        if policy is not None and "Worker" in specs:
            masters = int((specs.get("Master") or {}).get("replicas") or 0)
            w_lo = int(policy.get("minReplicas") or 1)
            w_hi = int(policy.get("maxReplicas") or w_lo)
            workers = min(max(gpus // per_pod - masters, w_lo), w_hi)
        scale = workers is not None and workers != int(specs["Worker"].get("replicas") or 0)
        guard(f"patching {what}")
        patch = requests.patch_pytorchjob(ns, name, annotations={PLAN: plan_json},
                                          worker_replicas=workers if scale else None)
        resp = actions.send(patch, f"patch {what}")
        if not patch_applied(patch, resp, what=f"patch {what}", retry_s=actions.retry_s):
            return "gone"
        if not scale:
            return "planned"
        uid = str((job.get("metadata") or {}).get("uid") or "")
        guard(f"the {REASON_SCALED} Event of pytorchjob {ns}/{name}")
        self.ctx.recorder.record(ObjectRef(ns, name, uid, kind="PyTorchJob", api_version="kubeflow.org/v1"),
                                 REASON_SCALED, f"Worker replicas -> {workers}: {action.reason}", action="Scale")
        return "scaled"

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": asdict(self.cfg)}


def build(ctx: ControlContext) -> Elastic:
    return Elastic(ctx, ctx.core.elastic)
