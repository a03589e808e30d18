"""Extender round-trip latency and resident memory, from a separate client process over loopback.

    python -m benchmarks.extender_latency [--sizes 100,500,5000] [--requests 300] [--out DIR]
        [--verbs filter,prioritize,filter-ranked] [--client raw|stdlib] [--gc-freeze]
        [--http flowsched|httptools|h11] [--dra]

Starts `python -m benchmarks.extender_latency serve` (the real service app under uvicorn with
the service's own protocol unless --http says otherwise, with
a snapshot of openb nodes replicated to the largest size and --pods pods), then times filter,
prioritize and filter-ranked calls in names mode (nodeCacheCapable) and full-Node mode. Prints a table and
writes latency.csv; also prints the server's resident memory (VmRSS) once populated.

--dra: the same cluster with its GPUs published through Dynamic Resource Allocation (docs/dra.md):
every node's GPUs in a ResourceSlice instead of nvidia.com/gpu, a GPU DeviceClass, and each GPU
pod sent asking through a ResourceClaim of its GPU count (the running pods keep their requests, as
pods mapped through KEP-5004 do). Compare its p99 with a run without it on the same machine.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import openb
from benchmarks.csv_rows import write_rows
from benchmarks.local_serve import free_port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from extender.http.app import build_app
    from extender.metrics import build_metrics
    from extender.settings import Settings
    from extender.snapshot.state import ClusterState

    state = ClusterState()
    nodes = openb.populate(state, ns.nodes, ns.pods, Path(ns.data))
    if ns.dra:
        publish_through_dra(state, nodes)
    state.mark_synced()
    if ns.gc_freeze:
        gc.freeze()
    app = build_app(Settings(kube=False), state, build_metrics())
    print("populated nodes={nodes} pods={pods}".format(**state.read().counts()), flush=True)
    if ns.http == "flowsched":  # the protocol `flowsched serve` runs: the verbs answered directly
        from extender.http.server import FlowschedServer, server_config
        from extender.http.server_limits import ServerLimits

        FlowschedServer(server_config(app, host="127.0.0.1", port=ns.port, limits=ServerLimits(),
                                      log_level="warning", loop=ns.loop)).run()
        return 0
    uvicorn.run(app, host="127.0.0.1", port=ns.port, loop=ns.loop, http=ns.http, access_log=False,
                log_level="warning")
    return 0


DRA_CLAIM = "bench-gpus-{}"  # the unallocated claim of that many GPUs every --dra pod uses


def publish_through_dra(state: Any, nodes: list[openb.OpenbNode]) -> None:
    """The nodes' GPUs as ResourceSlice devices, not nvidia.com/gpu; one claim per GPU count."""
    from extender.snapshot.dra import parse_device_class, parse_resource_claim, parse_resource_slice
    from extender.snapshot.objects import parse_node

    drv = "gpu.nvidia.com"
    state.upsert_dra(parse_device_class({"metadata": {"name": drv}, "spec": {}}))
    for n in nodes:
        obj = openb.node_object(n)
        for key in ("capacity", "allocatable"):
            obj["status"][key] = {k: v for k, v in obj["status"][key].items() if k != "nvidia.com/gpu"}
        state.upsert_node(parse_node(obj))
        devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{n.name}-{i}"}}} for i in range(n.gpus)]
        state.upsert_dra(parse_resource_slice({"metadata": {"name": f"{n.name}-{drv}"}, "spec": {
            "driver": drv, "nodeName": n.name, "pool": {"name": n.name}, "devices": devices}}))
    for count in range(1, 9):
        state.upsert_dra(parse_resource_claim({"metadata": {"name": DRA_CLAIM.format(count), "namespace": "default"},
                                               "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                                                   "deviceClassName": drv, "count": count}}]}}}))


def dra_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod asking its GPUs through a ResourceClaim instead of nvidia.com/gpu."""
    c = pod["spec"]["containers"][0]
    gpus = int(c["resources"]["limits"].pop("nvidia.com/gpu", 0))
    if gpus:
        pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": DRA_CLAIM.format(min(gpus, 8))}]
        c["resources"]["claims"] = [{"name": "gpus"}]
    return pod


class StdlibClient:
    """http.client on one kept-alive connection (httpx alone added ~0.7 ms a request here)."""

    def __init__(self, host: str, port: int) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.conn.request("POST", path, body=body, headers={"content-type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, resp.read()

    def close(self) -> None:
        self.conn.close()


class RawClient:
    """HTTP/1.1 over one kept-alive socket, framing by Content-Length: about as lean per request
    as kube-scheduler's Go client. http.client's own request building and header parsing (the
    email package) added ~0.1 ms a request on top of the server's time here."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go's net/http does
        self.head = f"host: {host}:{port}\r\ncontent-type: application/json\r\n".encode()
        self.buf = b""

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.sock.sendall(b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n%s"
                          % (path.encode(), self.head, len(body), body))
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = next((int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:])
                       if k.strip().lower() == b"content-length"), None)
        if length is None:
            raise RuntimeError(f"{path}: response without content-length: {head[:200]!r}")
        while len(self.buf) < length:
            self._recv()
        payload, self.buf = self.buf[:length], self.buf[length:]
        return status, payload

    def _recv(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _percentiles(ms: np.ndarray[Any, np.dtype[np.float64]]) -> dict[str, float]:
    return {"p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


def client(ns: argparse.Namespace) -> int:
    import httpx

    sizes = [int(x) for x in ns.sizes.split(",")]
    port = free_port()
    cmd = [sys.executable, "-m", "benchmarks.extender_latency", "serve", "--port", str(port),
           "--nodes", str(max(sizes)), "--pods", str(ns.pods), "--data", ns.data, "--loop", ns.loop, "--http", ns.http,
           *(["--gc-freeze"] if ns.gc_freeze else []), *(["--dra"] if ns.dra else [])]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    rows: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None
        print(server.stdout.readline().strip(), flush=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=base, timeout=30) as api:
            while True:
                try:
                    if api.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not come up")
                time.sleep(0.2)
            print(f"server resident memory: {rss_mib(server.pid):.0f} MiB "
                  f"({max(sizes)} nodes, {ns.pods} pods, loop={ns.loop}, http={ns.http}, client={ns.client})",
                  flush=True)
            nodes = openb.replicate(openb.read_nodes(Path(ns.data)), max(sizes))
            pods = openb.read_pods(Path(ns.data))
            rng = np.random.default_rng(1)
            for size in sizes:
                for mode in ns.modes.split(","):
                    full_objects = [openb.node_object(n) for n in nodes[:size]] if mode == "full" else None
                    for verb in ns.verbs.split(","):
                        bodies = []
                        for r in range(ns.requests + ns.warmup):
                            p = pods[int(rng.integers(len(pods)))]
                            pod = openb.pod_object(p, f"bench-{r}")
                            if ns.dra:
                                pod = dra_pod(pod)
                            idx = rng.permutation(len(nodes))[:size]
                            body: dict[str, Any]
                            if full_objects is not None:
                                body = {"Pod": pod, "Nodes": {"items": [full_objects[i % size] for i in idx]},
                                        "NodeNames": None}
                            else:
                                body = {"Pod": pod, "Nodes": None, "NodeNames": [nodes[i].name for i in idx]}
                            bodies.append(orjson.dumps(body))
                        times = []
                        conn = (RawClient if ns.client == "raw" else StdlibClient)("127.0.0.1", port)
                        start_all = time.perf_counter()
                        for k, b in enumerate(bodies):
                            t0 = time.perf_counter()
                            status, payload = conn.post(f"/{verb}", b)
                            dt = time.perf_counter() - t0
                            if status != 200:
                                raise RuntimeError(f"{verb} {size} {mode}: {status} {payload[:200]!r}")
                            if k >= ns.warmup:
                                times.append(dt * 1000)
                        conn.close()
                        wall = time.perf_counter() - start_all
                        ms = np.asarray(times)
                        row = {"verb": verb, "nodes": size, "mode": mode, "requests": len(times),
                               "body_kib": round(float(np.mean([len(b) for b in bodies])) / 1024, 1),
                               **{k: round(v, 3) for k, v in _percentiles(ms).items()},
                               "req_per_s": round(len(bodies) / wall, 1)}
                        rows.append(row)
                        print(f"{verb:<13} {size:>5} {mode:<5} body={row['body_kib']:>8} KiB  p50={row['p50']:7.3f} "
                              f"p90={row['p90']:7.3f} p99={row['p99']:7.3f} max={row['max']:7.3f} ms  "
                              f"{row['req_per_s']:>7} req/s", flush=True)
            print(f"server resident memory after the run: {rss_mib(server.pid):.0f} MiB", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    print(f"wrote {write_rows(Path(ns.out) / 'latency.csv', rows)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="client", choices=["client", "serve"])
    p.add_argument("--sizes", default="100,500,5000")
    p.add_argument("--modes", default="names,full")
    p.add_argument("--verbs", default="filter,prioritize,filter-ranked",
                   help="filter-ranked is the filter-only mode deploy/ configures (docs/hot-path.md)")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--pods", type=int, default=50_000)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--client", default="raw", choices=["raw", "stdlib"],
                   help="raw: minimal HTTP/1.1 over a socket; stdlib: http.client (about 0.1 ms more a request)")
    p.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    p.add_argument("--http", default="flowsched", choices=["flowsched", "httptools", "h11"],
                   help="flowsched: the service's own protocol (extender/http/server.py); httptools, h11: "
                        "plain uvicorn, every verb through ASGI")
    p.add_argument("--data", default=str(openb.DEFAULT_DIR))
    p.add_argument("--gc-freeze", action="store_true", help="freeze the populated heap (what serve does after a list)")
    p.add_argument("--dra", action="store_true", help="GPUs through DRA: ResourceSlices and claims (docs/dra.md)")
    p.add_argument("--out", default=os.environ.get("FLOWSCHED_BENCH_OUT", "results/extender"))
    ns = p.parse_args(argv)
    return serve(ns) if ns.mode == "serve" else client(ns)


if __name__ == "__main__":
    raise SystemExit(main())
