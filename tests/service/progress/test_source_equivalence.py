"""Per progress source, the estimate on one curve matches the estimate from SDK posts.

One training curve (loss = 0.3 + exp(-t/τ), 20 steps a second, a point every 0.5 s) reaches
flowsched four ways: posted to /v1/progress (the reference), printed in each built-in log
format and read by the log follower with its default thinning (one point per second kept),
and exported as a gauge that a real Prometheus scrapes every 0.5 s. Each path ends in the
same SQLite store and the same estimator.

Stated tolerance: the same phase, and remaining seconds within 25 % of the SDK's. Why 25 %:
the log formats print 3–4 significant digits (Lightning prints 0.693), thinning halves the
points, and the gauge path has no step (its steps are seconds), so the curve fits see slightly
different data; the control loops act on remaining time in coarse ranks, where 25 % does not
reorder jobs whose remaining times differ by more than that.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from extender.http.auth import StaticTokenAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.progress.log_follower import LogFollower, LogSourceSettings
from extender.progress.prometheus_progress import PrometheusProgress, PromSourceSettings
from extender.progress.store import ProgressStore, ProgressStoreSettings
from extender.prometheus.config import TelemetryConfig
from scoring.convergence import ConvergenceEstimate, ConvergenceSettings, estimate
from tests.prometheus_harness import running_prometheus, wait_for
from tests.service.progress.test_log_follower import ScriptedLogEmulator, pod, run_until
from tests.service.progress.test_prometheus_progress import LossExporter
from tests.service.progress.test_prometheus_progress import pod as prom_pod

TAU_S = 12.0
DURATION_S = 24.0
DT_S = 0.5
STEPS_PER_S = 20
TOLERANCE = 0.25
SETTINGS = ConvergenceSettings(window_s=2.0)


def loss(t: float) -> float:
    return 0.3 + math.exp(-t / TAU_S)


def samples() -> list[tuple[float, int, float]]:
    """(seconds since start, step, loss), one every DT_S."""
    n = int(DURATION_S / DT_S) + 1
    return [(i * DT_S, int(i * DT_S * STEPS_PER_S), loss(i * DT_S)) for i in range(n)]


def est_of(store: ProgressStore, job: str) -> ConvergenceEstimate:
    h = store.history("ns", job)
    assert h is not None, f"no history for {job}"
    return estimate(h.steps, h.values, h.timestamps, SETTINGS)


def sdk_estimate(t0: float) -> ConvergenceEstimate:
    store = ProgressStore(ProgressStoreSettings(path=":memory:"))
    app = FastAPI()
    app.include_router(build_progress_router(
        store, StaticTokenAuthenticator({"tok": frozenset({"*"})}), ProgressApiSettings(),
        ProgressApiMetrics.build(CollectorRegistry())))
    points = [{"step": s, "loss": v, "timestamp": t0 + t} for t, s, v in samples()]

    async def post() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.post("/v1/progress", json={"namespace": "ns", "job": "sdk", "points": points},
                             headers={"Authorization": "Bearer tok"})
            return int(r.json()["accepted"])

    assert asyncio.run(post()) == len(points)
    out = est_of(store, "sdk")
    store.close()
    return out


# Each built-in format, as the library prints it (see tests/data/logs/ for the captured originals).
def plain(_i: int, step: int, v: float) -> list[str]:
    return [f"step={step} loss={v:.4f}"]


def lightning(_i: int, step: int, v: float) -> list[str]:
    per_epoch = 100
    epoch, batch = divmod(step, per_epoch)
    if batch == 0:
        epoch, batch = epoch - 1, per_epoch
    if step == 0:
        return []
    pct = int(100 * batch / per_epoch)
    return [f"\rEpoch {epoch}: {pct:3d}%|█████     | {batch}/{per_epoch} [00:01<00:00,  6.27it/s, train_loss={v:.3g}]"]


def keras(i: int, step: int, v: float) -> list[str]:
    per_epoch = 10  # one epoch per point: Keras off a terminal prints a line per epoch
    epoch = step // per_epoch
    if step == 0:
        return []
    return [f"Epoch {epoch}/{int(DURATION_S * STEPS_PER_S) // per_epoch}",
            f"{per_epoch}/{per_epoch} - 0s - 1ms/step - loss: {v:.4f}"]


def huggingface(_i: int, step: int, v: float) -> list[str]:
    total = int(DURATION_S * STEPS_PER_S)
    if step == 0:
        return []
    return [f"\r{int(100 * step / total):3d}%|██        | {step}/{total} [00:01<00:03,  8.30it/s]\r"
            f"{{'loss': '{v:.4g}', 'grad_norm': '0.2759', 'learning_rate': '0.08667', 'epoch': '{step / 100:.4g}'}}"]


FORMATS: dict[str, Callable[[int, int, float], list[str]]] = {
    "plain": plain, "lightning": lightning, "keras": keras, "huggingface": huggingface}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_log_source_estimate_matches_sdk(fmt: str) -> None:
    t0 = time.time() - 3600
    reference = sdk_estimate(t0)
    em = ScriptedLogEmulator()
    lines: list[tuple[float, str]] = []
    for i, (t, step, v) in enumerate(samples()):
        lines += [(t0 + t, text) for text in FORMATS[fmt](i, step, v)]
    em.lines[("p-0", "main")] = lines
    store = ProgressStore(ProgressStoreSettings(path=":memory:"))
    follower = LogFollower(lambda: [pod("p-0", job="logs")], store, em, LogSourceSettings(reconcile_s=0.05))
    run_until(follower, lambda: follower.status()["streams"].get("ns/logs", {}).get("ended", 0) >= 1)
    follower.stop()
    got = est_of(store, "logs")
    print(f"{fmt}: points {got.points_used} vs sdk {reference.points_used}; phase {got.phase.name} vs "
          f"{reference.phase.name}; remaining_s {got.remaining_seconds:.1f} vs {reference.remaining_seconds:.1f} "
          f"(ratio {got.remaining_seconds / reference.remaining_seconds:.3f})")
    assert got.points_used >= reference.points_used // 2 - 1  # thinned to one point per second of log
    assert got.phase == reference.phase
    assert got.remaining_seconds == pytest.approx(reference.remaining_seconds, rel=TOLERANCE)
    store.close()


@pytest.mark.prometheus
def test_prometheus_gauge_estimate_matches_sdk(tmp_path: Path) -> None:
    exporter = LossExporter()
    start = time.time() + 3600.0  # set once Prometheus scrapes; until then the gauge holds loss(0)

    class LiveCurve(dict[str, float]):
        """The gauge's value computed when Prometheus scrapes it, so a stalled thread on a busy
        machine cannot leave a stale value (and a flat stretch the SDK curve does not have)."""

        def items(self) -> Any:
            return [("0", loss(min(DURATION_S, max(0.0, time.time() - start))))]

    exporter.values = LiveCurve()
    store = ProgressStore(ProgressStoreSettings(path=":memory:"))
    try:
        with running_prometheus(tmp_path / "prom", [(f"127.0.0.1:{exporter.port}", {})],
                                scrape_interval_s=DT_S) as prom:
            wait_for(lambda: prom.query("train_loss"), 20, "the first scrape")
            start = time.time()
            time.sleep(DURATION_S + 1.0)
            src = PrometheusProgress(
                lambda: [prom_pod("w-0", "gauge", {"flowsched.io/progress": "prometheus",
                                                   "flowsched.io/loss-metric": 'train_loss{rank="0"}'})],
                store, TelemetryConfig(prometheus_url=prom.url), PromSourceSettings(lookback_s=DURATION_S + 0.5),
                clock=time.time)
            assert src.read_once() > 0
            src.stop()
        h = store.history("team-a", "gauge")
        assert h is not None
        # The gauge's samples over the curve only: scrapes before `start` hold loss(0), and after
        # DURATION_S the driver holds the last value (a flat tail the SDK curve does not have).
        keep = (h.timestamps >= start - DT_S) & (h.timestamps <= start + DURATION_S)
        got = estimate(h.steps[keep] - h.steps[keep][0], h.values[keep], h.timestamps[keep], SETTINGS)
        reference = sdk_estimate(start)
        print(f"prometheus: points {got.points_used} vs sdk {reference.points_used}; phase {got.phase.name} vs "
              f"{reference.phase.name}; remaining_s {got.remaining_seconds:.1f} vs {reference.remaining_seconds:.1f} "
              f"(ratio {got.remaining_seconds / reference.remaining_seconds:.3f})")
        assert got.phase == reference.phase
        assert got.remaining_seconds == pytest.approx(reference.remaining_seconds, rel=TOLERANCE)
    finally:
        exporter.close()
        store.close()
