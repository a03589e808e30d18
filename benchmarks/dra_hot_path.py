"""The verbs on DRA nodes against the same cluster with device-plugin nodes, in one process.

    python -m benchmarks.dra_hot_path [--nodes 5000] [--pods 20000] [--requests 300] [--dra-first]

Two snapshots of the same openb cluster: one with nvidia.com/gpu nodes, one with the GPUs in
ResourceSlices and every GPU pod asking through a ResourceClaim (extender_latency --dra's
cluster). Each request goes to both, alternating which goes first, so load on a shared machine
falls on both alike; thread CPU time and wall time per call, p50 and p99. The snapshot built
first tends to be faster (memory layout): --dra-first builds the DRA one first, and a fair reading
takes both orders.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import openb
from benchmarks.extender_latency import dra_pod, publish_through_dra
from extender.http.verbs import (
    FilterAnswer,
    Policy,
    ScoreAnswer,
    decide_filter,
    decide_filter_ranked,
    decide_prioritize,
)
from extender.http.wire import ExtenderArgs
from extender.snapshot.state import ClusterState
from scoring.placement import PlacementSettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=20_000)
    p.add_argument("--sizes", default="500,5000")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--dra-first", action="store_true")
    p.add_argument("--data", default=str(openb.DEFAULT_DIR))
    ns = p.parse_args(argv)
    data = Path(ns.data)
    policy = Policy(placement=PlacementSettings(), stale_after_s=60.0, rank_keep=1)
    dp, dra = ClusterState(), ClusterState()
    first, second = (dra, dp) if ns.dra_first else (dp, dra)
    nodes = openb.populate(first, ns.nodes, ns.pods, data)
    openb.populate(second, ns.nodes, ns.pods, data)
    publish_through_dra(dra, nodes)
    pods = openb.read_pods(data)
    rng = np.random.default_rng(1)
    verbs: dict[str, object] = {"filter-ranked": decide_filter_ranked, "filter": decide_filter,
                                "prioritize": decide_prioritize}
    print("verb           names kind  p50_cpu  p99_cpu p50_wall p99_wall (ms)")
    for size in (int(x) for x in ns.sizes.split(",")):
        for name, fn in verbs.items():
            cpu: dict[str, list[float]] = {"dp": [], "dra": []}
            wall: dict[str, list[float]] = {"dp": [], "dra": []}
            for r in range(ns.requests + ns.warmup):
                pod = pods[int(rng.integers(len(pods)))]
                names = [nodes[i].name for i in rng.permutation(len(nodes))[:size]]
                calls = [("dp", dp, openb.pod_object(pod, f"b-{r}")),
                         ("dra", dra, dra_pod(openb.pod_object(pod, f"b-{r}")))]
                for kind, state, obj in calls if r % 2 else calls[::-1]:
                    args = ExtenderArgs(obj, names, None)
                    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                    answer = fn(state, args, policy, 0.0)  # type: ignore[operator]
                    c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                    assert isinstance(answer, FilterAnswer | ScoreAnswer)
                    if r >= ns.warmup:
                        cpu[kind].append((c1 - c0) / 1e6)
                        wall[kind].append((w1 - w0) / 1e6)
            for kind in ("dp", "dra"):
                c, w = np.asarray(cpu[kind]), np.asarray(wall[kind])
                print(f"{name:<14} {size:>5} {kind:<4} {np.percentile(c, 50):8.3f} {np.percentile(c, 99):8.3f} "
                      f"{np.percentile(w, 50):8.3f} {np.percentile(w, 99):8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
