"""Progress from a loss gauge through a real Prometheus (flowsched.io/progress: prometheus)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from extender.progress.prometheus_progress import (
    PrometheusProgress,
    PromSourceSettings,
    parse_loss_series,
    pick_prom_targets,
    points_from,
)
from extender.progress.store import ProgressStore, ProgressStoreSettings
from extender.prometheus.client import TelemetryError
from extender.prometheus.config import TelemetryConfig
from extender.snapshot.objects import PodInfo, parse_pod
from tests.prometheus_harness import free_port, running_prometheus, wait_for


class LossExporter:
    """A training job's /metrics: `train_loss{rank=..}` gauges the test sets (a real HTTP target)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.port = free_port()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = "# TYPE train_loss gauge\n" + "".join(
                    f'train_loss{{rank="{r}"}} {v}\n' for r, v in sorted(exporter.values.items()))
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a scrape cut off when Prometheus stops first: nothing to report

        self.server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[LossExporter]:
    e = LossExporter()
    yield e
    e.close()


def pod(name: str, job: str, annotations: dict[str, str], phase: str = "Running") -> PodInfo:
    return parse_pod({
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "labels": {"flowsched.io/job": job},
                     "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "main", "restartCount": 0,
                                                          "state": {"running": {}}}]},
    })


def test_gauge_samples_become_points_newer_only(exporter: LossExporter, tmp_path: Path) -> None:
    exporter.values = {"0": 1.0, "1": 1.1}
    pods = [pod("w-1", "gauge-job", {"flowsched.io/progress": "prometheus",
                                     "flowsched.io/loss-metric": 'train_loss{rank="0"}'}),
            pod("w-0", "gauge-job", {"flowsched.io/progress": "prometheus",
                                     "flowsched.io/loss-metric": 'train_loss{rank="0"}'})]
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path / "p.sqlite")))
    with running_prometheus(tmp_path / "prom", [(f"127.0.0.1:{exporter.port}", {})], scrape_interval_s=0.5) as prom:
        cfg = TelemetryConfig(prometheus_url=prom.url)
        src = PrometheusProgress(lambda: pods, store, cfg, PromSourceSettings(interval_s=1, lookback_s=120),
                                 clock=time.time)
        wait_for(lambda: prom.query('train_loss{rank="0"}'), 20, "the first scrape")
        for v in (0.8, 0.6, 0.5):
            # Each value stays until Prometheus has scraped it (no fixed sleep: a busy machine may
            # delay a scrape), so every value is in the series.
            held = exporter.values["0"]
            wait_for(lambda held=held: float(prom.query('train_loss{rank="0"}')[0]["value"][1]) == held,  # type: ignore[index]
                     20, f"a scrape of {held}")
            exporter.values["0"] = v
        wait_for(lambda: float(prom.query('train_loss{rank="0"}')[0]["value"][1]) == 0.5, 20,  # type: ignore[index]
                 "a scrape of 0.5")
        assert src.read_once() > 0
        hist = store.history("team-a", "gauge-job")
        assert hist is not None
        values = list(hist.values)
        # Every distinct gauge value, in order, from rank 0 only (rank 1's 1.1 never appears).
        distinct = [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
        assert distinct == [1.0, 0.8, 0.6, 0.5]
        assert hist.steps[0] == 0 and list(hist.steps) == sorted(hist.steps)
        assert hist.steps[-1] == pytest.approx(1000 * (hist.timestamps[-1] - hist.timestamps[0]), abs=1)
        n = hist.count
        # A second read right away stores nothing it already has.
        src.read_once()
        hist2 = store.history("team-a", "gauge-job")
        assert hist2 is not None and hist2.count - n <= 2  # at most the scrapes since
        assert src.status()["team-a/gauge-job"]["series"] == 1
        src.stop()
    store.close()


def test_bad_selector_is_an_error_in_status_not_a_crash(tmp_path: Path) -> None:
    pods = [pod("w-0", "bad", {"flowsched.io/progress": "prometheus", "flowsched.io/loss-metric": "train_loss{"})]
    store = ProgressStore(ProgressStoreSettings(path=":memory:"))
    with running_prometheus(tmp_path / "prom", []) as prom:
        src = PrometheusProgress(lambda: pods, store, TelemetryConfig(prometheus_url=prom.url), PromSourceSettings(),
                                 clock=time.time)
        assert src.read_once() == 0
        st = src.status()["team-a/bad"]
        assert st["errors"] == 1 and "parse error" in st["last_error"]
        src.stop()
    assert store.jobs() == []


def test_targets_need_the_metric_and_skip_terminating() -> None:
    pods = [pod("a-0", "a", {"flowsched.io/progress": "prometheus"}),  # no loss-metric: a problem
            pod("b-0", "b", {"flowsched.io/progress": "prometheus", "flowsched.io/loss-metric": "x"}),
            pod("c-0", "c", {"flowsched.io/progress": "logs"})]
    assert pods[0].progress is not None and "needs flowsched.io/loss-metric" in (pods[0].progress.problem or "")
    assert list(pick_prom_targets(pods)) == ["team-a/b"]


def test_parse_rejects_non_matrix_and_drops_nan() -> None:
    with pytest.raises(TelemetryError, match="not a matrix"):
        parse_loss_series(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
            b'"values":[[10,"0.5"],[11,"NaN"],[12,"0.4"]]}]}}')
    [(labels, samples)] = parse_loss_series(200, body)
    assert labels == (("a", "1"),) and samples == [(10.0, 0.5), (12.0, 0.4)]
    assert [(p.step, p.value) for p in points_from(samples, after_ts=10.0, first_ts=4.0)] == [(8000, 0.4)]
