"""The curve families of a training curve and what a fit says: where it levels off, when it
reaches a value (scoring.convergence's remaining steps, scoring.remaining's distribution,
scoring.job_end's sampled futures).

Each family is l(x) = c + a * g(x) on the normalised curve (0..1, lower is better) over x =
(step - step0) / span: Optimus' inverse 1/(x + b), an exponential exp(-x / b) and a power law
(x + shift)^-b. The shape parameter b is scanned over a geometric grid (coarse, then fine
around the best), with (a, c) by weighted least squares at each, the recent points weighing
most. Pure: numpy and arithmetic only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

Family = Literal["inverse", "exponential", "power"]
FAMILIES: tuple[Family, ...] = ("inverse", "exponential", "power")
_GRID_LO_HI = {  # shape parameter range per family, in units of the observed span
    "inverse": (1e-3, 1e2),  # theta = shift s in A / (x + s)
    "exponential": (1e-2, 1e2),  # theta = time constant tau in A * exp(-x / tau)
    "power": (5e-2, 4.0),  # theta = exponent p in A * (x + x0)^-p, x0 = one step
}


@dataclass(frozen=True)
class CurveFit:
    """l(x) = c + a * g(x) in normalised units, x = (step - step0) / step_span, g decreasing to 0.

    family "inverse": g = 1/(x + b) (Optimus' 1/(b0*x + b1) + c with b0 = 1/a, b1 = b/a);
    "exponential": g = exp(-x / b); "power": g = (x + shift)^-b, shift = one step in x units.
    """

    a: float
    b: float
    c: float
    step0: float
    step_span: float
    rmse: float
    family: str = "inverse"
    shift: float = 0.0

    def predict(self, steps: FloatArray) -> FloatArray:
        x = (np.asarray(steps, dtype=np.float64) - self.step0) / self.step_span
        with np.errstate(all="ignore"):
            out: FloatArray = self.c + self.a * _basis(self.family, np.array([self.b]), x, self.shift)[0]
        return out

    def value_at(self, step: float) -> float:
        """predict() at one step, in scalar arithmetic (NaN where predict() is not finite)."""
        x = (step - self.step0) / self.step_span
        try:
            if self.family == "exponential":
                g = math.exp(-x / self.b)
            elif self.family == "power":
                g = (x + self.shift) ** (-self.b) if x + self.shift > 0 else math.nan
            else:
                g = 1.0 / (x + self.b)
        except (OverflowError, ZeroDivisionError):
            return math.nan
        v = self.c + self.a * g
        return v if isinstance(v, float) and math.isfinite(v) else math.nan

    def x_at_gap(self, gap: float) -> float:
        """The x at which a * g(x) = gap (> 0); inf or NaN when never."""
        with np.errstate(all="ignore"):
            r = gap / self.a
            if not r > 0:
                return math.nan
            if self.family == "exponential":
                return -self.b * math.log(r)
            if self.family == "power":
                return float(r ** (-1.0 / self.b)) - self.shift
            return 1.0 / r - self.b


def _basis(family: str, theta: FloatArray, x: FloatArray, shift: float) -> FloatArray:
    t, xx = theta[:, None], x[None, :]
    with np.errstate(all="ignore"):
        if family == "exponential":
            return np.asarray(np.exp(-xx / t), dtype=np.float64)
        if family == "power":
            return np.asarray((xx + shift) ** (-t), dtype=np.float64)
        return np.asarray(1.0 / (xx + t), dtype=np.float64)


def _grid(family: str, size: int) -> FloatArray:
    lo, hi = _GRID_LO_HI[family]
    return np.asarray(np.geomspace(lo, hi, max(2, size)), dtype=np.float64)


def _fit_grid(
    family: str, x: FloatArray, y: FloatArray, w: FloatArray, thetas: FloatArray, shift: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Weighted least squares of y ~ c + a * g(x; theta) for every theta: (a, c, sse).

    Candidates whose fit does not decrease (a <= 0) or is degenerate get sse = inf."""
    g = _basis(family, thetas, x, shift)
    sw, sy = float(w.sum()), float((w * y).sum())
    with np.errstate(all="ignore"):
        wg = w[None, :] * g
        sg, sgg, sgy = wg.sum(1), (wg * g).sum(1), (wg * y[None, :]).sum(1)
        det = sw * sgg - sg * sg
        a = (sw * sgy - sg * sy) / det
        c = (sy - a * sg) / sw
        resid = y[None, :] - c[:, None] - a[:, None] * g
        sse = (w[None, :] * resid * resid).sum(1)
    ok = (a > 0) & (det > 1e-12 * sw * sgg) & np.isfinite(sse) & np.isfinite(c)
    return a, c, np.where(ok, sse, np.inf)


def _weights(n: int) -> FloatArray:
    """A linear ramp favouring recent points, which matter most for what comes next."""
    return np.arange(1, n + 1, dtype=np.float64) / n


def _family_bases(families: tuple[str, ...], thetas: FloatArray, x: FloatArray, logx: FloatArray) -> FloatArray:
    """_basis of every family's row of candidates (thetas: families x candidates) at x:
    families x candidates x points. The power law as exp(-p log(x + shift)) (same values; logx is
    log(x + shift)), so that its rows and the exponential's take one exp. Call under
    np.errstate(all="ignore")."""
    out = np.empty((len(families), thetas.shape[1], x.size))
    exp_rows = []
    for i, fam in enumerate(families):
        if fam == "exponential":
            np.multiply.outer(-1.0 / thetas[i], x, out=out[i])
            exp_rows.append(i)
        elif fam == "power":
            np.multiply.outer(-thetas[i], logx, out=out[i])
            exp_rows.append(i)
        else:
            np.divide(1.0, np.add.outer(thetas[i], x), out=out[i])
    if exp_rows:
        lo, hi = exp_rows[0], exp_rows[-1] + 1
        if hi - lo == len(exp_rows):  # contiguous (the usual family order): one exp
            np.exp(out[lo:hi], out=out[lo:hi])
        else:
            for i in exp_rows:
                np.exp(out[i], out=out[i])
    return out


def _solve_grid(g: FloatArray, sums: tuple[float, float, float], wy2: FloatArray,
                w: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """_fit_grid on a precomputed basis (candidates x points): (a, c, weighted sse), sse inf where
    the fit does not decrease or is degenerate. sums: (sum w, sum w y, sum w y^2); wy2: the
    columns w and w y. The sse from the normal equations (sum w y^2 - c sum w y - a sum w g y),
    not from the residuals: one pass less over the matrix. Call under np.errstate(all="ignore")."""
    sw, sy, syy = sums
    sg, sgy = (g @ wy2).T
    sgg = (g * g) @ w
    det = sw * sgg - sg * sg
    a = (sw * sgy - sg * sy) / det
    c = (sy - a * sg) / sw
    sse = syy - c * sy - a * sgy
    ok = (a > 0) & (det > 1e-12 * sw * sgg) & np.isfinite(sse)  # c NaN or inf: sse is too
    return a, c, np.where(ok, np.maximum(sse, 0.0), np.inf)


@functools.lru_cache(maxsize=32)
def _coarse_grid(families: tuple[str, ...], size: int) -> FloatArray:
    grid = np.vstack([_grid(fam, size) for fam in families])
    grid.flags.writeable = False
    return grid


@functools.lru_cache(maxsize=32)
def _unit_steps(size: int) -> FloatArray:
    u = np.linspace(0.0, 1.0, size)
    u.flags.writeable = False
    return u


def _fit_many(families: tuple[str, ...], steps: FloatArray, norm: FloatArray, grid: int) -> list[CurveFit]:
    """fit_family for several families at once, in family order (those that fit): each pass
    evaluates every family's candidates in one array (the per-call numpy overhead, not the
    arithmetic, is most of a fit's cost at a few hundred points)."""
    for fam in families:
        if fam not in _GRID_LO_HI:
            raise ValueError(f"unknown curve family {fam!r}; one of {FAMILIES}")
    if steps.size < 3:
        return []
    step0, span = float(steps[0]), float(steps[-1] - steps[0])
    if not span > 0 or not math.isfinite(span):
        return []
    x = (steps - step0) / span
    shift = float(np.min(x[1:] - x[:-1]))
    if not shift > 0:  # the power law needs one step of offset
        families = tuple(f for f in families if f != "power")
    if not families:
        return []
    w = _weights(x.size)
    wy = w * norm
    sums = (float(w.sum()), float(wy.sum()), float(wy @ norm))
    wy2 = np.stack((w, wy), axis=1)
    m, m2 = max(4, grid // 2), max(3, grid // 2)
    coarse = _coarse_grid(families, m)
    f_count = len(families)
    with np.errstate(all="ignore"):
        logx = np.log(x + shift) if "power" in families else x
        g1 = _family_bases(families, coarse, x, logx).reshape(f_count * m, x.size)
        a1, c1, sse1 = (v.reshape(f_count, m) for v in _solve_grid(g1, sums, wy2, w))
        i = np.argmin(sse1, axis=1)
        best1 = sse1[np.arange(f_count), i].tolist()
        live = [math.isfinite(v) for v in best1]
        if not any(live):
            return []
        # second pass: a finer geometric grid between the best coarse candidate's neighbours
        lo = coarse[np.arange(f_count), np.maximum(i - 1, 0)]
        hi = coarse[np.arange(f_count), np.minimum(i + 1, m - 1)]
        fine = np.exp(np.log(lo)[:, None] + np.log(hi / lo)[:, None] * _unit_steps(m2)[None, :])
        fine[:, 0], fine[:, -1] = lo, hi
        g2 = _family_bases(families, fine, x, logx).reshape(f_count * m2, x.size)
        a2, c2, sse2 = _solve_grid(g2, sums, wy2, w)
    out: list[CurveFit] = []
    for k, fam in enumerate(families):
        if not live[k]:
            continue
        i1 = k * m + int(i[k])
        j = k * m2 + int(np.argmin(sse2[k * m2:(k + 1) * m2]))
        if sse2[j] <= best1[k]:
            th, aa, cc, basis = float(fine.flat[j]), float(a2[j]), float(c2[j]), g2[j]
        else:
            th, aa, cc, basis = float(coarse.flat[i1]), float(a1.flat[i1]), float(c1.flat[i1]), g1[i1]
        resid = cc + aa * basis - norm
        rmse = math.sqrt(float(resid @ resid) / norm.size)
        out.append(CurveFit(a=aa, b=th, c=cc, step0=step0, step_span=span, rmse=rmse, family=fam,
                            shift=shift if fam == "power" else 0.0))
    return out


def fit_family(family: str, steps: FloatArray, norm: FloatArray, grid: int = 48) -> CurveFit | None:
    """Least-squares fit of norm ~ c + a * g(x) for one family (see CurveFit), a > 0.

    The shape parameter is scanned over a fixed grid (in units of the observed span); for each
    the model is linear in (a, c). Weighted towards recent points."""
    fits = _fit_many((family,), steps, norm, grid)
    return fits[0] if fits else None


def fit_inverse_curve(steps: FloatArray, norm: FloatArray, grid: int = 48) -> CurveFit | None:
    """Optimus' l = 1/(b0*x + b1) + c (family "inverse"); see fit_family."""
    return fit_family("inverse", steps, norm, grid)


def _thin(steps: FloatArray, norm: FloatArray, max_points: int) -> tuple[FloatArray, FloatArray]:
    """At most max_points points: means over consecutive equal-count bins (cheap fits)."""
    n = steps.size
    if max_points < 3 or n <= max_points:
        return steps, norm
    edges = np.arange(max_points, dtype=np.int64) * n // max_points  # distinct, as n > max_points
    counts = np.concatenate((edges[1:], [n])) - edges
    return (np.add.reduceat(steps, edges) / counts, np.add.reduceat(norm, edges) / counts)


def fit_families(
    steps: FloatArray, norm: FloatArray, grid: int = 48, families: tuple[str, ...] = FAMILIES,
    max_points: int = 256,
) -> list[CurveFit]:
    """Every family that fits (see fit_family), on at most max_points binned points."""
    steps, norm = _thin(steps, norm, max_points)
    order = {f.family: f for f in _fit_many(tuple(families), steps, norm, grid)}
    return [order[fam] for fam in families if fam in order]


def ensemble_remaining_steps(
    fits: list[CurveFit], tol: float, max_horizon_factor: float, points: int,
    max_steps: float | None = None, rmse_ratio: float = 3.0, rmse_floor: float = 0.002,
) -> float:
    """Geometric mean of the families' remaining steps (see remaining_steps_to_plateau).

    The plateau time is ill-conditioned: the exponential's asymptote tends to sit too close
    (it says "done" too early), the inverse's and power law's too far. Averaging the
    logarithms (of remaining + one mean step, so that 0 counts) balances them; on the
    even-numbered LCBench tasks this beat picking one family by held-out error on the latest
    quarter of the history (benchmarks/convergence_eval). Families fitting clearly worse
    than the best (rmse > rmse_ratio x best + rmse_floor) do not vote, so a clean curve of
    one family is predicted by that family. Families without a prediction
    within the horizon are left out; NaN when none has one."""
    if not fits:
        return math.nan
    best = min(f.rmse for f in fits)
    fits = [f for f in fits if f.rmse <= rmse_ratio * best + rmse_floor]
    r = np.array([remaining_steps_to_plateau(f, tol, max_horizon_factor, max_steps) for f in fits])
    ok = np.isfinite(r)
    if not ok.any():
        return math.nan
    if not np.any(r[ok] > 0):
        return 0.0  # every voter is at the plateau: exactly 0, not a rounding residue
    unit = fits[0].step_span / max(1, points - 1)  # one mean step
    mean = float(np.exp(np.mean(np.log(r[ok] + unit)))) - unit
    return max(0.0, mean) if math.isfinite(mean) else math.nan


def remaining_steps_to_plateau(
    fit: CurveFit, tol: float, max_horizon_factor: float, max_steps: float | None = None
) -> float:
    """Steps from the last observed step to the plateau of the fitted curve.

    The plateau is defined as the offline evaluation defines it on a whole curve: the first
    point whose remaining improvement (to the final value) is at most tol x the total
    improvement (the worst observed point, 1 after normalisation, to the final value). The
    final value is the asymptote, or the fitted value at max_steps when the job has a planned
    end; the plateau is never after max_steps. NaN when it lies beyond max_horizon_factor x
    the observed span."""
    x_end = math.inf
    g_end = 0.0
    if max_steps is not None and math.isfinite(max_steps):
        if max_steps <= fit.step0 + fit.step_span:  # at or past the planned end
            return 0.0
        x_end = (max_steps - fit.step0) / fit.step_span
        g_end = fit.value_at(max_steps) - fit.c
        if not (math.isfinite(g_end) and g_end >= 0):
            return math.nan
    total = 1.0 - fit.c - g_end
    if not (total > 0 and tol > 0):
        return math.nan
    x_plateau = min(fit.x_at_gap(tol * total + g_end), x_end)
    left = max(0.0, x_plateau - 1.0)  # x = 1 is the last observed step
    if not math.isfinite(left) or left > max_horizon_factor:
        return math.nan
    return left * fit.step_span


def target_steps_left(fit: CurveFit, norm_target: float, last_norm: float) -> float:
    """Steps from the last observed step until the fitted curve reaches norm_target (normalised,
    lower is better): 0 when the smoothed last value is there already, inf when the fit's
    asymptote never gets there."""
    if last_norm <= norm_target:
        return 0.0
    gap = norm_target - fit.c
    if not gap > 0:
        return math.inf
    x = fit.x_at_gap(gap)
    if not math.isfinite(x):
        return math.inf
    return max(0.0, x - 1.0) * fit.step_span
