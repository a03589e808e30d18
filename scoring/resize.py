"""FlowCon's elastic configuration of co-located jobs, as CPU requests for in-place resize.

Pure: numpy and dataclasses. One call plans one node: one row per opted-in pod (its resized
container), everything in millicores.

FlowCon (ICPP'19, the authors' `algo_1`) sets each container's CPU *limit* as a share of the
host: growing containers get r = G_c / ΣG (at most the whole host), completing ones
max(r, 1/(βN)) (here: never more than they have), watching ones keep theirs, and when every
container is completing all get the whole host (equal shares under CFS). Docker limits are
caps that may overcommit; Kubernetes requests are reservations that must fit the node. So
here the shares are of the node's *pool* (allocatable CPU minus what the pods outside the plan
request, minus headroom) and the plan is projected onto what Kubernetes allows:

- every row stays in its bounds: never below `lo` (its cpu-min, and what it started with
  unless it opted in to shrink) when lowered, never above `hi` (cpu-max) when raised;
- the rows' requests never sum above the pool when anything is raised (a raise the node
  cannot hold would only sit as PodResizePending/Infeasible);
- rows without evidence (phase UNKNOWN or WATCHING, or all G unknown/zero) keep what they have;
- a change smaller than max(min_step_m, hysteresis x current) is not made, and a row resized
  less than cooldown_s ago is left alone, so limits do not oscillate on noise.

Which rows are flexible when the pool is short: raises of growing rows shrink first
(proportionally above their floors), then the lowered/equal rows' targets, and if even the
floors do not fit, nothing is raised and only decreases are made.

The settings (beta, min_step_m, hysteresis, cooldown_s, min_cpu_m) are the resizer loop's own,
scoring.settings.ResizerLoopSettings: the planner has none of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from scoring.convergence import Phase
from scoring.settings import ResizerLoopSettings

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class Why(IntEnum):
    """Per-row reason for the planned value (for Events and metrics)."""

    NO_EVIDENCE = 0  # watching / unknown phase, or no usable growth efficiency: unchanged
    GROWING = 1  # share raised (or lowered) to G_c / ΣG of the pool
    COMPLETING = 2  # share lowered to max(G_c / ΣG, 1 / (βN)) of the pool
    ALL_COMPLETING = 3  # every row completing: equal shares
    SMALL_STEP = 4  # target within min step / hysteresis of the current value: unchanged
    COOLDOWN = 5  # resized too recently: unchanged
    NO_ROOM = 6  # a raise the pool could not hold (after the decreases): unchanged or smaller


@dataclass(frozen=True)
class NodeRows:
    """One row per opted-in pod on the node (its resized container)."""

    pool_m: float  # CPU the rows share: allocatable - requests of pods outside the plan - headroom
    current_m: FloatArray  # the container's CPU request now
    original_m: FloatArray  # its request when the pod started
    growth: FloatArray  # FlowCon's G = P / u; NaN unknown
    phase: IntArray  # scoring.convergence.Phase values
    min_m: FloatArray  # flowsched.io/cpu-min (0 when absent)
    max_m: FloatArray  # flowsched.io/cpu-max (inf when absent)
    may_shrink: BoolArray  # flowsched.io/cpu-shrink: "true" -> may go below original_m
    since_resize_s: FloatArray  # seconds since flowsched last resized it (inf = never)

    @staticmethod
    def build(
        pool_m: float,
        current_m: npt.ArrayLike,
        growth: npt.ArrayLike,
        phase: npt.ArrayLike,
        *,
        original_m: npt.ArrayLike | None = None,
        min_m: npt.ArrayLike | None = None,
        max_m: npt.ArrayLike | None = None,
        may_shrink: npt.ArrayLike | None = None,
        since_resize_s: npt.ArrayLike | None = None,
    ) -> NodeRows:
        cur = np.asarray(current_m, dtype=np.float64).reshape(-1)
        n = cur.size

        def col(a: npt.ArrayLike | None, fill: float) -> FloatArray:
            out = np.full(n, fill) if a is None else np.asarray(a, dtype=np.float64).reshape(-1)
            if out.size != n:
                raise ValueError(f"column of {out.size} rows for {n} pods")
            return out

        shrink = np.zeros(n, dtype=bool) if may_shrink is None else np.asarray(may_shrink, dtype=bool).reshape(-1)
        ph = np.asarray(phase, dtype=np.int64).reshape(-1)
        if shrink.size != n or ph.size != n:
            raise ValueError("phase / may_shrink differ in length from current_m")
        return NodeRows(
            pool_m=float(pool_m), current_m=cur, original_m=col(original_m, np.nan), growth=col(growth, np.nan),
            phase=ph, min_m=col(min_m, 0.0), max_m=col(max_m, np.inf), may_shrink=shrink,
            since_resize_s=col(since_resize_s, np.inf),
        )


@dataclass(frozen=True)
class NodePlan:
    current_m: FloatArray
    target_m: FloatArray  # FlowCon's share of the pool, clipped to the row's bounds
    new_m: FloatArray  # what to apply: equals current_m where unchanged
    changed: BoolArray
    why: IntArray  # Why values
    lo_m: FloatArray  # the bounds used
    hi_m: FloatArray

    @property
    def increases(self) -> BoolArray:
        out: BoolArray = self.changed & (self.new_m > self.current_m)
        return out

    @property
    def decreases(self) -> BoolArray:
        out: BoolArray = self.changed & (self.new_m < self.current_m)
        return out


def bounds(rows: NodeRows, s: ResizerLoopSettings) -> tuple[FloatArray, FloatArray]:
    """(lo, hi) per row. lo: cpu-min, and the original request unless the pod may shrink
    (a row whose original is unknown counts its current request as original). hi: cpu-max,
    never below lo (a floor wins over a contradicting cap)."""
    orig = np.where(np.isfinite(rows.original_m), rows.original_m, rows.current_m)
    lo = np.maximum(np.maximum(rows.min_m, s.min_cpu_m), np.where(rows.may_shrink, 0.0, orig))
    hi = np.maximum(np.where(np.isnan(rows.max_m), np.inf, rows.max_m), lo)
    return lo, hi


def flowcon_targets(rows: NodeRows, s: ResizerLoopSettings) -> tuple[FloatArray, IntArray]:
    """FlowCon's shares of the pool (before bounds and fitting) and the reason per row."""
    n = rows.current_m.size
    phase = rows.phase
    growing = phase == Phase.GROWING
    completing = phase == Phase.COMPLETING
    g = np.where(np.isfinite(rows.growth) & (rows.growth > 0), rows.growth, 0.0)
    target = rows.current_m.copy()
    why = np.full(n, int(Why.NO_EVIDENCE), dtype=np.int64)
    if n == 0:
        return target, why
    if bool(completing.all()):
        target[:] = rows.pool_m / n
        why[:] = Why.ALL_COMPLETING
        return target, why
    gsum = float(g.sum())
    if not gsum > 0:  # FlowCon stops when the growth sum is 0: nothing to split by
        return target, why
    r = g / gsum
    target = np.where(growing, np.minimum(r, 1.0) * rows.pool_m, target)
    # Completing rows are only ever lowered (FlowCon's max() could raise one whose limit is
    # already below its floor share; DESIGN §5 lowers completing containers).
    completing_share = np.maximum(r, 1.0 / (s.beta * n)) * rows.pool_m
    target = np.where(completing, np.minimum(completing_share, rows.current_m), target)
    why = np.where(growing, int(Why.GROWING), why)
    why = np.where(completing, int(Why.COMPLETING), why)
    return target, why


def _shrink_excess(x: FloatArray, floor: FloatArray, mask: BoolArray, over: float) -> tuple[FloatArray, float]:
    """Lower the masked rows of x toward floor, proportionally to their excess, by up to `over`."""
    excess = np.where(mask, np.maximum(x - floor, 0.0), 0.0)
    total = float(excess.sum())
    if over <= 0 or total <= 0:
        return x, over
    theta = max(0.0, 1.0 - over / total)
    return np.where(mask, floor + theta * excess, x), max(0.0, over - total)


def plan_node(rows: NodeRows, s: ResizerLoopSettings | None = None) -> NodePlan:
    s = s or ResizerLoopSettings()
    cur = rows.current_m
    lo, hi = bounds(rows, s)
    raw, why = flowcon_targets(rows, s)
    # Bounds: a decrease stops at lo (or where it already is, if below), an increase at hi.
    target = np.clip(raw, np.minimum(lo, cur), hi)
    cooling = rows.since_resize_s < s.cooldown_s
    frozen = (why == Why.NO_EVIDENCE) | cooling
    x = np.where(frozen, cur, target)

    # Fit the pool: growing raises give way first, then the other planned rows; if even the
    # floors do not fit, nothing is raised at all.
    floor = np.where(frozen, cur, np.minimum(cur, lo))
    over = float(x.sum()) - rows.pool_m
    if over > 0:
        x, over = _shrink_excess(x, np.maximum(floor, np.minimum(cur, x)), ~frozen & (why == Why.GROWING), over)
    if over > 0:
        x, over = _shrink_excess(x, floor, ~frozen, over)
    if over > 0:
        x = np.minimum(x, cur)
    no_room = ~frozen & (x < target - 1e-9) & (target > cur)

    # Hysteresis / minimum step: small moves are not made.
    step = np.maximum(s.min_step_m, s.hysteresis * cur)
    small = ~frozen & (np.abs(x - cur) < step)
    x = np.where(small, cur, x)
    # Suppressed decreases may have eaten the room raises counted on: scale raises back.
    inc = np.maximum(x - cur, 0.0)
    if inc.sum() > 0:
        room = rows.pool_m - float(np.minimum(x, cur).sum())
        factor = min(1.0, max(0.0, room / float(inc.sum())))
        if factor < 1.0:
            x = np.where(inc > 0, cur + factor * inc, x)
            no_room |= inc > 0
            dropped = (inc > 0) & (factor * inc < step)
            x = np.where(dropped, cur, x)

    # Whole millicores, rounded toward the current value (never past a bound or the pool).
    x = np.where(x > cur, np.floor(x + 1e-9), np.where(x < cur, np.ceil(x - 1e-9), x))
    # Decreases rounded up can leave the raises up to a millicore per row over the pool: the
    # largest raises give it back (a raise left under the step is not made).
    over = float(x.sum()) - rows.pool_m
    for i in np.argsort(cur - x):  # largest raise first
        if over <= 1e-9 or x[i] <= cur[i]:
            break
        take = min(float(np.ceil(over - 1e-9)), float(x[i] - cur[i]))
        x[i] -= take
        over -= take
        if x[i] - cur[i] < step[i]:
            over -= float(x[i] - cur[i])
            x[i] = cur[i]
    changed = x != cur
    why = np.where(cooling & (why != Why.NO_EVIDENCE), int(Why.COOLDOWN), why)
    unchanged_planned = ~frozen & ~changed
    why = np.where(unchanged_planned, np.where(no_room & (target > cur), int(Why.NO_ROOM), int(Why.SMALL_STEP)), why)
    return NodePlan(current_m=cur.copy(), target_m=target, new_m=x, changed=changed, why=why.astype(np.int64),
                    lo_m=lo, hi_m=hi)


def growth_efficiency(progress: npt.ArrayLike, current_m: npt.ArrayLike, pool_m: float) -> FloatArray:
    """FlowCon's G = P / u with u the row's share of the pool (its request / pool); NaN where
    P is unknown or the share is not positive."""
    p = np.asarray(progress, dtype=np.float64)
    u = np.asarray(current_m, dtype=np.float64) / pool_m if pool_m > 0 else np.full(p.shape, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where((u > 0) & np.isfinite(p), np.maximum(p, 0.0) / u, np.nan)
    return np.asarray(g, dtype=np.float64)
