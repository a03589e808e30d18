"""The GPU campaign (benchmarks/data/real_curves_gpu: real runs on a lent H200): shipped small and
sourced, its specs gpu_matrix()'s or, for the third and fourth sittings' (run ids ending -gpu2, -gpu3),
gpu2_matrix()'s and gpu3_matrix()'s
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
from benchmarks.curves.train_runs import GPU_FAMILIES, GPU_RULES, gpu2_matrix, gpu3_matrix, gpu_matrix
from tests.sim.shipped_runs import shipped_small_and_sourced

SPEC_FIELDS = ("family", "dataset", "model", "optimizer", "lr", "schedule", "batch_size", "seed", "rule",
               "eval_every", "monitor", "patience", "min_delta", "plan_s", "device")


@pytest.fixture(scope="module")
def runs() -> list[RealRun]:
    return load_runs(gpu_dir())


def test_the_gpu_campaign_is_shipped_small_sourced_and_held_out(runs: list[RealRun]) -> None:
    shipped_small_and_sourced(gpu_dir(), ("Source:", "seed", "Licence:", "torch", "H200", "--matrix gpu", "-w2",
                                          "--matrix gpu2", "4141", "-gpu2", "--matrix gpu3", "4242", "-gpu3"))
    assert len(runs) >= 50  # 21 of the first session, 17 of the third sitting, 12 of the fourth (SOURCE.md)
    assert sum(r.run_id.endswith("-gpu2") for r in runs) >= 17
    assert sum(r.run_id.endswith("-gpu3") for r in runs) >= 12
    assert {r.rule for r in runs} == set(GPU_RULES)
    assert not {r.family for r in runs} & job_end_eval.TUNE_FAMILIES
    assert data_dir("gpu") == gpu_dir()


def test_the_shipped_specs_are_the_gpu_matrix(runs: list[RealRun]) -> None:
    specs = gpu_matrix() + gpu2_matrix() + gpu3_matrix()
    matrix = {s.run_id: {k: str(getattr(s, k)) for k in SPEC_FIELDS} for s in specs}
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


def _record(run_id: str, family: str, steps: int, loss0: float) -> dict[str, object]:
    spec = {**{s.run_id: s for s in gpu_matrix()}["gpu_chars_gpt-planned-0-gpu"].__dict__,
            "run_id": run_id, "family": family, "max_steps": steps}
    train = [[k, 0.01 * k, loss0 / k, 0.01 * k] for k in range(1, steps + 1)]
    return {"spec": spec, "train": train, "evals": [[steps, 0.01 * steps, loss0 / steps, float("nan"), 0.01 * steps]],
            "stopped_by": "max_steps", "true_end_step": steps, "true_end_seconds": 0.01 * steps,
            "true_end_cpu_seconds": 0.01 * steps}


def test_pack_beside_keeps_the_packed_runs_as_packing_all_at_once_would(tmp_path: Path) -> None:
    """A new sitting packed beside runs whose raw records are gone: the files are byte for byte those
    of packing every record at once (pack's order: family, then run id), and a re-packed run replaces
    its old rows instead of doubling them."""
    recs = {"b-1": _record("b-1", "fam_b", 700, 3.0), "a-2": _record("a-2", "fam_a", 5, 2.0),
            "a-1": _record("a-1", "fam_a", 4, 1.0), "b-0": _record("b-0", "fam_b", 3, float("nan"))}
    for name, ids in (("all", list(recs)), ("old", ["a-2", "b-1"]), ("new", ["a-1", "b-0", "b-1"])):
        (tmp_path / name).mkdir()
        for rid in ids:
            (tmp_path / name / f"{rid}.json").write_text(json.dumps(recs[rid]))
    n_all, _ = pack(tmp_path / "all", tmp_path / "at_once")
    pack(tmp_path / "old", tmp_path / "in_parts")
    n_parts, _ = pack(tmp_path / "new", tmp_path / "in_parts", beside=True)
    assert n_all == n_parts == 4
    for f in ("runs.csv", "fam_a.csv", "fam_b.csv"):
        assert (tmp_path / "in_parts" / f).read_bytes() == (tmp_path / "at_once" / f).read_bytes(), f
    assert [r.run_id for r in load_runs(tmp_path / "in_parts")] == ["a-1", "a-2", "b-0", "b-1"]
    assert len(load_runs(tmp_path / "in_parts")[3].train_steps) == 600  # thinned once, not doubled
    pack(tmp_path / "new", tmp_path / "fresh")  # without beside: only the raw records
    assert [r.run_id for r in load_runs(tmp_path / "fresh")] == ["a-1", "b-0", "b-1"]
