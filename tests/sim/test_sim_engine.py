"""Engine, FIFO and kube-scheduler emulation behaviour on the calibrated (data-free) profiles."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.engine import Engine, EngineSettings, SimJob
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.policies import FifoPolicy, make_policy, pod_sizes
from benchmarks.sim.workload import JobSpec

PROFILES = calibrated_profiles()


def settings(nodes: int = 2, seed: int = 0) -> EngineSettings:
    return EngineSettings(cluster=ClusterSettings(nodes=nodes), seed=seed)


def test_lone_job_finishes_when_the_model_says() -> None:
    spec = JobSpec("yolo", 10.0, "yolov3", 4, 64)
    eng = Engine([spec], PROFILES, FifoPolicy(), settings()).run()
    job = eng.jobs[0]
    atomic, accum = PROFILES.apps["yolov3"].batch_config(4, 64)
    table = PROFILES.rate_table("yolov3", [4], atomic, accum)
    # Seen at the first 60 s round, then 30 s of restart before progress starts.
    assert job.first_start == 60.0
    assert job.completion == pytest.approx(60.0 + 30.0 + table.total, rel=1e-9)
    assert table.total == pytest.approx(50 * 282.0, rel=1e-6)  # 50 epochs x calibrated epoch time
    assert job.restarts == 0 and job.placement == ()
    assert eng.cluster.total_free == eng.cluster.total_gpus


def test_fifo_head_of_line_blocks_later_jobs() -> None:
    big = JobSpec("big", 0.0, "cifar10", 8, 2048)
    bigger = JobSpec("bigger", 1.0, "cifar10", 8, 2048)  # cannot start while `big` runs on 2 nodes
    small = JobSpec("small", 2.0, "ncf", 1, 32768)
    eng = Engine([big, bigger, small], PROFILES, FifoPolicy(), settings()).run()
    b, bb, s = eng.jobs
    assert b.first_start == 60.0
    assert bb.first_start is not None and s.first_start is not None
    assert bb.first_start > 60.0
    assert s.first_start >= bb.first_start  # strict FIFO: the small job waited behind `bigger`


def test_kube_emulation_sets_aside_a_pod_that_does_not_fit() -> None:
    big = JobSpec("big", 0.0, "cifar10", 8, 2048)
    bigger = JobSpec("bigger", 1.0, "cifar10", 6, 2048)
    small = JobSpec("small", 2.0, "ncf", 1, 32768)
    eng = Engine([big, bigger, small], PROFILES, make_policy("kube-default"), settings(nodes=3)).run()
    b, bb, s = eng.jobs
    assert b.first_start == 60.0 and s.first_start == 60.0  # small went ahead of the set-aside job
    assert bb.first_start is not None and bb.first_start > 60.0
    assert bb.first_start >= (b.completion or 0.0) - 1e-6  # freed at the round its blocker ended


def test_multi_gpu_jobs_are_node_sized_pods() -> None:
    assert pod_sizes(6, 4) == [4, 2]
    assert pod_sizes(8, 4) == [4, 4]
    assert pod_sizes(1, 4) == [1]
    spec = JobSpec("c", 0.0, "cifar10", 6, 2048)
    eng = Engine([spec], PROFILES, make_policy("binpack"), settings(nodes=3))
    eng.run()
    assert eng.jobs[0].completion is not None


def _jcts(seed: int, policy: str) -> list[float]:
    jobs = generate(GeneratorSettings(jobs=40, hours=2.0, seed=3))
    eng = Engine(jobs, PROFILES, make_policy(policy, seed), settings(nodes=8, seed=seed)).run()
    return [float(j.completion or -1) for j in eng.jobs]


def test_same_seed_same_result() -> None:
    assert _jcts(5, "flowsched") == _jcts(5, "flowsched")
    assert _jcts(5, "kube-default") == _jcts(5, "kube-default")


def test_series_and_telemetry_are_emitted() -> None:
    spec = JobSpec("c", 0.0, "cifar10", 4, 2048)
    eng = Engine([spec], PROFILES, FifoPolicy(), settings(nodes=1)).run()
    series = eng.jobs[0].series
    assert [p[1] for p in series] == list(range(1, 101))  # one point per epoch
    assert np.all(np.diff([p[0] for p in series]) > 0)
    assert series[-1][2] > series[0][2]  # accuracy rises


def test_control_loop_can_evict_only_checkpointable_jobs() -> None:
    evicted: list[bool] = []

    def loop(engine: Engine, now: float) -> None:
        if now == 600.0:
            for job in list(engine.active.values()):
                evicted.append(engine.evict(job))

    specs = [JobSpec("a", 0.0, "yolov3", 4, 64), JobSpec("b", 0.0, "yolov3", 4, 64, checkpointable=False)]
    eng = Engine(specs, PROFILES, make_policy("kube-default"), settings(), control_loops=[loop]).run()
    assert sorted(evicted) == [False, True]
    a, b = eng.jobs
    assert a.restarts == 1 and b.restarts == 0
    assert (a.completion or 0) > (b.completion or 0)  # the evicted one paid a restart


def test_simjob_gpus_property() -> None:
    j = SimJob(0, JobSpec("x", 0.0, "ncf", 1, 32768), 1, 1, 0, placement=((0, 2), (1, 2)))
    assert j.gpus == 4 and j.multi_node


def test_a_live_rebatch_keeps_progress_and_costs_no_restart() -> None:
    from benchmarks import data_paths
    from benchmarks.sim.jobmodel import load_profiles

    profiles = load_profiles(data_paths.pollux_traces())
    app = profiles.apps["cifar10"]
    seen: dict[str, float] = {}

    def loop(engine: Engine, now: float) -> None:
        job = engine.jobs[0]
        if now == 600.0 and job.placement:
            engine.sync(job)
            seen["before"] = job.progress
            seen["ok"] = float(engine.rebatch(job, 4 * app.init_batch_size))
            seen["after"] = job.progress
            seen["same"] = float(engine.rebatch(job, job.batch_size))  # its own batch: nothing to do

    spec = JobSpec("c", 0.0, "cifar10", 4, int(app.init_batch_size))
    plain = Engine([spec], profiles, FifoPolicy(), settings()).run().jobs[0]
    eng = Engine([spec], profiles, FifoPolicy(), settings(), control_loops=[loop]).run()
    job = eng.jobs[0]
    assert seen["ok"] == 1.0 and seen["same"] == 0.0
    assert seen["after"] == seen["before"] > 0  # progress kept
    assert job.restarts == 0 and job.allocations == 1 and job.batch_size == 4 * app.init_batch_size
    atomic, accum = app.batch_config(4, 4 * int(app.init_batch_size))
    table = profiles.rate_table("cifar10", [4], atomic, accum)
    # From the switch on, the rest of the work at the new batch's goodput, no restart penalty.
    assert job.completion == pytest.approx(600.0 + table.total - table.time_at(seen["before"]), rel=1e-9)
    assert job.completion != pytest.approx(plain.completion or 0.0, rel=1e-3)
    assert not Engine([spec], profiles, FifoPolicy(), settings()).rebatch(SimJob(0, spec, 4, 1, 0), 256)
