"""Bottleneck diagnosis on against off, in a small simulated cluster (docs/bottlenecks.md).

    .venv/bin/python -m benchmarks.run_bottleneck [--seeds 3] [--jobs 40] [--nodes 4]

Jobs follow benchmarks/sim/bottleneck_model.py (Optimus' PS/worker speed model plus an input
pipeline bounded by CPU). Every 30 s (the elastic loop's interval) the simulator builds the
control core's World and runs the core's plans, exactly as the service does:

- off: the kernel's elastic plan (scoring.kernel.plan_loop) with no diagnosis on any job;
- on:  each running job's telemetry (as cAdvisor and DCGM would show it, with noise) goes through
       scoring.bottleneck.diagnose, the diagnosis is put on JobState.diagnosis (scoring.remedy.
       with_diagnoses, as the service's shell does), the same
       elastic plan runs (now capping growth of diagnosed jobs), then the kernel's remedies plan
       (scoring.remedy.plan_remedies): GiveCpu raises the job's CPU by scoring.remedy.cpu_target
       (at most once per
       the resizer's cooldown_s), AddPs adds a parameter server (a restart, like a rescale).
       Consolidate and MoveReplica are counted, not carried out (placement is not modelled).

A job starts when its starting size fits (pods that fit go ahead of ones that do not, as
kube-scheduler does); a rescale or a PS change pauses it for the elastic loop's restart_s.
All settings are CoreSettings() defaults; the simulator adds no policy of its own.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim.bottleneck_model import SpeedModel, model_for
from scoring.actions import AddPs, Consolidate, GiveCpu, MoveReplica, Scale
from scoring.bottleneck import PS, Bottleneck, diagnose
from scoring.kernel import Memory, plan_loop
from scoring.remedy import cpu_target, with_diagnoses
from scoring.settings import CoreSettings
from scoring.world import JobState, NodeState, PendingPod, World

GPUS_PER_NODE = 8
LINK = 1.25e9
NOISE = 0.05
START = {PS: 4, "input": 2, "compute": 2}
RANGE = {PS: (2, 8), "input": (1, 8), "compute": (1, 8)}
CPU0, CPU_MAX, CPU_PS = 2.0, 8.0, 4.0
PS_RANGE = (1, 4)

# NEARCHUS (NOMS'24), their testbed and workloads, as published: not a like-for-like comparison.
NEARCHUS = {"speedup": "+71.4% to +129.1% training speed", "jct": "-35.6% JCT", "queue": "-67.8% queueing"}


@dataclass
class SimJob:
    key: str
    kind: str
    model: SpeedModel
    arrival: float
    work: float  # steps to do
    gpus: int = 0
    ps: int = 1
    cpu: float = CPU0
    placed: dict[str, int] = field(default_factory=dict)
    started: float = math.nan
    finished: float = math.nan
    done: float = 0.0
    paused_until: float = 0.0
    scaled_at: float = -math.inf
    cpu_at: float = -math.inf
    prev_rate: float = math.nan
    samples: dict[int, float] = field(default_factory=dict)
    diagnoses: dict[str, int] = field(default_factory=dict)

    def step_s(self) -> float:
        return self.model.step_s(self.gpus, self.ps if self.kind == PS else 0, self.cpu)


def workload(seed: int, n: int) -> list[SimJob]:
    rng = np.random.default_rng(seed)
    t = 0.0
    jobs = []
    for k in range(n):
        t += float(rng.exponential(240.0))
        kind = (PS, "input", "compute")[k % 3]
        m = model_for(kind, rng, LINK)
        best = m.step_s(START[kind], PS_RANGE[1] if kind == PS else 0, CPU_MAX)
        jobs.append(SimJob(f"sim/{kind}-{k:03d}", kind, m, t, float(rng.uniform(0.5, 1.5)) * 3600.0 / best))
    return jobs


class Cluster:
    def __init__(self, nodes: int) -> None:
        self.free = {f"node-{k}": GPUS_PER_NODE for k in range(nodes)}

    def place(self, job: SimJob, gpus: int) -> bool:
        if sum(self.free.values()) < gpus:
            return False
        left = gpus
        for name in sorted(self.free, key=lambda n: (-self.free[n], n)):  # fewest nodes first
            take = min(left, self.free[name])
            if take:
                self.free[name] -= take
                job.placed[name] = job.placed.get(name, 0) + take
                left -= take
            if not left:
                break
        job.gpus = gpus
        return True

    def release(self, job: SimJob) -> None:
        for name, g in job.placed.items():
            self.free[name] += g
        job.placed, job.gpus = {}, 0


def world(now: float, cl: Cluster, running: list[SimJob], queued: list[SimJob], on: bool,
          core: CoreSettings, rng: np.random.Generator) -> World:
    nodes = tuple(NodeState(n, GPUS_PER_NODE, GPUS_PER_NODE - f) for n, f in sorted(cl.free.items()))
    states = []
    diagnoses = {}
    for j in running:
        diag = None
        if on:
            rate = 1.0 / j.step_s() if now >= j.paused_until else 0.0
            trend = (rate - j.prev_rate) / j.prev_rate if j.prev_rate > 0 else math.nan
            sig = j.model.signals(j.key, j.gpus, j.ps, j.cpu, CPU_PS, LINK, sorted(j.placed), rng, NOISE,
                                  rate if now >= j.paused_until else math.nan, trend,
                                  PS_RANGE if j.kind == PS else None)
            diag = diagnose(sig, core.bottleneck)
            j.diagnoses[str(diag.kind)] = j.diagnoses.get(str(diag.kind), 0) + 1
        states.append(JobState(
            key=j.key, namespace="sim", gpus_on=dict(j.placed), live_gpus=j.gpus, per_pod=1, checkpointable=True,
            elastic=RANGE[j.kind], running=now >= j.paused_until, settling=now < j.paused_until,
            runtime_s=now - j.started, attained_gpu_s=math.nan, since_scaled_s=now - j.scaled_at,
            batch_size=j.model.batch, step_samples=dict(j.samples)))
        if diag is not None:
            diagnoses[j.key] = diag
    pending = tuple(PendingPod(f"{j.key}-{k}", j.key, 1.0, now - j.arrival)
                    for j in queued for k in range(START[j.kind]))
    # As the service's shell does: the diagnoses go on the World with with_diagnoses (which also
    # fills each one's measured scaling from the job's step samples).
    return with_diagnoses(World(now, nodes, tuple(sorted(states, key=lambda s: s.key)), pending), diagnoses)


MODES = ("off", "constrain", "on")


def run(seed: int, n_jobs: int, nodes: int, mode: str) -> dict[str, float]:
    """mode off: no diagnosis; constrain: diagnosis on JobState (growth capped), no remedies; on: both."""
    on = mode != "off"
    core = CoreSettings()
    dt = core.elastic.interval_s
    restart = core.elastic.restart_s
    jobs = workload(seed, n_jobs)
    cl = Cluster(nodes)
    noise_rng = np.random.default_rng(10_000 + seed)  # measurement noise, its own stream
    now = 0.0
    remedies = {"give-cpu": 0, "add-ps": 0, "consolidate": 0, "move-replica": 0, "scale": 0}
    while any(math.isnan(j.finished) for j in jobs):
        queued = [j for j in jobs if j.arrival <= now and math.isnan(j.started)]
        for j in queued:
            if cl.place(j, START[j.kind]):
                j.started = now
        running = [j for j in jobs if not math.isnan(j.started) and math.isnan(j.finished)]
        queued = [j for j in jobs if j.arrival <= now and math.isnan(j.started)]
        w = world(now, cl, running, queued, on, core, noise_rng)
        plan = plan_loop("elastic", w, core, Memory(), 0)  # the kernel's plan; every action applied
        by_key = {j.key: j for j in running}
        for a in plan.actions:  # shrinks first
            assert isinstance(a, Scale)
            j = by_key[a.job]
            old = j.gpus
            cl.release(j)
            if not cl.place(j, a.gpus):
                cl.place(j, old)
                continue
            j.paused_until, j.scaled_at = now + restart, now
            remedies["scale"] += 1
        if mode == "on":
            for r in plan_loop("remedies", w, core, Memory(), 0).actions:
                assert isinstance(r, GiveCpu | AddPs | Consolidate | MoveReplica)
                j = by_key[r.job]
                if isinstance(r, GiveCpu) and now - j.cpu_at >= core.resizer.cooldown_s and j.cpu < CPU_MAX:
                    j.cpu = cpu_target(j.cpu * 1000, CPU_MAX * 1000, core.bottleneck) / 1000
                    j.cpu_at = now
                    remedies["give-cpu"] += 1
                elif isinstance(r, AddPs):
                    j.ps = r.ps
                    j.paused_until, j.scaled_at = now + restart, now
                    remedies["add-ps"] += 1
                elif isinstance(r, Consolidate):
                    remedies["consolidate"] += 1
                elif isinstance(r, MoveReplica):
                    remedies["move-replica"] += 1
        # progress over [now, now + dt)
        for j in running:
            t = j.step_s()
            j.samples[j.gpus] = t
            active = max(0.0, now + dt - max(now, j.paused_until))
            j.prev_rate = 1.0 / t if active > 0 else 0.0
            need = (j.work - j.done) * t
            if need <= active:
                j.finished = now + (dt - active) + need
                j.done = j.work
                cl.release(j)
            else:
                j.done += active / t
        now += dt
        if now > 60 * 86400:
            raise RuntimeError("simulation did not finish in 60 days")
    jct = np.array([j.finished - j.arrival for j in jobs])
    queue = np.array([j.started - j.arrival for j in jobs])
    speed = {f"speed:{j.key}": j.work / (j.finished - j.started) for j in jobs}  # steps/s while admitted
    return {"jct": float(jct.mean()), "queue": float(queue.mean()), "makespan": now, **speed,
            **{f"n_{k}": float(v) for k, v in remedies.items()},
            "diag_comm": float(sum(j.diagnoses.get(str(Bottleneck.COMMUNICATION), 0) for j in jobs)),
            "diag_input": float(sum(j.diagnoses.get(str(Bottleneck.INPUT), 0) for j in jobs))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args(argv)
    print(f"# bottleneck diagnosis on vs off: {args.jobs} jobs (1/3 PS/worker, 1/3 input-bound, 1/3 compute-bound),"
          f" {args.nodes} nodes x {GPUS_PER_NODE} GPUs, seeds 1..{args.seeds}")
    print("# job mix: every job elastic and checkpointable (PS/worker workers 2-8, others 1-8 GPUs); PS/worker "
          f"jobs opted in to PS {PS_RANGE[0]}-{PS_RANGE[1]}; input-bound jobs' pods resizable {CPU0:g}->{CPU_MAX:g} "
          "cores. Settings: CoreSettings() defaults, no overrides.")
    rows = []
    for seed in range(1, args.seeds + 1):
        res = {m: run(seed, args.jobs, args.nodes, m) for m in MODES}
        rows.append(res)
        on = res["on"]
        print(f"seed {seed}: " + " | ".join(f"{m} jct {r['jct']:.0f}s queue {r['queue']:.0f}s" for m, r in res.items())
              + f" | on: {int(on['n_give-cpu'])} give-cpu, {int(on['n_add-ps'])} add-ps, {int(on['n_consolidate'])} "
              f"consolidate (counted, not applied); rescales " + ", ".join(f"{m} {int(r['n_scale'])}"
                                                                          for m, r in res.items()))

    def mean(mode: str, key: str) -> float:
        return float(np.mean([r[mode][key] for r in rows]))

    def speedup(mode: str, kind: str) -> float:
        """Geometric mean over the kind's jobs (all seeds) of its speed in `mode` / with diagnosis off."""
        ratios = [r[mode][k] / r["off"][k] for r in rows for k in r["off"]
                  if k.startswith(f"speed:sim/{kind}-")]
        return float(np.exp(np.mean(np.log(ratios))))

    print()
    print("| metric (mean over seeds) | off | constrain only | on (constrain + remedies) | on / off "
          "| NEARCHUS (published, their testbed) |")
    print("|---|---|---|---|---|---|")
    for kind, label in ((PS, "PS/worker"), ("input", "input-bound"), ("compute", "compute-bound")):
        theirs = NEARCHUS["speedup"] if kind != "compute" else ""
        c, o = speedup("constrain", kind), speedup("on", kind)
        print(f"| training speed of {label} jobs, x off (geo. mean per job) | 1 | {c:.3f} | {o:.3f} | {o:.3f} "
              f"| {theirs} |")
    for key, label, theirs in (("jct", "average JCT (s)", NEARCHUS["jct"]),
                               ("queue", "average queueing (s)", NEARCHUS["queue"]),
                               ("makespan", "makespan (s)", "")):
        a, c, b = mean("off", key), mean("constrain", key), mean("on", key)
        print(f"| {label} | {a:.0f} | {c:.0f} | {b:.0f} | {b / a:.3f} | {theirs} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
