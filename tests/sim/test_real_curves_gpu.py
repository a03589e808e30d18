"""The GPU campaign (benchmarks/data/real_curves_gpu: real runs on a lent H200): shipped small and
sourced, its specs gpu_matrix()'s or, for the third sitting's (run ids ending -gpu2), gpu2_matrix()'s
(the plan in steps set on the device), held out from tuning, every answer of the job-end estimator
inside its interval; and the packing of records made before the GPU fields existed."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from benchmarks import job_end_eval
from benchmarks.curves.real_curves import RUN_FIELDS, RealRun, data_dir, gpu_dir, load_runs, on_clock, pack
from benchmarks.curves.train_runs import GPU_FAMILIES, GPU_RULES, gpu2_matrix, gpu_matrix
from tests.sim.shipped_runs import shipped_small_and_sourced

SPEC_FIELDS = ("family", "dataset", "model", "optimizer", "lr", "schedule", "batch_size", "seed", "rule",
               "eval_every", "monitor", "patience", "min_delta", "plan_s", "device")


@pytest.fixture(scope="module")
def runs() -> list[RealRun]:
    return load_runs(gpu_dir())


def test_the_gpu_campaign_is_shipped_small_sourced_and_held_out(runs: list[RealRun]) -> None:
    shipped_small_and_sourced(gpu_dir(), ("Source:", "seed", "Licence:", "torch", "H200", "--matrix gpu", "-w2",
                                          "--matrix gpu2", "4141", "-gpu2"))
    assert len(runs) >= 38  # 21 of the first session, 17 of the third sitting (SOURCE.md)
    assert sum(r.run_id.endswith("-gpu2") for r in runs) >= 17
    assert {r.rule for r in runs} == set(GPU_RULES)
    assert not {r.family for r in runs} & job_end_eval.TUNE_FAMILIES
    assert data_dir("gpu") == gpu_dir()


def test_the_shipped_specs_are_the_gpu_matrix(runs: list[RealRun]) -> None:
    matrix = {s.run_id: {k: str(getattr(s, k)) for k in SPEC_FIELDS} for s in gpu_matrix() + gpu2_matrix()}
    assert {r.family for r in runs} == set(GPU_FAMILIES)
    for r in runs:
        base = r.run_id.removesuffix("-w2")  # the second sitting repeats the matrix's runs (SOURCE.md)
        assert {k: r.spec[k] for k in SPEC_FIELDS} == matrix[base], r.run_id
        assert r.max_steps > 0  # set on the device from plan_s and a timed step
        if r.rule in ("planned", "none"):
            assert r.spec["stopped_by"] == "max_steps" and r.true_end_step == r.max_steps, r.run_id
        elif r.spec["stopped_by"] == "early_stopping":
            assert r.true_end_step < r.max_steps, r.run_id
        else:  # an early-stopping run that never stopped early ends at its cap (gpu_chars_gpt-early_stopping-0-gpu2)
            assert r.spec["stopped_by"] == "max_steps" and r.true_end_step == r.max_steps, r.run_id


def test_every_answer_on_the_gpu_runs_lies_inside_its_interval(runs: list[RealRun]) -> None:
    _, rows = job_end_eval.evaluate([on_clock(r, "wall") for r in runs], {"job_end": job_end_eval.job_end})
    answered = [r for r in rows if math.isfinite(float(str(r["remaining_s"])))]
    assert len(answered) > 0.8 * len(runs) * len(job_end_eval.FRACTIONS)
    for r in answered:
        assert float(str(r["low_s"])) <= float(str(r["remaining_s"])) <= float(str(r["high_s"])), r


def test_pack_fills_the_gpu_fields_of_older_records(tmp_path: Path) -> None:
    """A CPU run recorded before plan_s and device existed packs with their defaults, not a KeyError."""
    spec = {k: v for k, v in {s.run_id: s for s in gpu_matrix()}["gpu_chars_gpt-planned-0-gpu"].__dict__.items()
            if k not in ("plan_s", "device")}
    rec = {"spec": {**spec, "max_steps": 3}, "train": [[1, 0.1, 2.0, 0.1], [2, 0.2, 1.5, 0.2], [3, 0.3, 1.2, 0.3]],
           "evals": [[3, 0.31, 1.4, 1.4, 0.31]], "stopped_by": "max_steps", "true_end_step": 3,
           "true_end_seconds": 0.3, "true_end_cpu_seconds": 0.3}
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.json").write_text(json.dumps(rec))
    pack(tmp_path / "raw", tmp_path / "out")
    with (tmp_path / "out" / "runs.csv").open() as f:
        row = next(csv.DictReader(f))
    assert list(row) == list(RUN_FIELDS)
    assert (row["plan_s"], row["device"]) == ("0.0", "cpu")
    assert load_runs(tmp_path / "out")[0].true_end_step == 3
