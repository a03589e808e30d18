"""The simulator's bottleneck model: its telemetry is diagnosed as the bottleneck its terms say."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.run_bottleneck import run
from benchmarks.sim.bottleneck_model import model_for
from scoring.bottleneck import PS, Bottleneck, BottleneckSettings, diagnose

S = BottleneckSettings()
LINK = 1.25e9


def _diag(kind: str, w: int, p: int, cpu: float, seed: int = 0) -> tuple[Bottleneck, str, float]:
    rng = np.random.default_rng(seed)
    m = model_for(kind, rng, LINK)
    sig = m.signals("sim/j", w, p, cpu, 4.0, LINK, ["a", "b"], rng, 0.05, 1.0 / m.step_s(w, p, cpu), 0.0)
    d = diagnose(sig, S)
    return d.kind, d.where, m.step_s(w, p, cpu)


def test_a_ps_job_with_one_ps_is_communication_bound_at_the_ps_and_more_ps_speed_it_up() -> None:
    kind, where, t1 = _diag(PS, 4, 1, 2.0)
    assert (kind, where) == (Bottleneck.COMMUNICATION, PS)
    _, _, t4 = _diag(PS, 4, 4, 2.0)
    assert t4 < 0.6 * t1


def test_an_input_job_is_input_bound_until_it_has_cpu() -> None:
    assert _diag("input", 2, 0, 2.0)[0] == Bottleneck.INPUT
    assert _diag("input", 2, 0, 32.0)[0] == Bottleneck.COMPUTE  # its pipeline outruns the GPU
    assert _diag("input", 2, 0, 8.0)[2] < _diag("input", 2, 0, 2.0)[2]


def test_a_compute_job_is_compute_bound() -> None:
    assert _diag("compute", 2, 0, 2.0)[0] == Bottleneck.COMPUTE


def test_the_benchmark_runs_all_modes_and_finishes_every_job() -> None:
    for mode in ("off", "constrain", "on"):
        r = run(seed=1, n_jobs=6, nodes=1, mode=mode)
        assert math.isfinite(r["jct"]) and r["jct"] > 0
        assert all(math.isfinite(v) and v > 0 for k, v in r.items() if k.startswith("speed:"))
    on = run(seed=1, n_jobs=6, nodes=1, mode="on")
    assert on["n_give-cpu"] + on["n_add-ps"] > 0  # the remedies were used
    assert run(seed=1, n_jobs=6, nodes=1, mode="off")["n_give-cpu"] == 0
