"""What one progress batch costs the verbs' process, before and with the front's checked form
(issue 33, finding 7): the hostile probe's batch, 100 points x 64 metric names of 123 characters.

    python -m benchmarks.progress_form_cost [--repeat 50]

"raw JSON" is what the verbs' process did with every batch before the front checked reports
(b67ffaf's steps, rebuilt from today's parts): parse, validate (pydantic: one call that holds the
GIL throughout), drop non-finite metrics, encode each point's metrics for the quota and again for
the rows. "checked form" is what it does now: read the front's head, slice
the metrics blobs, the clock checks. Each is timed alone, best and median of --repeat runs, in
this process (single-threaded: the time is GIL held). The front's own cost is printed beside.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from extender.http.progress_api import split_points
from extender.http.progress_wire import ReportIn, check_report, decode_checked, encode_checked, parse_json
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings, encode_points

NAMES = [("m" * 120) + f"{i:03d}" for i in range(64)]


def batch() -> bytes:
    metrics = dict.fromkeys(NAMES, 1.0)
    return orjson.dumps({"namespace": "team-a", "job": "flood-1",
                         "points": [{"step": i, "loss": 1.0, "metrics": metrics} for i in range(100)]})


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000)
    return min(runs), statistics.median(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=50)
    ns = ap.parse_args()
    raw = batch()
    wire = encode_checked(check_report(raw, 10_000))

    def before() -> object:  # the old code's steps on the verbs' process (b67ffaf's post_progress)
        report = ReportIn.model_validate(parse_json(raw))
        at = time.time()
        pts = [ProgressPoint(p.step, p.loss, at, None,
                             {k: v for k, v in (p.metrics or {}).items() if v is not None and math.isfinite(v)})
               for p in report.points if p.loss is not None]
        encode_points(report.job, pts)  # admit(): each point's metrics encoded to size the quota
        return encode_points(report.job, pts)  # add_points(): and again for the rows

    def now() -> object:
        return split_points(decode_checked(wire), time.time())

    print(f"batch: 100 points x 64 metric names of 123 characters; {len(raw):,} bytes of JSON, "
          f"{len(wire):,} bytes in the checked form")
    for label, fn in (("verbs' process, raw JSON (before)", before), ("verbs' process, checked form (now)", now),
                      ("front, check + encode (now)", lambda: encode_checked(check_report(raw, 10_000)))):
        best, median = timed(fn, ns.repeat)
        print(f"  {label:36s} best {best:6.2f} ms  median {median:6.2f} ms")
    # The insert that follows either way, on a worker thread: CPU, mostly off the GIL (sqlite's
    # steps release it); a new job each batch, as the probe's flood sends.
    with tempfile.TemporaryDirectory() as tmp:
        store = ProgressStore(ProgressStoreSettings(path=str(Path(tmp) / "p.sqlite"), max_jobs_per_namespace=1 << 30,
                                                    max_bytes_per_namespace=1 << 40,
                                                    max_points_per_namespace=1 << 40))
        kept, _ = split_points(decode_checked(wire), time.time())
        cpu = []
        for n in range(ns.repeat):
            t = time.thread_time()
            store.admit("team-a", f"flood-{n}", kept)
            store.add_points("team-a", f"flood-{n}", kept)
            cpu.append((time.thread_time() - t) * 1000)
        store.close()
    cpu.sort()
    print(f"  {'store insert, CPU (both)':36s} median {statistics.median(cpu):6.2f} ms  "
          f"p90 {cpu[int(0.9 * (len(cpu) - 1))]:6.2f} ms (WAL checkpoints)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
