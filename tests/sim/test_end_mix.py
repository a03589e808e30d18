"""The end mix and the throughput mode: what a simulated job tells flowsched of its end and its
step times is what its declared rule and its own measurements say, never the trace's truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import data_paths
from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.ends import EARLY_STOPPING, declared
from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.policies import make_policy
from benchmarks.sim.variants import build, mark_ends, prepare
from benchmarks.sim.workload import JobSpec
from benchmarks.sim.world import SimWorldBuilder, job_key
from scoring.job_end import rule_state
from scoring.settings import CoreSettings
from scoring.stopping import EndReason
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


def test_an_early_stopping_job_ends_where_its_rule_fires_on_the_curve_it_reported() -> None:
    """The engine stops an "early" job at the evaluation where its declared rule fires on the
    series it reported (replayed here with the core's rule_state), the others at their epochs'
    end; and the core's estimate of each reads the rule the job declared, nothing else."""
    app = next(a for a in PROFILES.apps.values() if a.max_epochs >= 50)
    specs = [JobSpec(f"j{i}", 0.0, app.name, 1, int(app.init_batch_size), end_rule=rule)
             for i, rule in enumerate(("early", "planned", "none", "early"))]
    eng = Engine(specs, PROFILES, make_policy("fifo"), EngineSettings(cluster=ClusterSettings(nodes=1))).run()
    for j in eng.jobs:
        epochs = [k for _, k, _ in j.series]
        assert epochs == list(range(1, epochs[-1] + 1))  # one point an epoch, none after the end
        values = np.array([v for _, _, v in j.series])
        _, _, fired = rule_state(-values if app.metric_increases else values, EARLY_STOPPING)
        if j.spec.end_rule == "early":
            assert 0 <= fired == len(values) - 1 < app.max_epochs - 1  # it stopped at the firing, early
        else:
            assert epochs[-1] == app.max_epochs
    early = [j for j in eng.jobs if j.spec.end_rule == "early"]
    assert len({len(j.series) for j in early}) == 2  # each on its own curve (its own noise)

    tracker = ConvergenceTracker(CoreSettings().convergence)
    reasons = {}
    for j in eng.jobs:  # what the core reads half way through each job's series
        half = np.asarray(j.series[: len(j.series) // 2])
        steps = np.asarray(j.series_steps[: len(j.series) // 2])  # the step each point was posted at
        max_steps, early_stopping = declared(j.spec.end_rule, j.planned_steps)
        est = tracker.update(job_key(j), steps, half[:, 2], half[:, 0], higher_is_better=app.metric_increases,
                             signature=(len(half), float(half[-1, 0])), max_steps=max_steps,
                             early_stopping=early_stopping)
        assert est is not None and est.end is not None
        reasons[j.spec.end_rule] = est.end.reason
    assert reasons == {"early": EndReason.EARLY_STOPPING, "planned": EndReason.PLANNED_END, "none": EndReason.PLATEAU}


@pytest.mark.parametrize(("app_name", "gpus", "batch"), [("deepspeech2", 12, 640), ("cifar10", 12, 4096)])
def test_a_planned_end_posted_in_optimizer_steps_reads_the_true_remaining_time_early(
        app_name: str, gpus: int, batch: int) -> None:
    """A job's step counter advances one step per step time whatever its statistical progress per
    step, and it declares its planned end in those steps, as a real script's max_steps is. On the
    Pollux artifact's profiles, at a batch above the application's initial one (these are rows of
    its workload 2), an epoch of progress takes fewer steps as the gradient noise grows: posted as
    steps, those epochs made a planned end read 2-3.5 times the time left at a tenth of the run."""
    profiles = load_profiles(data_paths.pollux_dir() / "traces")
    app = profiles.apps[app_name]
    spec = JobSpec("j0", 0.0, app_name, gpus, batch, end_rule="planned")
    eng = Engine([spec], profiles, make_policy("fifo"), EngineSettings()).run()
    [j] = eng.jobs
    assert j.completion is not None and len(j.series) == app.max_epochs
    assert j.series_steps == sorted(j.series_steps) and j.planned_steps == pytest.approx(j.series_steps[-1], abs=1.0)
    k = len(j.series) // 10
    pts = np.asarray(j.series[:k])
    truth = j.completion - float(pts[-1, 0])

    def left(steps: np.ndarray, max_steps: float) -> float:
        est = ConvergenceTracker(CoreSettings().convergence).update(
            job_key(j), steps, pts[:, 2], pts[:, 0], higher_is_better=app.metric_increases,
            signature=(k, float(pts[-1, 0])), max_steps=max_steps)
        assert est is not None and est.end is not None and est.end.reason == EndReason.PLANNED_END
        return est.end.remaining_seconds

    assert left(np.asarray(j.series_steps[:k]), j.planned_steps) == pytest.approx(truth, rel=0.05)
    assert left(pts[:, 1], float(app.max_epochs)) > 2.0 * truth  # epochs of progress as steps: why
