"""The data shipped in benchmarks/data/: present, small, sourced, shaped as the readers expect,
and packaged (so an installed flowsched finds it too)."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import pytest

from benchmarks import data_paths
from benchmarks.openb import read_nodes, read_pods
from benchmarks.sim.jobmodel import load_profiles
from benchmarks.sim.workload import read_workload

DATA = data_paths.SHIPPED
REPO = DATA.parents[1]
MAX_BYTES = 2 * 1024 * 1024
POLLUX_FOLDERS = ("workloads", "workloads-0.5", "workloads-1.5", "workloads-2.0", "workloads-realistic")
MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


def header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def rows(path: Path) -> int:
    with path.open(newline="") as f:
        return sum(1 for _ in f) - 1


def test_every_file_is_small_and_every_folder_names_its_source() -> None:
    files = [p for p in DATA.rglob("*") if p.is_file()]
    assert len(files) > 90
    big = [f"{p.relative_to(DATA)}: {p.stat().st_size} B" for p in files if p.stat().st_size > MAX_BYTES]
    assert not big
    for source in ("pollux", "lcbench", "alibaba-openb"):
        text = (DATA / source / "SOURCE.md").read_text()
        for needed in ("Source:", "commit", "Licence:"):
            assert needed in text, f"{source}/SOURCE.md lacks {needed!r}"


def test_pollux_workloads_and_traces_are_complete() -> None:
    expected_jobs = {"workloads": 160, "workloads-0.5": 80, "workloads-1.5": 240, "workloads-2.0": 320,
                     "workloads-realistic": 160}
    for folder in POLLUX_FOLDERS:
        for w in range(1, 9):
            jobs = read_workload(DATA / "pollux" / folder / f"workload-{w}.csv")
            assert len(jobs) == expected_jobs[folder], (folder, w)
    for model in MODELS:
        d = DATA / "pollux" / "traces" / model
        assert header(d / "placements.csv") == ["placement", "local_bsz", "step_time", "sync_time"]
        assert header(d / "scalability.csv")[:3] == ["num_nodes", "num_replicas", "local_bsz"]
        validations = sorted(d.glob("validation-*.csv"))
        assert len(validations) >= 6
        assert header(validations[0]) == ["progress", "iteration", "metric", "grad_sqr", "grad_var"]
    assert sorted(load_profiles(DATA / "pollux" / "traces").app_objects()) == sorted(MODELS)
    assert not (DATA / "pollux" / "traces" / "philly.csv").exists()  # 3.3 MiB: not shipped (SOURCE.md)


def test_lcbench_and_openb_have_their_documented_shape() -> None:
    curves = DATA / "lcbench" / "curves.csv"
    assert header(curves) == ["task", "curve", "epoch", "time_s", "val_cross_entropy", "val_accuracy"]
    assert rows(curves) == 34 * 30 * 52
    assert len(read_nodes(DATA / "alibaba-openb")) == 1213
    assert rows(DATA / "alibaba-openb" / "openb_pod_list_default.csv") == 8152
    assert all(p.gpus > 0 for p in read_pods(DATA / "alibaba-openb"))


def test_readers_default_to_the_shipped_copy_and_flowsched_data_overrides(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    monkeypatch.delenv(data_paths.ENV, raising=False)
    assert data_paths.pollux_traces() == DATA / "pollux" / "traces"
    assert data_paths.lcbench_curves() == DATA / "lcbench" / "curves.csv"
    monkeypatch.setenv(data_paths.ENV, str(tmp_path))
    assert data_paths.pollux_dir() == tmp_path / "pollux"
    assert data_paths.openb_dir() == tmp_path / "alibaba-openb"


def test_package_data_globs_cover_every_shipped_file() -> None:
    # setuptools copies benchmarks' package data by these globs into a wheel; a file they miss
    # would exist in a clone and be absent from an installed flowsched.
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]["benchmarks"]
    pkg = REPO / "benchmarks"
    covered = {p for g in globs for p in pkg.glob(g) if p.is_file()}
    shipped = {p for p in DATA.rglob("*") if p.is_file()}
    assert shipped - covered == set()
