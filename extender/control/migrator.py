"""The migrator (SpeCon): evicts slow-growing checkpointable jobs so waiting work can start.

plan(): the snapshot (pods, nodes, convergence estimates, migration marks) -> arrays ->
scoring.migration.plan_migrations -> one Action per chosen job. act(): re-checks the opt-in
on every pod, marks the pods (annotation flowsched.io/migration, which every replica's pod
watch turns into the job's origin record that the extender scores down), evicts them through
policy/v1 Eviction, withdraws the mark if the eviction is refused, and records a
FlowschedMigrated Event per pod with the numbers behind the decision.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import Counter

from extender.control.errors import PermanentError, TemporaryError
from extender.control.events import ObjectRef
from extender.control.kube_actions import EVICTED
from extender.control.loop import Action
from extender.control.runtime import ControlContext
from extender.k8s_objects import EVICTED_FROM, MIGRATION, PodInfo
from extender.settings import MigratorConfig
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.migration import (
    WHY_TEXT,
    Demands,
    JobArrays,
    MigrationPlan,
    MigrationSettings,
    Why,
    plan_migrations,
)

log = logging.getLogger("flowsched.migrator")

REASON = "FlowschedMigrated"


@dataclass(frozen=True)
class Snapshot:
    """The arrays handed to the planner, with the names to map its answer back."""

    job_keys: list[str]
    node_names: list[str]
    jobs: JobArrays
    node_free: np.ndarray[Any, np.dtype[np.float64]]
    demands: Demands
    demand_pods: list[str]
    pods_of: dict[str, list[PodInfo]]
    estimates: dict[str, ConvergenceEstimate]


def _fmt(x: float, spec: str = ".3g") -> str:
    return format(x, spec) if math.isfinite(x) else "unknown"


class Migrator:
    name = "migrator"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.cfg: MigratorConfig = ctx.settings.migrator
        self.alpha = ctx.settings.convergence.alpha
        self.gpu_resource = ctx.settings.gpu_resource
        self.excluded = set(ctx.settings.control.excluded_namespaces)
        self.opt_out_label = ctx.settings.control.opt_out_label
        self.migrations = Counter("flowsched_migrations", "Jobs evicted for migration", ["namespace"],
                                  registry=ctx.registry)
        self.freed = Counter("flowsched_migration_freed_gpus", "GPUs released by migrations",
                             registry=ctx.registry)
        self.last: dict[str, Any] = {}

    # ---- snapshot -> arrays ----
    def _namespace_allowed(self, ns: str) -> bool:
        if ns in self.excluded:
            return False
        if self.ctx.actions is None:
            return True
        try:
            labels = self.ctx.actions.namespace_labels(ns)
        except (TemporaryError, PermanentError) as e:
            log.info("namespace %s unreadable, not migrating there: %s", ns, e)
            return False  # unknown -> no
        return labels.get(self.opt_out_label, "").lower() != "false"

    def snapshot(self, now: float) -> Snapshot:
        state = self.ctx.state
        with state._lock:  # a consistent copy; the planner runs outside the lock
            pods = list(state.pods.values())
            nodes = {n: i for n, i in state.nodes.items() if i.ready and not i.unschedulable}
            marks = {j: state.migration_of(j) for j in list(state.migrations)}
        estimates = dict(self.ctx.tracker.snapshot())
        node_names = sorted(nodes)
        col = {n: k for k, n in enumerate(node_names)}
        free = np.array([nodes[n].allocatable.gpus for n in node_names], dtype=np.float64)
        pods_of: dict[str, list[PodInfo]] = {}
        demand_gpus: list[float] = []
        demand_wait: list[float] = []  # seconds since creation (NaN unknown)
        demand_pods: list[tuple[int, float, str]] = []
        for p in pods:
            if p.node and p.holds_resources and p.node in col:
                free[col[p.node]] -= p.requests.gpus
            if p.phase in ("Succeeded", "Failed"):
                continue
            if not p.node and not p.terminating and p.requests.gpus > 0:
                # kube-scheduler's order: priority, then when the pod was created.
                created = p.created_at if p.created_at is not None else math.nan
                demand_pods.append((-p.priority, created if math.isfinite(created) else 0.0, p.key))
                demand_gpus.append(p.requests.gpus)
                demand_wait.append(now - created)
            pods_of.setdefault(p.job, []).append(p)
        order = sorted(range(len(demand_pods)), key=lambda i: demand_pods[i][:2])
        demands = Demands.pending(np.asarray([demand_gpus[i] for i in order], dtype=np.float64),
                                  np.asarray([demand_wait[i] for i in order], dtype=np.float64))
        # Jobs holding GPUs are the only ones migration could move.
        keys = sorted(j for j, ps in pods_of.items() if any(p.node and p.requests.gpus > 0 for p in ps))
        n_j, n_n = len(keys), len(node_names)
        gpus_on = np.zeros((n_j, n_n))
        arr: dict[str, list[Any]] = {k: [] for k in ("opted_in", "allowed", "running", "runtime_s", "phase",
                                                     "growth", "remaining_s", "migrations", "since",
                                                     "attained")}
        allowed_ns: dict[str, bool] = {}
        for r, job in enumerate(keys):
            ps = pods_of[job]
            for p in ps:
                if p.node in col and p.holds_resources:
                    gpus_on[r, col[p.node]] += p.requests.gpus
            ns = ps[0].namespace
            if ns not in allowed_ns:
                allowed_ns[ns] = self._namespace_allowed(ns)
            est = estimates.get(job)
            starts = [p.started_at for p in ps]
            mark = marks.get(job)
            arr["opted_in"].append(all(p.checkpointable for p in ps))
            arr["allowed"].append(allowed_ns[ns])
            arr["running"].append(all(p.node and p.phase == "Running" and not p.terminating for p in ps))
            arr["runtime_s"].append(now - max(s for s in starts if s is not None)
                                    if all(s is not None for s in starts) else math.nan)
            # Attained GPU service since its pods started (a replacement pod starts afresh).
            arr["attained"].append(sum(p.requests.gpus * (now - p.started_at) for p in ps
                                       if p.started_at is not None and p.node and p.holds_resources)
                                   if all(s is not None for s in starts) else math.nan)
            arr["phase"].append(int(est.phase) if est else int(Phase.UNKNOWN))
            # G = P / share; without a known share the state machine decides on P (share 1).
            g = est.growth_efficiency if est and math.isfinite(est.growth_efficiency) else (
                est.progress if est else math.nan)
            arr["growth"].append(g)
            # The job's end is unknown here: the convergence plateau is not the end of training (a
            # job trains on for its configured epochs). min_remaining_s applies only when it is known.
            arr["remaining_s"].append(math.nan)
            arr["migrations"].append(mark.count if mark else 0)
            arr["since"].append(now - mark.at if mark else math.inf)
        jobs = JobArrays(
            opted_in=np.asarray(arr["opted_in"], dtype=bool).reshape(-1),
            allowed=np.asarray(arr["allowed"], dtype=bool).reshape(-1),
            running=np.asarray(arr["running"], dtype=bool).reshape(-1),
            runtime_s=np.asarray(arr["runtime_s"], dtype=np.float64).reshape(-1),
            phase=np.asarray(arr["phase"], dtype=np.int64).reshape(-1),
            growth=np.asarray(arr["growth"], dtype=np.float64).reshape(-1),
            remaining_s=np.asarray(arr["remaining_s"], dtype=np.float64).reshape(-1),
            migrations=np.asarray(arr["migrations"], dtype=np.int64).reshape(-1),
            since_migration_s=np.asarray(arr["since"], dtype=np.float64).reshape(-1),
            gpus_on=gpus_on,
            attained_gpu_s=np.asarray(arr["attained"], dtype=np.float64).reshape(-1),
        )
        return Snapshot(keys, node_names, jobs, free, demands, [demand_pods[i][2] for i in order], pods_of,
                        estimates)

    def settings(self) -> MigrationSettings:
        c = self.cfg
        return MigrationSettings(min_runtime_s=c.min_runtime_s, max_migrations=c.max_migrations,
                                 cooldown_s=c.cooldown_s, min_remaining_s=c.min_remaining_s,
                                 require_room_elsewhere=c.require_room_elsewhere,
                                 max_moves=max(1, c.max_per_interval),
                                 slow_phases=tuple(Phase[x.upper()] for x in c.slow_phases),
                                 order=c.order, wait_threshold_s=c.wait_threshold_s,
                                 min_attained_gpu_s=c.min_attained_gpu_s)

    # ---- Controller ----
    def plan(self, now: float) -> Sequence[Action]:
        if not self.ctx.state.ready:
            self.last = {"at": now, "skipped": "snapshot not synced yet"}
            return []
        snap = self.snapshot(now)
        plan = plan_migrations(snap.jobs, snap.node_free, snap.demands, self.settings())
        self.last = self._describe_plan(now, snap, plan)
        return [self._action(now, snap, plan, i) for i in range(len(plan.moves))]

    def _action(self, now: float, snap: Snapshot, plan: MigrationPlan, i: int) -> Action:
        m = plan.moves[i]
        job = snap.job_keys[m.job]
        j = snap.jobs
        pods = [p for p in snap.pods_of[job] if p.node]
        origin = max(snap.node_names, key=lambda n: j.gpus_on[m.job, snap.node_names.index(n)])
        served = [snap.demand_pods[d] for d in m.served]
        est = snap.estimates.get(job)
        plateau = est.remaining_seconds if est else math.nan
        reason = (f"phase {Phase(int(j.phase[m.job])).name.lower()}, growth efficiency "
                  f"{_fmt(float(j.growth[m.job]))} < alpha {self.alpha:g}, time to plateau "
                  f"{_fmt(plateau, '.0f')}s, running {_fmt(float(j.runtime_s[m.job]), '.0f')}s, "
                  f"migration {int(j.migrations[m.job]) + 1}/{self.cfg.max_migrations}: frees {m.freed_gpus:g} GPUs "
                  f"on {origin} for {len(served)} waiting pod(s) needing {m.benefit_gpus:g} GPUs "
                  f"({', '.join(served[:3])}{', ...' if len(served) > 3 else ''}); "
                  f"estimated restart cost {self.cfg.restart_cost_s:.0f}s")
        return Action(key=job, kind="evict", target=job, reason=reason, detail={
            "job": job, "origin": origin, "count": int(j.migrations[m.job]) + 1,
            "pods": [{"namespace": p.namespace, "name": p.name, "uid": p.uid, "node": p.node} for p in pods],
            "freed_gpus": m.freed_gpus, "benefit_gpus": m.benefit_gpus, "served": served,
            "relocation": [snap.node_names[k] if k >= 0 else None for k in m.relocation],
        })

    def act(self, action: Action, now: float) -> str:
        state = self.ctx.state
        actions = self.ctx.actions
        if actions is None:
            raise PermanentError("no cluster: the migrator can only plan")
        targets = []
        for p in action.detail["pods"]:
            current = state.pods.get(p["uid"])
            # The last line of defence: never evict a pod that has not opted in, whatever the plan.
            if current is None:
                continue
            if not current.checkpointable:
                raise PermanentError(f"{current.key} is not annotated flowsched.io/checkpointable=true")
            if current.terminating:
                continue
            targets.append(current)
        if not targets:
            return "gone"
        mark = json.dumps({"from": action.detail["origin"], "at": round(now, 3), "count": action.detail["count"]})
        evicted: list[PodInfo] = []
        for p in targets:
            if not actions.annotate_pod(p.namespace, p.name, {MIGRATION: mark, EVICTED_FROM: p.node}):
                continue
            try:
                outcome = actions.evict(p.namespace, p.name, p.uid)
            except (TemporaryError, PermanentError):
                try:  # refused (a PDB, ...): withdraw the mark so cooldown and counts stay true
                    actions.annotate_pod(p.namespace, p.name, {MIGRATION: None, EVICTED_FROM: None})
                except (TemporaryError, PermanentError) as e2:
                    log.warning("could not withdraw the migration mark of %s: %s", p.key, e2)
                if evicted:
                    log.warning("%s: evicted %d of %d pods before a refusal", action.key, len(evicted),
                                len(targets))
                raise
            if outcome == EVICTED:
                evicted.append(p)
                self.ctx.recorder.record(ObjectRef(p.namespace, p.name, p.uid), REASON,
                                         f"Evicted from {p.node} to migrate: {action.reason}", action="Evict")
        if not evicted:
            return "gone"
        self.migrations.labels(evicted[0].namespace).inc()
        self.freed.inc(sum(p.requests.gpus for p in evicted))
        log.info("migrated %s off %s: %s", action.key, action.detail["origin"], action.reason)
        return EVICTED

    # ---- debug ----
    def _describe_plan(self, now: float, snap: Snapshot, plan: MigrationPlan) -> dict[str, Any]:
        j = snap.jobs

        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {
            "at": now,
            "unmet_demands": [snap.demand_pods[d] for d in plan.unmet_before],
            "free_gpus": dict(zip(snap.node_names, snap.node_free.tolist(), strict=True)),
            "jobs": {key: {"decision": WHY_TEXT[Why(int(plan.why[r]))],
                "checkpointable": bool(j.opted_in[r]), "phase": Phase(int(j.phase[r])).name.lower(),
                "growth_efficiency": num(float(j.growth[r])), "remaining_s": num(float(j.remaining_s[r])),
                "runtime_s": num(float(j.runtime_s[r])), "migrations": int(j.migrations[r]),
                "attained_gpu_s": num(float(j.attained_gpu_s[r])) if j.attained_gpu_s is not None else None,
                "gpus": float(j.gpus_on[r].sum())}
                for r, key in enumerate(snap.job_keys)},
        }

    def describe(self) -> dict[str, Any]:
        return {"last_plan": self.last, "settings": self.cfg.model_dump()}


def build(ctx: ControlContext) -> Migrator:
    return Migrator(ctx)
