"""The simulator shell's resizer half: the engine's pods as the resizer's World rows
(World.resize_nodes), and the kernel's Resize actions carried out on them. Nothing here decides:
scoring.kernel (scoring.resize_loop) plans, benchmarks/sim/control.py runs the round.

What it may do (DESIGN §7: only what flowsched can do in a real cluster): change the CPU request
of opted-in running pods without a restart. GPUs are never resized. Its effect on a job is the
CPU-sensitivity model (cpu_model.py); its effect on the cluster is real too: a raised request
counts against the node's CPU, so kube-scheduler (the policy) may find a node's GPUs free but
its CPU taken.

The rows are what the service's resizer (extender/control/resizer.py) reads from a cluster, no
more: per node holding an opted-in pod of a job the tracker knows, the node's allocatable CPU,
the requests of the pods outside the plan (not opted in, or in a namespace the safety rules
refuse), and each opted-in pod's request in effect, its template request (what flowsched records
as cpu-original before its first resize), the time of flowsched's last resize (the cpu-resized-at
annotation: the cooldown), its opt-ins, and its job's convergence phase and progress from the
tracker the simulator shell shares with its other loops (the service's tracker, over the points
the job would post). A pod the engine recreates (evicted, rescaled, restarted elsewhere) is a new
pod with a new uid: it starts again from its template, without annotations. The engine's pods
resize at once: none is ever in flight or pending.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.cpu_model import DEFAULT_SENSITIVITY, CpuSensitivity, cpu_speed, sensitivity_of
from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.world import job_key, node_name, pod_name
from scoring.actions import Resize
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.kernel import DONE, GONE
from scoring.safety import namespace_refusal
from scoring.settings import SafetySettings
from scoring.world import ResizeNode, ResizeRow

CONTAINER = "main"  # the simulated pods' one container


def _everyone(_job: SimJob) -> bool:
    return True


def pod_uid(job: SimJob, i: int) -> str:
    """A recreated pod is a new object: its uid changes with each allocation of the job."""
    return f"sim-{job.idx}-{job.allocations}-{i}"


@dataclass(frozen=True)
class SimPod:
    uid: str
    name: str  # namespace/name
    job: SimJob
    node: int
    gpus: int


@dataclass
class ResizerStats:
    resizes: int = 0
    increases: int = 0
    decreases: int = 0
    cpu_seconds_moved: float = 0.0  # sum over rounds of |request - original| x interval, core-seconds


Estimate = Callable[[SimJob], ConvergenceEstimate | None]  # the shared tracker's estimate (syncs the job)


@dataclass
class SimResizer:
    sensitivity: Mapping[str, CpuSensitivity] = field(default_factory=lambda: dict(DEFAULT_SENSITIVITY))
    opted_in: Callable[[SimJob], bool] = _everyone  # flowsched.io/resizable
    may_shrink: Callable[[SimJob], bool] = _everyone  # flowsched.io/cpu-shrink
    limit_ratio: float | None = 1.0  # the pods' CPU limit / request (limit = request: no use beyond it)
    stats: ResizerStats = field(default_factory=ResizerStats)
    # The API server's side of the opted-in pods, by uid: the request in effect where flowsched
    # changed it, and its cpu-resized-at annotation.
    requests: dict[str, float] = field(default_factory=dict)
    resized_at: dict[str, float] = field(default_factory=dict)
    _applied: np.ndarray | None = None  # per node: millicores the requests add above the templates
    _last_t: float | None = None

    def pods(self, engine: Engine) -> list[SimPod]:
        return [SimPod(pod_uid(j, i), pod_name(j, i), j, node, g)
                for j in engine.active.values() for i, (node, g) in enumerate(j.placement)]

    def template_m(self, engine: Engine, pod: SimPod) -> float:
        return pod.gpus * engine.cluster.settings.cpu_per_gpu

    def request_m(self, engine: Engine, pod: SimPod) -> float:
        return self.requests.get(pod.uid, self.template_m(engine, pod))

    # ---- the World (what the service's resizer reads from a cluster) ----
    def nodes(self, engine: Engine, now: float, estimate: Estimate, labels: Mapping[str, Mapping[str, str]],
              safety: SafetySettings) -> tuple[ResizeNode, ...]:
        by_node: dict[int, list[SimPod]] = {}
        for p in self.pods(engine):
            by_node.setdefault(p.node, []).append(p)
        # The opted-in jobs' estimates, node by node in the order the engine lists their pods: each
        # is brought up to now first (the points it would have posted), and the engine draws the
        # points' noise from one generator as it goes, so this order is part of the random draws.
        est: dict[int, ConvergenceEstimate | None] = {}
        for p in (p for ps in by_node.values() for p in ps if self.opted_in(p.job)):
            if p.job.idx not in est:
                est[p.job.idx] = estimate(p.job)
        out: list[ResizeNode] = []
        for node in sorted(by_node, key=node_name):  # the service lists them by name
            on_node = by_node[node]
            # It lists only the nodes holding an opted-in pod of a job its tracker knows.
            if not any(est.get(p.job.idx) is not None for p in on_node):
                continue
            rows: list[ResizeRow] = []
            skipped: dict[str, str] = {}
            others = 0.0
            for p in on_node:
                why = "not opted in" if not self.opted_in(p.job) else namespace_refusal(
                    p.job.spec.namespace, labels, safety)
                if why is not None:
                    skipped[p.name] = why
                    others += self.request_m(engine, p)
                    continue
                rows.append(self._row(engine, p, now, est[p.job.idx]))
            if rows:
                out.append(ResizeNode(node_name(node), float(engine.cluster.cpu_alloc[node]), others, tuple(rows),
                                      skipped))
        return tuple(out)

    def _row(self, engine: Engine, p: SimPod, now: float, est: ConvergenceEstimate | None) -> ResizeRow:
        resized = self.resized_at.get(p.uid)
        return ResizeRow(
            p.name, p.uid, job_key(p.job), CONTAINER, self.request_m(engine, p), self.limit_ratio,
            self.template_m(engine, p), 0.0, math.inf, self.may_shrink(p.job),
            now - resized if resized is not None else math.inf, False, None, resized is not None,
            est.phase if est is not None else Phase.UNKNOWN, est.progress if est is not None else math.nan)

    # ---- carrying out (the pod's resize subresource; the kubelet applies it at once) ----
    def carry_out(self, engine: Engine, a: Resize, now: float) -> str:
        if not any(p.uid == a.uid for p in self.pods(engine)):
            return GONE
        self.requests[a.uid] = a.to_m
        self.resized_at[a.uid] = now
        self.stats.resizes += 1
        self.stats.increases += int(a.to_m > a.from_m)
        self.stats.decreases += int(a.to_m < a.from_m)
        return DONE

    def forget_gone(self, engine: Engine, now: float) -> None:
        """Drop what went with the pods that are gone (completed, evicted, recreated) and count the
        CPU moved since the last round (the requests in effect over that interval)."""
        live = {p.uid: p for p in self.pods(engine)}
        for uid in [u for u in self.requests if u not in live]:
            self.requests.pop(uid, None)
            self.resized_at.pop(uid, None)
        if self._last_t is not None:
            dt = now - self._last_t
            self.stats.cpu_seconds_moved += dt * sum(
                abs(c - self.template_m(engine, live[u])) for u, c in self.requests.items()) / 1000.0
        self._last_t = now

    def settle(self, engine: Engine) -> None:
        """The requests in effect count against their nodes' CPU; each job runs at the speed its
        slowest pod's CPU allows (cpu_model)."""
        cl = engine.cluster
        if self._applied is None:
            self._applied = np.zeros(cl.settings.nodes)
        cl.cpu_used -= self._applied
        self._applied[:] = 0.0
        speeds: dict[int, float] = {}
        for p in self.pods(engine):
            tmpl = self.template_m(engine, p)
            c = self.requests.get(p.uid)
            if c is not None:
                self._applied[p.node] += c - tmpl
            sens = sensitivity_of(p.job.spec.app, self.sensitivity)
            sp = float(cpu_speed(tmpl if c is None else c, tmpl, sens.cpu_fraction, sens.saturation))
            speeds[p.job.idx] = min(speeds.get(p.job.idx, np.inf), sp)
        cl.cpu_used += self._applied
        for idx, sp in speeds.items():
            engine.set_cpu_speed(engine.jobs[idx], sp)
