from __future__ import annotations

import types

import numpy as np
import pytest

from benchmarks.fit_remaining import boost, render, trees_value
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
    module = types.ModuleType("rendered")
    exec(render(models, "note"), module.__dict__)  # the generated file is plain Python
    assert module.OPEN_END == remaining_params.OPEN_END and module.PLANNED_END == remaining_params.PLANNED_END
