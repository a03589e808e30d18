"""Telemetry settings (Settings.telemetry): which source, where it is, how often to read it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

# Labels that commonly carry the Kubernetes node name on DCGM series: dcgm-exporter's own
# `Hostname` (its NODE_NAME env, which the Helm chart sets from spec.nodeName), or one added
# by relabelling in Prometheus (`kubernetes_node`, `node`), or `instance` when targets are
# addressed by node name (its ":port" is stripped).


class TelemetryConfig(BaseModel):
    model_config = {"extra": "forbid"}

    source: Literal["none", "prometheus", "scrape"] = "none"
    refresh_s: float = Field(5.0, gt=0)  # one read per period; must be well under telemetry_stale_s
    query_timeout_s: float = Field(3.0, gt=0)  # per HTTP call (a Prometheus query, one exporter scrape)
    node_label: str = Field("Hostname", min_length=1)
    max_response_bytes: int = Field(32 * 1024 * 1024, ge=1024)  # a bigger answer is an error, not a crash
    bearer_token_file: str | None = None  # re-read on every call, so rotated tokens are picked up
    ca_file: str | None = None  # for https endpoints with a private CA
    # prometheus
    prometheus_url: str = ""  # e.g. http://prometheus-operated.monitoring.svc:9090
    range_s: float = Field(30.0, gt=0)  # average over the last range_s seconds
    series_selector: str = ""  # extra PromQL matchers, e.g. 'cluster="gpu-a"'
    # scrape
    scrape_selector: str = "app.kubernetes.io/name=dcgm-exporter"  # label selector of exporter pods
    scrape_namespace: str = ""  # "" lists all namespaces
    scrape_port: int = Field(9400, ge=1, le=65535)
    scrape_path: str = "/metrics"
    scrape_scheme: Literal["http", "https"] = "http"
    scrape_targets: list[str] = Field(default_factory=list)  # static URLs instead of pod discovery
    discovery_s: float = Field(30.0, gt=0)  # how often exporter pods are re-listed
    scrape_concurrency: int = Field(16, ge=1, le=256)

    @model_validator(mode="after")
    def _check(self) -> TelemetryConfig:
        if self.source == "prometheus" and not self.prometheus_url:
            raise ValueError("telemetry.source=prometheus needs telemetry.prometheus_url")
        return self


class DiagnosisConfig(BaseModel):
    """Bottleneck diagnosis (extender.control.bottleneck); its thresholds are the core's BottleneckSettings.
    Reads cAdvisor and dcgm-exporter series through telemetry.prometheus_url."""

    model_config = {"extra": "forbid"}

    enabled: bool = False
    interval_s: float = Field(30.0, gt=0)
    window_s: float = Field(60.0, gt=0)  # rate() and step-rate window; at least 2 scrape intervals
