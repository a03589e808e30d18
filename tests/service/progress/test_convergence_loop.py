"""The convergence tracker on a real SQLite store, with a fake clock."""

from __future__ import annotations

from pathlib import Path

from extender.progress.convergence import ConvergenceTracker
from extender.progress.store import ProgressPoint, ProgressStore, ProgressStoreSettings
from extender.snapshot.state import ClusterState
from scoring.convergence import Phase
from scoring.settings import TrackerSettings
from scoring.stopping import EarlyStopping, EndReason

DAY = 86400.0


def test_silent_jobs_are_not_estimated_and_idle_ones_pruned_hourly(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite"), max_idle_s=7 * DAY))
    now = [100 * DAY]
    flat = [ProgressPoint(step=k, value=1.0 + 1.0 / (k + 1), timestamp=now[0] - 8 * DAY + 10 * k) for k in range(50)]
    fresh = [ProgressPoint(step=k, value=5.0 - 0.01 * k, timestamp=now[0] - 600 + 10 * k) for k in range(50)]
    store.add_points("ns", "old", flat)
    store.add_points("ns", "new", fresh)
    settings = TrackerSettings(window_s=0.0, window_points=5, active_within_s=3600)
    tracker = ConvergenceTracker(store, ClusterState(), settings, prune_every_s=3600, clock=lambda: now[0])
    assert tracker.refresh_once() == 1  # the job silent for 8 days is not re-estimated
    assert tracker.phase_of("ns/new") == Phase.GROWING
    assert tracker.phase_of("ns/old") == Phase.UNKNOWN
    assert tracker.prune_if_due() == 0  # not due yet: the first prune is an hour after start
    now[0] += 3601
    assert tracker.prune_if_due() == 1
    assert {j.job for j in store.jobs()} == {"new"}
    assert tracker.prune_if_due() == 0  # and not again within the hour
    store.close()


def test_jobs_without_new_points_are_not_estimated_again(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    now = [1000.0]
    store.add_points("ns", "a", [ProgressPoint(step=k, value=5.0 - 0.01 * k, timestamp=10.0 * k) for k in range(60)])
    tracker = ConvergenceTracker(store, ClusterState(), TrackerSettings(window_s=0.0, window_points=5),
                                 clock=lambda: now[0])
    assert tracker.refresh_once() == 1
    assert tracker.refresh_once() == 0 and tracker.skipped == 1
    store.add_points("ns", "a", [ProgressPoint(step=60, value=4.3, timestamp=600.0)])
    assert tracker.refresh_once() == 1
    store.close()


def test_too_few_points_stay_unknown(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    store.add_points("ns", "a", [ProgressPoint(step=k, value=5.0 - k, timestamp=10.0 * k) for k in range(3)])
    tracker = ConvergenceTracker(store, ClusterState(), TrackerSettings(min_points=6), clock=lambda: 100.0)
    assert tracker.refresh_once() == 0 and tracker.phase_of("ns/a") == Phase.UNKNOWN
    store.close()


def one_slowing_job(tmp_path: Path) -> ProgressStore:
    """A store holding job ns/a: 40 points of a loss slowing down towards 1 (its last ~1.2)."""
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    store.add_points("ns", "a", [ProgressPoint(step=k, value=1.0 + 1.0 / (0.1 * k + 1.0), timestamp=10.0 * k)
                                 for k in range(40)])
    return store


def test_a_reported_planned_end_reaches_the_estimate_and_a_change_re_estimates(tmp_path: Path) -> None:
    store = one_slowing_job(tmp_path)
    planned: dict[str, float | None] = {"ns/a": None}
    tracker = ConvergenceTracker(store, ClusterState(), TrackerSettings(window_s=0.0, window_points=5),
                                 clock=lambda: 400.0, planned_end=planned.get)
    assert tracker.refresh_once() == 1
    open_end = tracker.snapshot()["ns/a"]
    assert open_end.remaining_steps == open_end.ensemble_remaining_steps  # "auto": no planned end
    planned["ns/a"] = 60.0
    assert tracker.refresh_once() == 1  # no new points, but a new planned end
    est = tracker.snapshot()["ns/a"]
    assert est.remaining_steps == est.learned_remaining_steps and est.remaining_steps_high <= 60.0 - 39.0
    assert tracker.refresh_once() == 0
    store.close()


def test_a_reported_target_reaches_the_estimate_and_a_change_re_estimates(tmp_path: Path) -> None:
    store = one_slowing_job(tmp_path)
    target: dict[str, float | None] = {"ns/a": None}
    tracker = ConvergenceTracker(store, ClusterState(), TrackerSettings(window_s=0.0, window_points=5),
                                 clock=lambda: 400.0, stop_target=target.get)
    assert tracker.refresh_once() == 1
    assert tracker.snapshot()["ns/a"].remaining_steps > 0
    target["ns/a"] = 1.3  # a loss the job has already gone below (its last value is ~1.2)
    assert tracker.refresh_once() == 1  # no new points, but a new target
    est = tracker.snapshot()["ns/a"]
    assert est.remaining_steps == 0.0 and est.remaining_seconds == 0.0 and est.plateau_probability == 1.0
    assert tracker.refresh_once() == 0
    store.close()


def test_early_stopping_on_a_named_metric_reaches_the_end(tmp_path: Path) -> None:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    store.add_points("ns", "a", [ProgressPoint(step=k, value=1.0 + 1.0 / (0.1 * k + 1.0), timestamp=10.0 * k,
                                               metrics={"val_acc": 0.9 - 0.5 / (0.1 * k + 1.0)} if k % 5 == 0 else None)
                                 for k in range(80)])
    rule: dict[str, EarlyStopping | None] = {"ns/a": None}
    tracker = ConvergenceTracker(store, ClusterState(), TrackerSettings(window_s=0.0, window_points=5),
                                 clock=lambda: 800.0, early_stopping=rule.get)
    assert tracker.refresh_once() == 1
    end = tracker.snapshot()["ns/a"].end
    assert end is not None and end.reason == EndReason.PLATEAU
    rule["ns/a"] = EarlyStopping(patience=3, metric="val_acc", higher_is_better=True)
    assert tracker.refresh_once() == 1  # no new points, but a new rule
    end = tracker.snapshot()["ns/a"].end
    assert end is not None and end.reason == EndReason.EARLY_STOPPING and end.known
    assert end.steps_low <= end.remaining_steps <= end.steps_high
    rule["ns/a"] = EarlyStopping(patience=3, metric="never_reported")
    assert tracker.refresh_once() == 1
    end = tracker.snapshot()["ns/a"].end
    assert end is not None and not end.known and end.reason == EndReason.EARLY_STOPPING
    store.close()
