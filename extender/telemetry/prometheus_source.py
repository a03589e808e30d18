"""Telemetry from Prometheus' HTTP API (or Thanos / Mimir: same /api/v1/query).

One instant query per refresh selects the raw samples of the last `range_s` seconds for the
three DCGM metrics (a range selector, so each sample comes back with its own timestamp); the
average and the newest sample time are computed here. Building the query and reading the
answer are pure functions; `PrometheusSource` only adds the HTTP call.
"""

from __future__ import annotations

import math
from collections import Counter

from extender.prometheus.client import auth_headers, bounded_get, make_client
from extender.prometheus.config import TelemetryConfig
from extender.prometheus.response import parse_query_answer
from extender.telemetry.source import (
    METRICS,
    GpuSeries,
    TelemetryReading,
    assemble,
    check_value,
    node_name,
    parse_gpu_index,
    pod_key,
)


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def build_query(cfg: TelemetryConfig) -> str:
    """The PromQL: raw samples of the DCGM metrics that carry a node label, over range_s."""
    names = "|".join(METRICS)
    matchers = [f'__name__=~"{names}"', f'{cfg.node_label}!=""']
    if cfg.series_selector.strip():
        matchers.append(cfg.series_selector.strip().strip("{}"))
    return "{" + ",".join(matchers) + "}[" + _duration(cfg.range_s) + "]"


def query_request(cfg: TelemetryConfig) -> tuple[str, dict[str, str]]:
    """URL and query parameters of the one call a refresh makes."""
    url = cfg.prometheus_url.rstrip("/") + "/api/v1/query"
    return url, {"query": build_query(cfg), "timeout": _duration(cfg.query_timeout_s)}


def parse_query_response(status: int, body: bytes, cfg: TelemetryConfig) -> TelemetryReading:
    """Interpret /api/v1/query's answer. Raises TelemetryError when the answer as a whole is unusable."""
    answer = parse_query_answer(status, body, expect=("matrix", "vector"))
    bad: Counter[str] = Counter()
    if answer.malformed_rows:
        bad["malformed"] += answer.malformed_rows
    rows: list[GpuSeries] = []
    for series in answer.series:
        labels = series.labels
        metric = labels.get("__name__", "")
        node = node_name(labels, cfg.node_label)
        if metric not in METRICS:
            bad["unexpected_metric"] += 1
            continue
        if not node:
            bad["no_node_label"] += 1
            continue
        gpu = parse_gpu_index(labels.get("gpu"), bad)
        if gpu is None:
            continue
        if series.malformed:  # unreadable pairs count only on a series that would be used
            bad["malformed"] += series.malformed
        total, count, newest = 0.0, 0, -math.inf
        for ts, value in series.samples:
            if not check_value(metric, value, bad):
                continue
            total += value
            count += 1
            newest = max(newest, ts)
        if count:
            rows.append(GpuSeries(node=node, gpu=gpu, metric=metric, value=total / count, sampled_at=newest,
                                  pod=pod_key(labels), instance=labels.get("GPU_I_ID", ""),
                                  uuid=labels.get("UUID", "")))
    return assemble(rows, bad)


class PrometheusSource:
    name = "prometheus"

    def __init__(self, cfg: TelemetryConfig) -> None:
        self.cfg = cfg
        self._client = make_client(cfg)

    def fetch(self) -> TelemetryReading:
        url, params = query_request(self.cfg)
        status, body = bounded_get(self._client, url, params=params, headers=auth_headers(self.cfg),
                                   limit=self.cfg.max_response_bytes)
        # Prometheus answers 400/422/503 with a JSON error body; anything else non-JSON is reported as such.
        return parse_query_response(status, body, self.cfg)

    def close(self) -> None:
        self._client.close()
