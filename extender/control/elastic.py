"""The elastic controller: GPU counts for jobs that declare elasticity, planned by
scoring.elastic.plan_elastic and published for their job controllers. See docs/elastic.md.

plan(): the snapshot -> one scoring.elastic.ElasticJob per opted-in job (every live pod of the
job annotated `flowsched.io/elastic: "min-max"` GPUs) -> plan_elastic within the GPUs the
elastic jobs may use (allocatable GPUs of ready nodes, minus those held by other pods, minus,
with reserve_pending, those asked for by waiting non-elastic pods) -> one Action per job whose
size changes. A job rescaled within `cooldown_s`, or with pods terminating, is held at its size.

Throughput S_j(g): from the job's measured step times (the convergence tracker's step rate of
its current run, kept per GPU count while it runs at a steady size; scoring.elastic.
fit_step_time) when it reports progress, else a prior (linear compute, `sync_fraction` of a
1-GPU step for synchronisation on more than one GPU). Weight: the job's convergence phase
(scoring.elastic.convergence_weight). The batch size is the job's own: choosing it needs the
gradient noise, which the progress API does not carry yet (the simulator shows what it adds).

act(): writes `flowsched.io/elastic-plan` = {"gpus", "replicas", "batch_size", "at", "reason"}
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
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge

from extender.control.errors import PermanentError
from extender.control.events import ObjectRef
from extender.control.kube_actions import MERGE_PATCH, map_api_error
from extender.control.loop import Action
from extender.control.rest import kube_request
from extender.control.runtime import ControlContext
from extender.k8s_objects import KUBEFLOW_JOB_LABEL, PodInfo
from extender.settings import ElasticConfig
from scoring.elastic import (
    ElasticJob,
    ElasticPlan,
    ElasticSettings,
    StepTimeModel,
    convergence_weight,
    fit_step_time,
    plan_elastic,
)

log = logging.getLogger("flowsched.elastic")

PLAN = "flowsched.io/elastic-plan"
REASON_PLAN = "FlowschedElasticPlan"
REASON_SCALED = "FlowschedScaled"
PYTORCHJOBS = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/{name}"
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_range(value: str | None) -> tuple[int, int] | None:
    """`"min-max"` GPUs -> (min, max) with 1 <= min <= max; anything else -> None (not elastic)."""
    if value is None:
        return None
    m = _RANGE.match(value)
    if not m:
        return None
    lo, hi = int(m.group(1)), int(m.group(2))
    return (lo, hi) if 1 <= lo <= hi else None


@dataclass
class JobView:
    key: str  # namespace/job
    namespace: str
    pods: list[PodInfo]
    lo: int
    hi: int
    per_pod: int  # GPUs per pod: the plan's granularity
    held: int  # GPUs of bound live pods
    live: int  # GPUs of all live pods (bound or waiting)
    settling: bool  # pods terminating or waiting: the job is mid-change
    kubeflow: str | None  # PyTorchJob name when the pods carry Kubeflow's job-name label


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
class Elastic:
    ctx: ControlContext
    cfg: ElasticConfig
    name: str = "elastic"
    samples: dict[str, dict[int, float]] = field(default_factory=dict)  # job -> GPUs -> seconds/step
    last_scaled: dict[str, float] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.metrics = ElasticMetrics.build(self.ctx.registry)

    # ---- snapshot ----
    def jobs(self) -> tuple[list[JobView], int, dict[str, Any]]:
        """Opted-in jobs, the GPUs they may share, and the accounting behind that figure."""
        state = self.ctx.state
        with state._lock:
            pods = list(state.pods.values())
            nodes = [n for n in state.nodes.values() if n.ready and not n.unschedulable]
        total = int(sum(n.allocatable.gpus for n in nodes))
        by_job: dict[str, list[PodInfo]] = {}
        for p in pods:
            if p.phase in ("Succeeded", "Failed") or p.requests.gpus <= 0:
                continue
            by_job.setdefault(p.job, []).append(p)
        views: list[JobView] = []
        other_held = other_waiting = 0.0
        excluded = set(self.ctx.settings.control.excluded_namespaces)
        for key, ps in by_job.items():
            ranges = {parse_range(p.elastic) for p in ps}
            rng = next(iter(ranges)) if len(ranges) == 1 else None
            if rng is None or ps[0].namespace in excluded:
                other_held += sum(p.requests.gpus for p in ps if p.holds_resources)
                other_waiting += sum(p.requests.gpus for p in ps if not p.node and not p.terminating)
                continue
            per_pod = max(1, int(max(p.requests.gpus for p in ps)))
            held = int(sum(p.requests.gpus for p in ps if p.holds_resources))
            live = int(sum(p.requests.gpus for p in ps if not p.terminating))
            settling = any(p.terminating or not p.node or p.phase != "Running" for p in ps)
            kf = next((p.labels.get(KUBEFLOW_JOB_LABEL) for p in ps if p.labels.get(KUBEFLOW_JOB_LABEL)), None)
            views.append(JobView(key, ps[0].namespace, ps, rng[0], rng[1], per_pod, held, live, settling, kf))
        reserve = other_waiting if self.cfg.reserve_pending else 0.0
        capacity = int(max(0.0, total - other_held - reserve))
        return sorted(views, key=lambda v: v.key), capacity, {
            "allocatable_gpus": total, "held_by_others": other_held, "reserved_for_waiting": reserve,
            "capacity": capacity}

    def _model(self, v: JobView, nominal_batch: int) -> StepTimeModel:
        prior = StepTimeModel(0.0, 1.0 / nominal_batch, self.cfg.sync_fraction, 0.0)
        seen = self.samples.get(v.key) or {}
        if not seen:
            return prior
        g = np.array(sorted(seen), dtype=np.float64)
        t = np.array([seen[int(x)] for x in g])
        # Put the prior on the measured scale first, so one measurement fixes the level and
        # the prior only the shape.
        scale = float(t[0] / prior.step_time(g[0], nominal_batch))
        scaled = StepTimeModel(0.0, prior.per_sample_s * scale, prior.sync_s * scale, 0.0)
        fit = fit_step_time(g, np.full_like(g, nominal_batch), t, prior=scaled)
        return fit or scaled

    def elastic_jobs(self, views: Sequence[JobView], now: float) -> list[ElasticJob]:
        est = self.ctx.tracker.snapshot()
        out: list[ElasticJob] = []
        for v in views:
            e = est.get(v.key)
            # A job running steadily at one size tells us its step time there.
            if e is not None and not v.settling and v.held > 0 and math.isfinite(e.step_rate) and e.step_rate > 0:
                self.samples.setdefault(v.key, {})[v.held] = 1.0 / e.step_rate
            hi = max(v.hi, v.lo)
            nominal = hi * 1024
            g = np.arange(hi + 1)
            model = self._model(v, nominal)
            rate = (nominal / model.step_time(np.maximum(g, 1), nominal))[:, None].astype(np.float64)
            rate[(g % v.per_pod) != 0] = np.nan  # whole pods only
            rate[0] = 0.0
            cur = v.live if v.held > 0 else 0
            lo, top = v.lo, hi
            if cur and (v.settling or now - self.last_scaled.get(v.key, -math.inf) < self.cfg.cooldown_s):
                lo = top = cur  # mid-change or just rescaled: hold it where it is
                if cur > hi:
                    rate = np.vstack([rate, np.full((cur - hi, 1), np.nan)])
                    rate[cur] = 1.0
            out.append(ElasticJob(v.key, lo, top, np.array([nominal]), rate, cur, nominal if cur else 0,
                                  weight=convergence_weight(e)))
        return out

    # ---- Controller ----
    def plan(self, now: float) -> Sequence[Action]:
        if not self.ctx.state.ready:
            self.last = {"at": now, "skipped": "snapshot not synced yet"}
            return []
        views, capacity, accounting = self.jobs()
        if not views:
            self.last = {"at": now, "jobs": {}, **accounting}
            return []
        ejobs = self.elastic_jobs(views, now)
        settings = ElasticSettings(restart_s=self.cfg.restart_s, horizon_s=self.cfg.horizon_s,
                                   min_gain=self.cfg.min_gain)
        # Running jobs are never stopped: if waiting pods claim more than the rest, every running
        # elastic job can at most go down to its minimum.
        floor = sum(j.min_gpus for j in ejobs if j.current_gpus > 0)
        plan = plan_elastic(ejobs, max(capacity, floor), settings)
        self.last = self._describe(now, views, ejobs, plan, accounting)
        actions: list[Action] = []
        for v, d in sorted(zip(views, plan.decisions, strict=True), key=lambda x: x[1].gpus - x[1].current_gpus):
            self.metrics.planned.labels(v.key).set(d.gpus)
            if not plan.feasible or d.gpus == 0 or d.gpus == v.live:
                continue
            reason = (f"elastic plan {v.live} -> {d.gpus} GPUs (range {v.lo}-{v.hi}, {v.per_pod} per pod): "
                      f"{plan.gpus_used}/{plan.capacity} GPUs planned over {len(views)} elastic job(s), "
                      f"objective {plan.total_value:.3g}; restart cost {self.cfg.restart_s:.0f}s over "
                      f"{self.cfg.horizon_s:.0f}s, min gain {self.cfg.min_gain:.0%}")
            actions.append(Action(key=v.key, kind="scale-up" if d.gpus > v.live else "scale-down", target=v.key,
                                  reason=reason, detail={
                                      "namespace": v.namespace, "gpus": d.gpus, "from_gpus": v.live,
                                      "replicas": d.gpus // v.per_pod, "per_pod": v.per_pod, "lo": v.lo, "hi": v.hi,
                                      "kubeflow": v.kubeflow,
                                      "pods": [{"name": p.name, "uid": p.uid} for p in v.pods if not p.terminating],
                                  }))
        return actions

    def act(self, action: Action, now: float) -> str:
        actions = self.ctx.actions
        if actions is None:
            raise PermanentError("no cluster: the elastic optimizer can only plan")
        d = action.detail
        ns = str(d["namespace"])
        # The last line of defence: every pod still opted in, and the plan within its range.
        for p in d["pods"]:
            cur = self.ctx.state.pods.get(p["uid"])
            if cur is not None and parse_range(cur.elastic) is None:
                raise PermanentError(f"{cur.key} is not annotated flowsched.io/elastic")
        if not (int(d["lo"]) <= int(d["gpus"]) <= int(d["hi"])):
            raise PermanentError(f"plan of {d['gpus']} GPUs outside {d['lo']}-{d['hi']}")
        body = {"gpus": int(d["gpus"]), "replicas": int(d["replicas"]), "batch_size": None, "at": round(now, 3),
                "reason": action.reason[:300]}
        plan_json = json.dumps(body, separators=(",", ":"))
        outcome = "planned"
        kf = d.get("kubeflow")
        if kf and self.cfg.patch_pytorchjobs:
            outcome = self._scale_pytorchjob(ns, str(kf), int(d["gpus"]), int(d["per_pod"]), plan_json, action)
        annotated = 0
        for p in d["pods"]:
            if actions.annotate_pod(ns, p["name"], {PLAN: plan_json}):
                annotated += 1
                self.ctx.recorder.record(ObjectRef(ns, p["name"], p["uid"]), REASON_PLAN, action.reason,
                                         action="Scale")
        if not annotated and outcome == "planned":
            outcome = "gone"
        self.last_scaled[action.key] = now
        self.metrics.plans.labels(outcome).inc()
        log.info("elastic %s: %s (%s)", action.key, outcome, action.reason)
        return outcome

    def _scale_pytorchjob(self, ns: str, name: str, gpus: int, per_pod: int, plan_json: str, action: Action) -> str:
        """Worker replicas within elasticPolicy; "scaled", "planned" (no elasticPolicy: annotated
        only) or "gone". The Master (if any) keeps its pods; Workers take the rest."""
        assert self.ctx.actions is not None
        api = self.ctx.actions.api_client
        path = PYTORCHJOBS.format(ns=ns, name=name)
        try:
            job = kube_request(api, "GET", path, timeout_s=10)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return "planned"  # not a PyTorchJob (or the CRD is absent): pods carry the plan
            raise map_api_error(e, f"read pytorchjob {ns}/{name}") from e
        spec = job.get("spec") or {}
        specs = spec.get("pytorchReplicaSpecs") or {}
        policy = spec.get("elasticPolicy")
        patch: dict[str, Any] = {"metadata": {"annotations": {PLAN: plan_json}}}
        workers = None
        if policy is not None and "Worker" in specs:
            masters = int((specs.get("Master") or {}).get("replicas") or 0)
            w_lo = int(policy.get("minReplicas") or 1)
            w_hi = int(policy.get("maxReplicas") or w_lo)
            workers = min(max(gpus // per_pod - masters, w_lo), w_hi)
            if workers != int(specs["Worker"].get("replicas") or 0):
                patch["spec"] = {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}
        try:
            kube_request(api, "PATCH", path, patch, content_type=MERGE_PATCH)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return "gone"
            raise map_api_error(e, f"patch pytorchjob {ns}/{name}") from e
        if "spec" not in patch:
            return "planned"
        uid = str((job.get("metadata") or {}).get("uid") or "")
        self.ctx.recorder.record(ObjectRef(ns, name, uid, kind="PyTorchJob", api_version="kubeflow.org/v1"),
                                 REASON_SCALED, f"Worker replicas -> {workers}: {action.reason}", action="Scale")
        return "scaled"

    # ---- debug ----
    def _describe(self, now: float, views: Sequence[JobView], ejobs: Sequence[ElasticJob], plan: ElasticPlan,
                  accounting: dict[str, Any]) -> dict[str, Any]:
        return {"at": now, **accounting, "feasible": plan.feasible, "objective": plan.total_value,
                "jobs": {v.key: {"range": [v.lo, v.hi], "per_pod": v.per_pod, "live_gpus": v.live,
                                 "held_gpus": v.held, "settling": v.settling, "weight": j.weight,
                                 "planned_gpus": d.gpus, "kubeflow": v.kubeflow,
                                 "measured_step_s": self.samples.get(v.key, {})}
                         for v, j, d in zip(views, ejobs, plan.decisions, strict=True)}}

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": self.cfg.model_dump()}


def build(ctx: ControlContext) -> Elastic:
    return Elastic(ctx, ctx.settings.elastic)
