"""The GPU campaign with live estimates: real training runs on a GPU, each reporting as it trains
to a real `flowsched serve --no-kube`, whose answers are read while they run.

    python -m benchmarks.gpu_runs run --out DIR [--workers 8] [--deadline-s 330]   # needs CUDA
    python -m benchmarks.gpu_runs summary DIR                                      # anywhere

`run` starts the service (benchmarks/local_serve.py), then --workers processes of
`benchmarks.curves.train_runs run --matrix gpu --device cuda --report ...` sharing the GPU (each
run declares its rule through `Reporter.training` and reports every step's loss tensor), and polls
`GET /v1/jobs/<ns>/<run id>` of every run every --poll-s seconds into DIR/polls.jsonl. Runs still
going at the deadline are stopped and not written. The runs land in DIR/runs/ in the format of the
CPU campaigns (benchmarks.curves.real_curves packs them).

`summary`: for each finished run, the answer the service gave at 25 / 50 / 75 % of the run's
wall time (the last poll whose last point was reported by then), against the truth: the run's end
less that answer's last point's timestamp. Per rule: median APE of remaining_seconds, how often
the 80 % interval held the truth, and whether the point lay inside its interval in every answer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.curves.train_runs import MATRICES

FRACTIONS = (0.25, 0.5, 0.75)
GPU_SITTINGS = tuple(m for m in MATRICES if m.startswith("gpu"))  # the GPU campaign's --matrix names
ROOT = Path(__file__).resolve().parents[1]


def _poll(url: str, token: str, namespace: str, jobs: list[str], out: Path, done: Path, stop: threading.Event,
          every_s: float) -> None:
    with out.open("a") as f:
        while not stop.is_set():
            for job in jobs:
                if (done / f"{job}.json").exists():
                    continue
                req = urllib.request.Request(f"{url}/v1/jobs/{namespace}/{job}",
                                             headers={"Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(req, timeout=5) as resp:
                        body = json.loads(resp.read())
                except urllib.error.HTTPError as e:
                    if e.code != 404:  # 404: not started yet
                        f.write(json.dumps({"t": time.time(), "job": job, "error": e.code}) + "\n")
                    continue
                except (OSError, ValueError) as e:
                    f.write(json.dumps({"t": time.time(), "job": job, "error": str(e)}) + "\n")
                    continue
                keep = ("last_timestamp", "last_step", "points", "remaining_seconds", "remaining_seconds_interval",
                        "remaining_steps", "end_reason", "evidence_weight", "step_rate")
                f.write(json.dumps({"t": time.time(), "job": job, **{k: body.get(k) for k in keep}}) + "\n")
            f.flush()
            stop.wait(every_s)


def run(out: Path, workers: int, deadline_s: float, poll_s: float, python: str, extra: list[str],
        matrix: str = "gpu") -> int:
    from benchmarks.local_serve import local_flowsched

    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    # polled: those --only leaves out answer 404 throughout
    jobs = [s.run_id for s in MATRICES[matrix]()]
    (out / "serve").mkdir(exist_ok=True)
    with local_flowsched(keep_in=out / "serve") as s:
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(s.api_url, s.token, s.namespace, jobs, out / "polls.jsonl",
                                                      runs, stop, poll_s), daemon=True)
        poller.start()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [python, "-m", "benchmarks.curves.train_runs", "run", "--matrix", matrix, "--out", str(runs),
               "--report", s.api_url, s.token, s.namespace, *extra]
        logs = [(out / f"worker{i}.log").open("w") for i in range(workers)]
        procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
        deadline = time.monotonic() + deadline_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(1.0)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(30)
        stop.set()
        poller.join(10)
        for log in logs:
            log.close()
    print(summary(out))
    return 0


def _answer_at(polls: list[dict[str, Any]], at: float) -> dict[str, Any] | None:
    """The last answer whose last point was reported by `at` (polls in time order)."""
    best = None
    for p in polls:
        if p.get("last_timestamp") is not None and p["last_timestamp"] <= at:
            best = p
    return best


def summary(out: Path) -> str:
    polls: dict[str, list[dict[str, Any]]] = {}
    for line in (out / "polls.jsonl").read_text().splitlines():
        p = json.loads(line)
        if "error" not in p:
            polls.setdefault(p["job"], []).append(p)
    rows: dict[str, dict[str, Any]] = {}
    lines = []
    for path in sorted((out / "runs").glob("*.json")):
        rec = json.loads(path.read_text())
        spec, job = rec["spec"], rec["spec"]["run_id"]
        t0, t1 = rec["started_at"], rec["ended_at"]
        tally = rows.setdefault(spec["rule"], {"runs": 0, "ape": {f: [] for f in FRACTIONS}, "covered": 0,
                                               "answers": 0, "point_outside": 0, "missing": 0, "reasons": {}})
        tally["runs"] += 1
        for p in polls.get(job, []):  # every answer: the point inside its own interval?
            iv, rs = p.get("remaining_seconds_interval"), p.get("remaining_seconds")
            if iv and rs is not None and not iv[0] <= rs <= iv[1]:
                tally["point_outside"] += 1
        cells = []
        for f in FRACTIONS:
            a = _answer_at(polls.get(job, []), t0 + f * (t1 - t0))
            if a is None or a.get("remaining_seconds") is None:
                tally["missing"] += 1
                cells.append("-")
                continue
            truth = t1 - a["last_timestamp"]
            ape = abs(a["remaining_seconds"] - truth) / truth
            iv = a.get("remaining_seconds_interval")
            inside = iv is not None and iv[0] <= truth <= iv[1]
            tally["ape"][f].append(ape)
            tally["answers"] += 1
            tally["covered"] += inside
            tally["reasons"][a.get("end_reason")] = tally["reasons"].get(a.get("end_reason"), 0) + 1
            cells.append(f"{a['remaining_seconds']:.0f}/{truth:.0f} s{'' if inside else ' (out)'}")
        lines.append(f"  {job}: {rec['stopped_by']} at step {rec['true_end_step']} after {t1 - t0:.1f} s "
                     f"({rec.get('timed_step_s', math.nan) * 1e3:.1f} ms/step timed); answered/true at 25/50/75 %: "
                     + ", ".join(cells))
    head = ["GPU runs reported live to flowsched serve --no-kube; remaining_seconds at 25 / 50 / 75 % of each "
            "run's wall time (median APE), 80 % interval coverage over the three, answers whose point lay "
            "outside its interval (of all polled answers):"]
    for rule, t in sorted(rows.items()):
        mdape = " / ".join("-" if not t["ape"][f] else f"{100 * statistics.median(t['ape'][f]):.1f}"
                           for f in FRACTIONS)
        cov = 100 * t["covered"] / t["answers"] if t["answers"] else math.nan
        head.append(f"{rule:15s} runs {t['runs']:2d}  mdAPE {mdape} %  coverage {cov:.1f} % of {t['answers']}  "
                    f"point outside {t['point_outside']}  no answer {t['missing']}  end_reason {t['reasons']}")
    return "\n".join(head + lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--matrix", choices=GPU_SITTINGS, default="gpu", help="which sitting's runs")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--deadline-s", type=float, default=330.0)
    r.add_argument("--poll-s", type=float, default=2.0)
    r.add_argument("--python", default=sys.executable, help="the workers' interpreter (one with torch)")
    r.add_argument("--device", default=None, help="override the runs' device (cpu: a smoke test without a GPU)")
    r.add_argument("--only", nargs="*", default=None, help="run ids or family names")
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    ns = ap.parse_args(argv)
    if ns.cmd == "run":
        extra = (["--device", ns.device] if ns.device else []) + (["--only", *ns.only] if ns.only else [])
        return run(ns.out, ns.workers, ns.deadline_s, ns.poll_s, ns.python, extra, ns.matrix)
    print(summary(ns.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
