"""Where the elastic optimizer's step-time prior comes from (elastic.compute_fraction,
sync_fraction, sync_per_gpu_fraction in scoring/settings.py, and with --node-gpus 4 the shares with a
sync line across nodes apart, node_sync_fraction and node_sync_per_gpu_fraction): scoring.elastic.fit_step_time fitted
to each profiled model of the Pollux artifact (benchmarks/data/pollux/traces, Apache-2.0) at every
packed size up to 64 GPUs and 8 batches over its range, its terms taken as shares of a 1-GPU step
at the geometric middle of that range (where the jobs' live batches mostly run), and the median
over the six models printed.

    python -m benchmarks.fit_step_prior [--node-gpus 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.world import measured_throughput
from scoring.elastic import StepTimeModel, fit_step_time

TRACES = Path(__file__).resolve().parent / "data" / "pollux" / "traces"


def shares(max_gpus: int = 64, gpus_per_node: int = 4, node_gpus: int = 0
           ) -> dict[str, tuple[float, float, float, float, float]]:
    """Model -> (fixed compute, sync, sync per added GPU, and across nodes: sync, sync per added GPU)
    as shares of its 1-GPU step at the middle batch; node_gpus 0: one sync line (the last two 0)."""
    out: dict[str, tuple[float, float, float, float, float]] = {}
    for name, app in load_profiles(TRACES).app_objects().items():
        batches = np.unique(np.geomspace(app.init_batch_size, app.max_batch_size, 8).astype(np.int64))
        tp = measured_throughput(app, max_gpus, gpus_per_node, batches)
        g, b = np.meshgrid(np.arange(max_gpus + 1), batches, indexing="ij")
        ok = np.isfinite(tp.step_s) & (g >= 1)
        m = fit_step_time(g[ok], b[ok], tp.step_s[ok], max_local_bsz=app.max_local_bsz, node_gpus=node_gpus)
        if m is None:
            continue
        middle = float(np.sqrt(app.init_batch_size * app.max_batch_size))
        one = float(StepTimeModel(m.compute_s, m.per_sample_s).step_time(1, middle))  # no accumulation
        out[name] = (m.compute_s / one, m.sync_s / one, m.sync_per_gpu_s / one, m.node_sync_s / one,
                     m.node_sync_per_gpu_s / one)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node-gpus", type=int, default=0,
                    help="GPUs of one node: fit a sync line across nodes apart (0: one sync line)")
    rows = shares(node_gpus=ap.parse_args(argv).node_gpus)
    print(f"{'model':<12}{'compute':>9}{'sync':>8}{'sync/GPU':>10}{'node sync':>11}{'node/GPU':>10}")
    for name, (c, s, p, n, q) in rows.items():
        print(f"{name:<12}{c:>9.3f}{s:>8.3f}{p:>10.4f}{n:>11.3f}{q:>10.4f}")
    c, s, p, n, q = np.median(np.array(list(rows.values())), axis=0)
    print(f"{'median':<12}{c:>9.3f}{s:>8.3f}{p:>10.4f}{n:>11.3f}{q:>10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
