"""The GPU types the extender's filter keeps each job on (DESIGN §10, docs/gpu-types.md).

Every replica answers kube-scheduler's verbs, so every replica refreshes the plan (not only the
Lease holder), every GpuTypeSettings.refresh_s, from the watched snapshot through a WorldBuilder:
the same World the control loops plan from, node types included, and the same core
(scoring.typed_placement, over scoring.typed_elastic.job_types) the simulator's filter decides by.
The service gives the control loops' builder this builder's per-type step times (one memory:
what one measures the other sees); this one reads no namespace labels (nothing here depends on
them). On a cluster of one GPU type the plan is empty and the filter does nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from extender.control.world_builder import EstimateSource, JobReports, WorldBuilder, observe
from extender.periodic import PeriodicRunner
from extender.snapshot.objects import PodInfo
from extender.snapshot.state import ClusterState
from scoring.gpu_types import GpuTypeSettings, cluster_types, gpu_type_of, typed
from scoring.settings import CoreSettings
from scoring.typed_placement import TypePlan, plan_types

log = logging.getLogger("flowsched.control")

# On a waiting pod whose job waited gpu_types.fallback_s for its GPU type: when that bound passed.
FALLBACK = "flowsched.io/gpu-type-fallback"
Annotate = Callable[[str, str, dict[str, str | None]], bool]  # namespace, pod, annotations -> pod still there


class TypePlanSource:
    def __init__(self, state: ClusterState, estimates: EstimateSource, settings: CoreSettings, *,
                 job_reports: JobReports | None = None, gate: str = "flowsched.io/admission",
                 annotate: Annotate | None = None, clock: Callable[[], float] = time.time) -> None:
        self.state, self.settings, self.clock = state, settings, clock
        self.builder = WorldBuilder(estimates, dict, job_reports, gate=gate, gpu_types=settings.gpu_types)
        self._plan = TypePlan()
        self._runner: PeriodicRunner | None = None
        self.annotate = annotate
        self._nudged: set[str] = set()  # pod uids this replica annotated FALLBACK on

    @property
    def gpu_types(self) -> GpuTypeSettings:
        return self.settings.gpu_types

    def get(self) -> TypePlan:
        return self._plan

    def refresh_once(self) -> TypePlan:
        now = self.clock()
        view = self.state.read()
        if view.ready:  # on a cluster of one type no World is built (its cost grows with the pods)
            _, nodes, _ = view.control_view()
            if not typed(cluster_types([gpu_type_of(n.gpu_product) for n in nodes]), self.gpu_types):
                self._plan = TypePlan(at=now)
                return self._plan
        obs = observe(view, self.builder, now, gpu_pods_only=True)
        if obs is not None:
            self._plan = plan_types(obs.world, self.settings)
            self._nudge(self._plan, obs.pods_of, now)
        return self._plan

    def _nudge(self, plan: TypePlan, pods_of: Mapping[str, list[PodInfo]], now: float) -> None:
        """kube-scheduler retries a pod the filter rejected on the next cluster event, or after
        minutes: a job that has waited fallback_s for its type gets FALLBACK on its waiting pods
        (the time its bound passed: the same value from every replica), an update of the pod itself
        that makes kube-scheduler try it again at once, now on every type."""
        if self.annotate is None or not plan.typed:
            return
        self._nudged &= {p.uid for ps in pods_of.values() for p in ps}  # forget pods that are gone
        for key, jt in plan.jobs.items():
            if jt.home is not None or not math.isfinite(jt.waiting_since):
                continue
            bound = jt.waiting_since + self.gpu_types.fallback_s
            if now < bound:
                continue
            for p in pods_of.get(key, ()):
                if p.node or p.terminating or p.scheduling_gates or p.uid in self._nudged:
                    continue
                at = datetime.fromtimestamp(bound, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                try:
                    self.annotate(p.namespace, p.name, {FALLBACK: at})
                except Exception as e:  # the next refresh tries again
                    log.warning("cannot annotate %s after its GPU-type bound: %s", p.key, e)
                    continue
                self._nudged.add(p.uid)
                log.info("%s waited %.0f s for GPU type %s: types %s now", p.key, now - jt.waiting_since,
                         jt.assigned or "?", ",".join(plan.allowed(key, now, self.gpu_types)))

    def job_view(self, key: str) -> dict[str, Any] | None:
        """A job's GPU types for GET /v1/jobs and /debug/explain: the step times it measured on each
        type (GPUs -> seconds per step), its speed on each type (measured, else the prior scaled to
        its measurements) and the types its pods may bind to now. None on an untyped cluster."""
        plan = self._plan
        if not plan.typed:
            return None
        jt = plan.jobs.get(key)
        m = self.builder.measured.get(key)
        samples = m.by_type if m is not None else {}
        out: dict[str, Any] = {
            "step_s": {t: {str(g): round(s, 6) for g, s in sorted(by.items())}
                       for t, by in sorted(samples.items()) if by},
            "types": sorted(set(plan.node_types.values()) - {""}),
        }
        if jt is None:
            return out
        top = max(jt.speeds.values(), default=0.0)
        pinned = (self.state.read().plan_of(key) or {}).get("gpu_type")
        out.update({
            "speed": {t: round(v / top, 4) if top > 0 else None for t, v in sorted(jt.speeds.items())},
            "source": {t: "measured" if t in jt.measured else "prior" for t in sorted(jt.speeds)},
            "home": jt.home, "assigned": jt.assigned or None,
            "allowed": list(plan.allowed(key, self.clock(), self.gpu_types,
                                         pinned=pinned if isinstance(pinned, str) else "")),
            "waited_s": round(self.clock() - jt.waiting_since, 1) if math.isfinite(jt.waiting_since) else None,
            "fallback_s": self.gpu_types.fallback_s,
        })
        return out

    def start(self) -> None:
        self._runner = PeriodicRunner("gpu-type-plan", self.refresh_once, self.gpu_types.refresh_s, logger=log)
        self._runner.start()

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.stop(join_s=5.0)

