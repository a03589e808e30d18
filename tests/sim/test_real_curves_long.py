"""The second, third and fourth real-run campaigns (benchmarks/data/real_curves_long: runs of one to
five CPU minutes) and the fifth (early-stopping runs of the tuning families, packed with them): shipped
small and sourced, their specs the long, long3, long4 and tune5 matrices', every answer of the job-end
estimator inside its interval on every run; and the packing round trip."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import job_end_eval
from benchmarks.curves.real_curves import (
    MAX_TRAIN_POINTS,
    RULES,
    RealRun,
    data_dir,
    load_runs,
    long_dir,
    on_clock,
    pack,
)
from benchmarks.curves.train_runs import (
    LONG_FAMILIES,
    TUNE5_SHORT_FAMILIES,
    long3_matrix,
    long4_matrix,
    long_matrix,
    run_matrix,
    tune5_matrix,
)
from tests.sim.shipped_runs import shipped_small_and_sourced

SPEC_FIELDS = ("family", "dataset", "model", "optimizer", "lr", "schedule", "batch_size", "seed", "rule", "max_steps",
               "eval_every", "monitor", "patience", "min_delta")


@pytest.fixture(scope="module")
def runs() -> list[RealRun]:
    return load_runs(long_dir())


def _as_cells(spec: dict[str, Any]) -> dict[str, str]:
    return {k: str(spec[k]) for k in SPEC_FIELDS}


def test_the_long_campaign_is_shipped_small_sourced_and_long(runs: list[RealRun]) -> None:
    shipped_small_and_sourced(long_dir(), ("Source:", "seed", "Licence:", "torch", "--matrix long", "--matrix long3",
                                           "--matrix long4", "--matrix tune5"))
    assert len(runs) >= 140  # 48 of the second campaign, 72 of the third, the fourth's (SOURCE.md)
    minutes = [r for r in runs if 60.0 <= on_clock(r, "cpu").true_end_seconds <= 300.0]
    assert len(minutes) >= 100  # issue 35: about a hundred runs of 1-5 minutes
    assert {r.rule for r in runs} == set(RULES)
    assert {r.family for r in runs} - job_end_eval.TUNE_FAMILIES, "no held-out family"
    cpu_end = np.array([on_clock(r, "cpu").true_end_seconds for r in runs])
    assert cpu_end.max() <= 330.0  # minutes: one early-stopping run of the fourth campaign took 315 s
    planned = [on_clock(r, "cpu").true_end_seconds for r in runs if r.rule in ("planned", "none")]
    assert min(planned) >= 45.0 and float(np.median(cpu_end)) >= 45.0  # minutes, not the short set's seconds
    assert data_dir("long") == long_dir() and data_dir("short").name == "real_curves"


def test_the_shipped_specs_are_the_matrices(runs: list[RealRun]) -> None:
    """Every campaign reproduces from the script: the long runs are long_matrix()'s, long3_matrix()'s,
    long4_matrix()'s and tune5_matrix()'s, and the short matrix still makes the shipped short runs (adding the others
    changed none of its seeds)."""
    long_specs = {s.run_id: _as_cells(s.__dict__) for s in (*long_matrix(), *long3_matrix(), *long4_matrix(),
                                                                        *tune5_matrix())}
    for r in runs:
        assert {k: r.spec[k] for k in SPEC_FIELDS} == long_specs[r.run_id], r.run_id
    assert {r.family for r in runs} <= set(LONG_FAMILIES) | set(TUNE5_SHORT_FAMILIES)
    assert {r.run_id for r in runs} == set(long_specs)  # every campaign complete
    tuning = {r.family for r in runs if r.run_id.endswith("-tune5")}
    assert tuning <= job_end_eval.TUNE_FAMILIES  # the fifth campaign is tuning data only
    with (data_dir("short") / "runs.csv").open() as f:
        shipped = {row["run_id"]: {k: row[k] for k in SPEC_FIELDS} for row in csv.DictReader(f)}
    short_specs = {s.run_id: _as_cells(s.__dict__) for s in run_matrix()}
    assert shipped == short_specs


def test_every_answer_on_the_long_runs_lies_inside_its_interval(runs: list[RealRun]) -> None:
    _, rows = job_end_eval.evaluate([on_clock(r, "cpu") for r in runs], {"job_end": job_end_eval.job_end})
    assert len(rows) > 0.9 * len(runs) * len(job_end_eval.FRACTIONS)
    answered = [r for r in rows if math.isfinite(float(str(r["remaining_s"])))]
    assert len(answered) > 0.9 * len(rows)  # `none` may leave a plateau beyond its horizon unanswered
    for r in answered:
        assert float(str(r["low_s"])) <= float(str(r["remaining_s"])) <= float(str(r["high_s"])), r


def _raw_run(run_id: str, steps: int, every: int, rule: str) -> dict[str, Any]:
    spec = {"run_id": run_id, "family": "fam_a" if run_id.endswith("a") else "fam_b", "dataset": "d", "model": "m",
            "optimizer": "adam", "lr": 0.001, "schedule": "constant", "batch_size": 8, "seed": 7, "rule": rule,
            "max_steps": steps, "eval_every": every, "monitor": "val_loss", "higher_is_better": False,
            "patience": 0, "min_delta": 0.0, "target": math.nan}
    train = [[s, round(0.02 * s, 4), round(2.0 / s, 5), round(0.015 * s, 4)] for s in range(1, steps + 1)]
    evals = [[s, round(0.02 * s + 0.001, 4), round(1.0 / s, 5), round(0.5 + s / (4 * steps), 5),
              round(0.015 * s + 0.001, 4)] for s in range(every, steps + 1, every)]
    return {"spec": spec, "train": train, "evals": evals, "stopped_by": "max_steps", "true_end_step": steps,
            "true_end_seconds": round(0.02 * steps + 0.01, 4), "true_end_cpu_seconds": round(0.015 * steps + 0.01, 4)}


def test_packing_round_trips_and_thins(tmp_path: Path) -> None:
    raw, dest = tmp_path / "raw", tmp_path / "packed"
    raw.mkdir()
    records = [_raw_run("r1a", 2500, 100, "planned"), _raw_run("r2b", 300, 50, "none")]
    for rec in records:
        (raw / f"{rec['spec']['run_id']}.json").write_text(json.dumps(rec))
    n, sizes = pack(raw, dest)
    assert n == 2 and set(sizes) == {"runs.csv", "fam_a.csv", "fam_b.csv"}
    back = {r.run_id: r for r in load_runs(dest)}
    for rec in records:
        r, steps = back[rec["spec"]["run_id"]], rec["true_end_step"]
        assert r.rule == rec["spec"]["rule"] and r.max_steps == steps and r.true_end_step == steps
        assert r.true_end_seconds == rec["true_end_seconds"]
        assert on_clock(r, "cpu").true_end_seconds == rec["true_end_cpu_seconds"]
        kept = min(steps, MAX_TRAIN_POINTS)
        assert r.train_steps.size == kept and r.train_steps[0] == 1 and r.train_steps[-1] == steps
        assert np.all(np.diff(r.train_steps) > 0)
        i = r.train_steps.astype(int) - 1  # each kept point is the raw step's, all four columns
        raw_train = np.array(rec["train"])
        assert np.array_equal(r.train_seconds, raw_train[i, 1]) and np.array_equal(r.train_loss, raw_train[i, 2])
        assert np.array_equal(r.train_cpu_seconds, raw_train[i, 3])
        raw_evals = np.array(rec["evals"])  # every evaluation kept
        assert np.array_equal(r.eval_steps, raw_evals[:, 0]) and np.array_equal(r.val_loss, raw_evals[:, 2])
        assert np.array_equal(r.val_metric, raw_evals[:, 3]) and np.array_equal(r.eval_cpu_seconds, raw_evals[:, 4])
    assert math.isnan(float(back["r1a"].spec["target"] or "nan"))
