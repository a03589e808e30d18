"""The service's Prometheus metrics, on a registry owned by the app (no global registry)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    bad_requests: Counter
    unknown_nodes: Counter
    filter_rejections: Counter
    preempt_dropped: Counter
    watch_restarts: Counter
    watch_events: Counter
    snapshot_nodes: Gauge
    snapshot_pods: Gauge
    telemetry_unknown_nodes: Gauge
    telemetry_refreshes: Counter
    telemetry_failures: Counter
    telemetry_bad_samples: Counter
    jobs_by_phase: Gauge
    control_budget_left: Gauge


def build_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    r = registry or CollectorRegistry()
    return Metrics(
        registry=r,
        requests=Counter("flowsched_extender_requests", "Extender calls", ["verb", "code"], registry=r),
        latency=Histogram(
            "flowsched_extender_seconds", "Extender handling time", ["verb"], registry=r,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
        ),
        bad_requests=Counter("flowsched_bad_requests", "Rejected requests", ["verb", "reason"], registry=r),
        unknown_nodes=Counter("flowsched_unknown_nodes", "Candidate nodes not in the snapshot", ["verb"],
                              registry=r),
        filter_rejections=Counter("flowsched_filter_rejections", "Nodes filtered out", ["reason"], registry=r),
        preempt_dropped=Counter("flowsched_preempt_candidates_dropped", "Preemption candidates dropped",
                                registry=r),
        watch_restarts=Counter("flowsched_watch_restarts", "Watch reconnects and relists", ["kind", "why"],
                               registry=r),
        watch_events=Counter("flowsched_watch_events", "Watch events applied", ["kind", "type"], registry=r),
        snapshot_nodes=Gauge("flowsched_snapshot_nodes", "Nodes in the snapshot", registry=r),
        snapshot_pods=Gauge("flowsched_snapshot_pods", "Pods in the snapshot", registry=r),
        telemetry_unknown_nodes=Gauge("flowsched_telemetry_unknown_nodes",
                                      "Nodes whose GPU telemetry is missing or stale", registry=r),
        telemetry_refreshes=Counter("flowsched_telemetry_refreshes", "Successful telemetry reads", ["source"],
                                    registry=r),
        telemetry_failures=Counter("flowsched_telemetry_failures", "Failed telemetry reads (Prometheus query "
                                   "or all scrapes)", ["source", "reason"], registry=r),
        telemetry_bad_samples=Counter("flowsched_telemetry_bad_samples", "Telemetry samples or scrape targets "
                                      "dropped as unusable", ["source", "reason"], registry=r),
        jobs_by_phase=Gauge("flowsched_jobs", "Jobs with pods in the snapshot, by convergence phase "
                            "(unknown: no progress reported yet)", ["phase"], registry=r),
        control_budget_left=Gauge("flowsched_control_budget_left", "Actions a control loop may still take "
                                  "in this interval or sliding hour", ["loop", "window"], registry=r),
    )


def watch_status(metrics: Metrics, phase_counts: Callable[[], Mapping[str, int]], phases: Sequence[str],
                 budgets: Mapping[str, Callable[[], Mapping[str, int]]]) -> None:
    """Gauges read at scrape time, so they can never be stale: one series per phase (0 when no
    job is in it, so a dashboard shows 0 rather than no data) and per loop and budget window."""
    def count(phase: str) -> Callable[[], float]:
        return lambda: float(phase_counts().get(phase, 0))

    def left(remaining: Callable[[], Mapping[str, int]], window: str) -> Callable[[], float]:
        return lambda: float(remaining().get(window, 0))

    for phase in phases:
        metrics.jobs_by_phase.labels(phase).set_function(count(phase))
    for loop, remaining in budgets.items():
        for window in ("interval", "hour"):
            metrics.control_budget_left.labels(loop, window).set_function(left(remaining, window))
