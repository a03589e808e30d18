from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.fit_remaining import OUT, boost, render, trees_value
from scoring import remaining_params


def test_quantile_boosting_recovers_the_quantiles_of_a_step() -> None:
    rng = np.random.default_rng(0)
    n = 6000
    z = rng.uniform(0.0, 1.0, n)
    noise = rng.normal(0.0, 1.0, n)
    y = np.where(z > 0.5, 3.0, 0.0) + noise * np.where(z > 0.5, 1.0, 0.2)  # the spread changes at the step
    x = np.column_stack([np.ones(n), z, rng.uniform(0.0, 1.0, n)])  # a constant and a useless column
    w = np.ones(n)
    for tau, z_tau in ((0.1, -1.2816), (0.5, 0.0), (0.9, 1.2816)):
        t = boost(x, y, w, "quantile", tau)
        pred = trees_value(t, x)
        assert np.mean(y <= pred) == pytest.approx(tau, abs=0.03)
        assert np.median(pred[z < 0.45]) == pytest.approx(0.2 * z_tau, abs=0.15)
        assert np.median(pred[z > 0.55]) == pytest.approx(3.0 + z_tau, abs=0.25)
        assert all(t.value(x[i]) == pytest.approx(pred[i]) for i in range(0, n, 500))  # runtime == fit-time


def test_logistic_boosting_separates_and_stays_calibrated() -> None:
    rng = np.random.default_rng(1)
    n = 6000
    z = rng.normal(0.0, 1.0, n)
    t = (rng.uniform(0.0, 1.0, n) < 1.0 / (1.0 + np.exp(-(0.5 + 2.0 * z)))).astype(float)
    trees = boost(np.column_stack([z]), t, np.ones(n), "logistic")
    p = 1.0 / (1.0 + np.exp(-trees_value(trees, np.column_stack([z]))))
    assert np.mean(p) == pytest.approx(np.mean(t), abs=0.02)
    assert np.mean(t[p > 0.8]) > 0.8 and np.mean(t[p < 0.2]) < 0.2


def test_rendered_parameters_read_back_equal() -> None:
    models = {"OPEN_END": remaining_params.OPEN_END, "PLANNED_END": remaining_params.PLANNED_END}
    back = remaining_params.parse(render(models, "a note\non two lines"))  # the generated file is JSON
    assert back.note == "a note\non two lines"
    assert back.models["OPEN_END"] == remaining_params.OPEN_END
    assert back.models["PLANNED_END"] == remaining_params.PLANNED_END
    for name, model in models.items():  # to the bit, not only ==
        for old, new in zip((*model.quantile_trees, model.plateau_trees),
                            (*back.models[name].quantile_trees, back.models[name].plateau_trees), strict=True):
            assert [float(v).hex() for v in (old.base, *old.threshold, *old.leaf)] == \
                   [v.hex() for v in (new.base, *new.threshold, *new.leaf)]


def test_the_shipped_file_is_what_the_script_writes() -> None:
    # the shipped data file is fit_remaining's output as it stands: rendering what it holds gives it back byte for byte
    # (a hand edit, or a change to render() without regenerating, shows here)
    shipped = remaining_params.load()
    assert render(dict(shipped.models), shipped.note) == remaining_params.DATA_FILE.read_text(encoding="utf-8")
    assert "even-numbered OpenML tasks of lcbench/curves.csv" in shipped.note


def test_the_default_output_is_the_shipped_data_file() -> None:
    assert OUT.parts[-3:] == ("scoring", "data", "remaining_params.json")
    assert Path(str(remaining_params.DATA_FILE)) == OUT
