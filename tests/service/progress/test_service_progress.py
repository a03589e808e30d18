"""The whole service (no cluster): progress reports reach the snapshot's job phases."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from extender.service import build_service
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from scoring.convergence import Phase
from tests.k8s_factories import node, pod


def _service(tmp_path: Path) -> tuple[TestClient, object]:
    tokens = tmp_path / "tokens"
    tokens.write_text("team-a-token team-a\n# comment\nadmin-token *\n")
    settings = Settings(kube=False, progress_db=str(tmp_path / "progress.sqlite"), progress_auth="static",
                        static_tokens_file=str(tokens))
    svc = build_service(settings)
    return TestClient(svc.app, client=("127.0.0.1", 50000)), svc


# The service's clock is the real one, and points older than the store's idle window are rejected:
# the curves end about now.
START = time.time() - 10.0 * 120


def _curve(plateau: bool, n: int = 120) -> list[dict[str, float]]:
    steps = np.arange(n)
    loss = 2.0 * np.exp(-steps / 8.0) + 0.3 if plateau else 3.0 - 0.02 * steps
    return [{"step": int(s), "loss": float(v), "timestamp": START + 10.0 * s}
            for s, v in zip(steps, loss, strict=True)]


def test_reports_become_phases_in_the_snapshot(tmp_path: Path) -> None:
    client, svc = _service(tmp_path)
    with client:
        st = svc.state  # type: ignore[attr-defined]
        st.upsert_node(parse_node(node("n0", gpus=4)))
        st.upsert_pod(parse_pod(pod("done-0", gpus=2, node_name="n0", phase="Running", namespace="team-a",
                                    labels={"flowsched.io/job": "done"})))
        st.upsert_pod(parse_pod(pod("fast-0", gpus=1, node_name="n0", phase="Running", namespace="team-a",
                                    labels={"flowsched.io/job": "fast"})))
        auth = {"Authorization": "Bearer team-a-token"}
        for job, plateau in (("done", True), ("fast", False)):
            r = client.post("/v1/progress", headers=auth,
                            json={"namespace": "team-a", "job": job, "points": _curve(plateau)})
            assert r.status_code == 200, r.text
        foreign = {"namespace": "team-b", "job": "x", "points": _curve(True, 1)}
        r = client.post("/v1/progress", headers=auth, json=foreign)
        assert r.status_code == 403
        svc.tracker.clock = lambda: START + 10.0 * 120  # type: ignore[attr-defined]
        assert svc.tracker.refresh_once() == 2  # type: ignore[attr-defined]
        assert svc.tracker.phase_of("team-a/done") == Phase.COMPLETING  # type: ignore[attr-defined]
        assert svc.tracker.phase_of("team-a/fast") == Phase.GROWING  # type: ignore[attr-defined]
        snap = client.get("/debug/snapshot").json()
        assert snap["jobs"]["team-a/done"]["phase"] == "completing"
        assert snap["nodes"]["n0"]["completing_gpus"] == 2
        assert client.get("/v1/jobs/team-a/done", headers=auth).json()["phase"] == "completing"


def test_without_a_telemetry_source_gpu_nodes_count_as_unknown(tmp_path: Path) -> None:
    client, svc = _service(tmp_path)
    with client:
        st = svc.state  # type: ignore[attr-defined]
        st.upsert_node(parse_node(node("g0", gpus=4)))
        st.upsert_node(parse_node(node("g1", gpus=8)))
        st.upsert_node(parse_node(node("cpu-only", gpus=0)))
        text = client.get("/metrics").text
        assert "flowsched_telemetry_unknown_nodes 2.0" in text  # not a silent 0
