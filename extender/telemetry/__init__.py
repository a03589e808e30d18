"""Live GPU telemetry: DCGM exporter metrics, read through Prometheus or scraped directly.

A background refresher fills ClusterState's per-node, per-GPU columns; the request path
only ever reads those columns (never waits on Prometheus or an exporter).
"""
