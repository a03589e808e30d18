"""The service's Prometheus metrics, on a registry owned by the app (no global registry)."""

from __future__ import annotations

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
    )
