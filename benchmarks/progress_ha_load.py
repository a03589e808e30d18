"""Verb latency with 1,000 jobs reporting every 10 s through the Prometheus-shared store (HA mode).

    python -m benchmarks.progress_ha_load [--store prometheus|sqlite] [--jobs 1000] [--period-s 10] [--nodes 500]
                                          [--rounds 3] [--round-s 20]

One run, alternating rounds: the same prioritize calls (names mode, --nodes candidates from the
openb snapshot) are timed back to back for --round-s seconds with no progress reporting, then
while a reporter process posts one point per job every --period-s seconds (jobs spread evenly
over the period) to the same server, whose store remote-writes each point to a real Prometheus
(--web.enable-remote-write-receiver) before answering, and whose convergence tracker reads the
histories back from it every 10 s. Prints p50/p99 per side and the p99 ratio (on / off).
The reporter and the client share this machine's CPUs with the server. --store sqlite runs the
same load on the single-replica SQLite store, to tell what HA adds from what re-estimating 1,000
jobs costs in any mode.
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import openb
from benchmarks.extender_latency import _percentiles
from benchmarks.local_serve import free_port, wait_ready

TOKEN = "bench-token"


def serve(ns: argparse.Namespace) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from extender.http.app import build_app
    from extender.http.auth import StaticTokenAuthenticator
    from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
    from extender.metrics import build_metrics
    from extender.progress.convergence import ConvergenceTracker
    from extender.progress.replicated_store import ReplicatedProgressStore, ReplicatedStoreSettings
    from extender.progress.store import ProgressStore, ProgressStoreSettings
    from extender.settings import Settings
    from extender.snapshot.state import ClusterState
    from scoring.settings import TrackerSettings

    state = ClusterState()
    openb.populate(state, ns.nodes, ns.pods, Path(ns.data))
    state.mark_synced()
    local = ProgressStoreSettings(path=str(Path(ns.workdir) / "local.sqlite"))
    store = ProgressStore(local) if ns.store == "sqlite" else ReplicatedProgressStore(
        local, ReplicatedStoreSettings(prometheus_url=ns.prometheus, remote_write_url=ns.prometheus + "/api/v1/write"))
    tracker = ConvergenceTracker(store, state, TrackerSettings(interval_s=10.0))
    tracker.start()
    metrics = build_metrics()
    progress = build_progress_router(store, StaticTokenAuthenticator({TOKEN: frozenset({"*"})}),
                                     ProgressApiSettings(), ProgressApiMetrics.build(CollectorRegistry()))
    app = build_app(Settings(kube=False), state, metrics, routers=[progress])
    print("populated nodes={nodes} pods={pods}".format(**state.read().counts()), flush=True)
    uvicorn.run(app, host="127.0.0.1", port=ns.port, access_log=False, log_level="warning")
    return 0


def report(ns: argparse.Namespace) -> int:
    """Post one point per job every period, jobs spread evenly; prints posts and failures at exit."""
    conn = http.client.HTTPConnection("127.0.0.1", ns.port, timeout=30)
    headers = {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"}
    gap = ns.period_s / ns.jobs
    step, sent, failed = 0, 0, 0
    next_at = time.monotonic()
    try:
        while True:
            step += 1
            for j in range(ns.jobs):
                body = orjson.dumps({"namespace": "bench", "job": f"job-{j}",
                                     "points": [{"step": step * 10, "loss": 0.2 + 1.0 / (1 + step * 0.1 + j * 1e-3),
                                                 "timestamp": time.time()}]})
                conn.request("POST", "/v1/progress", body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                sent += 1
                failed += resp.status != 200
                next_at += gap
                time.sleep(max(0.0, next_at - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        print(f"reporter: {sent} posts, {failed} not 200", flush=True)
    return 0


def _time_round(port: int, bodies: list[bytes], seconds: float) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"content-type": "application/json"}
    out: list[float] = []
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        t0 = time.perf_counter()
        conn.request("POST", "/prioritize", body=bodies[k % len(bodies)], headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"prioritize: {resp.status} {payload[:200]!r}")
        out.append((time.perf_counter() - t0) * 1000)
        k += 1
    conn.close()
    return out


def client(ns: argparse.Namespace) -> int:
    import httpx

    from tests.prometheus_harness import PrometheusServer, prometheus_binary

    work = Path(tempfile.mkdtemp(prefix="flowsched-ha-load-"))
    prom = PrometheusServer(prometheus_binary(), work / "prom", [], extra_args=["--web.enable-remote-write-receiver"])
    prom.start()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.progress_ha_load", "serve", "--port", str(port),
                               "--nodes", str(ns.nodes), "--pods", str(ns.pods), "--data", ns.data,
                               "--prometheus", prom.url, "--workdir", str(work), "--store", ns.store],
                              stdout=subprocess.PIPE, text=True)
    reporter: subprocess.Popen[str] | None = None
    try:
        assert server.stdout is not None
        print(server.stdout.readline().strip(), flush=True)
        if not wait_ready(port, 120, server):
            raise RuntimeError("server did not come up")
        nodes = openb.read_nodes(Path(ns.data))
        names = [n.name for n in openb.replicate(nodes, ns.nodes)]
        pods = openb.read_pods(Path(ns.data))
        rng = np.random.default_rng(1)
        bodies = [orjson.dumps({"Pod": openb.pod_object(pods[int(rng.integers(len(pods)))], f"b-{r}"), "Nodes": None,
                                "NodeNames": [names[i] for i in rng.permutation(len(names))[:ns.nodes]]})
                  for r in range(200)]
        _time_round(port, bodies, 2.0)  # warm-up
        samples: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(ns.rounds):
            for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
                if side == "on":
                    reporter = subprocess.Popen(
                        [sys.executable, "-m", "benchmarks.progress_ha_load", "report", "--port", str(port),
                         "--jobs", str(ns.jobs), "--period-s", str(ns.period_s)], text=True)
                    time.sleep(ns.period_s)  # every job reported once before timing
                ms = _time_round(port, bodies, ns.round_s)
                if reporter is not None:
                    reporter.send_signal(2)
                    reporter.wait(30)
                    reporter = None
                samples[side] += ms
                p = _percentiles(np.asarray(ms))
                print(f"round {r} {side:<3} requests={len(ms):>6} p50={p['p50']:.3f} p99={p['p99']:.3f} ms", flush=True)
        off, on = (_percentiles(np.asarray(samples[s])) for s in ("off", "on"))
        jobs = httpx.get(f"{prom.url}/api/v1/query", timeout=10,
                         params={"query": "count(count_over_time(flowsched_progress_ts[1h]))"}).json()["data"]["result"]
        print(f"store={ns.store}; prioritize, {ns.nodes} candidate nodes, {ns.rounds} alternating rounds of "
              f"{ns.round_s:.0f} s per side")
        print(f"no reporting: p50={off['p50']:.3f} p99={off['p99']:.3f} ms ({len(samples['off'])} calls)")
        print(f"{ns.jobs} jobs every {ns.period_s:.0f} s: p50={on['p50']:.3f} p99={on['p99']:.3f} ms "
              f"({len(samples['on'])} calls); jobs in Prometheus: {jobs[0]['value'][1] if jobs else 0}")
        print(f"p99 ratio (reporting / none): {on['p99'] / off['p99']:.3f}; p50 ratio: {on['p50'] / off['p50']:.3f}")
    finally:
        if reporter is not None:
            reporter.kill()
        server.terminate()
        server.wait(10)
        prom.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="client", choices=["client", "serve", "report"])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--period-s", type=float, default=10.0)
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--pods", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--round-s", type=float, default=20.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--prometheus", default="")
    p.add_argument("--workdir", default="")
    p.add_argument("--store", default="prometheus", choices=["prometheus", "sqlite"],
                   help="prometheus: the HA store (remote write + read back); sqlite: the single-replica default")
    p.add_argument("--data", default=os.environ.get("FLOWSCHED_OPENB", str(openb.DEFAULT_DIR)))
    ns = p.parse_args(argv)
    modes: dict[str, Any] = {"client": client, "serve": serve, "report": report}
    return int(modes[ns.mode](ns))


if __name__ == "__main__":
    sys.exit(main())
