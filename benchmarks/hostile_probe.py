"""Issue 33's hostile probes, re-run against `flowsched serve` (loopback, bounded loops).

    python -m benchmarks.hostile_probe [--seconds 5] [--rounds 3] [--only ws,headers,...]

Starts `flowsched serve --no-kube` (static progress tokens, a temporary store) with the verbs on
one port and the API on another, then for each attack: a round of /prioritize calls on the
verbs' port with nothing else going on (one kept-alive connection, like kube-scheduler), and a
round with the attack running in another process against the API port, alternating `--rounds`
times (the box's other load then falls on both conditions). Prints p50/p99/max of
the verbs and their failures in each round, the p99 ratio, the server's peak RSS, what the
attack itself saw, and the CPU seconds the verbs' process and the front spent in each round (the
verbs' process's include answering the measuring calls: compare its idle rounds'), which a busy
box's load does not blur as it does the p99. Attacks (finding numbers of issue 33):

  ws        1: 1,100 one-packet `Upgrade: websocket` connections, held open
  headers   2: 8 connections sending endless header lines
  pipeline  3: one client pipelining GET /metrics and never reading
  slowbody  4: 64 connections, headers and one body byte each, plus 64 pipelined unread requests
  jobs      13: 16 readers looping on GET /v1/jobs of a 4,000-point job
  quota     7: one token posting 64 long metric names per point, a new job every batch
  quotacut  7's control: the same batches one byte short, so the front parses each and refuses it
            (400) and nothing reaches the verbs' process: what the traffic alone costs the verbs

Attackers run in a child process so that their Python does not share the measuring client's GIL.
`--attacker-cpus`, `--server-cpus`, `--verbs-loop-cpus` and `--client-cpus` pin the parties to
cores, to separate what flowsched does for an attack from the attack's own CPU on a small box.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.extender_latency import rss_mib
from benchmarks.local_serve import local_flowsched

TOKEN = "probe-token"
NAMES = [f"node-{i:04d}" for i in range(200)]
PRIORITIZE = orjson.dumps({"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"},
                                   "spec": {"containers": [{"name": "c", "resources": {
                                       "requests": {"nvidia.com/gpu": "1"}}}]}},
                           "NodeNames": NAMES})


# ---- attacks (each runs until `stop` is set, in a child process) ----

def attack_ws(port: int, stop: Any, out: Any) -> None:
    held, answered = [], 0
    req = (b"POST /v1/progress HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    for _ in range(1100):
        if stop.is_set():
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(req)
            held.append(s)
        except OSError:
            pass
    for s in held:
        try:
            s.settimeout(0.5)
            if s.recv(64).startswith(b"HTTP/1.1 400"):
                answered += 1
        except OSError:
            pass
    out.put({"connections": len(held), "refused_with_400": answered})
    stop.wait()
    for s in held:
        s.close()


def attack_headers(port: int, stop: Any, out: Any) -> None:
    sent, cut = 0, 0

    def one() -> None:
        nonlocal sent, cut
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    while not stop.is_set():
                        s.sendall(b"X-A: " + b"b" * 60 + b"\r\n" * 1 + b"X-B: c\r\n" * 64)
                        sent += 600
            except OSError:
                cut += 1

    threads = [threading.Thread(target=one, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    stop.wait()
    out.put({"bytes_sent": sent, "connections_cut": cut})


def attack_pipeline(port: int, stop: Any, out: Any) -> None:
    sent = 0
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 64
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.settimeout(0.2)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    sent += s.send(req[sent % len(req):])
    except OSError:
        pass
    out.put({"bytes_sent": sent})


def attack_slowbody(port: int, stop: Any, out: Any) -> None:
    held = []
    for _ in range(64):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"POST /v1/progress HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            held.append(s)
            p = socket.create_connection(("127.0.0.1", port), timeout=2)
            p.sendall(b"POST /webhook/gate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" * 64)
            held.append(p)
        except OSError:
            pass
    codes: dict[int, int] = {}
    for _ in range(50):  # what another tenant (another address) gets meanwhile
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2, source_address=("127.0.0.2", 0))
            c.request("GET", "/metrics")
            r = c.getresponse()
            r.read()
            codes[r.status] = codes.get(r.status, 0) + 1
            c.close()
        except OSError:
            codes[0] = codes.get(0, 0) + 1
    out.put({"held": len(held), "other_tenant": codes})
    stop.wait()
    for s in held:
        s.close()


def attack_jobs(port: int, stop: Any, out: Any) -> None:
    calls = 0

    def one() -> None:
        nonlocal calls
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while not stop.is_set():
            try:
                c.request("GET", "/v1/jobs/team-a/big", headers={"Authorization": f"Bearer {TOKEN}"})
                c.getresponse().read()
                calls += 1
            except OSError:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    stop.wait()
    out.put({"job_reads": calls})


def attack_quota(port: int, stop: Any, out: Any, cut: bool = False) -> None:
    codes: dict[int, int] = {}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    metrics = {("m" * 120) + f"{i:03d}": 1.0 for i in range(64)}
    n = 0
    while not stop.is_set():
        n += 1
        body = orjson.dumps({"namespace": "team-a", "job": f"flood-{n}",
                             "points": [{"step": i, "loss": 1.0, "metrics": metrics} for i in range(100)]})
        if cut:  # one byte short: the front parses it all, then refuses it (400); nothing is forwarded
            body = body[:-1]
        try:
            c.request("POST", "/v1/progress", body=body,
                      headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            codes[r.status] = codes.get(r.status, 0) + 1
        except OSError:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out.put({"answers": codes})


def attack_quota_cut(port: int, stop: Any, out: Any) -> None:
    attack_quota(port, stop, out, cut=True)


ATTACKS = {"ws": attack_ws, "headers": attack_headers, "pipeline": attack_pipeline,
           "slowbody": attack_slowbody, "jobs": attack_jobs, "quota": attack_quota, "quotacut": attack_quota_cut}


def _niced(nice: int, cpus: set[int] | None, attack: Any, port: int, stop: Any, out: Any) -> None:
    os.nice(nice)
    if cpus:
        os.sched_setaffinity(0, cpus)
    attack(port, stop, out)


# Where the parties run (the probe's --X-cpus options): to separate what flowsched does for an
# attack from the attack's own CPU on a small box.
PIN_OPTIONS = {
    "attacker-cpus": "the attack process (on a cluster, another pod with CPU of its own)",
    "server-cpus": "`flowsched serve`, both processes, every thread",
    "front-cpus": "the API port's front process instead (which of the two the verbs share a core with)",
    "verbs-loop-cpus": "the verbs' process's main thread (its event loop) instead, its other threads as "
                       "--server-cpus (CPU against GIL)",
    "client-cpus": "the measuring client (kube-scheduler's stand-in)",
}


def parse_cpus(text: str) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def pin_tree(pid: int, cpus: set[int], front_cpus: set[int] | None, loop_cpus: set[int] | None) -> int:
    """Pins every thread of `pid` to `cpus` (its main thread, the verbs' loop, to `loop_cpus`),
    and of its children (the front) to `front_cpus` (None: `cpus` too); returns how many."""
    pinned = 0
    for p in [pid, *children(pid)]:
        for task in Path(f"/proc/{p}/task").iterdir():
            tid = int(task.name)
            mine = (front_cpus if p != pid else loop_cpus if tid == pid else None) or cpus
            with contextlib.suppress(OSError):  # a thread that has just ended
                os.sched_setaffinity(tid, mine)
                pinned += 1
    return pinned


def children(pid: int) -> list[int]:
    """The process's children (the front of `flowsched serve`); none if it is gone."""
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# ---- measuring ----

def tree_rss_mib(pid: int) -> float:
    """The RSS of `flowsched serve` and its children (the API port's front process)."""
    total = rss_mib(pid)
    for k in children(pid):
        with contextlib.suppress(OSError):  # a front being restarted
            total += rss_mib(k)
    return total


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def front_pid(pid: int) -> int | None:
    kids = children(pid)
    return kids[0] if kids else None


def verb_round(port: int, seconds: float) -> tuple[np.ndarray, int]:
    """prioritize calls on one kept-alive connection for `seconds`: latencies (ms), failures."""
    lat: list[float] = []
    failed = 0
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        try:
            c.request("POST", "/prioritize", body=PRIORITIZE, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                failed += 1
        except OSError:
            failed += 1
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            continue
        lat.append((time.perf_counter() - t) * 1000)
    return np.array(lat), failed


def seed_big_job(api_port: int) -> None:
    c = http.client.HTTPConnection("127.0.0.1", api_port, timeout=30)
    now = time.time()
    for b in range(4):
        pts = [{"step": b * 1000 + i, "loss": 1.0 / (1 + b * 1000 + i), "timestamp": now - 4000 + b * 1000 + i}
               for i in range(1000)]
        c.request("POST", "/v1/progress", body=orjson.dumps({"namespace": "team-a", "job": "big", "points": pts}),
                  headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        c.getresponse().read()


def attack_round(name: str, ns: argparse.Namespace, api_port: int, port: int, server_pid: int
                 ) -> tuple[np.ndarray, int, dict[str, Any], float]:
    """One round of /prioritize calls with the attack running: latencies, failures, what the
    attack saw, the server's peak RSS (both processes)."""
    ctx = mp.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_niced, args=(ns.attacker_nice, parse_cpus(ns.attacker_cpus), ATTACKS[name], api_port,
                                             stop, out), daemon=True)
    child.start()
    peak = [tree_rss_mib(server_pid)]
    watching = threading.Event()

    def watch() -> None:
        while not watching.wait(0.2):
            peak[0] = max(peak[0], tree_rss_mib(server_pid))

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    time.sleep(1.0)  # the attack under way
    front = front_pid(server_pid)
    cpu0 = cpu_s(server_pid), cpu_s(front) if front else math.nan
    busy, busy_failed = verb_round(port, ns.seconds)
    seen_cpu: dict[str, float] = {}
    with contextlib.suppress(OSError):
        cpu1 = cpu_s(server_pid), cpu_s(front) if front else math.nan
        # The verbs' process's CPU includes the measuring calls themselves (compare an idle round's).
        seen_cpu = {"verbs_process_cpu_s": round(cpu1[0] - cpu0[0], 2), "front_cpu_s": round(cpu1[1] - cpu0[1], 2)}
    stop.set()
    try:
        seen = out.get(timeout=30)
    except Exception:
        seen = {}
    seen.update(seen_cpu)
    child.join(10)
    if child.is_alive():
        child.kill()
    watching.set()
    w.join()
    time.sleep(1.0)
    return busy, busy_failed, seen, peak[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--only", default=",".join(ATTACKS))
    ap.add_argument("--rounds", type=int, default=3, help="alternating idle / attack rounds per attack")
    ap.add_argument("--attacker-nice", type=int, default=0,
                    help="the attack process's nice value: on a box this small it stands for a client on another "
                         "machine (its own CPU is not flowsched's); 0 lets it compete with the verbs for the cores")
    for flag, what in PIN_OPTIONS.items():
        ap.add_argument(f"--{flag}", default="", help=f"pin {what}; a comma list of CPUs (e.g. 0), empty: not pinned")
    ns = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flowsched-probe-"))  # kept: its serve.log is printed at the end
    with local_flowsched(TOKEN, "team-a", keep_in=work) as served:
        port, api_port = served.verbs_port, served.api_port
        seed_big_job(api_port)
        if ns.server_cpus:
            cpus = parse_cpus(ns.server_cpus) or set()
            n = pin_tree(served.pid, cpus, parse_cpus(ns.front_cpus), parse_cpus(ns.verbs_loop_cpus))
            print(f"pinned {n} server threads")
        if ns.client_cpus:
            os.sched_setaffinity(0, parse_cpus(ns.client_cpus) or set())  # the attacker re-pins itself
        verb_round(port, 1.0)  # warm up
        print(f"load average {os.getloadavg()[0]:.1f}; attacker nice {ns.attacker_nice}; "
              f"attacker CPUs {ns.attacker_cpus or 'any'}; server CPUs {ns.server_cpus or 'any'} "
              f"(front {ns.front_cpus or ns.server_cpus or 'any'}, "
              f"verbs' loop {ns.verbs_loop_cpus or ns.server_cpus or 'any'}); client CPUs {ns.client_cpus or 'any'}; "
              f"{len(NAMES)} names per /prioritize; "
              f"{ns.seconds:.0f} s per round; server RSS (both processes) {tree_rss_mib(served.pid):.0f} MiB")
        for name in ns.only.split(","):
            idle, busy, idle_failed, busy_failed, peak = [], [], 0, 0, 0.0
            for r in range(ns.rounds):  # alternating, so that the box's other load falls on both
                cpu0 = cpu_s(served.pid)
                lat, failed = verb_round(port, ns.seconds)
                idle_cpu = cpu_s(served.pid) - cpu0
                idle.append(lat)
                idle_failed += failed
                lat, failed, seen, round_peak = attack_round(name, ns, api_port, port, served.pid)
                busy.append(lat)
                busy_failed += failed
                peak = max(peak, round_peak)
                print(f"{name} round {r + 1}: attack saw {seen}; p99 {np.percentile(idle[-1], 99):.2f} ms idle, "
                      f"{np.percentile(lat, 99):.2f} ms under attack; verbs' process CPU {idle_cpu:.2f} s idle; "
                      f"load {os.getloadavg()[0]:.1f}")
            print(f"{name}: server peak RSS (both processes) {peak:.0f} MiB")
            for label, lats, failed in (("idle", idle, idle_failed), (name, busy, busy_failed)):
                lat = np.concatenate(lats)
                print(f"  {label:9s} calls={lat.size:6d} failed={failed} p50={np.percentile(lat, 50):7.2f} ms "
                      f"p99={np.percentile(lat, 99):7.2f} ms max={lat.max():8.2f} ms")
            ratio = np.percentile(np.concatenate(busy), 99) / np.percentile(np.concatenate(idle), 99)
            print(f"  p99 ratio ({name} / idle) = {ratio:.2f}")
    print(f"server log: {work / 'serve.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
