"""Candidate (a) for the remaining-steps distribution: a Bayesian average over curve families.

Measured against the learnt model (scoring.remaining) by benchmarks/convergence_eval, which is
how the choice between the two kinds of idea was made; it is not used by the scheduler.

In the spirit of Domhan et al. (IJCAI 2015: a weighted ensemble of parametric learning-curve
families with MCMC over their parameters), made cheap: for each family of scoring.convergence
(inverse, exponential, power law) the shape parameter runs over the same log grid the fits use,
and for each value the scale and asymptote are the weighted least-squares ones (a profile
likelihood instead of sampling them). Every (family, shape) candidate gets the posterior weight
exp(-(sse - sse_best) / (2 * temperature * sigma^2)), sigma^2 the best candidate's weighted
residual variance; `temperature` > 1 widens the posterior for residuals that are correlated
along a curve (chosen on the even LCBench tasks: the interval's coverage there). Each candidate
gives its steps to the plateau (as remaining_steps_to_plateau defines it); the distribution is
the weighted set of those, its median and 10th/90th percentiles, and P(plateau) the weight of
the candidates saying 0.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from scoring.convergence import ConvergenceSettings
from scoring.curve_fit import _GRID_LO_HI, FAMILIES, _basis, _fit_grid, _thin, _weights
from scoring.remaining import RemainingDistribution

FloatArray = npt.NDArray[np.float64]
TEMPERATURE = 4.0  # chosen on the even LCBench tasks (see the module docstring)


def _x_at_gap(family: str, a: FloatArray, theta: FloatArray, gap: FloatArray, shift: float) -> FloatArray:
    with np.errstate(all="ignore"):
        r = gap / a
        if family == "exponential":
            x = -theta * np.log(r)
        elif family == "power":
            x = r ** (-1.0 / theta) - shift
        else:
            x = 1.0 / r - theta
    return np.asarray(np.where(r > 0, x, np.nan), dtype=np.float64)


def _weighted_quantile(v: FloatArray, w: FloatArray, q: float) -> float:
    order = np.argsort(v)
    cw = np.cumsum(w[order])
    i = int(np.searchsorted(cw, q * cw[-1]))
    return float(v[order][min(i, v.size - 1)])


def bayes_remaining(
    steps: FloatArray, norm: FloatArray, settings: ConvergenceSettings, max_steps: float | None = None,
    temperature: float = TEMPERATURE,
) -> RemainingDistribution:
    steps, norm = _thin(steps, norm, settings.fit_max_points)
    if steps.size < 3:
        return RemainingDistribution.unknown()
    step0, span = float(steps[0]), float(steps[-1] - steps[0])
    if not span > 0:
        return RemainingDistribution.unknown()
    x = (steps - step0) / span
    w = _weights(x.size)
    x_end = (max_steps - step0) / span if max_steps is not None else math.inf
    if x_end <= 1.0:
        return RemainingDistribution(0.0, 0.0, 0.0, 1.0)
    lefts: list[FloatArray] = []
    sses: list[FloatArray] = []
    for fam in FAMILIES:
        lo, hi = _GRID_LO_HI[fam]
        thetas = np.geomspace(lo, hi, settings.fit_grid)
        shift = float(np.min(np.diff(x))) if fam == "power" else 0.0
        if fam == "power" and not shift > 0:
            continue
        a, c, sse = _fit_grid(fam, x, norm, w, thetas, shift)
        planned = math.isfinite(x_end)
        g_end = a * _basis(fam, thetas, np.array([x_end]), shift)[:, 0] if planned else np.zeros_like(a)
        total = 1.0 - c - g_end
        xp = np.minimum(_x_at_gap(fam, a, thetas, settings.plateau_rel_tol * total + g_end, shift), x_end)
        left = np.maximum(0.0, xp - 1.0)
        left = np.where(total > 0, left, np.nan)
        lefts.append(np.where(left > settings.max_horizon_factor, settings.max_horizon_factor, left) * span)
        sses.append(sse)
    if not sses:
        return RemainingDistribution.unknown()
    sse_all, left_all = np.concatenate(sses), np.concatenate(lefts)
    ok = np.isfinite(sse_all) & np.isfinite(left_all)
    if not ok.any():
        return RemainingDistribution.unknown()
    sse_ok, left_ok = sse_all[ok], left_all[ok]
    best = float(sse_ok.min())
    sigma2 = max(best / float(w.sum()), 1e-10)
    logw = -(sse_ok - best) / (2.0 * temperature * sigma2)
    wt = np.exp(logw - logw.max())
    p = float(wt[left_ok == 0.0].sum() / wt.sum())
    return RemainingDistribution(
        median=_weighted_quantile(left_ok, wt, 0.5),
        low=_weighted_quantile(left_ok, wt, 0.1),
        high=_weighted_quantile(left_ok, wt, 0.9),
        plateau_probability=p,
    )
