"""scoring.resize: FlowCon's reallocation rule projected onto what Kubernetes allows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.convergence import Phase
from scoring.resize import NodeRows, Why, bounds, flowcon_targets, growth_efficiency, plan_node
from scoring.settings import ResizerLoopSettings

G, W, C, U = Phase.GROWING, Phase.WATCHING, Phase.COMPLETING, Phase.UNKNOWN
NO_DAMPING = ResizerLoopSettings(min_step_m=1.0, hysteresis=0.0, cooldown_s=0.0)


def test_flowcon_shares_growing_by_ratio_completing_floored() -> None:
    # 4 rows, pool 40 cores: G = 3, 1 (growing), 0 (completing), 0 (completing), beta 2.
    rows = NodeRows.build(40_000, [10_000] * 4, [3.0, 1.0, 0.0, 0.0], [G, G, C, C], may_shrink=[True] * 4)
    target, why = flowcon_targets(rows, ResizerLoopSettings(beta=2.0))
    np.testing.assert_allclose(target, [30_000, 10_000, 5_000, 5_000])  # 3/4, 1/4, 1/(2*4), 1/(2*4)
    assert list(why) == [Why.GROWING, Why.GROWING, Why.COMPLETING, Why.COMPLETING]


def test_plateaued_goes_down_fast_goes_up_and_the_pool_is_respected() -> None:
    rows = NodeRows.build(16_000, [8_000, 8_000], [2.0, 0.01], [G, C], may_shrink=[False, True])
    plan = plan_node(rows, NO_DAMPING)
    assert plan.new_m[1] < 8_000 < plan.new_m[0]
    assert plan.new_m.sum() <= 16_000
    # completing floor is 1/(beta N) = 1/4 of the pool; the fast one gets the rest.
    np.testing.assert_allclose(plan.new_m, [12_000, 4_000])
    assert list(plan.why) == [Why.GROWING, Why.COMPLETING]
    assert list(plan.increases) == [True, False] and list(plan.decreases) == [False, True]


def test_never_below_the_start_without_shrink_opt_in() -> None:
    rows = NodeRows.build(16_000, [8_000, 8_000], [2.0, 0.01], [G, C], original_m=[8_000, 8_000])
    plan = plan_node(rows, NO_DAMPING)
    # The completing pod may not shrink below its start, so there is no room to grow into.
    np.testing.assert_array_equal(plan.new_m, [8_000, 8_000])
    assert plan.why[0] == Why.NO_ROOM


def test_a_pod_raised_before_may_come_back_down_to_its_start_only() -> None:
    rows = NodeRows.build(32_000, [20_000, 4_000], [0.001, 1.0], [C, G], original_m=[8_000, 4_000])
    plan = plan_node(rows, NO_DAMPING)
    assert plan.new_m[0] == 8_000  # floor = its start (1/(2*2) of 32 cores would be 8 too; raise beta)
    rows = NodeRows.build(32_000, [20_000, 4_000], [0.001, 1.0], [C, G], original_m=[10_000, 4_000])
    plan = plan_node(rows, ResizerLoopSettings(beta=8.0, min_step_m=1, hysteresis=0, cooldown_s=0))
    assert plan.new_m[0] == 10_000 and plan.new_m[1] == 22_000


def test_cpu_min_and_cpu_max_bound_the_plan() -> None:
    rows = NodeRows.build(64_000, [8_000, 8_000], [5.0, 0.0], [G, C], min_m=[0, 6_000], max_m=[12_000, np.inf],
                          may_shrink=[True, True])
    s = ResizerLoopSettings(beta=8.0, min_step_m=1, hysteresis=0, cooldown_s=0)
    plan = plan_node(rows, s)
    # Growing: all of the pool by G, capped by cpu-max. Completing: 1/(8*2) of 64 = 4 cores,
    # held up by cpu-min.
    np.testing.assert_array_equal(plan.new_m, [12_000, 6_000])
    lo, hi = bounds(rows, s)
    np.testing.assert_array_equal(lo, [100, 6_000])
    np.testing.assert_array_equal(hi, [12_000, np.inf])


def test_completing_rows_are_never_raised() -> None:
    # FlowCon's floor share (1/(2*2) of 64 = 16 cores) is above this row's 8: it stays at 8.
    rows = NodeRows.build(64_000, [8_000, 8_000], [5.0, 0.0], [G, C], may_shrink=[True, True])
    plan = plan_node(rows, NO_DAMPING)
    assert plan.new_m[1] == 8_000 and plan.new_m[0] > 8_000


def test_contradicting_bounds_let_the_floor_win() -> None:
    rows = NodeRows.build(64_000, [8_000], [1.0], [G], min_m=[10_000], max_m=[9_000])
    lo, hi = bounds(rows, NO_DAMPING)
    assert lo[0] == hi[0] == 10_000


def test_all_completing_gives_equal_shares() -> None:
    rows = NodeRows.build(30_000, [20_000, 5_000, 5_000], [0.0, 0.0, 0.0], [C, C, C], may_shrink=[True] * 3)
    plan = plan_node(rows, NO_DAMPING)
    np.testing.assert_array_equal(plan.new_m, [10_000, 10_000, 10_000])
    assert set(plan.why) == {Why.ALL_COMPLETING}


def test_watching_and_unknown_rows_are_never_touched() -> None:
    rows = NodeRows.build(40_000, [5_000, 5_000, 5_000, 5_000], [4.0, 0.0, 9.0, np.nan], [G, C, W, U],
                          may_shrink=[True] * 4)
    plan = plan_node(rows, NO_DAMPING)
    assert plan.new_m[2] == 5_000 and plan.new_m[3] == 5_000
    assert plan.why[2] == plan.why[3] == Why.NO_EVIDENCE
    assert plan.new_m[0] > 5_000


def test_no_growth_evidence_means_no_change() -> None:
    rows = NodeRows.build(40_000, [5_000, 5_000], [np.nan, 0.0], [G, C], may_shrink=[True, True])
    plan = plan_node(rows, NO_DAMPING)
    assert not plan.changed.any()


def test_small_steps_and_hysteresis_hold_the_value() -> None:
    # Target 8.3 cores from 8: 300 m is under 10 % of 8 cores -> held.
    rows = NodeRows.build(16_600, [8_000, 8_000], [1.0, 1.0], [G, G])
    plan = plan_node(rows, ResizerLoopSettings(min_step_m=100, hysteresis=0.10, cooldown_s=0))
    assert not plan.changed.any()
    assert set(plan.why) == {Why.SMALL_STEP}
    plan = plan_node(rows, ResizerLoopSettings(min_step_m=100, hysteresis=0.0, cooldown_s=0))
    np.testing.assert_array_equal(plan.new_m, [8_300, 8_300])


def test_hysteresis_stops_oscillation_between_rounds() -> None:
    # Apply the plan, let G jitter by a few percent, replan: nothing moves the second time.
    rng = np.random.default_rng(1)
    s = ResizerLoopSettings(min_step_m=100, hysteresis=0.10, cooldown_s=0)
    cur = np.array([6_000.0, 6_000.0, 6_000.0])
    g = np.array([3.0, 2.0, 1.0])
    cur = plan_node(NodeRows.build(24_000, cur, g, [G, G, G]), s).new_m
    moves = 0
    for _ in range(20):
        jitter = g * (1 + rng.uniform(-0.05, 0.05, 3))
        plan = plan_node(NodeRows.build(24_000, cur, jitter, [G, G, G]), s)
        moves += int(plan.changed.sum())
        cur = plan.new_m
    assert moves == 0


def test_cooldown_freezes_recently_resized_rows() -> None:
    rows = NodeRows.build(16_000, [8_000, 8_000], [2.0, 0.01], [G, C], may_shrink=[True, True],
                          since_resize_s=[30.0, np.inf])
    plan = plan_node(rows, ResizerLoopSettings(min_step_m=1, hysteresis=0, cooldown_s=60))
    assert plan.new_m[0] == 8_000 and plan.why[0] == Why.COOLDOWN
    assert plan.new_m[1] == 4_000  # the other one still moves


def test_a_suppressed_decrease_takes_the_room_back_from_raises() -> None:
    # The completing row would drop by 50 m (under the step), so the growing row may only take
    # the pool's actual free room.
    rows = NodeRows.build(10_000, [5_000, 4_050], [1.0, 0.0], [G, C], may_shrink=[True, True])
    plan = plan_node(rows, ResizerLoopSettings(beta=1.25, min_step_m=100, hysteresis=0.0, cooldown_s=0))
    # Target 4 cores (1/(1.25*2) of 10): a 50 m drop, under the step, so it stays at 4.05.
    assert plan.new_m[1] == 4_050
    assert plan.new_m[0] == 5_950 and plan.why[0] == Why.GROWING
    assert plan.new_m.sum() <= 10_000


def test_growth_efficiency_is_progress_per_share() -> None:
    g = growth_efficiency([0.1, 0.1, np.nan, 0.2], [4_000, 8_000, 4_000, 0.0], 16_000)
    np.testing.assert_allclose(g[:2], [0.4, 0.2])
    assert np.isnan(g[2]) and np.isnan(g[3])


def test_empty_node() -> None:
    plan = plan_node(NodeRows.build(16_000, [], [], []))
    assert plan.new_m.size == 0 and not plan.changed.any()


phases = st.sampled_from([G, W, C, U])


@st.composite
def node_rows(draw: st.DrawFn) -> NodeRows:
    n = draw(st.integers(1, 8))
    cur = draw(st.lists(st.integers(100, 16_000), min_size=n, max_size=n))
    orig = [c if draw(st.booleans()) else draw(st.integers(100, 16_000)) for c in cur]
    growth = draw(st.lists(st.one_of(st.just(float("nan")), st.floats(0, 50)), min_size=n, max_size=n))
    ph = draw(st.lists(phases, min_size=n, max_size=n))
    mins = draw(st.lists(st.sampled_from([0, 500, 4_000]), min_size=n, max_size=n))
    maxs = draw(st.lists(st.sampled_from([np.inf, 6_000, 20_000]), min_size=n, max_size=n))
    shrink = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    since = draw(st.lists(st.sampled_from([np.inf, 10.0, 500.0]), min_size=n, max_size=n))
    pool = draw(st.integers(0, 80_000))
    return NodeRows.build(pool, cur, growth, ph, original_m=orig, min_m=mins, max_m=maxs, may_shrink=shrink,
                          since_resize_s=since)


@settings(max_examples=300, deadline=None)
@given(node_rows(), st.floats(1.0, 8.0), st.sampled_from([1.0, 100.0]), st.sampled_from([0.0, 0.1]))
def test_plan_invariants(rows: NodeRows, beta: float, step: float, hyst: float) -> None:
    s = ResizerLoopSettings(beta=beta, min_step_m=step, hysteresis=hyst, cooldown_s=60.0)
    plan = plan_node(rows, s)
    cur, new = rows.current_m, plan.new_m
    lo, hi = plan.lo_m, plan.hi_m
    moved = new != cur
    # Holds: no evidence or cooling down -> untouched.
    held = (rows.phase == W) | (rows.phase == U) | (rows.since_resize_s < 60.0)
    held &= ~((rows.phase == C).all() & (rows.since_resize_s >= 60.0))
    assert not (moved & held).any()
    # Bounds: never lowered below lo, never raised above hi.
    assert not (moved & (new < cur) & (new < lo - 1e-9)).any()
    assert not (moved & (new > cur) & (new > hi + 1e-9)).any()
    # Any raise fits the pool.
    if (new > cur).any():
        assert new.sum() <= rows.pool_m + 1e-6
    # Every move clears the step.
    need = np.maximum(step, hyst * cur)
    assert (np.abs(new - cur)[moved] >= need[moved] - 1.0).all()
    # Whole millicores.
    assert (new[moved] == np.round(new[moved])).all()
