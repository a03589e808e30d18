"""The end mix and the throughput mode: what a simulated job tells flowsched of its end and its
step times is what its declared rule and its own measurements say, never the trace's truth."""

from __future__ import annotations

import math

import pytest

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.variants import build, mark_ends, prepare
from benchmarks.sim.world import SimWorldBuilder, job_key
from scoring.settings import CoreSettings
from scoring.tracker import ConvergenceTracker
from scoring.world import World

PROFILES = calibrated_profiles()


def test_the_default_end_mix_cycles_planned_planned_early_none_by_arrival() -> None:
    specs = generate(GeneratorSettings(jobs=12, hours=1.0, seed=3))
    rules = [s.end_rule for s in mark_ends(specs)]
    assert rules == ["planned", "planned", "early", "none"] * 3
    assert {s.end_rule for s in mark_ends(specs, "none")} == {"none"}
    with pytest.raises(ValueError, match="unknown end mix"):
        mark_ends(specs, "sometimes")


def test_only_a_job_that_declares_its_planned_end_reports_it_and_step_times_are_measured_ones() -> None:
    specs = prepare(generate(GeneratorSettings(jobs=16, hours=1.0, seed=3)), PROFILES, "all")
    v = build("flowsched", PROFILES, 0)
    assert v.control is not None
    control = v.control
    seen: list[World] = []

    def looking(engine: Engine, now: float) -> None:  # the World the core is given, an hour in
        control(engine, now)
        if not seen and now >= 3600.0:
            seen.append(control.builder.build(engine, now))

    eng = Engine(specs, PROFILES, v.policy, EngineSettings(cluster=ClusterSettings(nodes=4)), control_loops=[looking],
                 gated=True).run()
    [world] = seen
    rules = {job_key(j): j.spec.end_rule for j in eng.jobs}
    assert world.jobs
    for j in world.jobs:
        assert math.isfinite(j.planned_steps) == (rules[j.key] == "planned")
        assert j.throughput is None  # learned: no table of sizes the job never ran
        assert set(j.step_samples) == set(j.step_batches)
    assert any(j.step_samples for j in world.jobs)
    with pytest.raises(ValueError, match="throughput mode"):
        SimWorldBuilder(CoreSettings(), ConvergenceTracker(CoreSettings().convergence), throughput_mode="psychic")
