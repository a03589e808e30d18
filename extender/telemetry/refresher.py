"""The background loop that keeps ClusterState's GPU telemetry current.

Each period it asks the source for one full reading and writes it into the state. The
request path never waits on this: it reads the state's columns, where samples older than
`telemetry_stale_s` already count as unknown (NaN, neutral in scoring).

What each outcome does to a node:
- a fresh reading with series for the node: stored, with the samples' own timestamps;
- a reading without series for the node: cleared now (unknown);
- a failed read (Prometheus down, a timeout, an error answer) or a failed scrape of that
  node's exporter: left alone, so its last real samples age out at the staleness bound.
  A blip shorter than the bound changes nothing; a longer outage turns every node unknown,
  never idle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from extender.metrics import Metrics
from extender.periodic import PeriodicRunner, fixed_rate
from extender.prometheus.client import TelemetryError
from extender.prometheus.config import TelemetryConfig
from extender.snapshot.state import ClusterState
from extender.telemetry.dra_join import join_by_uuid
from extender.telemetry.source import TelemetryReading, TelemetrySource

log = logging.getLogger("flowsched.telemetry")


@dataclass
class RefresherStatus:
    source: str
    refreshes: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_success_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    series: int = 0
    nodes_with_series: int = 0
    nodes_unknown: int = 0
    unmatched_nodes: list[str] = field(default_factory=list)  # series for nodes not in the snapshot
    partial_errors: list[str] = field(default_factory=list)


class TelemetryRefresher:
    def __init__(self, source: TelemetrySource, state: ClusterState, metrics: Metrics, *, stale_s: float,
                 refresh_s: float, clock: Callable[[], float] = time.time) -> None:
        self.source, self.state, self.metrics = source, state, metrics
        self.stale_s, self.refresh_s, self.clock = stale_s, refresh_s, clock
        self.status = RefresherStatus(source=source.name)
        self.pods: dict[str, Any] = {}  # per-pod attribution from the last reading
        # A read every refresh_s, the read's own time included (a slow Prometheus does not stretch the period).
        self._runner = PeriodicRunner(f"telemetry-{source.name}", self.refresh_once, fixed_rate(refresh_s), logger=log)
        self._lock = threading.Lock()  # one refresh at a time (the thread, or a test calling refresh_once)
        # Computed when /metrics is scraped, so the gauge agrees with what requests see right now
        # (staleness is a matter of time passing, not only of refreshes).
        metrics.telemetry_unknown_nodes.set_function(lambda: float(self.unknown_now()))

    # ---- one cycle ----
    def refresh_once(self) -> bool:
        """Read once and apply; True when the read succeeded. Never raises."""
        with self._lock:
            ok = False
            try:
                reading = self.source.fetch()
            except TelemetryError as e:
                self._failed(e.reason, str(e))
            except Exception as e:  # a bug in a source must not kill the loop
                log.exception("telemetry source %s failed unexpectedly", self.source.name)
                self._failed("internal", f"{type(e).__name__}: {e}")
            else:
                self._apply(reading)
                ok = True
            self._count_unknown()
            return ok

    def _failed(self, reason: str, message: str) -> None:
        st = self.status
        st.failures += 1
        st.consecutive_failures += 1
        st.last_error, st.last_error_at = message[:500], self.clock()
        self.metrics.telemetry_failures.labels(self.source.name, reason).inc()
        # Log the first failure and then every 12th, so an outage is visible without flooding.
        if st.consecutive_failures == 1 or st.consecutive_failures % 12 == 0:
            log.warning("telemetry read failed (%s, %d in a row); samples age out after %.0fs: %s",
                        reason, st.consecutive_failures, self.stale_s, message[:300])

    def _apply(self, reading: TelemetryReading) -> None:
        st = self.status
        reader = self.state.read()
        known = set(reader.node_names())
        if reading.uuids and reader.has_dra_gpus():  # DRA devices: join by uuid (dra_join.py)
            reading = join_by_uuid(reading, known, reader.dra_device_nodes(reading.uuids), reader.dra_pod_gpus())
        for name in known:
            t = reading.nodes.get(name)
            if t is not None:
                self.state.set_node_telemetry(name, t.util_pct, t.fb_free_mib, t.sampled_at)
            elif name not in reading.failed_nodes:
                self.state.clear_node_telemetry(name)
        for reason, n in reading.bad_samples.items():
            self.metrics.telemetry_bad_samples.labels(self.source.name, reason).inc(n)
        if reading.bad_samples:
            log.debug("dropped bad telemetry samples: %s", dict(reading.bad_samples))
        unmatched = sorted(set(reading.nodes) - known)
        if unmatched and not st.unmatched_nodes:
            log.warning("telemetry has series for %d node name(s) not in the cluster, e.g. %s; "
                        "is telemetry.node_label right?", len(unmatched), ", ".join(unmatched[:3]))
        self.pods = {p: {"gpus": [list(w) for w in where], "util_pct": reading.pod_util.get(p)}
                     for p, where in reading.pods.items()}
        # Each pod's GPUs' utilisation, for the idle loop (on a shared GPU, the physical GPU's:
        # co-tenants' work keeps a pod from reading idle, never the reverse).
        self.state.set_pod_gpu_util({p: [u for nd, g in where if (u := _util_of(reading, nd, g)) is not None]
                                     for p, where in reading.pods.items()}, self.clock())
        st.refreshes += 1
        st.consecutive_failures = 0
        st.last_success_at = self.clock()
        st.series = reading.series
        st.nodes_with_series = len(reading.nodes)
        st.unmatched_nodes = unmatched[:10]
        st.partial_errors = list(reading.errors)
        self.metrics.telemetry_refreshes.labels(self.source.name).inc()

    def unknown_now(self) -> int:
        return self.state.read().count_telemetry_unknown(self.clock(), self.stale_s)

    def _count_unknown(self) -> None:
        self.status.nodes_unknown = self.unknown_now()

    # ---- thread ----
    def start(self) -> TelemetryRefresher:
        self._runner.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._runner.stop(join_s=timeout_s)
        self.source.close()

    def describe(self) -> dict[str, Any]:
        return {**asdict(self.status), "refresh_s": self.refresh_s, "stale_s": self.stale_s,
                "pods_attributed": len(self.pods)}


def _util_of(reading: TelemetryReading, node: str, gpu: int) -> float | None:
    t = reading.nodes.get(node)
    if t is None or not 0 <= gpu < len(t.util_pct):
        return None
    v = t.util_pct[gpu]
    return v if v == v else None  # NaN: unknown


def build_source(cfg: TelemetryConfig, api_client: Any = None) -> TelemetrySource | None:
    """The configured source, or None for source=none."""
    if cfg.source == "prometheus":
        from extender.telemetry.prometheus_source import PrometheusSource

        return PrometheusSource(cfg)
    if cfg.source == "scrape":
        from extender.telemetry.scrape_source import ScrapeSource, kube_pod_lister

        lister = kube_pod_lister(api_client, cfg) if api_client is not None else None
        return ScrapeSource(cfg, lister)
    return None


def start_telemetry(cfg: TelemetryConfig, state: ClusterState, metrics: Metrics, *, stale_s: float,
                    api_client: Any = None) -> TelemetryRefresher | None:
    source = build_source(cfg, api_client)
    if source is None:
        return None
    if cfg.refresh_s * 2 > stale_s:
        log.warning("telemetry.refresh_s=%.1fs is over half of telemetry_stale_s=%.1fs: one missed read "
                    "will turn nodes unknown", cfg.refresh_s, stale_s)
    log.info("telemetry from %s every %.1fs (stale after %.0fs, node label %r)", source.name, cfg.refresh_s,
             stale_s, cfg.node_label)
    return TelemetryRefresher(source, state, metrics, stale_s=stale_s, refresh_s=cfg.refresh_s).start()
