"""Shared-GPU interference: what placing by live utilisation does to job completion times.

A time-sliced cluster (each physical GPU advertised as `replicas` replicas) receives pods that
each ask one replica. Pods differ in how busy they keep a GPU (their own utilisation u, drawn
from a notebook / inference / training mix), which allocation counts cannot see.

The model (printed with the table):
- the device plugin, not the scheduler, picks the physical GPU on the chosen node: the one
  with the fewest replicas allocated (first on ties);
- on a physical GPU with total demand U = sum of its pods' u, pod i progresses at
  rate_i = (1 / max(1, U)) * (1 - overhead * min(1, U - u_i)): time-slicing divides the GPU
  when it is oversubscribed, and context switching costs more the busier the co-tenants are;
- telemetry (DCGM) shows min(100 %, 100 * U) per physical GPU, one step late.

Policies choose only the node, among nodes with a free replica:
- binpack (allocation only, as HAMi's and gpushare's binpack): most replicas allocated;
- spread (allocation only, as their spread): fewest replicas allocated;
- flowsched: scoring/sharing.py's idle term (mean idle share of the node's physical GPUs, from
  telemetry) averaged with the allocation headroom (free replicas share), ties to the most
  allocated node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scoring.sharing import shared_gpu_terms

FloatArray = npt.NDArray[np.float64]
POLICIES = ("binpack", "spread", "flowsched")


@dataclass(frozen=True)
class Model:
    nodes: int = 16
    gpus_per_node: int = 4
    replicas: int = 4
    overhead: float = 0.15
    jobs: int = 900
    arrival_window_s: float = 8 * 3600.0
    mean_work_s: float = 3600.0  # solo GPU time
    step_s: float = 60.0
    # load the scheduler's allocation counts cannot see (processes outside Kubernetes, pods of
    # another scheduler): this share of the physical GPUs carries hidden_util all the time
    hidden_gpu_share: float = 0.0
    hidden_util: float = 0.5

    def describe(self) -> str:
        return (f"{self.nodes} nodes x {self.gpus_per_node} GPUs x {self.replicas} replicas; {self.jobs} pods over "
                f"{self.arrival_window_s / 3600:g} h (Poisson), solo work lognormal mean {self.mean_work_s:g} s; "
                f"u: 40 % notebooks U(0.05, 0.2), 30 % inference U(0.2, 0.5), 30 % training U(0.6, 0.95); "
                f"rate_i = 1/max(1,U) * (1 - {self.overhead} * min(1, U - u_i)); device plugin: fewest-allocated GPU; "
                f"step {self.step_s:g} s; hidden load {self.hidden_util:g} on "
                f"{100 * self.hidden_gpu_share:g} % of GPUs")


@dataclass(frozen=True)
class Jobs:
    arrive: FloatArray
    work: FloatArray
    util: FloatArray
    hidden: FloatArray  # per physical GPU


def make_jobs(m: Model, rng: np.random.Generator) -> Jobs:
    arrive = np.sort(rng.uniform(0.0, m.arrival_window_s, m.jobs))
    sigma = 0.8
    work = rng.lognormal(np.log(m.mean_work_s) - sigma**2 / 2, sigma, m.jobs)
    kind = rng.choice(3, size=m.jobs, p=[0.4, 0.3, 0.3])
    lo = np.array([0.05, 0.2, 0.6])[kind]
    hi = np.array([0.2, 0.5, 0.95])[kind]
    util = rng.uniform(lo, hi)
    g_total = m.nodes * m.gpus_per_node
    hidden = np.zeros(g_total)
    hidden[rng.permutation(g_total)[:round(m.hidden_gpu_share * g_total)]] = m.hidden_util
    return Jobs(arrive, work, util, hidden)


@dataclass(frozen=True)
class JctResult:
    mean_jct_s: float
    p95_jct_s: float
    mean_slowdown: float  # JCT / solo work


def simulate(m: Model, jobs: Jobs, policy: str) -> JctResult:
    g_total = m.nodes * m.gpus_per_node
    alloc = np.zeros(g_total, dtype=np.int64)  # replicas allocated per physical GPU
    load = jobs.hidden.copy()  # sum of u of pods running there, plus the hidden load
    seen_util = np.full(g_total, np.nan)  # telemetry, one step late
    gpu_of = np.full(m.jobs, -1, dtype=np.int64)
    left = jobs.work.copy()
    start = np.full(m.jobs, np.nan)
    done = np.full(m.jobs, np.nan)
    queue: list[int] = []
    nxt = 0
    t = 0.0
    while np.isnan(done).any():
        while nxt < m.jobs and jobs.arrive[nxt] <= t:
            queue.append(nxt)
            nxt += 1
        waiting = []
        for j in queue:  # FIFO; a pod that finds no replica waits
            per_node = alloc.reshape(m.nodes, m.gpus_per_node)
            free = (m.replicas * m.gpus_per_node - per_node.sum(axis=1))
            ok = np.flatnonzero(free > 0)
            if ok.size == 0:
                waiting.append(j)
                continue
            used = per_node.sum(axis=1)[ok]
            if policy == "binpack":
                node = int(ok[np.argmax(used)])
            elif policy == "spread":
                node = int(ok[np.argmin(used)])
            else:
                util = seen_util.reshape(m.nodes, m.gpus_per_node)[ok]
                terms = shared_gpu_terms(util, np.full_like(util, np.nan), np.full(ok.size, float(m.gpus_per_node)),
                                         None, bound_pct=100.0)
                # the extender's combination: live idle share and allocation headroom, equal weights
                # (allocation counts move at once; telemetry lags a step, so a burst of arrivals
                # would otherwise all chase the same idle node)
                headroom = 1.0 - used / (m.replicas * m.gpus_per_node)
                score = 0.5 * terms.idle + 0.5 * headroom
                node = int(ok[np.lexsort((-used, -np.round(score, 6)))[0]])
            row = alloc[node * m.gpus_per_node:(node + 1) * m.gpus_per_node]
            cand = np.flatnonzero(row < m.replicas)
            g = node * m.gpus_per_node + int(cand[np.argmin(row[cand])])
            alloc[g] += 1
            load[g] += jobs.util[j]
            gpu_of[j] = g
            start[j] = t
        queue = waiting
        running = np.flatnonzero((gpu_of >= 0) & np.isnan(done))
        seen_util = np.minimum(100.0, 100.0 * load)
        if running.size:
            u_gpu = load[gpu_of[running]]
            rate = (1.0 / np.maximum(1.0, u_gpu)) * (1.0 - m.overhead * np.minimum(1.0, u_gpu - jobs.util[running]))
            left[running] -= rate * m.step_s
            fin = running[left[running] <= 0]
            for j in fin.tolist():
                done[j] = t + m.step_s
                alloc[gpu_of[j]] -= 1
                load[gpu_of[j]] -= jobs.util[j]
        t += m.step_s
        if t > 50 * (m.arrival_window_s + float(jobs.work.sum())):
            raise RuntimeError("simulation did not drain: the model is overloaded")
    jct = done - jobs.arrive
    return JctResult(float(jct.mean()), float(np.percentile(jct, 95)), float((jct / jobs.work).mean()))
