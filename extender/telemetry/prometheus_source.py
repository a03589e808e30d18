"""Telemetry from Prometheus' HTTP API (or Thanos / Mimir: same /api/v1/query).

One instant query per refresh selects the raw samples of the last `range_s` seconds for the
three DCGM metrics (a range selector, so each sample comes back with its own timestamp); the
average and the newest sample time are computed here. Building the query and reading the
answer are pure functions; `PrometheusSource` only adds the HTTP call.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import orjson

from extender.prometheus.client import TelemetryError, auth_headers, bounded_get, make_client
from extender.prometheus.config import TelemetryConfig
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


def _samples(row: Mapping[str, Any]) -> list[Any]:
    if "values" in row:  # matrix (our range selector)
        values = row["values"]
        return values if isinstance(values, list) else []
    if "value" in row:  # vector (a user query that averages server-side)
        return [row["value"]]
    return []


def parse_query_response(status: int, body: bytes, cfg: TelemetryConfig) -> TelemetryReading:
    """Interpret /api/v1/query's answer. Raises TelemetryError when the answer as a whole is unusable."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise TelemetryError("bad_response", f"HTTP {status}, body is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise TelemetryError("bad_response", f"HTTP {status}, body is not a JSON object")
    if doc.get("status") != "success":
        raise TelemetryError("prometheus_error",
                             f"HTTP {status}: {doc.get('errorType', '?')}: {str(doc.get('error', ''))[:300]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector") \
            or not isinstance(data.get("result"), list):
        raise TelemetryError("bad_response", "data.result is not a matrix or vector")
    bad: Counter[str] = Counter()
    rows: list[GpuSeries] = []
    for row in data["result"]:
        labels = row.get("metric") if isinstance(row, dict) else None
        if not isinstance(labels, dict):
            bad["malformed"] += 1
            continue
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
        total, count, newest = 0.0, 0, -math.inf
        for pair in _samples(row):
            try:
                ts, value = float(pair[0]), float(pair[1])  # Prometheus sends values as strings
            except (TypeError, ValueError, IndexError):
                bad["malformed"] += 1
                continue
            if not math.isfinite(ts) or not check_value(metric, value, bad):
                continue
            total += value
            count += 1
            newest = max(newest, ts)
        if count:
            rows.append(GpuSeries(node=node, gpu=gpu, metric=metric, value=total / count, sampled_at=newest,
                                  pod=pod_key(labels), instance=str(labels.get("GPU_I_ID", ""))))
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
