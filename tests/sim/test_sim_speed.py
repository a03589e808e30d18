"""The simulator's speed-ups change no result: a job's state kept within a round (world_keep.py)
and the round's World kept until an action is carried out give the run a fresh build gives."""

from __future__ import annotations

import pytest

from benchmarks import sim_speed
from benchmarks.data_paths import pollux_traces
from benchmarks.sim.control import SimControl
from benchmarks.sim.engine import EngineSettings
from benchmarks.sim.generator import GeneratorSettings, generate
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.variants import prepare, run_one
from benchmarks.sim.world import SimWorldBuilder

PROFILES = load_profiles(pollux_traces())


def _run() -> tuple[float, int, float]:
    specs = prepare(generate(GeneratorSettings(jobs=40, hours=2.0, seed=5)), PROFILES)
    m, _, v = run_one(specs, PROFILES, "flowsched", 0, EngineSettings(), "keep")
    assert v.control is not None and m.finished == m.jobs
    return m.avg_jct, m.restarts, float(v.control.stats.resizes)


def test_keeping_states_within_a_round_changes_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _run()
    built = 0
    fresh_job = SimWorldBuilder._job

    def always_fresh(self: SimWorldBuilder, engine: object, j: object, now: float) -> object:
        nonlocal built
        built += 1
        return fresh_job(self, engine, j, now)  # type: ignore[arg-type]

    monkeypatch.setattr(SimWorldBuilder, "_kept_job", always_fresh)
    fresh_build = SimWorldBuilder.build
    monkeypatch.setattr(SimControl, "__post_init__", _with_fresh_worlds(SimControl.__post_init__, fresh_build))
    assert _run() == kept
    assert built > 0


def _with_fresh_worlds(post_init: object, fresh_build: object) -> object:
    def init(self: SimControl) -> None:
        post_init(self)  # type: ignore[operator]
        # Drop the round's World after each build: every loop reads the engine afresh.
        builder = self.builder
        control = self

        def build(engine: object, now: float) -> object:
            w = fresh_build(builder, engine, now)  # type: ignore[operator]
            control._world = None
            return w

        object.__setattr__(builder, "build", build)

    return init


def test_sim_speed_prints_the_figures_it_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_speed.main(["--jobs", "30", "--hours", "2"]) == 0
    out = capsys.readouterr().out
    assert "30 jobs, Poisson arrivals over 2 h" in out
    assert "30/30 jobs finished, avg JCT" in out
    assert "engine rounds" in out and "wall " in out and "CPU " in out and "load average" in out


def test_sim_speed_refuses_what_it_cannot_run() -> None:
    with pytest.raises(SystemExit):
        sim_speed.main(["--jobs", "0"])
    with pytest.raises(SystemExit):
        sim_speed.main(["--policy", "flowsched+nothing"])


def test_back_to_back_shifts_each_shipped_workload_by_its_share_of_the_span() -> None:
    folder = pollux_traces().parent / "workloads"
    jobs = sim_speed.back_to_back(folder, "3-4", 16.0)
    assert len(jobs) == 320 and len({j.name for j in jobs}) == 320
    first = [j for j in jobs if j.name.startswith("w3-")]
    second = [j for j in jobs if j.name.startswith("w4-")]
    assert max(j.arrival for j in first) < 8 * 3600 <= min(j.arrival for j in second)
    with pytest.raises(ValueError, match="A-B"):
        sim_speed.back_to_back(folder, "x", 8.0)
    with pytest.raises(ValueError, match="no workload files"):
        sim_speed.back_to_back(folder, "8-9", 8.0)
