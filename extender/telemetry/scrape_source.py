"""Telemetry scraped straight from dcgm-exporter endpoints, without a Prometheus in between.

Targets come from a pod list (label selector; the node is the pod's spec.nodeName, which is
authoritative) made by the refresher thread every `discovery_s`, or from static URLs (then
the node is read from each series' node label). The exposition text is read with
prometheus_client's parser; pure functions turn pages and pod lists into rows and targets.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from extender.kube import requests
from extender.kube.client import send
from extender.kube.responses import checked
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

log = logging.getLogger("flowsched.telemetry.scrape")


@dataclass(frozen=True)
class ScrapeTarget:
    url: str
    node: str = ""  # "" = take it from each series' node label


def parse_exposition(text: str, scraped_at: float, node: str, node_label: str,
                     bad: Counter[str]) -> list[GpuSeries]:
    """Rows from one exporter page. Raises TelemetryError if the page is not valid exposition text.

    Exporters send no timestamps, so a sample's time is when its page arrived (scraped_at);
    an explicit timestamp on a line wins.
    """
    rows: list[GpuSeries] = []
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise TelemetryError("parse", f"not Prometheus text format: {e}") from e
    for fam in families:
        if fam.name not in METRICS:
            continue
        for s in fam.samples:
            n = node or node_name(s.labels, node_label)
            if not n:
                bad["no_node_label"] += 1
                continue
            gpu = parse_gpu_index(s.labels.get("gpu"), bad)
            if gpu is None or not check_value(fam.name, float(s.value), bad):
                continue
            ts = float(s.timestamp) if s.timestamp is not None else scraped_at
            if not math.isfinite(ts):
                bad["malformed"] += 1
                continue
            rows.append(GpuSeries(node=n, gpu=gpu, metric=fam.name, value=float(s.value), sampled_at=ts,
                                  pod=pod_key(s.labels), instance=s.labels.get("GPU_I_ID", ""),
                                  uuid=s.labels.get("UUID", "")))
    return rows


def targets_from_pod_list(pod_list: Mapping[str, Any], cfg: TelemetryConfig) -> list[ScrapeTarget]:
    """Running exporter pods with an IP and a node, as scrape targets."""
    out: list[ScrapeTarget] = []
    for item in pod_list.get("items") or []:
        spec, status = item.get("spec") or {}, item.get("status") or {}
        ip, node = status.get("podIP"), spec.get("nodeName")
        if status.get("phase") != "Running" or not ip or not node:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        out.append(ScrapeTarget(url=f"{cfg.scrape_scheme}://{host}:{cfg.scrape_port}{cfg.scrape_path}", node=node))
    return out


PodLister = Callable[[], Mapping[str, Any]]


def kube_pod_lister(api_client: Any, cfg: TelemetryConfig) -> PodLister:
    """A list call for exporter pods (run by the refresher thread, never on the request path)."""
    import orjson

    req = requests.list_pods(namespace=cfg.scrape_namespace or None, label_selector=cfg.scrape_selector or None)

    def list_pods() -> Mapping[str, Any]:
        resp = send(api_client, req, timeout_s=cfg.query_timeout_s * 3)
        doc: Mapping[str, Any] = orjson.loads(checked(req, resp).body)
        return doc

    return list_pods


class ScrapeSource:
    name = "scrape"

    def __init__(self, cfg: TelemetryConfig, list_pods: PodLister | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not cfg.scrape_targets and list_pods is None:
            raise ValueError("telemetry.source=scrape needs scrape_targets or a cluster to discover exporters in")
        self.cfg = cfg
        self._list_pods = list_pods
        self._clock = clock
        self._client = make_client(cfg)
        self._targets: list[ScrapeTarget] = [ScrapeTarget(u) for u in cfg.scrape_targets]
        self._discovered_at = -math.inf
        # Nodes each static target served last time: when it fails, those nodes keep their last
        # samples until they go stale, as a discovered target's node does.
        self._nodes_of: dict[str, frozenset[str]] = {}
        self._pool = ThreadPoolExecutor(max_workers=cfg.scrape_concurrency, thread_name_prefix="dcgm-scrape")

    def targets(self) -> list[ScrapeTarget]:
        if self._list_pods is not None and time.monotonic() - self._discovered_at >= self.cfg.discovery_s:
            try:
                found = targets_from_pod_list(self._list_pods(), self.cfg)
            except Exception as e:  # a failed list keeps the last known targets
                if self._discovered_at == -math.inf:
                    raise TelemetryError("discovery", f"listing exporter pods failed: {e}") from e
                log.warning("listing exporter pods failed, keeping %d known targets: %s", len(self._targets), e)
            else:
                self._targets = [ScrapeTarget(u) for u in self.cfg.scrape_targets] + found
                self._discovered_at = time.monotonic()
        return self._targets

    def _scrape(self, t: ScrapeTarget, headers: dict[str, str]) -> tuple[list[GpuSeries], Counter[str]]:
        bad: Counter[str] = Counter()
        status, body = bounded_get(self._client, t.url, params=None, headers=headers,
                                   limit=self.cfg.max_response_bytes)
        scraped_at = self._clock()
        if status != 200:
            raise TelemetryError("http", f"{t.url}: HTTP {status}")
        text = body.decode("utf-8", errors="replace")
        return parse_exposition(text, scraped_at, t.node, self.cfg.node_label, bad), bad

    def fetch(self) -> TelemetryReading:
        targets = self.targets()
        if not targets:
            raise TelemetryError("discovery", f"no exporter pods match {self.cfg.scrape_selector!r}")
        headers = auth_headers(self.cfg)
        futures = [(t, self._pool.submit(self._scrape, t, headers)) for t in targets]
        rows: list[GpuSeries] = []
        bad: Counter[str] = Counter()
        errors: list[str] = []
        failed: set[str] = set()
        for t, fut in futures:
            try:
                got, b = fut.result()
            except TelemetryError as e:
                errors.append(str(e))
                bad[f"target_{e.reason}"] += 1
                failed.update({t.node} if t.node else self._nodes_of.get(t.url, frozenset()))
                continue
            if not t.node:
                self._nodes_of[t.url] = frozenset(r.node for r in got)
            rows.extend(got)
            bad.update(b)
        if len(errors) == len(targets):
            raise TelemetryError("all_targets", f"all {len(targets)} exporter scrapes failed; first: {errors[0]}")
        return assemble(rows, bad, failed_nodes=frozenset(failed), errors=tuple(errors[:10]))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
