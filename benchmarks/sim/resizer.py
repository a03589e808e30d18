"""The resizer as a simulator control loop: the same scoring.resize planner the cluster
controller runs, fed from the simulated jobs' loss series, acting through in-place CPU resize.

What it may do (DESIGN §7: only what flowsched can do in a real cluster): change the CPU request
of opted-in running pods without a restart. GPUs are never resized. Its effect on a job is the
CPU-sensitivity model (cpu_model.py); its effect on the cluster is real too: a raised request
counts against the node's CPU, so kube-scheduler (the policy) may find a node's GPUs free but
its CPU taken. While GPU pods are waiting, CPU for the node's free GPUs (cpu_per_gpu each) is
kept out of the pool, so the resizer does not starve them.

Per round and node: rows = the opted-in jobs' pods on that node; pool = node CPU - requests of
the pods not opted in - the reserve; phase and progress P from scoring.convergence over the
job's (epoch, metric) series (window = `window_points` epochs, as benchmarks/sim/telemetry.py);
G = P / (request / pool); plan_node; apply.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.cpu_model import DEFAULT_SENSITIVITY, CpuSensitivity, cpu_speed, sensitivity_of
from benchmarks.sim.engine import Engine, SimJob
from benchmarks.sim.jobmodel import ProfileSet
from scoring.convergence import ConvergenceSettings, Phase, estimate
from scoring.resize import NodeRows, growth_efficiency, plan_node
from scoring.settings import ResizerLoopSettings


def _everyone(_job: SimJob) -> bool:
    return True


@dataclass
class ResizerStats:
    resizes: int = 0
    increases: int = 0
    decreases: int = 0
    rounds: int = 0
    cpu_seconds_moved: float = 0.0  # sum over rounds of |request - original| x interval, core-seconds


@dataclass
class SimResizer:
    profiles: ProfileSet
    settings: ResizerLoopSettings = field(default_factory=lambda: ResizerLoopSettings(cooldown_s=60.0))
    sensitivity: Mapping[str, CpuSensitivity] = field(default_factory=lambda: dict(DEFAULT_SENSITIVITY))
    opted_in: Callable[[SimJob], bool] = _everyone  # flowsched.io/resizable
    may_shrink: Callable[[SimJob], bool] = _everyone  # flowsched.io/cpu-shrink
    window_points: int = 3
    alpha: float = 0.05
    min_points: int = 6
    reserve_for_queue: bool = True
    dry_run: bool = False  # plan and count, change nothing (the controller's dry-run)
    stats: ResizerStats = field(default_factory=ResizerStats)
    requests: dict[tuple[int, int], float] = field(default_factory=dict)  # (job, node) -> millicores
    last_resized: dict[tuple[int, int], float] = field(default_factory=dict)
    _applied: np.ndarray | None = None
    _est: dict[int, tuple[int, Phase, float]] = field(default_factory=dict)
    _alloc_seen: dict[tuple[int, int], int] = field(default_factory=dict)
    _last_t: float | None = None

    def _phase_progress(self, job: SimJob) -> tuple[Phase, float]:
        n = len(job.series)
        if n < self.min_points:
            return Phase.UNKNOWN, float("nan")
        hit = self._est.get(job.idx)
        if hit is not None and hit[0] == n:
            return hit[1], hit[2]
        app = self.profiles.apps[job.spec.app]
        pts = np.array(job.series, dtype=np.float64)
        s = ConvergenceSettings(window_s=0.0, window_points=self.window_points, alpha=self.alpha,
                                higher_is_better=app.metric_increases)
        est = estimate(pts[:, 1], pts[:, 2], pts[:, 0], s)
        self._est[job.idx] = (n, est.phase, est.progress)
        return est.phase, est.progress

    def __call__(self, engine: Engine, now: float) -> None:
        cl = engine.cluster
        per_gpu = cl.settings.cpu_per_gpu
        if self._applied is None:
            self._applied = np.zeros(cl.settings.nodes)
        # Forget the pods that are gone (completed, evicted, restarted elsewhere): their raised
        # requests went with them.
        cl.cpu_used -= self._applied
        self._applied[:] = 0.0
        live: dict[tuple[int, int], tuple[SimJob, int]] = {}
        for j in engine.active.values():
            for node, g in j.placement:
                live[(j.idx, node)] = (j, g)
        # A pod recreated since (same node, new allocation) starts again from its template.
        for k in [k for k in self.requests if k not in live or self._alloc_seen.get(k) != live[k][0].allocations]:
            self.requests.pop(k, None)
            self.last_resized.pop(k, None)
            self._alloc_seen.pop(k, None)
        if self._last_t is not None:
            dt = now - self._last_t
            self.stats.cpu_seconds_moved += dt * sum(
                abs(c - live[k][1] * per_gpu) for k, c in self.requests.items()) / 1000.0
        self._last_t = now
        waiting = self.reserve_for_queue and any(not j.placement for j in engine.active.values())

        by_node: dict[int, list[tuple[SimJob, int]]] = defaultdict(list)
        for (_, node), (j, g) in live.items():
            by_node[node].append((j, g))
        self.stats.rounds += 1
        for node, members in by_node.items():
            rows = [(j, g) for j, g in members if self.opted_in(j)]
            if not rows:
                continue
            for j, _ in rows:
                engine._sync(j, now)  # bring its loss series up to now (what it would have posted)
            others = sum(g * per_gpu for j, g in members if not self.opted_in(j))
            reserve = float(cl.free[node]) * per_gpu if waiting else 0.0
            pool = float(cl.cpu_alloc[node]) - others - reserve
            keys = [(j.idx, node) for j, _ in rows]
            orig = np.array([g * per_gpu for _, g in rows], dtype=np.float64)
            cur = np.array([self.requests.get(k, o) for k, o in zip(keys, orig, strict=True)])
            pp = [self._phase_progress(j) for j, _ in rows]
            phase = np.array([int(p) for p, _ in pp], dtype=np.int64)
            progress = np.array([x for _, x in pp], dtype=np.float64)
            since = np.array([now - self.last_resized[k] if k in self.last_resized else np.inf for k in keys])
            plan = plan_node(NodeRows.build(
                pool, cur, growth_efficiency(progress, cur, pool), phase, original_m=orig,
                may_shrink=[self.may_shrink(j) for j, _ in rows], since_resize_s=since,
            ), self.settings)
            if self.dry_run:
                self.stats.resizes += int(plan.changed.sum())
                continue
            for i in np.flatnonzero(plan.changed):
                self.requests[keys[i]] = float(plan.new_m[i])
                self._alloc_seen[keys[i]] = rows[i][0].allocations
                self.last_resized[keys[i]] = now
                self.stats.resizes += 1
                self.stats.increases += int(plan.new_m[i] > cur[i])
                self.stats.decreases += int(plan.new_m[i] < cur[i])

        # Requests count against the nodes; speeds follow the CPU each job now has.
        speeds: dict[int, float] = {}
        for (idx, node), (j, g) in live.items():
            c = self.requests.get((idx, node))
            if c is not None:
                self._applied[node] += c - g * per_gpu
            sens = sensitivity_of(j.spec.app, self.sensitivity)
            sp = float(cpu_speed(g * per_gpu if c is None else c, g * per_gpu, sens.cpu_fraction, sens.saturation))
            speeds[idx] = min(speeds.get(idx, np.inf), sp)
        cl.cpu_used += self._applied
        for idx, sp in speeds.items():
            engine.set_cpu_speed(engine.jobs[idx], sp)
