"""benchmarks/fgd/interference.py: the model's bookkeeping on a small cluster."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fgd.interference import POLICIES, Model, make_jobs, simulate


@pytest.mark.parametrize("policy", POLICIES)
def test_every_pod_finishes_no_faster_than_alone(policy: str) -> None:
    m = Model(nodes=2, gpus_per_node=2, replicas=2, jobs=30, arrival_window_s=3600.0, mean_work_s=600.0)
    r = simulate(m, make_jobs(m, np.random.default_rng(0)), policy)
    assert r.mean_slowdown >= 1.0  # a pod never runs faster than alone (step rounding adds a little)
    assert r.p95_jct_s >= r.mean_jct_s * 0.5


def test_alone_on_a_gpu_a_pod_runs_at_full_speed() -> None:
    m = Model(nodes=1, gpus_per_node=1, replicas=1, jobs=1, arrival_window_s=1.0, mean_work_s=600.0)
    jobs = make_jobs(m, np.random.default_rng(1))
    r = simulate(m, jobs, "flowsched")
    # one step of rounding at most
    assert jobs.work[0] <= r.mean_jct_s <= jobs.work[0] + 2 * m.step_s


def test_hidden_load_slows_pods_down() -> None:
    base = Model(nodes=1, gpus_per_node=1, replicas=4, jobs=8, arrival_window_s=600.0, mean_work_s=600.0)
    loaded = Model(nodes=1, gpus_per_node=1, replicas=4, jobs=8, arrival_window_s=600.0, mean_work_s=600.0,
                   hidden_gpu_share=1.0, hidden_util=0.9)
    a = simulate(base, make_jobs(base, np.random.default_rng(2)), "spread")
    b = simulate(loaded, make_jobs(loaded, np.random.default_rng(2)), "spread")
    assert b.mean_jct_s > a.mean_jct_s
