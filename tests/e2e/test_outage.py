"""`ignorable: true`: with flowsched down, kube-scheduler goes on alone; back up, its scores apply."""

from __future__ import annotations

import httpx
import pytest

from tests.cluster.procs import wait_until
from tests.cluster.scenario import Scenario
from tests.e2e.test_scheduling import BUSY, FB, IDLE, _pin_cpu_hog

pytestmark = pytest.mark.cluster


def test_scheduling_survives_a_flowsched_outage(scenario: Scenario) -> None:
    s = scenario
    svc = s.flowsched
    s.add_nodes("gpu-o1", "gpu-o2")
    s.wait_snapshot(lambda snap: {"gpu-o1", "gpu-o2"} <= set(snap["nodes"]), "nodes listed")
    # kube-scheduler alone prefers gpu-o2 (gpu-o1 carries a CPU hog); flowsched prefers gpu-o1
    # (idle GPUs). Where pods land therefore tells who decided.
    _pin_cpu_hog(s, "gpu-o1")

    def telemetry() -> None:
        svc.inject_telemetry("gpu-o1", IDLE, FB)
        svc.inject_telemetry("gpu-o2", BUSY, FB)

    telemetry()
    s.create_pod("before", gpus=1)
    assert s.wait_bound("before") == "gpu-o1"

    svc.stop()
    with pytest.raises(httpx.TransportError):
        svc.http.get("/healthz")
    during = [f"during-{i}" for i in range(3)]
    for name in during:
        s.create_pod(name, gpus=1)
    placed = {n: s.wait_bound(n, timeout_s=30) for n in during}
    assert set(placed.values()) == {"gpu-o2"}, f"without flowsched, in-tree scores decide: {placed}"

    svc.start()  # same port: kube-scheduler's configuration is unchanged
    # Telemetry lives in memory (until the real source lands it is re-read, not persisted).
    wait_until(lambda: {"gpu-o1", "gpu-o2"} <= set(svc.snapshot()["nodes"]), 10, what="relisted nodes")
    telemetry()
    s.create_pod("after", gpus=1)
    assert s.wait_bound("after") == "gpu-o1"

    # None lost: every pod exists, is bound and running.
    for name in ["before", *during, "after"]:
        s.wait_running(name)
