"""What the remaining-time distribution costs per job update, at 2,000 points (issue 21: <= 1 ms).

Three things are timed in alternating rounds on the same noisy curve, so that a busy machine
slows them alike: the prediction this issue adds (scoring.convergence.curve_evidence, with the
prefix's shape, and scoring.remaining.predict's trees, given the family fits), the family fits
that estimate() already did before (fit_families), and the whole estimate() the tracker runs per
job update. Wall clock and CPU time both: on a shared, loaded machine the wall clock also counts
the waits for a core, the CPU time (time.process_time) does not.

Usage: python -m benchmarks.remaining_cost [--points 2000] [--rounds 30] [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from scoring.convergence import (
    ConvergenceSettings,
    clean_series,
    curve_evidence,
    estimate,
    normalise,
    remaining_model_for,
)
from scoring.curve_fit import fit_families
from scoring.remaining import predict


def per_call_us(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per call: the CPU time is what the call itself costs; on a busy
    shared machine the wall time adds the waits for a core."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=20, help="calls per round and thing timed")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(21)
    k = np.arange(1, args.points + 1) * 10.0
    loss = 1.0 / (0.001 * k + 0.5) + 0.3 + rng.normal(0.0, 0.005, k.size)
    t = k * 0.5
    s = ConvergenceSettings()
    clean = clean_series(k, loss, t)
    norm = normalise(clean.values, s.higher_is_better, s.median_points)
    assert norm is not None
    fits = fit_families(clean.steps, norm, s.fit_grid, s.fit_families, s.fit_max_points)
    model = remaining_model_for(None)

    def prediction() -> object:
        ev = curve_evidence(clean.steps, norm, fits, s)
        assert ev is not None
        return predict(ev, model)

    things: dict[str, Callable[[], object]] = {
        "prediction (curve_evidence + predict)": prediction,
        "family fits (fit_families, as before)": lambda: fit_families(
            clean.steps, norm, s.fit_grid, s.fit_families, s.fit_max_points),
        "whole estimate() per job update": lambda: estimate(k, loss, t, s),
    }
    for fn in things.values():  # warm up
        fn()
    wall: dict[str, list[float]] = {name: [] for name in things}
    cpu: dict[str, list[float]] = {name: [] for name in things}
    for _ in range(args.rounds):
        for name, fn in things.items():
            w, c = per_call_us(fn, args.calls)
            wall[name].append(w)
            cpu[name].append(c)
    load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs" if hasattr(os, "getloadavg") else ""
    print(f"{args.points} points, {args.rounds} alternating rounds x {args.calls} calls{load}; per call, "
          f"median (min) over rounds, wall clock and CPU time:")
    for name in things:
        print(f"  {name:40} wall {statistics.median(wall[name]) / 1000:6.3f} ms ({min(wall[name]) / 1000:.3f}), "
              f"CPU {statistics.median(cpu[name]) / 1000:6.3f} ms ({min(cpu[name]) / 1000:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
