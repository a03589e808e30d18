"""scoring.migration on arrays built directly: every rule, the benefit test, hysteresis, greed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.convergence import Phase
from scoring.migration import Demands, JobArrays, Why, place, plan_migrations
from scoring.settings import MigratorLoopSettings

S = MigratorLoopSettings(min_runtime_s=600, max_migrations=2, cooldown_s=1800, min_remaining_s=300,
                         require_room_elsewhere=True, max_per_interval=1)


def jobs(gpus_on: Any, **over: Any) -> JobArrays:
    g = np.asarray(gpus_on, dtype=np.float64)
    j = g.shape[0]
    base: dict[str, Any] = {
        "opted_in": np.ones(j, bool), "allowed": np.ones(j, bool), "running": np.ones(j, bool),
        "runtime_s": np.full(j, 3600.0), "phase": np.full(j, int(Phase.COMPLETING), np.int64),
        "growth": np.full(j, 0.01), "remaining_s": np.full(j, 3000.0),
        "migrations": np.zeros(j, np.int64), "since_migration_s": np.full(j, np.inf), "gpus_on": g,
        "attained_gpu_s": None,
    }
    for k, v in over.items():
        base[k] = np.asarray(v, dtype=np.float64 if base[k] is None else base[k].dtype)
    return JobArrays(**base)


# Three nodes of 4 GPUs. Node 0: job 0 (2 GPUs, slow) + 2 free. Node 1 full (job 1). Node 2: 2 free.
# A pending 4-GPU pod fits nowhere; evicting job 0 frees node 0 for it, and job 0 fits on node 2.
GPUS = [[2, 0, 0], [0, 4, 0]]
FREE = [2.0, 0.0, 2.0]
PENDING = Demands.pending([4])


def test_slow_checkpointable_job_is_moved_for_a_pending_pod() -> None:
    plan = plan_migrations(jobs(GPUS, phase=[Phase.COMPLETING, Phase.GROWING]), FREE, PENDING, S)
    assert plan.jobs == [0]
    m = plan.moves[0]
    assert m.benefit_gpus == 4 and m.freed_gpus == 2 and m.served == (0,) and m.relocation == (2,)
    assert plan.why[1] == Why.NOT_SLOW
    assert plan.unmet_before == (0,)


@pytest.mark.parametrize(("over", "why"), [
    ({"opted_in": [False, False]}, Why.NOT_OPTED_IN),
    ({"allowed": [False, True]}, Why.NAMESPACE_OPT_OUT),
    ({"running": [False, True]}, Why.NOT_RUNNING),
    ({"runtime_s": [599.0, 3600.0]}, Why.TOO_YOUNG),
    ({"runtime_s": [np.nan, 3600.0]}, Why.TOO_YOUNG),
    ({"phase": [Phase.WATCHING, Phase.GROWING]}, Why.NOT_SLOW),
    ({"phase": [Phase.UNKNOWN, Phase.GROWING]}, Why.NOT_SLOW),
    ({"migrations": [2, 0]}, Why.TOO_MANY_MOVES),
    ({"since_migration_s": [1799.0, np.inf]}, Why.COOLDOWN),
    ({"remaining_s": [299.0, 3000.0]}, Why.ALMOST_DONE),
])
def test_each_rule_blocks_the_move(over: dict[str, Any], why: Why) -> None:
    over.setdefault("phase", [Phase.COMPLETING, Phase.GROWING])
    plan = plan_migrations(jobs(GPUS, **over), FREE, PENDING, S)
    assert plan.jobs == []
    assert plan.why[0] == why


def test_not_opted_in_is_never_chosen_even_when_it_would_help_most() -> None:
    # Job 1 (not opted in) frees a whole node; job 0 (opted in) frees only what is needed.
    plan = plan_migrations(jobs([[2, 0, 0], [0, 4, 0]], opted_in=[True, False]), [2.0, 0.0, 2.0],
                           Demands.pending([4]), S)
    assert plan.jobs == [0] and plan.why[1] == Why.NOT_OPTED_IN


def test_unknown_remaining_time_does_not_block() -> None:
    plan = plan_migrations(jobs(GPUS, remaining_s=[np.nan, np.nan], phase=[3, 1]), FREE, PENDING, S)
    assert plan.jobs == [0]


def test_no_benefit_no_move() -> None:
    # Nothing pending.
    plan = plan_migrations(jobs(GPUS), FREE, Demands.pending([]), S)
    assert plan.jobs == [] and plan.why[0] == Why.NO_BENEFIT
    # The pending pod fits already (2 GPUs on node 0 or 2).
    plan = plan_migrations(jobs(GPUS), FREE, Demands.pending([2]), S)
    assert plan.jobs == [] and plan.why[0] == Why.NO_BENEFIT
    # Freeing job 0 is not enough for an 8-GPU pod.
    plan = plan_migrations(jobs(GPUS, phase=[3, 1]), FREE, Demands.pending([8]), S)
    assert plan.jobs == [] and plan.why[0] == Why.NO_BENEFIT


def test_room_elsewhere_required_unless_disabled() -> None:
    free = [2.0, 0.0, 0.0]  # after the move job 0 would have nowhere to go
    plan = plan_migrations(jobs(GPUS, phase=[3, 1]), free, PENDING, S)
    assert plan.jobs == [] and plan.why[0] == Why.NO_ROOM_ELSEWHERE
    loose = replace(S, require_room_elsewhere=False)
    plan = plan_migrations(jobs(GPUS, phase=[3, 1]), free, PENDING, loose)
    assert plan.jobs == [0] and plan.moves[0].relocation == (-1,)


def test_job_is_not_relocated_onto_its_origin_node() -> None:
    # Node 0 has 6 free besides job 0's 2: the pending 4 fits there anyway, so no move. Make the
    # pending pod 8 so it needs all of node 0; job 0 must then go to node 2, never node 0.
    g = [[2, 0, 0], [0, 8, 0]]
    plan = plan_migrations(jobs(g, phase=[3, 1]), [6.0, 0.0, 2.0], Demands.pending([8]), S)
    assert plan.jobs == [0] and plan.moves[0].relocation == (2,)


def test_greedy_prefers_benefit_then_slowest_growth_and_respects_max_moves() -> None:
    # Two slow jobs on nodes 0 and 1, each freeing its node for one of two pending 4-GPU pods.
    g = [[3, 0, 0, 0], [0, 3, 0, 0]]
    free = [1.0, 1.0, 3.0, 3.0]
    pending = Demands.pending([4, 4])
    j = jobs(g, growth=[0.02, 0.001])
    plan = plan_migrations(j, free, pending, S)
    assert plan.jobs == [1]  # slower growth first
    assert plan.why[0] == Why.MOVE_LIMIT
    plan = plan_migrations(j, free, pending, S, max_moves=2)
    assert plan.jobs == [1, 0]
    assert sorted(plan.moves[0].relocation + plan.moves[1].relocation) == [2, 3]


def test_second_move_only_if_still_useful() -> None:
    g = [[2, 0, 0, 0], [0, 2, 0, 0]]
    plan = plan_migrations(jobs(g), [2.0, 2.0, 2.0, 2.0], Demands.pending([4]), S, max_moves=2)
    assert len(plan.jobs) == 1
    other = 1 - plan.jobs[0]
    assert plan.why[other] == Why.NO_BENEFIT


def test_node_bound_demand_only_counts_on_its_node() -> None:
    # A growing job on node 1 wants 2 more GPUs there: freeing node 0 does not help it.
    g = [[2, 0, 0], [0, 2, 0]]
    d = Demands(np.array([4.0]), np.array([1], dtype=np.int64))
    plan = plan_migrations(jobs(g, phase=[3, 1]), [2.0, 2.0, 4.0], d, S)
    assert plan.jobs == [] and plan.why[0] == Why.NO_BENEFIT


def test_a_demand_counts_only_the_gpus_freed_on_nodes_it_may_take() -> None:
    # Node 0 a V100, node 1 a K80, each full with a slow job; the 4-GPU pod waiting binds only to
    # the V100. The K80 job grows slower (it would go first), but freeing it serves nothing.
    g = [[4, 0], [0, 4]]
    loose = replace(S, require_room_elsewhere=False)
    d = Demands.pending([4], allowed=[[True, False]])
    plan = plan_migrations(jobs(g, growth=[0.01, 0.001]), [0.0, 0.0], d, loose)
    assert plan.jobs == [0] and plan.why[1] == Why.NO_BENEFIT
    assert plan_migrations(jobs(g, growth=[0.01, 0.001]), [0.0, 0.0], Demands.pending([4]), loose).jobs == [1]
    # What fits now is placed on its own nodes too: a free K80 does not meet it.
    plan = plan_migrations(jobs([[4, 0]]), [0.0, 4.0], d, loose)
    assert plan.unmet_before == (0,) and plan.jobs == [0]
    with pytest.raises(ValueError, match="allowed"):
        plan_migrations(jobs(g), [0.0, 0.0], Demands.pending([4], allowed=[[True, False, True]]), loose)


def test_multi_node_job_frees_every_node() -> None:
    g = [[2, 2, 0, 0, 0], [0, 0, 4, 0, 0]]
    # Pending 4 and 4: nodes 0 and 1 have 2 free each and job 0, spread over both, holds the rest.
    plan = plan_migrations(jobs(g, phase=[3, 1]), [2.0, 2.0, 0.0, 2.0, 2.0], Demands.pending([4, 4]), S)
    # Freed, nodes 0 and 1 take both pending pods; job 0's chunks (2, 2) land on nodes 3 and 4.
    assert plan.jobs == [0] and plan.moves[0].benefit_gpus == 8 and plan.moves[0].relocation == (3, 4)


def test_overcommitted_node_credits_only_the_gpus_that_will_exist() -> None:
    # Node 0's allocatable fell to 4 while job 0 holds 8 there (free -4). Evicting it leaves 4
    # GPUs, not 8: a waiting 6-GPU pod still fits nowhere, so there is no move.
    loose = replace(S, require_room_elsewhere=False)
    plan = plan_migrations(jobs([[8.0]]), [-4.0], Demands.pending([6]), loose)
    assert plan.jobs == [] and plan.why[0] == Why.NO_BENEFIT
    # A 4-GPU pod does fit what is left: that move is still made.
    assert plan_migrations(jobs([[8.0]]), [-4.0], Demands.pending([4]), loose).jobs == [0]


def test_overcommit_stays_after_an_eviction_for_the_next_candidate() -> None:
    # Node 0: allocatable 6, jobs 0 and 1 hold 4 each (free -2); 2- and 6-GPU pods wait. Evicting
    # one job leaves 2 GPUs (the 2-GPU pod's); evicting both leaves 6, of which the 2-GPU pod took
    # 2: the 6-GPU pod cannot start, so the shortfall must not be forgotten for the second move.
    plan = plan_migrations(jobs([[4.0], [4.0]]), [-2.0], Demands.pending([2, 6]),
                           replace(S, require_room_elsewhere=False), max_moves=2)
    assert len(plan.jobs) == 1 and plan.moves[0].served == (0,) and plan.moves[0].benefit_gpus == 2


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="gpus_on"):
        plan_migrations(jobs(GPUS), [1.0, 2.0], PENDING, S)


def test_place_best_fit() -> None:
    where, left = place(np.array([4.0, 2.0, 8.0]), np.array([2.0, 3.0, 9.0]), np.full(3, -1, dtype=np.int64))
    assert where.tolist() == [1, 0, -1] and left.tolist() == [1.0, 0.0, 8.0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_invariants_on_random_clusters(n_jobs: int, n_nodes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 3, size=(n_jobs, n_nodes)).astype(float)
    j = jobs(g.tolist(), opted_in=rng.random(n_jobs) < 0.6, phase=rng.integers(0, 4, n_jobs),
             runtime_s=rng.uniform(0, 2000, n_jobs), migrations=rng.integers(0, 3, n_jobs))
    free = rng.integers(0, 4, n_nodes).astype(float)
    d = Demands.pending(rng.integers(1, 6, rng.integers(0, 4)).astype(float))
    plan = plan_migrations(j, free, d, S, max_moves=3)
    chosen = plan.jobs
    assert len(chosen) == len(set(chosen)) <= 3
    for m in plan.moves:
        k = m.job
        assert j.opted_in[k] and j.phase[k] == Phase.COMPLETING and j.runtime_s[k] >= 600 and j.migrations[k] < 2
        assert m.benefit_gpus > 0 and set(m.served) <= set(plan.unmet_before)
        assert all(r >= 0 and g[k, r] == 0 for r in m.relocation)
    assert all(plan.why[k] != Why.CHOSEN for k in range(n_jobs) if k not in chosen)
    served = [x for m in plan.moves for x in m.served]
    assert len(served) == len(set(served))


# ---- order="attained": least attained service through eviction ----
LAS = MigratorLoopSettings(min_runtime_s=600, max_migrations=2, cooldown_s=1800, min_remaining_s=300,
                           require_room_elsewhere=False, max_per_interval=1, order="attained",
                           wait_threshold_s=600.0, min_attained_gpu_s=3600.0)
# Two full nodes: job 0 (4 GPUs, 10 GPU-h) on node 0, job 1 (4 GPUs, 40 GPU-h) on node 1.
FULL = [[4, 0], [0, 4]]


def test_attained_evicts_the_most_served_slow_job_for_a_long_waiting_pod() -> None:
    plan = plan_migrations(jobs(FULL, attained_gpu_s=[10 * 3600.0, 40 * 3600.0]), [0.0, 0.0],
                           Demands.pending([2], wait_s=[900.0]), LAS)
    assert plan.jobs == [1]
    assert plan.moves[0].served == (0,) and plan.moves[0].relocation == (-1,)  # it requeues
    # The default order would have taken job 0 (equal benefit, then index).
    default = plan_migrations(jobs(FULL, attained_gpu_s=[10 * 3600.0, 40 * 3600.0]), [0.0, 0.0],
                              Demands.pending([2], wait_s=[900.0]),
                              replace(LAS, order="benefit"))
    assert default.jobs == [0]


def test_attained_waits_for_the_threshold() -> None:
    plan = plan_migrations(jobs(FULL, attained_gpu_s=[10 * 3600.0, 40 * 3600.0]), [0.0, 0.0],
                           Demands.pending([2], wait_s=[599.0]), LAS)
    assert plan.jobs == [] and plan.unmet_before == ()
    assert set(plan.why.tolist()) == {Why.NO_BENEFIT}
    unknown = plan_migrations(jobs(FULL, attained_gpu_s=[10 * 3600.0, 40 * 3600.0]), [0.0, 0.0],
                              Demands.pending([2], wait_s=[np.nan]), LAS)
    assert unknown.jobs == []


def test_attained_counts_only_long_waiting_demands_as_benefit() -> None:
    # A young 4-GPU pod ahead of an old 2-GPU one: only the old one calls for a move.
    plan = plan_migrations(jobs(FULL, attained_gpu_s=[20 * 3600.0, 40 * 3600.0]), [0.0, 0.0],
                           Demands.pending([4, 2], wait_s=[10.0, 1200.0]), LAS)
    assert plan.jobs == [1] and plan.moves[0].served == (1,) and plan.moves[0].benefit_gpus == 2


def test_attained_needs_minimum_service_and_a_slow_phase() -> None:
    low = plan_migrations(jobs(FULL, attained_gpu_s=[3599.0, np.nan]), [0.0, 0.0],
                          Demands.pending([2], wait_s=[900.0]), LAS)
    assert low.jobs == [] and list(low.why) == [Why.LOW_SERVICE, Why.LOW_SERVICE]
    growing = plan_migrations(jobs(FULL, attained_gpu_s=[10 * 3600.0, 40 * 3600.0],
                                   phase=[Phase.COMPLETING, Phase.GROWING]), [0.0, 0.0],
                              Demands.pending([2], wait_s=[900.0]), LAS)
    assert growing.jobs == [0] and growing.why[1] == Why.NOT_SLOW
    no_att = plan_migrations(jobs(FULL), [0.0, 0.0], Demands.pending([2], wait_s=[900.0]), LAS)
    assert no_att.jobs == []


def test_attained_respects_hysteresis_and_caps() -> None:
    att = [10 * 3600.0, 40 * 3600.0]
    d = Demands.pending([2], wait_s=[900.0])
    assert plan_migrations(jobs(FULL, attained_gpu_s=att, migrations=[0, 2]), [0.0, 0.0], d, LAS).jobs == [0]
    assert plan_migrations(jobs(FULL, attained_gpu_s=att, since_migration_s=[np.inf, 60.0]),
                           [0.0, 0.0], d, LAS).jobs == [0]
    two = plan_migrations(jobs(FULL, attained_gpu_s=att), [0.0, 0.0], Demands.pending([4, 4], wait_s=[900, 900]),
                          LAS, max_moves=2)
    assert two.jobs == [1, 0]


def test_attained_order_needs_wait_times_and_a_known_order() -> None:
    with pytest.raises(ValueError):
        plan_migrations(jobs(FULL, attained_gpu_s=[1e5, 1e5]), [0.0, 0.0], Demands.pending([2]), LAS)
    with pytest.raises(ValueError):
        plan_migrations(jobs(FULL), [0.0, 0.0], Demands.pending([2]), replace(LAS, order="fastest"))


def test_default_order_ignores_wait_and_service() -> None:
    # The same inputs with the default settings behave as before the option existed.
    plain = plan_migrations(jobs(GPUS, phase=[Phase.COMPLETING, Phase.GROWING]), FREE, PENDING, S)
    extra = plan_migrations(jobs(GPUS, phase=[Phase.COMPLETING, Phase.GROWING], attained_gpu_s=[0.0, 9e9]), FREE,
                            Demands.pending([4], wait_s=[0.0]), S)
    assert plain.jobs == extra.jobs == [0] and list(plain.why) == list(extra.why)
