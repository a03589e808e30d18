"""The preempt verb: among kube-scheduler's candidates, flowsched keeps checkpointable victims."""

from __future__ import annotations

import pytest

from tests.cluster.kubelet_emulator import STARTED_AGO
from tests.cluster.procs import wait_until
from tests.cluster.scenario import CHECKPOINTABLE, Scenario

pytestmark = pytest.mark.cluster


def _metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        head, value = line.rsplit(" ", 1)
        have = dict(kv.split("=", 1) for kv in head[len(name):].strip("{}").split(",") if "=" in kv)
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total


def test_high_priority_pod_preempts_the_checkpointable_victim(scenario: Scenario) -> None:
    s = scenario
    s.add_nodes("gpu-p1", "gpu-p2", gpus=1)
    s.wait_snapshot(lambda snap: {"gpu-p1", "gpu-p2"} <= set(snap["nodes"]), "nodes listed")

    # Two equal low-priority victims, one GPU each, one per node. Left to itself, kube-scheduler
    # picks the node whose victims started most recently (it loses the least work): that is
    # `fresh`, started a minute ago. flowsched must steer it to `ckpt`, the one that can resume
    # from a checkpoint although it has run for two hours.
    s.create_pod("ckpt", gpus=1, priority_class="e2e-low",
                 annotations={CHECKPOINTABLE: "true", STARTED_AGO: "7200"})
    s.create_pod("fresh", gpus=1, priority_class="e2e-low", annotations={STARTED_AGO: "60"})
    ckpt_node, fresh_node = s.wait_running("ckpt"), s.wait_running("fresh")
    assert {ckpt_node, fresh_node} == {"gpu-p1", "gpu-p2"}
    s.wait_snapshot(lambda snap: all(snap["pods"].get(f"{s.ns}/{p}", {}).get("node") for p in ("ckpt", "fresh")),
                    "victims bound in the snapshot")
    before = s.flowsched.http.get("/metrics").text

    s.create_pod("urgent", gpus=1, priority_class="e2e-high")
    s.wait_event("ckpt", "Preempted", timeout_s=20)
    node = s.wait_bound("urgent", timeout_s=30)

    assert node == ckpt_node, f"urgent went to {node}; checkpointable victim was on {ckpt_node}"
    wait_until(lambda: not s.pod_exists("ckpt"), 10, what="the checkpointable victim to be gone")
    fresh = s.pod("fresh")
    assert fresh["status"]["phase"] == "Running" and not fresh["metadata"].get("deletionTimestamp")
    s.wait_running("urgent")

    # The decision went through flowsched's preempt verb, and it dropped the other candidate.
    after = s.flowsched.http.get("/metrics").text
    calls = "flowsched_extender_requests_total"
    assert _metric(after, calls, verb="preempt", code="200") > _metric(before, calls, verb="preempt", code="200"), \
        "preempt verb was not called"
    dropped = "flowsched_preempt_candidates_dropped_total"
    assert _metric(after, dropped) > _metric(before, dropped)
