"""Per-pod CPU, network and GPU use from Prometheus, for bottleneck diagnosis (scoring.bottleneck).

Sources users already run: cAdvisor (the kubelet's /metrics/cadvisor, scraped by every
kube-prometheus setup) and dcgm-exporter with its pod mapping. Five instant queries per read,
each aggregated server-side per (namespace, pod) over the last `window_s`:

    cpu    rate(container_cpu_usage_seconds_total{container!="",container!="POD"}[w])   cores
    limit  container_spec_cpu_quota / container_spec_cpu_period (same containers)       cores
    ncont  how many containers use CPU, and how many have a quota (a pod is limited only
           if all are; partly limited pods get an unknown limit, unlimited ones inf)
    net    rate(container_network_receive_bytes_total[w]) + rate(..._transmit_...[w])    bytes/s
    gpu    avg_over_time(DCGM_FI_DEV_GPU_UTIL{pod!=""}[w]) / 100, averaged over its GPUs  0..1

A pod with no series for a quantity gets NaN there (unknown, never 0): rate() needs two samples
in the window, so a pod whose exporter stopped answering drops out rather than reading idle.
Building the queries and reading the answers are pure; `PodUsageReader` adds the HTTP calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.prometheus.client import TelemetryError, auth_headers, bounded_get, make_client
from extender.prometheus.config import TelemetryConfig
from extender.prometheus.response import parse_query_answer

CONTAINERS = 'container!="",container!="POD"'


@dataclass(frozen=True)
class PodUsage:
    cpu_cores: float = math.nan
    cpu_limit_cores: float = math.nan  # inf: no CPU limit
    net_bytes_s: float = math.nan
    gpu_util: float = math.nan  # 0..1


def _w(window_s: float) -> str:
    return f"{max(1, round(window_s))}s"


def build_queries(window_s: float, selector: str = "") -> dict[str, str]:
    """The PromQL per quantity; `selector` adds matchers (e.g. 'cluster="gpu-a"') to every series."""
    extra = ("," + selector.strip().strip("{}")) if selector.strip() else ""
    w = _w(window_s)
    c = CONTAINERS + extra
    by = "sum by (namespace, pod)"
    return {
        "cpu": f"{by} (rate(container_cpu_usage_seconds_total{{{c}}}[{w}]))",
        "limit": f"{by} (container_spec_cpu_quota{{{c}}} / container_spec_cpu_period{{{c}}})",
        "containers": f"count by (namespace, pod) (container_cpu_usage_seconds_total{{{c}}})",
        "limited": f"count by (namespace, pod) (container_spec_cpu_quota{{{c}}} > 0)",
        "net": (f"{by} (rate(container_network_receive_bytes_total{{pod!=\"\"{extra}}}[{w}]))"
                f" + {by} (rate(container_network_transmit_bytes_total{{pod!=\"\"{extra}}}[{w}]))"),
        "gpu": f"avg by (namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=\"\"{extra}}}[{w}])) / 100",
    }


def parse_vector(status: int, body: bytes) -> dict[tuple[str, str], float]:
    """(namespace, pod) -> value of an instant vector answer; raises TelemetryError when unusable.
    Series without a pod label, and values that are not finite or are negative, are dropped."""
    out: dict[tuple[str, str], float] = {}
    for series in parse_query_answer(status, body, expect=("vector",)).series:
        ns, pod = series.labels.get("namespace", ""), series.labels.get("pod", "")
        for _, v in series.samples:
            if pod and math.isfinite(v) and v >= 0:
                out[(ns or "default", pod)] = v
    return out


def combine(answers: Mapping[str, Mapping[tuple[str, str], float]]) -> dict[str, PodUsage]:
    """"namespace/pod" -> PodUsage from the per-quantity answers (missing quantities: unknown)."""
    keys: set[tuple[str, str]] = set()
    for a in answers.values():
        keys |= set(a)
    out: dict[str, PodUsage] = {}
    for k in keys:
        def get(q: str, k: tuple[str, str] = k) -> float:
            return float(answers.get(q, {}).get(k, math.nan))

        containers, limited, limit = get("containers"), get("limited"), get("limit")
        if math.isfinite(containers) and not math.isfinite(limited):
            limit = math.inf  # no container has a quota: the pod is not CPU-limited
        elif not (math.isfinite(containers) and math.isfinite(limited) and limited >= containers):
            limit = math.nan  # partly limited (or unknown): its limit as a whole is not known
        gpu = get("gpu")
        out[f"{k[0]}/{k[1]}"] = PodUsage(get("cpu"), limit, get("net"), min(1.0, gpu) if math.isfinite(gpu) else gpu)
    return out


class PodUsageReader:
    """Reads PodUsage for every pod Prometheus has series for. One read = six GETs."""

    def __init__(self, cfg: TelemetryConfig, window_s: float) -> None:
        if not cfg.prometheus_url:
            raise ValueError("bottleneck diagnosis needs telemetry.prometheus_url (cAdvisor and DCGM through "
                             "Prometheus)")
        self.cfg, self.window_s = cfg, window_s
        self.queries = build_queries(window_s, cfg.series_selector)
        self._client = make_client(cfg)

    def read(self) -> tuple[dict[str, PodUsage], dict[str, str]]:
        """(usage per pod, errors per quantity). A failed quantity is unknown for every pod."""
        url = self.cfg.prometheus_url.rstrip("/") + "/api/v1/query"
        answers: dict[str, dict[tuple[str, str], float]] = {}
        errors: dict[str, str] = {}
        for name, q in self.queries.items():
            try:
                status, body = bounded_get(self._client, url, params={"query": q}, headers=auth_headers(self.cfg),
                                           limit=self.cfg.max_response_bytes)
                answers[name] = parse_vector(status, body)
            except TelemetryError as e:
                errors[name] = str(e)
        return combine(answers), errors

    def close(self) -> None:
        self._client.close()


def describe_usage(u: PodUsage) -> dict[str, Any]:
    def num(x: float) -> float | str | None:
        return None if math.isnan(x) else ("inf" if math.isinf(x) else round(x, 4))

    return {"cpu_cores": num(u.cpu_cores), "cpu_limit_cores": num(u.cpu_limit_cores),
            "net_bytes_s": num(u.net_bytes_s), "gpu_util": num(u.gpu_util)}
