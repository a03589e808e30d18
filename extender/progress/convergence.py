"""Turns stored progress histories into job phases in the snapshot, off the request path.

Every interval each recently-active job's history is read from the progress store and handed
to the control core's tracker (scoring.tracker: the same one the simulator uses), which
re-estimates only jobs with new points (or a new stopping rule: the max_steps, target_metric and
early_stopping a job reported in its `training` object, or declared by annotation, reach the
estimate, whose `end` is the job's end under that rule). Phases go to ClusterState (folded into the per-node
columns the placement reads); the estimates stay here for the control loops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import numpy as np

from extender.periodic import PeriodicRunner
from extender.progress.store import ProgressStore
from extender.snapshot.state import ClusterState, JobConvergence
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.settings import TrackerSettings
from scoring.stopping import EarlyStopping
from scoring.tracker import ConvergenceTracker as CoreTracker
from scoring.world import end_seconds

log = logging.getLogger("flowsched.convergence")


class ConvergenceTracker:
    def __init__(
        self,
        store: ProgressStore,
        state: ClusterState,
        settings: TrackerSettings,
        *,
        prune_every_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        planned_end: Callable[[str], float | None] | None = None,
        stop_target: Callable[[str], float | None] | None = None,
        early_stopping: Callable[[str], EarlyStopping | None] | None = None,
    ) -> None:
        self.store, self.state, self.settings, self.clock = store, state, settings, clock
        # The planned end (max_steps) a job reported, by "namespace/job"; the estimate uses it.
        self.planned_end = planned_end
        # The metric value a job said it stops at (training.target_metric), by "namespace/job".
        self.stop_target = stop_target
        # Its early stopping (training.early_stopping or the flowsched.io/early-stopping annotation).
        self.early_stopping = early_stopping
        self.interval_s, self.active_within_s = settings.interval_s, settings.active_within_s
        self.prune_every_s = prune_every_s
        self._next_prune = clock() + prune_every_s
        self.core = CoreTracker(settings)
        self._published: Mapping[str, ConvergenceEstimate] = {}
        self.errors = 0
        # A failed round (e.g. the SQLite file went away) is logged and counted; the service keeps
        # serving and the next round retries.
        self._runner = PeriodicRunner("convergence", self._round, self.interval_s, logger=log,
                                      on_error=self._count_error)

    @property
    def skipped(self) -> int:
        return self.core.skipped

    def refresh_once(self) -> int:
        """Estimate every job that reported within active_within_s; returns how many were recomputed."""
        now = self.clock()
        done = 0
        for summary in self.store.jobs():
            if now - summary.last_ts > self.active_within_s:
                continue
            key = f"{summary.namespace}/{summary.job}"
            signature = (summary.points, summary.last_ts)
            max_steps = self.planned_end(key) if self.planned_end is not None else None
            target = self.stop_target(key) if self.stop_target is not None else None
            es = self.early_stopping(key) if self.early_stopping is not None else None
            if self.core.unchanged(key, signature, max_steps, target, es):
                self.core.skipped += 1
                continue
            try:
                history = self.store.history(summary.namespace, summary.job)
                if history is None:
                    continue
                before = self.core.computed
                monitored = None
                if es is not None and es.metric is not None:  # never reported: empty, so unknown
                    monitored = self.store.metric_series(summary.namespace, summary.job, es.metric) \
                        or (np.zeros(0), np.zeros(0))
                est = self.core.update(key, history.steps, history.values, history.timestamps,
                                       higher_is_better=history.higher_is_better, signature=signature,
                                       max_steps=max_steps, target=target, early_stopping=es,
                                       monitored=monitored)
            except Exception:  # one bad history must not starve the others
                self.errors += 1
                log.exception("convergence estimate failed for %s", key)
                continue
            if est is None or self.core.computed == before:
                continue
            self.state.set_job_convergence(key, JobConvergence(est.phase, end_seconds(est), now))
            done += 1
        self._published = self.core.snapshot()  # readers (the loops' threads) see a whole round
        return done

    def snapshot(self) -> Mapping[str, ConvergenceEstimate]:
        return self._published

    def phase_of(self, job: str) -> Phase:
        est = self._published.get(job)
        return est.phase if est else Phase.UNKNOWN

    def prune_if_due(self) -> int:
        """Drop jobs silent for longer than the store's max_idle_s, at most every prune_every_s."""
        now = self.clock()
        if now < self._next_prune:
            return 0
        self._next_prune = now + self.prune_every_s
        return self.store.prune(now)

    def _round(self) -> None:
        self.refresh_once()
        self.prune_if_due()

    def _count_error(self, _e: Exception) -> None:
        self.errors += 1

    def start(self) -> None:
        self._runner.start()

    def stop(self) -> None:
        self._runner.stop()
