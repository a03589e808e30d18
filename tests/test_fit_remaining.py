from __future__ import annotations

import types

import numpy as np
import pytest

from benchmarks.fit_remaining import logistic_regression, quantile_regression, render
from scoring import remaining_params


def test_quantile_regression_recovers_the_quantiles_of_a_linear_model() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    z = rng.uniform(0.0, 1.0, n)
    y = 1.0 + 2.0 * z + rng.normal(0.0, 1.0, n) * (0.2 + 0.5 * z)  # spread grows with z
    x = np.column_stack([np.ones(n), z])
    w = np.ones(n)
    for tau, z90 in ((0.1, -1.2816), (0.5, 0.0), (0.9, 1.2816)):
        beta = quantile_regression(x, y, w, tau)
        assert beta[0] == pytest.approx(1.0 + 0.2 * z90, abs=0.06)
        assert beta[1] == pytest.approx(2.0 + 0.5 * z90, abs=0.1)
        assert np.mean(y <= x @ beta) == pytest.approx(tau, abs=0.02)


def test_logistic_regression_recovers_a_known_slope() -> None:
    rng = np.random.default_rng(1)
    n = 6000
    z = rng.normal(0.0, 1.0, n)
    t = (rng.uniform(0.0, 1.0, n) < 1.0 / (1.0 + np.exp(-(0.5 + 2.0 * z)))).astype(float)
    beta = logistic_regression(np.column_stack([np.ones(n), z]), t, np.ones(n), ridge=0.0)
    assert beta == pytest.approx([0.5, 2.0], abs=0.15)


def test_rendered_parameters_read_back_equal() -> None:
    models = {"OPEN_END": remaining_params.OPEN_END, "PLANNED_END": remaining_params.PLANNED_END}
    module = types.ModuleType("rendered")
    exec(render(models, "note"), module.__dict__)  # the generated file is plain Python
    assert module.OPEN_END == remaining_params.OPEN_END and module.PLANNED_END == remaining_params.PLANNED_END
