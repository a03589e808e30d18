from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings


def points(steps: list[int], t0: float = 1000.0) -> list[ProgressPoint]:
    return [ProgressPoint(step=s, value=1.0 / (s + 1), timestamp=t0 + i) for i, s in enumerate(steps)]


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "progress.sqlite")


def test_restart_of_the_service_keeps_history(db_path: str) -> None:
    store = ProgressStore(ProgressStoreSettings(path=db_path))
    assert store.add_points("ns", "job", points([1, 2, 3]), higher_is_better=True) == 3
    store.add_points("ns", "job", points([4, 2, 3], t0=2000.0))  # a restart from step 2, in arrival order
    store.close()

    reopened = ProgressStore(ProgressStoreSettings(path=db_path))
    h = reopened.history("ns", "job")
    assert h is not None
    assert h.steps.tolist() == [1, 2, 3, 4, 2, 3]
    assert h.values[0] == pytest.approx(0.5) and h.timestamps[3] == 2000.0
    assert h.higher_is_better
    [summary] = reopened.jobs()
    assert (summary.namespace, summary.job, summary.points) == ("ns", "job", 6)
    assert (summary.first_ts, summary.last_ts) == (1000.0, 2002.0)
    reopened.close()


def test_jobs_are_separate_per_namespace(db_path: str) -> None:
    store = ProgressStore(ProgressStoreSettings(path=db_path))
    store.add_points("a", "job", points([1, 2]))
    store.add_points("b", "job", points([7]))
    a, b = store.history("a", "job"), store.history("b", "job")
    assert a is not None and b is not None
    assert a.steps.tolist() == [1, 2] and b.steps.tolist() == [7]
    assert store.history("c", "job") is None
    assert store.delete_job("a", "job") and not store.delete_job("a", "job")
    assert [j.namespace for j in store.jobs()] == ["b"]
    store.close()


def test_non_finite_points_are_skipped_not_stored(db_path: str) -> None:
    store = ProgressStore(ProgressStoreSettings(path=db_path))
    pts = [ProgressPoint(1, math.nan, 1.0), ProgressPoint(2, 0.5, math.inf), ProgressPoint(3, 0.4, 3.0)]
    assert store.add_points("ns", "j", pts) == 1
    h = store.history("ns", "j")
    assert h is not None and h.steps.tolist() == [3]
    store.close()


def test_downsampling_bounds_a_job_and_keeps_recent_points_and_the_start(db_path: str) -> None:
    s = ProgressStoreSettings(path=db_path, max_points_per_job=200, keep_recent_points=100)
    store = ProgressStore(s)
    for chunk in range(10):
        store.add_points("ns", "j", points(list(range(chunk * 100, chunk * 100 + 100)), t0=chunk * 100.0))
    h = store.history("ns", "j")
    assert h is not None
    assert h.count <= 200
    assert h.steps[0] == 0  # the curve's start survives
    assert h.steps[-100:].tolist() == list(range(900, 1000))  # recent points all kept
    older = h.steps[:-100]
    assert np.all(np.diff(older) > 0) and older[-1] > 800  # thinned, in order, spanning the whole run
    # Thinning removed whole-curve density, not a contiguous block: gaps grow with age.
    gaps = np.diff(older)
    assert gaps[0] >= gaps[-1]
    store.close()


def test_prune_drops_idle_jobs_only(db_path: str) -> None:
    store = ProgressStore(ProgressStoreSettings(path=db_path, max_idle_s=100.0))
    store.add_points("ns", "old", points([1], t0=0.0))
    store.add_points("ns", "new", points([1], t0=950.0))
    assert store.prune(now=1000.0) == 1
    assert [j.job for j in store.jobs()] == ["new"]
    store.close()


def test_bad_retention_settings_are_refused(db_path: str) -> None:
    with pytest.raises(ValueError, match="keep_recent_points"):
        ProgressStore(ProgressStoreSettings(path=db_path, max_points_per_job=10, keep_recent_points=10))
