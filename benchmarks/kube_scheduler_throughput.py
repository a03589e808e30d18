"""Real kube-scheduler throughput with and without flowsched, in one run.

    python -m benchmarks.kube_scheduler_throughput [--nodes 1000] [--pods 1000] [--rounds 2]
        [--variants without,deploy] [--rank-margin M] [--rank-keep K] [--pprof-dir DIR]

On the real control plane of the tests (etcd, kube-apiserver, kube-scheduler built from
k8s.io/kubernetes; see tests/cluster/), with fake GPU nodes shaped like the Alibaba openb
nodes and GPU pods from the openb pod list. For each variant the pods are created first with
the scheduler stopped, then kube-scheduler starts and a watch times every binding; throughput
is bound pods / (last binding - first binding). Both variants use the same profile and the
same raised client QPS (the default 50/s would cap both and hide the extender's cost); the
only difference is the `extenders:` stanza of deploy/base/scheduler-config.yaml. Variants
alternate for --rounds rounds so drift on a shared machine hits both.

Variants: `without` (no extender), `deploy` (deploy/base/scheduler-config.yaml as it is),
`prioritize` (filter + prioritize, weight 5: two calls per pod) and `filter-ranked` (the
filter-only mode of docs/hot-path.md: one call per pod, no prioritizeVerb). Every with-variant
is reported as a ratio to `without`. `base` is `deploy` served by the flowsched code of another
checkout (`--base-tree`, e.g. a worktree of main), so that two versions are compared in the same
run, round by round (both services run, and watch, throughout).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from benchmarks import openb
from benchmarks.csv_rows import write_rows
from tests.cluster.controlplane import ControlPlane, ensure_binaries
from tests.cluster.flowsched_proc import FlowschedService
from tests.cluster.kubeapi import Kube, node_path, pods_path
from tests.cluster.manifests import scheduler_config_for_tests

NS = "bench"


VARIANTS = ("without", "deploy", "prioritize", "filter-ranked", "base")


def scheduler_config(url: str, kubeconfig: Path, variant: str) -> str:
    cfg = yaml.safe_load(scheduler_config_for_tests(url, kubeconfig))
    cfg["leaderElection"] = {"leaderElect": False}
    cfg["clientConnection"].update({"qps": 5000, "burst": 5000})
    if variant == "without":
        cfg.pop("extenders", None)
    elif variant not in ("deploy", "base"):
        ext = cfg["extenders"][0]
        for key in ("filterVerb", "prioritizeVerb", "weight"):
            ext.pop(key, None)
        if variant == "prioritize":
            ext.update({"filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 5})
        else:
            ext["filterVerb"] = "filter-ranked"
    return yaml.safe_dump(cfg, sort_keys=False)


def flowsched_settings(rank_margin: int | None, rank_keep: int | None) -> tuple[dict[str, int], dict[str, int]]:
    """The flowsched config files of the `base` and this tree's service: only what was asked
    for, so an unset option runs the service's own default (deploy/'s). rank_keep goes to this
    tree only: an older tree's settings reject keys they do not know."""
    base = {} if rank_margin is None else {"rank_margin": rank_margin}
    return base, {**base, **({} if rank_keep is None else {"rank_keep": rank_keep})}


def make_nodes(kube: Kube, count: int) -> None:
    for n in openb.replicate(openb.read_nodes(), count):
        obj = openb.node_object(n)
        obj["metadata"] = {"name": obj["metadata"]["name"], "labels": obj["metadata"]["labels"]}
        created = kube.create(node_path(), {"apiVersion": "v1", "kind": "Node", **obj})
        kube.request("PUT", node_path(n.name) + "/status", {**created, "status": obj["status"]})


def pod_specs(count: int, seed: int) -> list[dict[str, Any]]:
    # Only pods that fit some node shape of the trace: a pod that fits nowhere is retried with
    # back-off and would measure kube-scheduler's retry policy, not its throughput.
    shapes = {(n.cpu_milli, n.memory_mib, n.gpus) for n in openb.read_nodes()}
    pods = [p for p in openb.read_pods()
            if any(p.cpu_milli <= c and p.memory_mib <= m and p.gpus <= g for c, m, g in shapes)]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        p = pods[int(rng.integers(len(pods)))]
        obj = openb.pod_object(p, f"bench-{i:05d}", namespace=NS)
        obj["metadata"] = {"name": obj["metadata"]["name"], "namespace": NS, "labels": obj["metadata"]["labels"]}
        obj["spec"].pop("nodeName")
        obj["spec"].pop("priority")
        obj["status"] = {}
        out.append({"apiVersion": "v1", "kind": "Pod", **obj})
    return out


def delete_pods(kube: Kube) -> None:
    kube.request("DELETE", pods_path(NS), params={"gracePeriodSeconds": "0"})
    deadline = time.monotonic() + 120
    while kube.get(pods_path(NS), limit=1)["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError("pods did not go away")
        time.sleep(0.2)


def run_variant(cp: ControlPlane, kube: Kube, services: dict[str, FlowschedService], pods: list[dict[str, Any]],
                variant: str, pprof_dir: Path | None = None) -> dict[str, Any]:
    flowsched = services["base" if variant == "base" else "this"]
    with_extender = variant != "without"
    cp.stop_scheduler()
    delete_pods(kube)
    for p in pods:
        kube.create(pods_path(NS), p)
    rv = kube.get(pods_path(NS), limit=1)["metadata"]["resourceVersion"]
    bound: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        w = kube.clone()
        last_rv = rv
        while not done.is_set():
            try:
                for etype, obj in w.watch(pods_path(NS), last_rv, timeout_s=60):
                    last_rv = obj["metadata"].get("resourceVersion", last_rv)
                    if etype == "MODIFIED" and obj["spec"].get("nodeName") and obj["metadata"]["name"] not in bound:
                        bound[obj["metadata"]["name"]] = time.perf_counter()
                        if len(bound) == len(pods):
                            done.set()
                            return
            except Exception as e:  # a dropped watch resumes from the last resourceVersion
                print(f"watch reconnect: {type(e).__name__}", flush=True)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.5)  # the watch is established before the scheduler binds anything
    before = flowsched.http.get("/metrics").text if with_extender else ""
    cpu_before = _cpu_s(flowsched)
    threads_before = _thread_cpu_s(flowsched)
    # The admin identity: the benchmark measures scheduling, not the RBAC the e2e tests check.
    cp.start_scheduler(scheduler_config(flowsched.verbs_url, cp.kubeconfigs["admin"], variant))
    sampler = CpuSampler({"kube-scheduler": cp.scheduler.pid if cp.scheduler else None,
                          "apiserver": cp.apiserver.pid if cp.apiserver else None,
                          "etcd": cp.etcd.pid if cp.etcd else None,
                          "flowsched": flowsched.proc.pid if flowsched.proc else None,
                          "bench": os.getpid()})
    sampler.start()
    profile = _pprof(cp, pprof_dir / f"kube-scheduler-{variant}-{time.time():.0f}.pb.gz") if pprof_dir else None
    # Done when every pod is bound, or (if some cannot be) when bindings stop for 10 s.
    while not done.wait(1.0):
        last = max(bound.values(), default=time.perf_counter())
        if time.perf_counter() - last > 10.0:
            break
    done.set()
    if profile is not None:
        profile.join()
    sampler.stop()
    cp.stop_scheduler()
    times = sorted(bound.values())
    cpu_span = sampler.per_pod_ms(times[0], times[-1], len(times) - 1) if len(times) > 1 else {}
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    after = flowsched.http.get("/metrics").text if with_extender else ""
    cpu_per_pod_ms = 1000 * (_cpu_s(flowsched) - cpu_before) / max(1, len(bound))
    threads_after = _thread_cpu_s(flowsched)
    by_thread = {k: round(1000 * (threads_after.get(k, 0.0) - threads_before.get(k, 0.0)) / max(1, len(bound)), 3)
                 for k in sorted(set(threads_after) | set(threads_before))}
    calls = _sum(after, "flowsched_extender_requests_total{") - _sum(before, "flowsched_extender_requests_total{")
    handled = _sum(after, "flowsched_extender_seconds_count{") - _sum(before, "flowsched_extender_seconds_count{")
    seconds = _sum(after, "flowsched_extender_seconds_sum{") - _sum(before, "flowsched_extender_seconds_sum{")
    per_verb = {}
    for verb in ("filter", "prioritize"):
        n = _sum(after, f'flowsched_extender_seconds_count{{verb="{verb}"}}') - \
            _sum(before, f'flowsched_extender_seconds_count{{verb="{verb}"}}')
        secs = _sum(after, f'flowsched_extender_seconds_sum{{verb="{verb}"}}') - \
            _sum(before, f'flowsched_extender_seconds_sum{{verb="{verb}"}}')
        per_verb[f"{verb}_ms"] = round(1000 * secs / n, 3) if n else float("nan")
    return {"variant": variant, "pods": len(pods), "bound": len(bound), "span_s": round(span, 3),
            "pods_per_s": round((len(times) - 1) / span, 1), "extender_calls": int(calls),
            "server_ms_per_call": round(1000 * seconds / handled, 3) if handled else float("nan"), **per_verb,
            "flowsched_cpu_ms_per_pod": round(cpu_per_pod_ms, 3),
            "cpu_ms_per_pod_by_thread": " ".join(f"{k}={v}" for k, v in by_thread.items() if v),
            "cpu_ms_per_pod_between_bindings": " ".join(f"{k}={v}" for k, v in cpu_span.items())}


def _pprof(cp: ControlPlane, out: Path, seconds: int = 3) -> threading.Thread:
    """kube-scheduler's Go CPU profile over the first `seconds` of a variant (`go tool pprof` reads it):
    where its extra CPU a pod goes with the extender."""
    def grab() -> None:
        r = httpx.get(f"https://127.0.0.1:{cp.scheduler_port}/debug/pprof/profile", params={"seconds": seconds},
                      verify=False, timeout=seconds + 30)
        if r.status_code == 200:
            out.write_bytes(r.content)
        print(f"pprof: {out if r.status_code == 200 else f'HTTP {r.status_code}'}", flush=True)

    t = threading.Thread(target=grab, daemon=True)
    t.start()
    return t


def _cpu_s(flowsched: FlowschedService) -> float:
    """User+system CPU seconds of the flowsched process so far (all its threads)."""
    pid = flowsched.proc.pid if flowsched.proc is not None else None
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """CPU seconds of named processes and of the whole machine (busy and idle, all cores),
    sampled every 50 ms, so that the CPU spent between the first and the last binding can be
    told apart from start-up and tear-down."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = {k: v for k, v in pids.items() if v is not None}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> dict[str, float]:
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(f[11]) + int(f[12])) / tick
            except OSError:
                out[name] = float("nan")
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        out["machine_idle"] = (cpu[3] + cpu[4]) / tick  # idle + iowait, all cores
        out["machine_busy"] = (sum(cpu[:8]) - cpu[3] - cpu[4]) / tick
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._read()))
            self._stop.wait(0.05)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def per_pod_ms(self, t0: float, t1: float, pods: int) -> dict[str, float]:
        """CPU ms a pod of each process (and of the machine) between times t0 and t1."""
        def at(t: float) -> dict[str, float]:
            best = min(self.samples, key=lambda s: abs(s[0] - t))
            return best[1]
        a, b = at(t0), at(t1)
        return {k: round(1000 * (b[k] - a[k]) / max(1, pods), 3) for k in a}


def _thread_cpu_s(flowsched: FlowschedService) -> dict[str, float]:
    """CPU seconds of the flowsched process so far per thread: "loop" (the main thread, which
    answers the verbs), the threads by their OS names (the watches name theirs), the rest as
    "other"; each also as NAME.sys, its time in the kernel."""
    pid = flowsched.proc.pid if flowsched.proc is not None else None
    out: dict[str, float] = {}
    if pid is None:
        return out
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended
            continue
        name = "loop" if task.name == str(pid) else comm if comm.startswith("watch-") else "other"
        tick = os.sysconf("SC_CLK_TCK")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        out[name + ".sys"] = out.get(name + ".sys", 0.0) + int(fields[12]) / tick
    return out


def _sum(metrics_text: str, prefix: str) -> float:
    """Sum of a metric's samples over all label sets (flowsched's own /metrics)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines() if line.startswith(prefix))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="without,deploy",
                    help=f"comma-separated, from {', '.join(VARIANTS)}; each round runs them all, "
                         "in reverse order every other round")
    ap.add_argument("--rank-margin", type=int, help="flowsched's rank_margin (filter-ranked); default: the service's")
    ap.add_argument("--rank-keep", type=int,
                    help="flowsched's rank_keep (filter-ranked), this tree only; default: the service's")
    ap.add_argument("--pprof-dir", type=Path, help="save a 3 s CPU profile of kube-scheduler per variant and round")
    ap.add_argument("--base-tree", type=Path, help="checkout whose flowsched serves the `base` variant")
    ap.add_argument("--out", default="results/extender")
    ns = ap.parse_args(argv)
    variants = [v.strip() for v in ns.variants.split(",") if v.strip()]
    if "without" not in variants or not set(variants) <= set(VARIANTS) or len(set(variants)) < 2:
        ap.error(f"--variants: 'without' and at least one of {', '.join(VARIANTS[1:])}")
    if ("base" in variants) != (ns.base_tree is not None):
        ap.error("the `base` variant and --base-tree go together")
    if ns.pprof_dir:
        ns.pprof_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flowsched-bench-") as tmp:
        cp = ControlPlane(bin_dir=ensure_binaries(), workdir=Path(tmp) / "k8s")
        services: dict[str, FlowschedService] = {}
        try:
            cp.start()
            # A generous timeout: deleting 1,000 pods took over 15 s on the loaded 2-core machine.
            kube = Kube(cp.server, cp.admin_token, cp.ssl_context(), timeout_s=120.0)
            kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            t0 = time.perf_counter()
            make_nodes(kube, ns.nodes)
            print(f"created {ns.nodes} nodes in {time.perf_counter() - t0:.1f}s", flush=True)
            config = Path(tmp) / "flowsched.yaml"
            base_settings, this_settings = flowsched_settings(ns.rank_margin, ns.rank_keep)
            config.write_text(yaml.safe_dump(base_settings))
            this_config = Path(tmp) / "flowsched-this.yaml"
            this_config.write_text(yaml.safe_dump(this_settings))
            for name, repo in (("this", None), ("base", ns.base_tree)):
                if name == "this" or repo is not None:
                    workdir = Path(tmp) / name
                    workdir.mkdir()
                    services[name] = FlowschedService(workdir, cp.kubeconfigs["admin"],
                                                      ["--config", str(this_config if name == "this" else config)],
                                                      repo=repo)
                    services[name].start()
            pods = pod_specs(ns.pods, ns.seed)
            rows = []
            for r in range(ns.rounds):
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    row = {"round": r, **run_variant(cp, kube, services, pods, variant, ns.pprof_dir)}
                    rows.append(row)
                    print(f"round {r} {variant}: {row['bound']}/{row['pods']} "
                          f"bound in {row['span_s']}s = {row['pods_per_s']} pods/s "
                          f"(extender calls {row['extender_calls']}, flowsched's own handling "
                          f"{row['server_ms_per_call']} ms/call: filter {row['filter_ms']}, "
                          f"prioritize {row['prioritize_ms']}; its process used {row['flowsched_cpu_ms_per_pod']} "
                          f"ms CPU per pod: {row['cpu_ms_per_pod_by_thread']}; between the first and "
                          f"last binding, CPU ms per pod: {row['cpu_ms_per_pod_between_bindings']})", flush=True)
        finally:
            for service in services.values():
                service.close()
            cp.stop()
    mean = {v: float(np.mean([r["pods_per_s"] for r in rows if r["variant"] == v])) for v in variants}
    print(f"\nkube-scheduler throughput at {ns.nodes} nodes, {ns.pods} GPU pods, mean of {ns.rounds} rounds:")
    print(f"  without flowsched: {mean['without']:.1f} pods/s")
    for v in variants[1:] if variants[0] == "without" else [x for x in variants if x != "without"]:
        print(f"  with flowsched ({v}): {mean[v]:.1f} pods/s, ratio {mean[v] / mean['without']:.3f}")
    print(f"wrote {write_rows(Path(ns.out) / 'throughput.csv', rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
