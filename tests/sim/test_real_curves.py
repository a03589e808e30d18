"""The shipped real training runs (benchmarks/data/real_curves): every run has its rule and its
true end, the ends agree with replaying each rule on the run's own evaluations, and the
job-end evaluation replays them without looking ahead."""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import job_end_eval
from benchmarks.curves.real_curves import RULES, RealRun, has_cpu_clock, load_runs, on_clock
from benchmarks.curves.stopping import EarlyStopping, early_stop_index, target_index
from tests.sim.shipped_runs import MAX_BYTES, shipped_small_and_sourced

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "real_curves"


@pytest.fixture(scope="module")
def runs() -> list[RealRun]:
    return load_runs(FOLDER)


def test_the_campaign_is_shipped_small_and_sourced(runs: list[RealRun]) -> None:
    sizes = shipped_small_and_sourced(FOLDER, ("Source:", "seed", "Licence:", "torch", "train_runs"))
    assert sum(sizes.values()) < 8 * MAX_BYTES
    assert len(runs) >= 100
    per_family = Counter((r.family, r.rule) for r in runs)
    families = {r.family for r in runs}
    assert len(families) >= 6
    assert all(per_family[(f, rule)] >= 1 for f in families for rule in RULES)  # every family, every rule
    with (FOLDER / "runs.csv").open() as f:
        assert len({row["run_id"] for row in csv.DictReader(f)}) == len(runs)


def test_every_run_has_its_rule_and_true_end(runs: list[RealRun]) -> None:
    for r in runs:
        assert r.rule in RULES, r.run_id
        assert r.true_end_step == int(r.train_steps[-1]), r.run_id  # the last step is always kept
        assert 0 < r.train_seconds[-1] <= r.true_end_seconds, r.run_id
        assert np.all(np.diff(r.train_steps) > 0) and np.all(np.diff(r.train_seconds) >= 0), r.run_id
        assert r.true_end_step <= r.max_steps, r.run_id
        every = int(r.spec["eval_every"])
        assert np.array_equal(r.eval_steps, np.arange(1, r.eval_steps.size + 1) * every), r.run_id
        assert np.all(np.isfinite(r.train_loss)) and np.all(np.isfinite(r.monitored())), r.run_id
        if r.rule in ("planned", "none"):
            assert (r.spec["stopped_by"], r.true_end_step) == ("max_steps", r.max_steps), r.run_id


def test_every_point_carries_both_clocks_each_monotone(runs: list[RealRun]) -> None:
    for r in runs:
        assert has_cpu_clock(r), r.run_id
        for wall, cpu in ((r.train_seconds, r.train_cpu_seconds), (r.eval_seconds, r.eval_cpu_seconds)):
            assert wall.size == cpu.size and np.all(np.isfinite(wall)) and np.all(np.isfinite(cpu)), r.run_id
            assert np.all(np.diff(wall) >= 0) and np.all(np.diff(cpu) >= 0), r.run_id
            # one training thread: its CPU time cannot outrun the wall clock (1 ms: the files' rounding)
            assert np.all(cpu <= wall + 1e-3), r.run_id
        cpu_run = on_clock(r, "cpu")
        assert 0 < cpu_run.train_seconds[-1] <= cpu_run.true_end_seconds <= r.true_end_seconds + 1e-3, r.run_id
        assert cpu_run.train_steps is r.train_steps and cpu_run.val_loss is r.val_loss  # only the seconds change
    assert on_clock(runs[0], "wall") is runs[0]


def test_a_run_without_a_cpu_clock_is_refused_on_it(runs: list[RealRun]) -> None:
    old = replace(runs[0], train_cpu_seconds=np.full_like(runs[0].train_seconds, np.nan))
    with pytest.raises(ValueError, match="no CPU clock"):
        on_clock(old, "cpu")
    with pytest.raises(ValueError, match="clock"):
        on_clock(runs[0], "gpu")


def _replayed_end(r: RealRun) -> tuple[str, int]:
    """The end the run's rule gives on its own evaluations, replayed here."""
    hib = r.higher_is_better
    if r.rule == "early_stopping":
        i = early_stop_index(list(r.monitored()), int(r.spec["patience"]), float(r.spec["min_delta"]), hib)
        return ("early_stopping", int(r.eval_steps[i])) if i is not None else ("max_steps", r.max_steps)
    i = target_index(list(r.monitored()), float(r.spec["target"]), hib)
    return ("target", int(r.eval_steps[i])) if i is not None else ("max_steps", r.max_steps)


def test_early_stopping_and_target_ends_agree_with_replaying_the_rule(runs: list[RealRun]) -> None:
    checked: Counter[tuple[str, str]] = Counter()
    for r in runs:
        if r.rule in ("early_stopping", "target"):
            assert (r.spec["stopped_by"], r.true_end_step) == _replayed_end(r), r.run_id
            checked[(r.rule, r.spec["stopped_by"])] += 1
    assert checked[("early_stopping", "early_stopping")] >= 10  # the rule fired in most runs, not the cap
    assert checked[("target", "target")] >= 10


def test_early_stopping_is_lightnings() -> None:
    # min mode: an evaluation improves only when below best - min_delta; patience misses in a row stop it
    assert early_stop_index([1.0, 0.95, 0.949, 0.9495, 0.96], patience=3, min_delta=0.01,
                            higher_is_better=False) == 4
    assert early_stop_index([1.0, 0.9, 0.8, 0.7], patience=1, min_delta=0.0, higher_is_better=False) is None
    assert early_stop_index([0.5, 0.6, 0.6, 0.6], patience=2, min_delta=0.0, higher_is_better=True) == 3
    with pytest.raises(ValueError):
        EarlyStopping(patience=0, min_delta=0.0, higher_is_better=False)


def test_the_replay_shows_only_what_was_reported_by_then(runs: list[RealRun]) -> None:
    for r in (next(x for x in runs if x.rule == rule) for rule in RULES):
        cut = 0.5 * r.true_end_seconds
        v = job_end_eval.view_at(r, cut)
        assert v.timestamps.size and float(v.timestamps.max()) - job_end_eval.EPOCH <= cut
        assert v.eval_timestamps.size == 0 or float(v.eval_timestamps.max()) - job_end_eval.EPOCH <= cut
        assert (v.max_steps is None) == (r.rule == "none")
        assert (v.patience is not None) == (r.rule == "early_stopping")
        assert (v.target is not None) == (r.rule == "target")


def test_the_eval_asks_the_apis_estimator_three_times_per_run(runs: list[RealRun], capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    picked = [next(x for x in runs if x.rule == "planned"), next(x for x in runs if x.rule == "early_stopping")]
    tallies, rows = job_end_eval.evaluate(picked, {"api": job_end_eval.api})
    assert len(rows) == 6 and {row["fraction"] for row in rows} == set(job_end_eval.FRACTIONS)
    assert all(float(str(row["true_remaining_s"])) > 0 for row in rows)
    assert sum(t.asked for t in tallies.values()) == 6
    assert all(math.isfinite(float(str(row["remaining_s"]))) for row in rows)  # the API answers these
    job_end_eval.main(["--data", str(FOLDER), "--split", "all", "--estimators", "api",
                       "--runs", *[r.run_id for r in picked]])
    out = capsys.readouterr().out
    assert "api         planned" in out and "2 runs" in out and "clock: cpu" in out


def test_the_replay_check_has_teeth(runs: list[RealRun]) -> None:
    # one more evaluation of patience moves the end of the runs the rule stopped: the check above could fail
    moved = 0
    for r in runs:
        if r.spec["stopped_by"] == "early_stopping":
            i = early_stop_index(list(r.monitored()), int(r.spec["patience"]) + 1, float(r.spec["min_delta"]),
                                 r.higher_is_better)
            moved += int(i is None or int(r.eval_steps[i]) != r.true_end_step)
    assert moved >= 10
