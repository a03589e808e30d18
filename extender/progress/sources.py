"""Starts the progress sources the settings enable; the service calls start/stop/status."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extender.progress.log_follower import LogFollower, LogSourceSettings, kube_log_opener
from extender.progress.prometheus_progress import PrometheusProgress, PromSourceSettings
from extender.progress.replicated_store import ReplicatedProgressStore, ReplicatedStoreSettings
from extender.progress.store import ProgressStore, ProgressStoreSettings
from extender.settings import Settings
from extender.snapshot.state import ClusterState

log = logging.getLogger("flowsched.progress.sources")


@dataclass
class ProgressSources:
    logs: LogFollower | None = None
    prometheus: PrometheusProgress | None = None

    def stop(self) -> None:
        if self.logs is not None:
            self.logs.stop()
        if self.prometheus is not None:
            self.prometheus.stop()

    def status(self) -> dict[str, Any]:
        return {"logs": self.logs.status() if self.logs else None,
                "prometheus": self.prometheus.status() if self.prometheus else None}


def build_progress_store(settings: Settings) -> ProgressStore:
    """The embedded SQLite store (one replica), or the Prometheus-shared one (HA) when configured."""
    local = ProgressStoreSettings(path=settings.progress_db, **settings.progress_quota.model_dump())
    cfg = settings.progress_sources
    if not cfg.shared_prometheus_url:
        return ProgressStore(local)
    url = cfg.shared_prometheus_url.rstrip("/")
    log.info("progress history shared through Prometheus at %s (remote write, then read by every replica)", url)
    read_cfg = settings.telemetry.model_copy(update={"prometheus_url": url})
    return ReplicatedProgressStore(local, ReplicatedStoreSettings(
        prometheus_url=url, remote_write_url=cfg.shared_remote_write_url or url + "/api/v1/write",
        history_window_s=cfg.shared_history_window_s, write_timeout_s=cfg.shared_write_timeout_s), read_cfg)


def start_progress_sources(settings: Settings, state: ClusterState, store: ProgressStore, api_client: Any,
                           is_leader: Callable[[], bool]) -> ProgressSources:
    cfg = settings.progress_sources
    pods = lambda: state.read().control_view()[0]  # noqa: E731 - an immutable copy taken under the state's lock
    out = ProgressSources()
    if cfg.logs and api_client is not None:
        out.logs = LogFollower(
            pods, store, kube_log_opener(api_client),
            LogSourceSettings(max_streams=cfg.log_max_streams, connects_per_s=cfg.log_connects_per_s,
                              min_point_interval_s=cfg.log_min_point_interval_s, flush_s=cfg.log_flush_s,
                              read_timeout_s=cfg.log_read_timeout_s, reconnect_max_s=cfg.log_reconnect_max_s,
                              reconcile_s=cfg.reconcile_s),
            is_leader=is_leader).start()
    url = cfg.prometheus_url or settings.telemetry.prometheus_url
    if cfg.prometheus and url:
        tel = settings.telemetry.model_copy(update={"prometheus_url": url})
        out.prometheus = PrometheusProgress(
            pods, store, tel, PromSourceSettings(interval_s=cfg.prometheus_interval_s,
                                                 lookback_s=cfg.prometheus_lookback_s,
                                                 max_jobs=cfg.prometheus_max_jobs),
            clock=time.time, is_leader=is_leader).start()
    elif cfg.prometheus:
        log.info("progress from Prometheus gauges is off: no progress_sources.prometheus_url or "
                 "telemetry.prometheus_url")
    return out
