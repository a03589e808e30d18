"""Verb latency idle vs with a client looping on the heaviest debug call (issue 18).

    python -m benchmarks.debug_contention [--nodes 5000] [--pods 50000] [--names 500] [--rounds 3]

Starts `flowsched`'s real server (build_app under extender.http.server, as `flowsched serve`
runs it) on a populated snapshot of openb nodes and pods, then alternates rounds of
prioritize calls (names mode, one kept-alive connection, like kube-scheduler) with no other
load and with a second process looping on the heaviest debug-class call: each of the largest
/debug/snapshot page, /debug/explain and the /ui status page is timed, the slowest is looped on.
Prints p50/p99 per condition and the ratio of the p99s; both conditions are measured in the
same run, in alternating rounds.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import openb
from benchmarks.extender_latency import rss_mib
from benchmarks.local_serve import free_port, wait_ready


def serve(ns: argparse.Namespace) -> int:
    from extender.http.app import build_app
    from extender.http.server import FlowschedServer, server_config
    from extender.http.server_limits import ServerLimits
    from extender.http.ui import build_ui_router
    from extender.metrics import build_metrics
    from extender.progress.store import ProgressStore, ProgressStoreSettings
    from extender.settings import Settings
    from extender.snapshot.state import ClusterState
    from scoring.settings import TrackerSettings

    state = ClusterState()
    openb.populate(state, ns.nodes, ns.pods, Path(ns.data))
    state.mark_synced()
    gc.freeze()  # as the watcher does after its first list: the snapshot is not re-scanned by every GC
    settings = Settings(kube=False)
    store = ProgressStore(ProgressStoreSettings(path=str(Path(tempfile.mkdtemp()) / "progress.sqlite")))
    ui = build_ui_router(state, store, TrackerSettings(), lambda: None, settings.telemetry_stale_s)
    app = build_app(settings, state, build_metrics(), routers=[ui])
    print("populated nodes={nodes} pods={pods}".format(**state.read().counts()), flush=True)
    config = server_config(app, host="127.0.0.1", port=ns.port, limits=ServerLimits(), log_level="warning",
                           loop="uvloop")
    FlowschedServer(config).run()
    return 0


def _get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{path}: {resp.status} {body[:200]!r}")
    return body


def load(ns: argparse.Namespace) -> int:
    """Loop on one debug call until interrupted; print how many calls were answered."""
    calls = size = 0
    start = time.perf_counter()
    try:
        while True:
            size = len(_get(ns.port, ns.path))
            calls += 1
    except KeyboardInterrupt:
        pass
    wall = time.perf_counter() - start
    print(f"debug calls={calls} in {wall:.1f}s ({calls / wall:.1f}/s), {size} bytes each", flush=True)
    return 0


def heaviest_debug_call(port: int, pod_key: str) -> tuple[str, float]:
    """Of the largest pages of each debug endpoint, the one that takes longest (median of 3)."""
    paths = ["/debug/snapshot", "/debug/snapshot?kind=pods", f"/debug/explain?pod={pod_key}", "/ui"]
    timed = []
    for path in paths:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            size = len(_get(port, path))
            runs.append(time.perf_counter() - t0)
        timed.append((float(np.median(runs)), path, size))
        print(f"  {path}: {timed[-1][0] * 1000:.0f} ms, {size} bytes", flush=True)
    return max(timed)[1], max(timed)[0]


def _round(port: int, bodies: list[bytes]) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"content-type": "application/json"}
    times = []
    for b in bodies:
        t0 = time.perf_counter()
        conn.request("POST", "/prioritize", body=b, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        times.append((time.perf_counter() - t0) * 1000)
        if resp.status != 200:
            raise RuntimeError(f"prioritize: {resp.status} {payload[:200]!r}")
    conn.close()
    return times


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def client(ns: argparse.Namespace) -> int:
    port = free_port()
    me = [sys.executable, "-m", "benchmarks.debug_contention"]
    server = subprocess.Popen([*me, "serve", "--port", str(port), "--nodes", str(ns.nodes), "--pods", str(ns.pods),
                               "--data", ns.data], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        print(server.stdout.readline().strip(), flush=True)
        if not wait_ready(port, 300, server):
            raise RuntimeError("server did not come up")
        nodes = openb.replicate(openb.read_nodes(Path(ns.data)), ns.nodes)
        pods = openb.read_pods(Path(ns.data))
        rng = np.random.default_rng(1)

        def bodies(n: int) -> list[bytes]:
            out = []
            for r in range(n):
                pod: dict[str, Any] = openb.pod_object(pods[int(rng.integers(len(pods)))], f"bench-{r}")
                idx = rng.permutation(len(nodes))[: ns.names]
                out.append(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": [nodes[i].name for i in idx]}))
            return out

        _round(port, bodies(ns.warmup))
        print("debug calls at their largest page:", flush=True)
        heavy, heavy_s = heaviest_debug_call(port, "default/pod-000000")
        if ns.loop_on:  # a chosen call instead of the heaviest
            heavy = ns.loop_on
        print(f"the loader loops on {heavy}", flush=True)
        results: dict[str, list[float]] = {"idle": [], "debug loop": []}
        for r in range(ns.rounds):
            results["idle"] += _round(port, bodies(ns.requests))
            loader = subprocess.Popen([*me, "load", "--port", str(port), "--path", heavy], stdout=subprocess.PIPE,
                                      text=True)
            try:
                assert loader.stdout is not None
                time.sleep(ns.settle_s)  # the loader is calling before the round starts
                results["debug loop"] += _round(port, bodies(ns.requests))
            finally:
                loader.send_signal(2)
                out, _ = loader.communicate(timeout=60)
            # The server finishes the page the loader was waiting for: let it, or the next idle
            # round would be measured under that load.
            time.sleep(1.5 * heavy_s + 0.5)
            last = [line for line in out.splitlines() if line.startswith("debug calls")]
            print(f"round {r + 1}: {last[-1] if last else 'the debug loader printed nothing'}", flush=True)
        print(f"prioritize, names mode, {ns.names} candidate nodes of {ns.nodes}, {ns.pods} pods, "
              f"{ns.rounds} x {ns.requests} requests per condition; server RSS {rss_mib(server.pid):.0f} MiB")
        stats = {k: _stats(v) for k, v in results.items()}
        for k, s in stats.items():
            print(f"  {k:<11} p50={s['p50']:7.2f} ms  p99={s['p99']:7.2f} ms  max={s['max']:7.2f} ms")
        print(f"  p99 ratio (debug loop / idle) = {stats['debug loop']['p99'] / stats['idle']['p99']:.2f}")
    finally:
        server.terminate()
        server.wait(30)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="client", choices=["client", "serve", "load"])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=50_000)
    p.add_argument("--names", type=int, default=500, help="candidate nodes per prioritize call")
    p.add_argument("--requests", type=int, default=400, help="per round and condition")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--loop-on", default="", help="loop on this debug call instead of the heaviest one")
    p.add_argument("--path", default="/debug/snapshot", help="(load) the debug call to loop on")
    p.add_argument("--data", default=str(openb.DEFAULT_DIR))
    ns = p.parse_args(argv)
    return {"serve": serve, "load": load, "client": client}[ns.mode](ns)


if __name__ == "__main__":
    raise SystemExit(main())
