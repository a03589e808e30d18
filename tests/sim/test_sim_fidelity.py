"""Against the real Pollux artifact data (shipped in benchmarks/data/pollux, or $FLOWSCHED_DATA):
job model lookups and Tiresias fidelity."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import data_paths
from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.jobmodel import Application, load_profiles
from benchmarks.sim.tiresias import TiresiasPolicy
from benchmarks.sim.workload import read_workload

POLLUX = data_paths.pollux_dir()


def test_throughput_reads_placements_csv() -> None:
    app = Application(POLLUX / "traces" / "cifar10", max_epochs=100)
    # First row of traces/cifar10/placements.csv: placement 1, local_bsz 32.
    step, sync = app.throughput((1,), 32)
    assert step == pytest.approx(0.0427886962890625)
    assert sync == pytest.approx(0.0004995360016822816)
    # Rotations of one placement are the same measurement.
    assert app.throughput((4, 2), 128) == app.throughput((2, 4), 128)
    # Beyond 4 nodes: interpolated on the scalability grid, and slower per step than 1 node.
    assert app.throughput((4,) * 6, 128)[0] > app.throughput((4,), 128)[0]


def test_batch_config_matches_the_artifact_rule() -> None:
    app = Application(POLLUX / "traces" / "cifar10", max_epochs=100)
    assert app.batch_config(6, 2048) == (342, 0)
    assert app.batch_config(12, 4096) == (341, 0)  # capped so the batch stays <= 4096


def test_tiresias_on_workload_6_matches_the_published_average() -> None:
    profiles = load_profiles(POLLUX / "traces")
    jobs = read_workload(POLLUX / "workloads" / "workload-6.csv")
    eng = Engine(jobs, profiles, TiresiasPolicy(), EngineSettings()).run()
    jct = np.array([j.completion - j.spec.arrival for j in eng.jobs if j.completion is not None])
    assert jct.size == 160
    assert abs(jct.mean() / 3470.0 - 1.0) < 0.10
