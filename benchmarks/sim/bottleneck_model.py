"""A bottleneck model per job, for the diagnosis benchmark (benchmarks/run_bottleneck.py).

Seconds per step of a job with w workers (one GPU each), p parameter servers, global batch M and
c CPU cores per worker:

    T(w, p, c) = max(θ0·M/w,  M/(w·r·c))  +  θ1  +  θ2·w/p·[PS]  +  θ3·w  +  θ4·p·[PS]  +  σ·[w>1, allreduce]

- The PS/worker terms are Optimus' synchronous speed model (Peng et al., EuroSys'18, §3.2):
  f(p, w) = (θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p)^-1 steps/s: per-sample compute split over the
  workers, a constant, the gradient transfer each PS serves (w workers over p shards), and per
  worker / per PS overheads.
- The input pipeline: a worker decodes and augments r samples per second per CPU core and has c
  cores (its CPU limit); the GPU cannot go faster than its input, so the compute term is the max
  of the GPU's and the pipeline's time (prefetching overlaps them).
- All-reduce jobs (no PS) pay a sync term σ when w > 1.

The telemetry each pod would show follows from the same terms: a worker's GPU is busy for
θ0·M/w of every T (utilisation), its CPU decodes M/(w·T) samples/s (use, against its limit c),
each worker moves 2·G bytes per step (G: gradient bytes) and a PS 2·G·w/p; θ2 is G / link.
Measured values get multiplicative noise (1 ± noise), as a 30 s scrape average would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scoring.bottleneck import PS, WORKER, JobSignals


@dataclass(frozen=True)
class SpeedModel:
    kind: str  # "ps" (PS/worker), "input" (all-reduce, CPU-starved input), "compute" (all-reduce, GPU-bound)
    batch: int  # global batch M
    theta0: float  # GPU seconds per sample
    theta1: float  # constant seconds per step
    theta2: float  # PS: seconds per step per (workers / PS) of gradient transfer (= G / link)
    theta3: float  # seconds per step per worker
    theta4: float  # seconds per step per PS
    sync_s: float  # all-reduce sync per step when w > 1
    samples_per_core_s: float  # input pipeline: samples/s one CPU core prepares
    grad_bytes: float  # G

    def step_s(self, w: int, p: int, cpu: float) -> float:
        w = max(1, w)
        gpu = self.theta0 * self.batch / w
        feed = self.batch / (w * self.samples_per_core_s * max(cpu, 1e-9))
        t = max(gpu, feed) + self.theta1 + self.theta3 * w
        if self.kind == PS:
            t += self.theta2 * w / max(1, p) + self.theta4 * max(1, p)
        elif w > 1:
            t += self.sync_s
        return t

    def signals(self, job: str, w: int, p: int, cpu: float, cpu_ps: float, link: float, nodes: list[str],
                rng: np.random.Generator, noise: float, step_rate: float, trend: float,
                ps_range: tuple[int, int] | None = None) -> JobSignals:
        """What cAdvisor and DCGM would show over a window at (w, p, cpu), as JobSignals."""
        t = self.step_s(w, p, cpu)
        gpu = self.theta0 * self.batch / max(1, w)
        n_ps = p if self.kind == PS else 0
        roles = (WORKER,) * w + (PS,) * n_ps
        util = [min(1.0, gpu / t)] * w + [math.nan] * n_ps
        cpu_used = [min(cpu, self.batch / max(1, w) / self.samples_per_core_s / t)] * w
        if self.kind == PS:
            # A PS's CPU applies updates while its link carries them: busy for its transfer share.
            cpu_used += [cpu_ps * min(1.0, self.theta2 * w / max(1, p) / t)] * n_ps
        worker_net = 2 * self.grad_bytes / t if (self.kind == PS or w > 1) else 0.0
        net = [worker_net] * w + [2 * self.grad_bytes * w / max(1, p) / t] * n_ps
        n = len(roles)

        def noisy(x: list[float]) -> np.ndarray:
            return np.asarray(x, dtype=np.float64) * (1.0 + noise * rng.standard_normal(n))

        return JobSignals(
            job=job, pods=tuple(f"{job}-{r}-{k}" for k, r in enumerate(roles)), roles=roles,
            nodes=tuple(nodes[k % len(nodes)] for k in range(n)),
            gpu_util=np.clip(noisy(util), 0.0, 1.0), cpu_used=np.clip(noisy(cpu_used), 0.0, None),
            cpu_limit=np.array([cpu] * w + [cpu_ps] * n_ps, dtype=np.float64), net_bytes_s=np.clip(noisy(net), 0, None),
            pod_step_rate=np.full(n, math.nan), step_rate=step_rate, step_trend=trend,
            link_bytes_s=np.full(n, link), ps_range=ps_range)


def model_for(kind: str, rng: np.random.Generator, link: float) -> SpeedModel:
    """A job of `kind` with parameters drawn around the shapes described in the module docstring."""
    batch = int(rng.choice([256, 512]))
    theta0 = float(rng.uniform(0.002, 0.004))
    if kind == PS:
        grad = float(rng.uniform(0.25, 0.5)) * link  # 0.25-0.5 s of link time per worker per step
        return SpeedModel(PS, batch, theta0, 0.02, grad / link, 0.005, 0.01, 0.0, 1e9, grad)
    if kind == "input":
        return SpeedModel("input", batch, theta0, 0.02, 0.0, 0.005, 0.0, 0.03,
                          float(rng.uniform(40.0, 60.0)), 0.02 * link)
    return SpeedModel("compute", batch, theta0, 0.02, 0.0, 0.005, 0.0, 0.03, 1e9, 0.02 * link)
