"""What reporting costs a training loop: steps/s with no reporting and with report() every step.

    nice python -m benchmarks.client_cost [--torch-python /work/torchvenv/bin/python]

Starts a real `flowsched serve --no-kube` (benchmarks/local_serve.py), then runs each training
loop in a child process (one BLAS / torch thread): a numpy MLP (always) and a PyTorch MLP (with
--torch-python: an interpreter that has torch; the client needs nothing else) on CPU. Rounds of
`--steps` steps alternate between no reporting and report(step, loss) every step (the loss as the
loop holds it: a numpy float, a torch tensor, never .item()), so drift hits both alike. A reporting
round's time includes waiting, at its end, until every point it reported was sent (conservative:
a real loop would not wait). Printed for each loop: median steps/s of each mode and the median
of the per-pair cost (1 - reported / plain steps/s), by wall clock (which other load on a shared
machine moves by tens of %), by the process's CPU time (the loop plus the reporter's thread: what
reporting costs, robust to other load) and by the training thread's CPU time (the loop alone);
and, measured directly, the client's own time per point (inside report() on the training
thread, and its thread's CPU) against a step's CPU time: the A/B pairs above spread by several
% on a shared machine, this does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BATCH, IN, HIDDEN = 128, 256, 1024  # the MLP: 350-550 steps/s of CPU time on one core here
GPU_MLP = (4096, 2048, 2)  # --device cuda: batch (--gpu-batch), width, hidden layers: ~300 steps/s on an H200


def _numpy_loop() -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, IN)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    w1 = (rng.normal(size=(IN, HIDDEN)) * 0.05).astype(np.float32)
    w2 = (rng.normal(size=(HIDDEN, 10)) * 0.05).astype(np.float32)

    def step() -> Any:
        nonlocal w1, w2
        h = np.maximum(x @ w1, 0.0)
        z = h @ w2
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(BATCH), y] + 1e-9).mean()
        g = p
        g[np.arange(BATCH), y] -= 1.0
        g /= BATCH
        gw2 = h.T @ g
        gh = (g @ w2.T) * (h > 0)
        w1 -= 0.05 * (x.T @ gh)
        w2 -= 0.05 * gw2
        return loss  # a numpy float32 scalar

    return step, None


def _torch_loop(device: str = "cpu", gpu_batch: int = GPU_MLP[0]) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch, width, layers = (BATCH, HIDDEN, 1) if device == "cpu" else (gpu_batch, *GPU_MLP[1:])
    body = [torch.nn.Linear(IN, width), torch.nn.ReLU()]
    for _ in range(layers - 1):
        body += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*body, torch.nn.Linear(width, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(batch, IN, device=device), torch.randint(0, 10, (batch,), device=device)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss  # the tensor itself (on the GPU with --device cuda): no .item()

    version = torch.__version__ + ("" if device == "cpu" else f", {torch.cuda.get_device_name()}")
    return step, version


def _sync(device: str) -> None:
    """A GPU round ends when the device has run its steps (the loop only queued them)."""
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def child(kind: str, url: str, token: str, namespace: str, rounds: int, steps: int, device: str = "cpu",
          gpu_batch: int = GPU_MLP[0]) -> None:
    sys.path.insert(0, str(ROOT))
    from flowsched_client import Reporter, ReporterConfig

    train, version = _numpy_loop() if kind == "numpy" else _torch_loop(device, gpu_batch)
    reporter = Reporter(ReporterConfig(url=url, job=f"client-cost-{kind}", namespace=namespace, token=token))
    for _ in range(200):  # warm up
        train()
    _sync(device)
    rows: dict[str, list[list[float]]] = {"plain": [], "reported": []}  # per round: steps/s by wall, process, thread
    step_no = 0
    in_report = 0.0  # seconds the training thread spent inside report()
    for _ in range(rounds):
        for mode in ("plain", "reported"):
            w0, p0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
            if mode == "plain":
                for _ in range(steps):
                    train()
                _sync(device)
            else:
                for _ in range(steps):
                    step_no += 1
                    loss = train()
                    c0 = time.perf_counter()
                    reporter.report(step_no, loss)
                    in_report += time.perf_counter() - c0
                _sync(device)
                reporter.flush()  # counted: until this round's points are sent
            w, p, t = time.perf_counter() - w0, time.process_time() - p0, time.thread_time() - t0
            rows[mode].append([steps / w, steps / p, steps / t])
    reporter.close()
    print(json.dumps({"kind": kind, "version": version, "plain": rows["plain"], "reported": rows["reported"],
                      "sent": reporter.sent, "dropped": reporter.dropped, "failed_posts": reporter.failed_posts,
                      "in_report_s": in_report, "reporter_thread_cpu_s": reporter.busy_s, "points": step_no}))


def _stored(url: str, token: str, namespace: str, job: str) -> int:
    req = urllib.request.Request(f"{url}/v1/jobs/{namespace}/{job}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.loads(resp.read())["points"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3000, help="steps per round")
    ap.add_argument("--torch-python", default="/work/torchvenv/bin/python",
                    help="an interpreter with torch for the PyTorch loop ('' to skip)")
    ap.add_argument("--device", default="cpu",
                    help="the PyTorch loop's device: cuda runs an MLP of GPU_MLP there, the loss a CUDA tensor "
                         "(and skips the numpy loop)")
    ap.add_argument("--gpu-batch", type=int, default=GPU_MLP[0], help="the GPU loop's batch (its steps/s)")
    ap.add_argument("--child", nargs=4, metavar=("KIND", "URL", "TOKEN", "NAMESPACE"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        child(ns.child[0], ns.child[1], ns.child[2], ns.child[3], ns.rounds, ns.steps, ns.device, ns.gpu_batch)
        return 0
    from benchmarks.local_serve import local_flowsched

    loops = [("numpy", sys.executable)] if ns.device == "cpu" else []
    if ns.torch_python and (Path(ns.torch_python).exists() or ns.device != "cpu"):
        loops.append(("torch", ns.torch_python))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with local_flowsched() as s:
        print(f"flowsched serve --no-kube at {s.api_url}; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}; {ns.rounds} rounds x {ns.steps} steps per mode, report() every step")
        for kind, python in loops:
            out = subprocess.run([python, str(Path(__file__).resolve()), "--rounds", str(ns.rounds), "--steps",
                                  str(ns.steps), "--device", ns.device, "--gpu-batch", str(ns.gpu_batch),
                                  "--child", kind, s.api_url, s.token, s.namespace],
                                 capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
            if out.returncode != 0:
                print(f"{kind}: failed: {out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            stored = _stored(s.api_url, s.token, s.namespace, f"client-cost-{kind}")
            label = f"{kind} MLP {IN}-{HIDDEN}-10, batch {BATCH}, one CPU thread"
            if ns.device != "cpu":
                b, w, n = ns.gpu_batch, *GPU_MLP[1:]
                label = f"{kind} MLP {IN}-{w}x{n}-10, batch {b}, on {ns.device}, the loss a CUDA tensor"
            label += f" (torch {r['version']})" if r["version"] else ""
            print(f"{label}: points sent {r['sent']} of {ns.rounds * ns.steps}, dropped {r['dropped']}, "
                  f"posts retried {r['failed_posts']}; the job's history {stored} points (the store thins)")
            step_cpu = 1.0 / statistics.median(row[1] for row in r["plain"])
            in_report, thread = r["in_report_s"] / r["points"], r["reporter_thread_cpu_s"] / r["points"]
            print(f"  the client's own time per point: {in_report * 1e6:.1f} us inside report() on the training "
                  f"thread + {thread * 1e6:.1f} us CPU on its thread = {100 * (in_report + thread) / step_cpu:.2f} % "
                  f"of a step ({step_cpu * 1e3:.2f} ms CPU; {100 * in_report / step_cpu:.2f} % on the training thread)")
            for col, what in ((0, "wall clock (other load on the machine included)"),
                              (1, "process CPU (the loop and the reporter's thread)"),
                              (2, "training thread CPU (the loop alone)")):
                plain = [row[col] for row in r["plain"]]
                rep = [row[col] for row in r["reported"]]
                costs = [1.0 - b / a for a, b in zip(plain, rep, strict=True)]
                print(f"  steps/s by {what}: no reporting {statistics.median(plain):7.1f}, report() every step "
                      f"{statistics.median(rep):7.1f}; cost median {100 * statistics.median(costs):+.2f} % "
                      f"(pairs {min(costs) * 100:+.2f} .. {max(costs) * 100:+.2f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
