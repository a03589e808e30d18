"""Tiresias preempts and reorders; flowsched's policy goes through scoring.placement."""

from __future__ import annotations

import numpy as np
import pytest

import benchmarks.sim.policies as policies
import scoring.pipeline as pipeline
from benchmarks.sim.cluster import ClusterSettings, Placement
from benchmarks.sim.engine import Engine, EngineSettings, SimJob
from benchmarks.sim.generator import calibrated_profiles
from benchmarks.sim.policies import FlowschedScorer, make_policy
from benchmarks.sim.tiresias import TiresiasPolicy
from benchmarks.sim.variants import build, completing_hook
from benchmarks.sim.workload import JobSpec

PROFILES = calibrated_profiles()


def test_tiresias_demotes_then_preempts_for_a_new_job() -> None:
    # 4 GPUs; a 4-GPU imagenet job reaches 16 GPU-hours after 4 h and drops to queue 1.
    long = JobSpec("long", 0.0, "imagenet", 4, 3200)
    new = JobSpec("new", 5 * 3600.0, "ncf", 4, 32768)
    eng = Engine([long, new], PROFILES, TiresiasPolicy(), EngineSettings(cluster=ClusterSettings(nodes=1))).run()
    lj, nj = eng.jobs
    assert nj.first_start == pytest.approx(5 * 3600.0)  # no wait: it preempted the demoted job
    assert lj.restarts == 1
    assert (lj.completion or 0) > (nj.completion or 0)


def test_flowsched_policy_calls_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    # The policy goes through scoring.pipeline, which calls scoring.placement's filter and score.
    calls = {"filter": 0, "score": 0}
    real_filter, real_score = getattr(pipeline, "filter_nodes"), getattr(pipeline, "score_nodes")  # noqa: B009

    def counting_filter(*a, **k):  # type: ignore[no-untyped-def]
        calls["filter"] += 1
        return real_filter(*a, **k)

    def counting_score(*a, **k):  # type: ignore[no-untyped-def]
        calls["score"] += 1
        return real_score(*a, **k)

    monkeypatch.setattr(pipeline, "filter_nodes", counting_filter)
    monkeypatch.setattr(pipeline, "score_nodes", counting_score)
    specs = [JobSpec(f"j{i}", 30.0 * i, "cifar10", 2, 2048) for i in range(6)]
    policy = make_policy("flowsched")
    Engine(specs, PROFILES, policy, EngineSettings(cluster=ClusterSettings(nodes=4))).run()
    assert calls["filter"] >= 6 and calls["score"] >= 6
    assert isinstance(policy, policies.KubeSchedulerPolicy) and isinstance(policy.scorer, FlowschedScorer)


def test_flowsched_filter_rejects_saturated_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # Telemetry says node 0's free GPUs are pegged (work outside Kubernetes): flowsched avoids it,
    # kube-default (which cannot see telemetry) does not care.
    spec = [JobSpec("a", 0.0, "ncf", 1, 32768)]
    eng = Engine(spec, PROFILES, make_policy("flowsched"), EngineSettings(cluster=ClusterSettings(nodes=2)))
    util = np.zeros((2, 4))
    util[0] = 99.0
    monkeypatch.setattr(eng, "gpu_util", lambda: util)
    eng.run()
    assert eng.jobs[0].completion is not None
    # the job ran on node 1: check via a fresh run recording the placement
    placed: list[int] = []
    eng2 = Engine(spec, PROFILES, make_policy("flowsched"), EngineSettings(cluster=ClusterSettings(nodes=2)))
    monkeypatch.setattr(eng2, "gpu_util", lambda: util)
    real_start = eng2.start

    def recording_start(job: SimJob, p: Placement) -> None:
        placed.append(p[0][0])
        real_start(job, p)

    monkeypatch.setattr(eng2, "start", recording_start)
    eng2.run()
    assert placed == [1]


def test_the_placements_convergence_hook_is_the_services_tracker() -> None:
    spec = JobSpec("c", 0.0, "cifar10", 4, 2048)
    eng = Engine([spec], PROFILES, make_policy("fifo"), EngineSettings(cluster=ClusterSettings(nodes=1))).run()
    hook = completing_hook(build("flowsched-placement", PROFILES), PROFILES)
    assert hook is not None
    job = eng.jobs[0]
    assert hook(job) is True  # 100 epochs of an exponential approach end on a plateau
    job.series = job.series[:3]
    hook = completing_hook(build("flowsched-placement", PROFILES), PROFILES)
    assert hook is not None and hook(job) is None  # too few points: unknown, not "no"
