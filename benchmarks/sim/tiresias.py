"""Tiresias baseline: two-queue discretised least-attained-service with preemption.

Behaviour of the Pollux artifact's `simulator/tiresias.py` (read, not copied): a job enters
queue 0 and is demoted to queue 1 once its executed time x GPUs reaches 16 GPU-hours; every
round, jobs are admitted queue 0 first, each queue in order, while the cluster's GPU *count*
allows (smaller later jobs go ahead of one that does not fit); every job not admitted is
preempted; newly admitted jobs take GPUs from the nodes with the most free GPUs. Starvation
promotion is off, as in the artifact. Jobs run at the GPU count and batch size of their row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.sim.engine import Engine, SimJob


@dataclass(frozen=True)
class TiresiasSettings:
    queue_threshold: float = 16 * 3600.0  # GPU-seconds of service before demotion
    interval: float = 60.0


class TiresiasPolicy:
    name = "tiresias"

    def __init__(self, settings: TiresiasSettings | None = None):
        self.s = settings or TiresiasSettings()
        self.q0: list[SimJob] = []
        self.q1: list[SimJob] = []
        self.running: set[int] = set()  # status RUNNING after the last round
        self.executed: dict[int, float] = {}
        self.last_check: dict[int, float] = {}

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.q0.append(job)
        self.executed[job.idx] = 0.0
        self.last_check[job.idx] = now

    def on_requeue(self, job: SimJob, now: float) -> None:
        self.running.discard(job.idx)

    def on_complete(self, job: SimJob, now: float) -> None:
        self.running.discard(job.idx)
        self.q0 = [j for j in self.q0 if j.idx != job.idx]
        self.q1 = [j for j in self.q1 if j.idx != job.idx]

    def next_wakeup(self, now: float) -> float | None:
        # The next demotion changes the order; nothing else changes without an event.
        best: float | None = None
        iv = self.s.interval
        for job in self.q0:
            if job.idx not in self.running:
                continue
            need = self.s.queue_threshold / job.replicas - self.executed[job.idx]
            at = self.last_check[job.idx] + max(iv, iv * math.ceil(need / iv - 1e-9))
            best = at if best is None else min(best, at)
        return best

    def schedule(self, engine: Engine, now: float) -> None:
        demoted: list[SimJob] = []
        for job in self.q0 + self.q1:
            if job.idx in self.running:
                self.executed[job.idx] += now - self.last_check[job.idx]
            self.last_check[job.idx] = now
        for job in self.q0:
            if job.idx in self.running and self.executed[job.idx] * job.replicas >= self.s.queue_threshold:
                demoted.append(job)
        if demoted:
            gone = {j.idx for j in demoted}
            self.q0 = [j for j in self.q0 if j.idx not in gone]
            self.q1.extend(demoted)

        budget = engine.cluster.total_gpus
        admit: list[SimJob] = []
        new_running: set[int] = set()
        for job in self.q0 + self.q1:
            if job.replicas <= budget:
                budget -= job.replicas
                admit.append(job)
                new_running.add(job.idx)
            elif job.placement:
                engine.preempt(job)
        for job in admit:
            if not job.placement:
                placement = engine.cluster.greedy_most_free(job.replicas)
                if placement is None:  # cannot happen: admission counted GPUs
                    raise RuntimeError("Tiresias admitted more GPUs than the cluster has")
                engine.start(job, placement)
        self.running = new_running
