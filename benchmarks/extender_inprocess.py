"""CPU cost of the extender verbs with no network: the ASGI app driven in-process.

    python -m benchmarks.extender_inprocess [--names 100,420,5000] [--calls 300]

Pods look like what kube-scheduler forwards from kube-apiserver (managedFields, tolerations,
a projected token volume); prioritize is sent the nodes filter passed, as kube-scheduler does,
so it exercises the filter-to-prioritize memo. Separates flowsched's own compute from the
transport and CPU contention seen in benchmarks/kube_scheduler_throughput.py.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import openb
from extender.http.app import build_app
from extender.http.extender_app import ExtenderApp
from extender.metrics import build_metrics
from extender.settings import Settings
from extender.snapshot.state import ClusterState


def apiserver_like(pod: dict[str, Any]) -> dict[str, Any]:
    fields = {"f:metadata": {"f:labels": {".": {}, "f:flowsched.io/job": {}}},
              "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:resources": {}}}}}
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                                         "time": "2026-11-22T00:00:00Z", "fieldsType": "FieldsV1",
                                         "fieldsV1": fields}]
    pod["spec"].update({
        "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
        "volumes": [{"name": "kube-api-access", "projected": {
            "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
    })
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return pod


async def _call(app: ExtenderApp, body: bytes, path: str) -> bytes:
    out: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        out.append(message)

    await app({"type": "http", "method": "POST", "path": path,
               "headers": [(b"content-length", str(len(body)).encode())]}, receive, send)
    return bytes(out[-1]["body"])


async def measure(app: ExtenderApp, bodies: list[bytes]) -> tuple[float, float, float]:
    """Mean CPU ms per filter call, per prioritize call (on filter's passed nodes) and per
    filter-ranked call (filter-only mode: the one call per pod)."""
    filter_s = prioritize_s = ranked_s = 0.0
    for body in bodies:
        t = time.process_time()
        await _call(app, body, "/filter-ranked")
        ranked_s += time.process_time() - t
        t = time.process_time()
        reply = await _call(app, body, "/filter")
        filter_s += time.process_time() - t
        args = orjson.loads(body)
        args["NodeNames"] = orjson.loads(reply)["NodeNames"]
        follow_up = orjson.dumps(args)
        t = time.process_time()
        await _call(app, follow_up, "/prioritize")
        prioritize_s += time.process_time() - t
    return 1000 * filter_s / len(bodies), 1000 * prioritize_s / len(bodies), 1000 * ranked_s / len(bodies)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", default="100,420,5000")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--data", default=str(openb.DEFAULT_DIR))
    ns = ap.parse_args(argv)
    sizes = [int(x) for x in ns.names.split(",")]
    state = ClusterState()
    nodes = openb.populate(state, max(sizes), ns.pods, Path(ns.data))
    state.mark_synced()
    app = build_app(Settings(kube=False), state, build_metrics())
    pods = openb.read_pods(Path(ns.data))
    rng = np.random.default_rng(1)
    print(f"{len(nodes)} nodes, {ns.pods} pods; CPU ms per call (process time), mean of {ns.calls} calls")
    for size in sizes:
        bodies = [orjson.dumps({"Pod": apiserver_like(openb.pod_object(pods[i % len(pods)], f"b{i}")),
                                "NodeNames": [nodes[j].name for j in rng.permutation(len(nodes))[:size]]})
                  for i in range(ns.calls)]
        asyncio.run(measure(app, bodies[:20]))  # warm-up
        f, p, r = asyncio.run(measure(app, bodies))
        print(f"{size:>5} names  body {len(bodies[0]) / 1024:7.1f} KiB  filter {f:6.3f} ms  prioritize {p:6.3f} ms"
              f"  (sum {f + p:6.3f})  filter-ranked {r:6.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
