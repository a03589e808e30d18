"""scoring.end_paths: the forecast's futures drawn a block at a time, and the stops read from them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from scoring.convergence import ConvergenceSettings
from scoring.end_paths import first_stop, first_stops, path_blocks, sample_paths
from scoring.forecast_settings import ForecastSettings
from scoring.job_end import rule_state
from scoring.stopping import EarlyStopping

CONV = ConvergenceSettings()


def _walks(rng: np.random.Generator, m: int, max_k: int, min_delta: float
           ) -> tuple[np.ndarray, EarlyStopping, float, int]:
    """Random drifting paths and an early-stopping rule not fired yet (best, evaluations since)."""
    paths = np.cumsum(rng.normal(-0.01, 0.05, (m, int(rng.integers(2, max_k)))), axis=1)
    rule = EarlyStopping(int(rng.integers(1, 12)), min_delta)
    return paths, rule, float(rng.normal(0, 0.1)), int(rng.integers(0, rule.patience))


@pytest.mark.parametrize("min_delta", [0.0, 0.02])
def test_first_stop_matches_the_rule_run_point_by_point(min_delta: float) -> None:
    rng = np.random.default_rng(1)
    for _ in range(60):
        paths, rule, best, wait = _walks(rng, 12, 200, min_delta)
        got, _ = first_stop(paths, best, wait, rule, math.inf)
        for i in range(paths.shape[0]):
            # the observed evaluations, then this sample's future: where rule_state fires is the answer
            history = np.r_[best, np.full(wait, best + 1.0), paths[i]]
            fired = rule_state(history, rule)[2]
            expected = fired - wait if fired > wait else math.inf
            assert got[i] == expected, (i, got[i], expected)
    # no future evaluation at all: nothing stops
    none = first_stop(np.zeros((3, 0)), 0.0, 0, EarlyStopping(2, min_delta), -1.0)
    assert all(np.isinf(x).all() and x.shape == (3,) for x in none)


@pytest.mark.parametrize("min_delta", [0.0, 0.02])
def test_reading_the_paths_block_by_block_finds_the_stops_of_reading_them_whole(min_delta: float) -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        paths, rule, best, wait = _walks(rng, 16, 300, min_delta)
        target = float(rng.normal(-1.0, 0.5))
        cuts = np.sort(rng.choice(np.arange(1, paths.shape[1]), size=min(4, paths.shape[1] - 1), replace=False))
        whole = first_stop(paths, best, wait, rule, target)
        blocks = first_stops(np.split(paths, cuts, axis=1), best, wait, rule, target, paths.shape[0])
        # every sample's first stop is the same; a later second event may be left unread (inf)
        assert np.array_equal(np.minimum(*whole), np.minimum(*blocks))
        assert np.array_equal(np.argmin(np.stack(whole), axis=0), np.argmin(np.stack(blocks), axis=0))


def test_reading_stops_once_enough_samples_stopped_and_those_stops_are_exact() -> None:
    rng = np.random.default_rng(11)
    m = 32
    paths = np.cumsum(rng.normal(0.0, 0.05, (m, 400)), axis=1)
    rule = EarlyStopping(5)
    read: list[int] = []

    def blocks() -> object:
        for a in range(0, 400, 20):
            read.append(a)
            yield paths[:, a:a + 20]

    es_all, _ = first_stop(paths, 0.0, 0, rule, math.inf)
    need = 20
    es, _ = first_stops(blocks(), 0.0, 0, rule, math.inf, need)  # type: ignore[arg-type]
    assert len(read) < 20  # the later blocks were never drawn
    assert np.count_nonzero(np.isfinite(es)) >= need
    assert np.array_equal(np.sort(es)[:need], np.sort(es_all)[:need])
    assert np.all(es_all[np.isinf(es)] > np.sort(es_all)[need - 1])  # the unread ones stop later


def test_the_horizon_drawn_in_blocks_is_the_same_process_as_drawn_whole() -> None:
    steps = np.arange(1, 41, dtype=np.float64) * 10.0
    values = 1.0 + np.exp(-steps / 120.0) + np.random.default_rng(2).normal(0.0, 0.003, steps.size)
    whole = ForecastSettings(samples=2048, block_evaluations=300)
    blocks = list(path_blocks(steps, values, 300, 10.0, CONV, dataclasses.replace(whole, block_evaluations=64)))
    assert [b.shape for b in blocks] == [(2048, 64)] * 4 + [(2048, 44)]
    one = sample_paths(steps, values, 300, 10.0, CONV, whole)
    # one block of at least the horizon: one draw, whatever the block's size beyond it
    more = dataclasses.replace(whole, block_evaluations=900)
    assert np.array_equal(one, sample_paths(steps, values, 300, 10.0, CONV, more))
    cut = np.concatenate(blocks, axis=1)
    assert not np.array_equal(cut, one)  # other random numbers land in each place ...
    for col in (0, 63, 64, 299):  # ... from the same distribution at every future evaluation
        a, b = cut[:, col], one[:, col]
        assert abs(float(a.mean() - b.mean())) < 0.15 * float(b.std())
        assert float(a.std()) == pytest.approx(float(b.std()), rel=0.1)
    with pytest.raises(ValueError, match="block_evaluations"):
        ForecastSettings(block_evaluations=0)
