"""One replay: pods arrive in order, never leave; the allocation ratio is sampled after each.

As the artifact's analysis does, the ratio "at x % arrived" is the mean of the samples taken
while the arrived GPU demand, rounded to a whole percent of capacity, equals x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.fgd.cluster import Cluster
from benchmarks.fgd.policies import (
    BestFitPolicy,
    ClusteringPolicy,
    DotProdPolicy,
    FGDPolicy,
    FlowschedPolicy,
    PackingPolicy,
    Policy,
    RandomPolicy,
)
from benchmarks.fgd.workload import Nodes, Pods, arrivals
from scoring.fragmentation import MILLI


@dataclass(frozen=True)
class Result:
    alloc_pct: dict[int, float]  # arrived % -> mean allocated share of GPU capacity, %
    unalloc_gpus: dict[int, float]  # arrived % -> mean arrived GPU demand not allocated, GPUs
    failed_pods: int
    pods_arrived: int
    failed_gpus_by_ask: dict[str, float]  # "cpu", "share", "1", "2", ... -> GPUs asked by failed pods


def make_policy(name: str, cluster: Cluster, pods: Pods, rng: np.random.Generator, typical: Pods) -> Policy:
    simple: dict[str, type[Policy]] = {p.name: p for p in (RandomPolicy, DotProdPolicy, ClusteringPolicy,
                                                           PackingPolicy, BestFitPolicy, FlowschedPolicy)}
    if name == "FGD":
        return FGDPolicy(cluster, pods, rng, typical)
    if name not in simple:
        raise ValueError(f"unknown policy {name!r}")
    return simple[name](cluster, pods, rng)


def access_by_spec(nodes: Nodes, pods: Pods) -> dict[str, np.ndarray]:
    out = {}
    for s in set(pods.spec):
        allowed = set(s.split("|")) if s else None
        out[s] = np.array([allowed is None or m in allowed for m in nodes.models], dtype=bool)
    return out


def replay(nodes: Nodes, pod_list: Pods, policy_name: str, seed: int, at: Sequence[int] = (100,),
           tune_ratio: float = 1.3) -> Result:
    # The arrival sequence depends on the seed only, so every policy sees the same pods in the
    # same order for a given seed; the policy gets its own stream for its random choices.
    pods = arrivals(pod_list, nodes.total_gpu_milli, np.random.default_rng(seed), tune_ratio)
    cluster = Cluster.empty(nodes)
    policy = make_policy(policy_name, cluster, pods, np.random.default_rng([seed, 1]), pod_list)
    access = access_by_spec(nodes, pods)
    cap = nodes.total_gpu_milli
    stop = max(at) + 1.5
    samples: list[tuple[int, float, float]] = []  # (arrived % rounded, alloc %, unallocated GPUs)
    arrived = 0
    failed = 0
    failed_by: dict[str, float] = {}
    n_arrived = 0
    for i in range(pods.count):
        arrived += int(pods.total_milli[i])
        n_arrived += 1
        if 100.0 * arrived / cap >= stop:
            break
        policy.arrived(i)
        g, m = int(pods.gpus[i]), int(pods.gpu_milli[i])
        cand = cluster.feasible(float(pods.cpu_milli[i]), float(pods.memory_mib[i]), g, m, access[pods.spec[i]])
        if cand.size == 0:
            failed += 1
            ask = "cpu" if g == 0 else ("share" if m < MILLI else str(g))
            failed_by[ask] = failed_by.get(ask, 0.0) + g * m / MILLI
        else:
            node, cols = policy.choose(i, cand)
            cluster.place(node, cols, float(pods.cpu_milli[i]), float(pods.memory_mib[i]), m)
            policy.placed(i, node)
        samples.append((int(np.round(100.0 * arrived / cap)), 100.0 * cluster.used_milli / cap,
                        (arrived - cluster.used_milli) / MILLI))
    alloc, unalloc = {}, {}
    for x in at:
        # the artifact's rule: the samples in bucket x, else those within one point of it
        near = [s for s in samples if s[0] == x] or [s for s in samples if abs(s[0] - x) <= 1]
        alloc[x] = float(np.mean([s[1] for s in near])) if near else float("nan")
        unalloc[x] = float(np.mean([s[2] for s in near])) if near else float("nan")
    return Result(
        alloc_pct=alloc,
        unalloc_gpus=unalloc,
        failed_pods=failed,
        pods_arrived=n_arrived,
        failed_gpus_by_ask=failed_by,
    )
