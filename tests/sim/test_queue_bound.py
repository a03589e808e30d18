"""The ORACLE reference policies of benchmarks/queue_bound.py: strict shortest-remaining-first with
preemption, gangs in pods of at most a node's GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.queue_bound import StrictSRPT, fit, main
from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.generator import calibrated_profiles
from benchmarks.sim.policies import pod_sizes
from benchmarks.sim.workload import JobSpec

PROFILES = calibrated_profiles()


def test_pods_fill_whole_nodes_first_and_fit_prefers_gpus_free_now() -> None:
    assert pod_sizes(10, 4) == [4, 4, 2] and pod_sizes(3, 4) == [3]
    avail = np.array([4, 4, 2])
    free_now = np.array([0, 4, 2])  # node 0 is held by a job of lower priority
    assert fit([4], avail, free_now) == [(1, 4)]
    assert fit([2], avail, free_now) == [(2, 2)]  # free now and the tightest
    assert fit([4, 4], avail, free_now) == [(1, 4), (0, 4)]  # then a preemption's GPUs
    assert fit([4, 4, 4], avail, free_now) is None


def test_a_short_job_preempts_a_long_one_on_a_full_cluster_and_the_long_one_resumes() -> None:
    def hours(name: str) -> float:
        app = PROFILES.apps[name]
        return PROFILES.rate_table(name, [4], *app.batch_config(4, int(app.init_batch_size))).total

    names = sorted(PROFILES.apps, key=hours)
    shortest, longest = names[0], names[-1]
    assert hours(longest) > 3 * hours(shortest)
    specs = [JobSpec(n, t, n, 4, int(PROFILES.apps[n].init_batch_size), end_rule="planned")
             for n, t in ((longest, 0.0), (shortest, 600.0))]
    one_node = EngineSettings(cluster=ClusterSettings(nodes=1))
    long_job, short = Engine(specs, PROFILES, StrictSRPT("srpt-full"), one_node).run().jobs
    assert long_job.restarts == 1 and short.restarts == 0
    assert short.completion is not None and long_job.completion is not None
    assert short.completion < long_job.completion
    assert short.first_start == pytest.approx(600.0, abs=one_node.interval)  # not after the long one


def test_unknown_names_and_bad_ranges_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown reference policy"):
        StrictSRPT("srpt-psychic")
    with pytest.raises(SystemExit):
        main(["--workloads", "one-two"])


@pytest.mark.parametrize(("policy", "first_done"), [("srpt-declared", "long"), ("srpt-known", "medium")])
def test_only_the_reference_told_every_size_lets_a_job_with_less_left_take_its_gpus_back(policy: str,
                                                                                         first_done: str) -> None:
    # Neither job declares its end. The long job arrives half-way through the medium one and, new,
    # preempts it; a short job's arrival and end later re-order the queue (the references re-order
    # at arrivals and completions): srpt-declared ranks the two by attained service (the medium
    # job's is larger, so the long one keeps the node), srpt-known by the truth (the medium job has
    # less left, so it takes the node back and ends first).
    def seconds(name: str) -> float:
        app = PROFILES.apps[name]
        return PROFILES.rate_table(name, [4], *app.batch_config(4, int(app.init_batch_size))).total

    names = sorted(PROFILES.apps, key=seconds)
    short, medium, longest = names[0], names[len(names) // 2], names[-1]
    half = seconds(medium) / 2
    assert seconds(short) < 60.0 and half > 600.0 and seconds(longest) - 600.0 > 2 * half
    specs = [JobSpec(n, t, n, 4, int(PROFILES.apps[n].init_batch_size), end_rule="none")
             for n, t in ((medium, 0.0), (longest, half), (short, half + 600.0))]
    one_node = EngineSettings(cluster=ClusterSettings(nodes=1))
    mid_job, long_job, _ = Engine(specs, PROFILES, StrictSRPT(policy), one_node).run().jobs
    assert mid_job.completion is not None and long_job.completion is not None
    assert (mid_job.completion < long_job.completion) == (first_done == "medium")
