"""Turns stored progress histories into job phases in the snapshot, off the request path.

Every interval each recently-active job's history is estimated with scoring.convergence
and the result handed to ClusterState (which folds it into the per-node columns) and kept
here for the control loops, which need growth rates and predictions, not just phases.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from extender.progress_store import ProgressStore
from extender.state import ClusterState, JobConvergence
from scoring.convergence import ConvergenceEstimate, ConvergenceSettings, Phase, estimate

log = logging.getLogger("flowsched.convergence")


class ConvergenceTracker:
    def __init__(
        self,
        store: ProgressStore,
        state: ClusterState,
        settings: ConvergenceSettings,
        *,
        interval_s: float = 10.0,
        active_within_s: float = 3600.0,
        prune_every_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.state, self.settings = store, state, settings
        self.interval_s, self.active_within_s, self.clock = interval_s, active_within_s, clock
        self.prune_every_s = prune_every_s
        self._next_prune = clock() + prune_every_s
        self.estimates: dict[str, ConvergenceEstimate] = {}  # "namespace/job"
        self._seen: dict[str, tuple[int, float]] = {}  # job -> (points, last_ts) at its last estimate
        self.skipped = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh_once(self) -> int:
        """Estimate every job that reported within active_within_s; returns how many."""
        now = self.clock()
        done = 0
        for summary in self.store.jobs():
            if now - summary.last_ts > self.active_within_s:
                continue
            key = f"{summary.namespace}/{summary.job}"
            # A fit costs milliseconds (tens at 4,000 points): only jobs with new points pay it.
            if self._seen.get(key) == (summary.points, summary.last_ts) and key in self.estimates:
                self.skipped += 1
                continue
            try:
                history = self.store.history(summary.namespace, summary.job)
                if history is None:
                    continue
                settings = dataclasses.replace(self.settings, higher_is_better=history.higher_is_better)
                # max_steps / target: used once the store keeps them per job (see docs/progress-api.md)
                est = estimate(history.steps, history.values, history.timestamps, settings,
                               max_steps=getattr(history, "max_steps", None), target=getattr(history, "target", None))
            except Exception:  # one bad history must not starve the others
                self.errors += 1
                log.exception("convergence estimate failed for %s", key)
                continue
            self.estimates[key] = est
            self._seen[key] = (summary.points, summary.last_ts)
            self.state.set_job_convergence(key, JobConvergence(est.phase, est.remaining_seconds, now))
            done += 1
        return done

    def snapshot(self) -> Mapping[str, ConvergenceEstimate]:
        return dict(self.estimates)

    def phase_of(self, job: str) -> Phase:
        est = self.estimates.get(job)
        return est.phase if est else Phase.UNKNOWN

    def prune_if_due(self) -> int:
        """Drop jobs silent for longer than the store's max_idle_s, at most every prune_every_s."""
        now = self.clock()
        if now < self._next_prune:
            return 0
        self._next_prune = now + self.prune_every_s
        return self.store.prune(now)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_once()
                self.prune_if_due()
            except Exception:  # e.g. the SQLite file went away: keep serving, retry next round
                self.errors += 1
                log.exception("convergence refresh failed")
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="convergence", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
