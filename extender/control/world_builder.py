"""The service shell's half of the control core: the watched snapshot -> scoring.world.World.

Reads (never writes): the ClusterState's immutable control view (pods, schedulable nodes,
migration marks; GPUs allocated through DRA counted in pods' requests and nodes' allocatable, so
nothing here tells them apart: extender/snapshot/dra_control.py), the convergence tracker's
estimates, the progress store's latest batch and gradient statistics per job (when jobs report
them), and the namespaces' labels, listed fresh every time a World is built, so a namespace
labelled `flowsched.io/migrate: "false"` at run time is honoured at the next interval without a
restart.

It remembers each elastic job's measured step time per GPU count (a job running steadily at one
size tells its step time there), which the core's throughput prior is scaled to. What this
replica's loops just did, until the watch shows it, is the kernel's Memory (scoring.compose),
which the rounds runner keeps and the kernel applies on top of each World it is given: a World
is built afresh for every loop of a round, after the earlier loops carried their actions out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.control.measured_note import restore as restore_measured
from extender.progress.reports import JobReport
from extender.snapshot.objects import MigrationMark, NodeInfo, PodInfo
from scoring.bottleneck import Diagnosis
from scoring.convergence import ConvergenceEstimate
from scoring.gpu_types import GpuTypeSettings, cluster_types, gpu_type_of, typed
from scoring.remedy import with_diagnoses
from scoring.step_samples import MeasuredSteps, record_step_sample, record_type_sample, type_speeds
from scoring.workload import workload_class
from scoring.world import JobState, NodeState, PendingPod, World

log = logging.getLogger("flowsched.control")


class EstimateSource(Protocol):
    def snapshot(self) -> Mapping[str, ConvergenceEstimate]: ...


NamespaceLabels = Callable[[], Mapping[str, Mapping[str, str]]]
JobReports = Callable[[], Mapping[str, JobReport]]


def parse_range(value: str | None) -> tuple[int, int] | None:
    """`"min-max"` GPUs -> (min, max) with 1 <= min <= max; anything else -> None (not elastic)."""
    if value is None:
        return None
    lo_s, sep, hi_s = value.strip().partition("-")
    if not sep or not lo_s.strip().isdigit() or not hi_s.strip().isdigit():
        return None
    lo, hi = int(lo_s), int(hi_s)
    return (lo, hi) if 1 <= lo <= hi else None


@dataclass
class WorldBuilder:
    estimates: EstimateSource
    namespace_labels: NamespaceLabels  # raises when the namespaces cannot be read: no World, no plan
    job_reports: JobReports | None = None
    gate: str = "flowsched.io/admission"  # pods behind this scheduling gate wait for the admission loop
    diagnoses: Callable[[], Mapping[str, Diagnosis]] | None = None  # per-job bottleneck (extender/bottleneck_loop)
    # GPU types (scoring/gpu_types.py): a node's type from its gpu.product (label, else DRA
    # productName); with types on and more than one type, the World has them (as the simulator's)
    # and each job's step time per type and GPU count is kept from its step rate on the one type
    # its pods run on.
    gpu_types: GpuTypeSettings = field(default_factory=GpuTypeSettings)
    # job -> its step times measured so far (by GPU count, batch and type: scoring.step_samples)
    measured: dict[str, MeasuredSteps] = field(default_factory=dict)
    # A job with no live pod for this long is gone (its pods Succeeded, Failed or deleted): what was
    # measured of it is dropped, so a service that runs for months keeps only the jobs it sees. An
    # evicted or rescaled job's new pods come within seconds and find their samples kept.
    forget_after_s: float = 3600.0
    last_seen: dict[str, float] = field(default_factory=dict)  # job -> when it last had a live pod

    def build(self, pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...], marks: Mapping[str, MigrationMark],
              now: float) -> World:
        names = {n.name for n in nodes}
        used: dict[str, float] = {}
        by_job: dict[str, list[PodInfo]] = {}
        pending: list[tuple[int, float, PendingPod]] = []
        for p in pods:
            if p.node and p.holds_resources:
                used[p.node] = used.get(p.node, 0.0) + p.requests.gpus
            if p.phase in ("Succeeded", "Failed") or (p.requests.gpus <= 0 and not p.claims_unseen):
                continue
            by_job.setdefault(p.job, []).append(p)
            if not p.node and not p.terminating and not p.scheduling_gates:
                created = p.created_at if p.created_at is not None else math.nan
                # kube-scheduler's order: priority, then when the pod was created.
                pending.append((-p.priority, created if math.isfinite(created) else 0.0,
                                PendingPod(p.key, p.job, p.requests.gpus, now - created)))
        pending.sort(key=lambda x: (x[0], x[1]))
        self._forget_gone(by_job, now)
        estimates = self.estimates.snapshot()
        reports = self.job_reports() if self.job_reports is not None else {}
        node_type = {n.name: gpu_type_of(n.gpu_product) for n in nodes}
        if not typed(cluster_types(list(node_type.values())), self.gpu_types):
            node_type = {}  # one type, or types off: the World is untyped, as the simulator's
        jobs = tuple(self._job(key, ps, names, marks.get(key), estimates.get(key), reports.get(key), now, node_type)
                     for key, ps in sorted(by_job.items()))
        node_states = tuple(NodeState(n.name, n.allocatable.gpus, used.get(n.name, 0.0), node_type.get(n.name, ""))
                            for n in sorted(nodes, key=lambda n: n.name))
        labels = self.namespace_labels()
        world = World(now, node_states, jobs, tuple(p for *_, p in pending), labels)
        return with_diagnoses(world, self.diagnoses()) if self.diagnoses is not None else world

    def _forget_gone(self, live: Mapping[str, object], now: float) -> None:
        for key in live:
            self.last_seen[key] = now
        for key in [k for k, t in self.last_seen.items() if now - t > self.forget_after_s]:
            del self.last_seen[key]
            self.measured.pop(key, None)

    def _job(self, key: str, ps: list[PodInfo], nodes: set[str], mark: MigrationMark | None,
             est: ConvergenceEstimate | None, report: JobReport | None, now: float,
             node_type: Mapping[str, str]) -> JobState:
        gpus_on: dict[str, float] = {}
        elsewhere = 0.0  # on cordoned or NotReady nodes: held, but not capacity the plans may use
        for p in ps:
            if p.node and p.holds_resources:
                if p.node in nodes:
                    gpus_on[p.node] = gpus_on.get(p.node, 0.0) + p.requests.gpus
                else:
                    elsewhere += p.requests.gpus
        starts = [p.started_at for p in ps if p.node and p.holds_resources]
        known = bool(starts) and all(s is not None for s in starts)
        ranges = {parse_range(p.elastic) for p in ps}
        elastic = next(iter(ranges)) if len(ranges) == 1 else None
        settling = any(p.terminating or not p.node or p.phase != "Running" for p in ps)
        held = int(sum(gpus_on.values()))
        report = report or JobReport()
        kinds = {node_type.get(n, "") for n in gpus_on} if node_type else set()
        gpu_type = kinds.pop() if len(kinds) == 1 else ""  # the one type its pods run on
        rate = est.step_rate if est is not None else math.nan
        steps = self.measured.get(key)
        if steps is None:  # new to this replica: what its latest plan carries (measured_note.py)
            steps = self.measured[key] = MeasuredSteps()
            plan = newest_plan(ps)
            if plan is not None:
                restore_measured(steps, plan.get("measured"))
        if elastic is not None:
            record_step_sample(steps, rate, held, settling, batch=report.batch_size, gpu_type=gpu_type)
        measured: dict[str, float] = {}
        if node_type:
            record_type_sample(steps, gpu_type, rate, held, settling)
            measured = type_speeds(steps.by_type)
        # Since its size last changed: a plan that changed only a live job's batch restarts nothing.
        plan_at = [p.elastic_resized_at for p in ps if p.elastic_resized_at is not None]
        return JobState(
            key=key, namespace=ps[0].namespace, gpus_on=gpus_on,
            live_gpus=int(sum(p.requests.gpus for p in ps if not p.terminating)),
            gpus_elsewhere=elsewhere,
            per_pod=max(1, int(max(p.requests.gpus for p in ps))),
            checkpointable=all(p.checkpointable for p in ps),
            elastic=elastic,
            running=all(bool(p.node) and p.phase == "Running" and not p.terminating for p in ps),
            settling=settling,
            runtime_s=now - max(s for s in starts if s is not None) if known else math.nan,
            attained_gpu_s=attained(ps, mark, now) if known or not starts else math.nan,
            estimate=est,
            migrations=mark.count if mark else 0,
            since_migration_s=now - mark.at if mark else math.inf,
            since_scaled_s=now - max(plan_at) if plan_at else math.inf,
            planned_gpus=planned_gpus(ps),
            batch_size=report.batch_size, batch_range=report.batch_range, noise=report.noise,
            planned_steps=report.planned_steps, batch_live=report.batch_live, batch_local_max=report.batch_local_max,
            step_samples=dict(steps.samples), step_batches=dict(steps.batches), batch_samples=dict(steps.by_batch),
            # A gang with a pod whose claim is not seen yet is not offered: its GPUs are unknown.
            gated_pods=() if any(p.claims_unseen for p in ps) else
            tuple(p.requests.gpus for p in ps if self.gate in p.scheduling_gates and not p.terminating),
            # Inference if any pod is (DESIGN §3 classes; never moved or rescaled by flowsched).
            workload=min((str(workload_class(p.workload, p.owner_kind)) for p in ps),
                         key=lambda c: 0 if c == "inference" else 1),
            gpu_measured=measured,
            model_class=next((p.model_class for p in ps if p.model_class), ""),
            wait_s=now - min(created) if (created := [p.created_at for p in ps if not p.node and not p.terminating
                                                       and p.created_at is not None]) else math.nan,
        )


def newest_plan(ps: list[PodInfo]) -> Mapping[str, Any] | None:
    """The latest elastic plan on the job's pods (by its time); None when none has one."""
    plans = [p.elastic_plan for p in ps if p.elastic_plan is not None]
    return max(plans, key=lambda plan: float(plan["at"])) if plans else None


def planned_gpus(ps: list[PodInfo]) -> int:
    """GPUs of the latest elastic plan on the job's pods (by its time); 0 when none says."""
    plan = newest_plan(ps)
    g = plan.get("gpus") if plan is not None else None
    return int(g) if isinstance(g, int) and not isinstance(g, bool) and g > 0 else 0


def attained(ps: list[PodInfo], mark: MigrationMark | None, now: float) -> float:
    """GPU-seconds of service: what the job had when a loop last restarted it (the eviction mark's
    or the elastic plan's "attained", whichever is newer) plus its bound pods' time since then."""
    prev, since = 0.0, -math.inf
    if mark is not None and math.isfinite(mark.attained_gpu_s):
        prev, since = mark.attained_gpu_s, mark.at
    for p in ps:
        plan = p.elastic_plan
        a = plan.get("attained") if plan is not None else None
        if plan is None or not isinstance(a, int | float) or not (math.isfinite(a) and a >= 0):
            continue
        if float(plan["at"]) > since:
            prev, since = float(a), float(plan["at"])
    return prev + sum(p.requests.gpus * (now - max(p.started_at, since)) for p in ps
                      if p.started_at is not None and p.node and p.holds_resources)


def labels_from_namespace_list(body: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """GET /api/v1/namespaces -> name -> labels."""
    out: dict[str, dict[str, str]] = {}
    for item in body.get("items") or []:
        meta = item.get("metadata") or {}
        if isinstance(meta.get("name"), str):
            out[meta["name"]] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return out


PodsOf = dict[str, list[PodInfo]]  # job -> its pods, as a World was built from them


@dataclass(frozen=True)
class Observed:
    """What one interval of a loop decides from: the World and each job's live pods (to name
    them in the actions the shell sends)."""

    world: World
    pods_of: dict[str, list[PodInfo]]


class ControlView(Protocol):
    @property
    def ready(self) -> bool: ...

    def control_view(self) -> tuple[tuple[PodInfo, ...], tuple[NodeInfo, ...], dict[str, MigrationMark]]: ...


def observe(state: ControlView, builder: WorldBuilder, now: float, *, gpu_pods_only: bool,
            last: dict[str, Any] | None = None) -> Observed | None:
    """None until the snapshot has synced (a half-listed cluster is no basis for a plan); then
    `last` (a loop's /debug view of its latest plan) says so."""
    if not state.ready:
        if last is not None:
            last.clear()
            last.update({"at": now, "skipped": "snapshot not synced yet"})
        return None
    pods, nodes, marks = state.control_view()
    pods_of: dict[str, list[PodInfo]] = {}
    for p in pods:
        if p.phase not in ("Succeeded", "Failed") and (p.requests.gpus > 0 or not gpu_pods_only):
            pods_of.setdefault(p.job, []).append(p)
    return Observed(builder.build(pods, nodes, marks, now), pods_of)
