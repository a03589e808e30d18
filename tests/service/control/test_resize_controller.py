"""extender.control.resizer on a fake snapshot, tracker and pod source: what it plans, what it
writes, what it reports, under the service's rounds runner (dry run, budgets) with a fake clock."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from extender.control.events import LogRecorder
from extender.control.leader import AlwaysLeader
from extender.control.loop import ControlLoop, ControlMetrics
from extender.control.resizer import CPU_ORIGINAL, RESIZABLE, RESIZED_AT, Resizer, pod_row, resize_pending
from extender.kube.requests import resize_pod
from extender.settings import ResizerConfig, Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring.convergence import Phase
from tests.control_fakes import FakeActions, FakeTracker, OneLoop, make_context, plan_at
from tests.k8s_factories import node, pod


@dataclass
class Est:
    phase: Phase
    progress: float


def running(name: str, cpu: str, annotations: dict[str, str] | None = None, limit: str | None = None,
            status_cpu: str | None = None, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    p = pod(name, node_name="n1", namespace="t", cpu=cpu, phase="Running", annotations=annotations,
            labels={"flowsched.io/job": name})
    if limit:
        p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = limit
    p["status"]["containerStatuses"] = [{"name": "main", "resources": {"requests": {"cpu": status_cpu or cpu}}}]
    if conditions:
        p["status"]["conditions"] = conditions
    return p


RESIZER = ResizerConfig(min_step_m=100, hysteresis=0.1, cooldown_s=60)
OPT = {RESIZABLE: "true", "flowsched.io/cpu-shrink": "true"}


def make(pods: list[dict[str, Any]], est: dict[str, Est], clock: list[float],
         labels: dict[str, dict[str, str]] | None = None) -> tuple[Resizer, FakeActions, LogRecorder, ClusterState]:
    state = ClusterState()
    state.upsert_node(parse_node(node("n1", gpus=4, cpu="16")))
    for p in pods:
        state.upsert_pod(parse_pod(p))
    actions, rec = FakeActions(), LogRecorder()
    ctx = make_context(state, FakeTracker(est), actions, rec, clock=lambda: clock[0], namespace_labels=labels,
                       settings=Settings(kube=False, resizer=RESIZER))
    r = Resizer(ctx, pods_on=lambda _n: pods)

    def patch(ns: str, name: str, container: str, resources: dict[str, Any]) -> bool:
        # The body the resize subresource gets (extender.kube.requests.resize_pod).
        r.__dict__.setdefault("patched", []).append((ns, name, resize_pod(ns, name, container, resources).body))
        return True

    r._patch_resize = patch  # type: ignore[method-assign]
    return r, actions, rec, state


def test_fast_job_up_plateaued_down_decreases_first_with_reasons() -> None:
    pods = [running("fast", "4", OPT), running("flat", "4", OPT), running("other", "4")]
    est = {"t/fast": Est(Phase.GROWING, 0.3), "t/flat": Est(Phase.COMPLETING, 0.001), "t/other": Est(Phase.GROWING, 1)}
    r, *_ = make(pods, est, [1000.0])
    actions = plan_at(r, 1000.0)
    assert [a.target for a in actions] == ["t/flat", "t/fast"]  # down first, then up
    down, up = actions
    assert down.kind == "resize-down" and up.kind == "resize-up"
    # pool = 16 - 4 (the pod that did not opt in) = 12 cores; completing floor 12/(2*2) = 3.
    assert down.as_dict()["detail"]["to_m"] == 3000 and up.as_dict()["detail"]["to_m"] == 9000
    assert "completing" in down.reason and "G=" in up.reason
    assert "t/other" not in {a.target for a in actions}
    assert r.last_plan["nodes"]["n1"]["skipped"] == {"t/other": "not opted in"}


def test_act_annotates_patches_the_resize_subresource_and_records_an_event() -> None:
    pods = [running("fast", "6", OPT, limit="12"), running("flat", "6", OPT)]
    est = {"t/fast": Est(Phase.GROWING, 0.3), "t/flat": Est(Phase.COMPLETING, 0.001)}
    r, fake, rec, _ = make(pods, est, [1000.0])
    down, up = plan_at(r, 1000.0)
    assert r.act(down, 1000.0) == "resized" and r.act(up, 1000.0) == "resized"
    patched = r.__dict__["patched"]
    assert patched[1][2] == {"spec": {"containers": [{"name": "main", "resources": {
        "requests": {"cpu": f"{round(up.as_dict()['detail']['to_m'])}m"},
        "limits": {"cpu": f"{round(up.as_dict()['detail']['to_m'] * 2)}m"}}}]}}  # the limit keeps its 2x ratio
    assert "limits" not in patched[0][2]["spec"]["containers"][0]["resources"]  # no cpu limit: none added
    assert fake.annotations[0][2] == {RESIZED_AT: "1000", CPU_ORIGINAL: "6000m"}
    assert [e[1] for e in rec.events] == ["FlowschedResized", "FlowschedResized"]


def test_dry_run_and_budget_through_the_control_loop() -> None:
    pods = [running("fast", "6", OPT), running("flat", "6", OPT)]
    est = {"t/fast": Est(Phase.GROWING, 0.3), "t/flat": Est(Phase.COMPLETING, 0.001)}
    clock = [1000.0]
    r, _, rec, _ = make(pods, est, clock)
    metrics = ControlMetrics.build(CollectorRegistry())
    dry = ControlLoop(r, AlwaysLeader(), metrics, interval_s=30, dry_run=True, per_interval=4, per_hour=10,
                      clock=lambda: clock[0])
    tick = OneLoop(dry).run_once()
    assert [o.outcome for o in tick.outcomes] == ["dry_run", "dry_run"]
    assert "patched" not in r.__dict__ and not rec.events
    live = ControlLoop(r, AlwaysLeader(), metrics, interval_s=30, dry_run=False, per_interval=1, per_hour=10,
                       clock=lambda: clock[0])
    tick = OneLoop(live).run_once()
    assert [o.outcome for o in tick.outcomes] == ["resized", "budget_exhausted"]
    assert len(r.__dict__["patched"]) == 1


def test_pending_resize_is_reported_once_and_the_pod_left_alone() -> None:
    cond = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible",
             "message": "Node didn't have enough capacity"}]
    pods = [running("fast", "9", OPT, status_cpu="4", conditions=cond), running("flat", "4", OPT)]
    est = {"t/fast": Est(Phase.GROWING, 0.3), "t/flat": Est(Phase.GROWING, 0.3)}
    r, _, rec, _ = make(pods, est, [1000.0])
    notices = []
    for t in (1000.0, 1030.0, 1060.0):
        actions = plan_at(r, t)
        assert "t/fast" not in {a.target for a in actions if a.kind.startswith("resize-")}
        notices += [a for a in actions if a.kind == "resize_pending"]
    assert [(a.target, a.budgeted) for a in notices] == [("t/fast", False)]  # once, and no budget
    assert r.act(notices[0], 1060.0) == "recorded"
    assert [(e[1]) for e in rec.events] == ["FlowschedResizeInfeasible"]
    assert r.last_plan["nodes"]["n1"]["pods"]["t/fast"]["why"] == "NO_EVIDENCE"


def test_a_dry_run_resizer_reports_a_pending_resize_without_writing_an_event() -> None:
    cond = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "no room"}]
    pods = [running("fast", "9", OPT, status_cpu="4", conditions=cond)]
    r, fake, rec, _ = make(pods, {"t/fast": Est(Phase.GROWING, 0.3)}, [1000.0])
    dry = ControlLoop(r, AlwaysLeader(), ControlMetrics.build(CollectorRegistry()), interval_s=30, dry_run=True,
                      per_interval=0, per_hour=0, clock=lambda: 1000.0)
    tick = OneLoop(dry).run_once()
    assert [(o.action.kind, o.outcome) for o in tick.outcomes] == [("resize_pending", "dry_run")]
    assert rec.events == [] and fake.annotations == []  # dry run writes nothing, not even an Event


def test_pod_row_reads_bounds_original_and_cooldown() -> None:
    p = running("a", "4", {**OPT, "flowsched.io/cpu-min": "2", "flowsched.io/cpu-max": "6500m",
                           CPU_ORIGINAL: "3", RESIZED_AT: "970"})
    row = pod_row(p, "t/a", 1000.0)
    assert not isinstance(row, str)
    assert (row.min_m, row.max_m, row.original_m, row.since_resize_s) == (2000, 6500, 3000, 30)
    assert pod_row(running("b", "4"), "t/b", 0) == "not opted in"
    q = running("c", "4", OPT)
    q["spec"]["containers"][0]["resizePolicy"] = [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]
    assert "RestartContainer" in str(pod_row(q, "t/c", 0))
    assert math.isinf(pod_row(running("d", "4", OPT), "t/d", 0).since_resize_s)  # type: ignore[union-attr]


def test_resize_pending_reads_conditions_and_the_old_status_field() -> None:
    assert resize_pending({"status": {"resize": "Deferred"}}) == ("Deferred", "")
    assert resize_pending({"status": {"conditions": [{"type": "PodResizePending", "status": "True",
                                                      "reason": "Infeasible", "message": "m"}]}}) == ("Infeasible", "m")
    assert resize_pending({"status": {"conditions": [{"type": "PodResizeInProgress", "status": "True"}]}}) is None


def test_in_flight_resize_is_not_stacked() -> None:
    pods = [running("fast", "6", OPT, status_cpu="4"), running("flat", "4", OPT)]
    est = {"t/fast": Est(Phase.GROWING, 0.3), "t/flat": Est(Phase.COMPLETING, 0.001)}
    r, *_ = make(pods, est, [1000.0])
    targets = {a.target for a in plan_at(r, 1000.0)}
    assert "t/fast" not in targets
    assert np.isclose(r.last_plan["nodes"]["n1"]["pods"]["t/fast"]["current_m"], 4000)


def test_namespace_opt_outs_hold_for_the_resizer() -> None:
    pods = [running("fast", "4", OPT), running("flat", "4", OPT)]
    est = {"t/fast": Est(Phase.GROWING, 0.3), "t/flat": Est(Phase.COMPLETING, 0.001)}
    r, *_ = make(pods, est, [1000.0], labels={"t": {"flowsched.io/migrate": "false"}})
    assert plan_at(r, 1000.0) == []
    r2, *_ = make(pods, est, [1000.0])
    assert plan_at(r2, 1000.0) != []  # the same pods, the label gone: planned
    settings = Settings(kube=False, control={"excluded_namespaces": ["t"]}, resizer=RESIZER)
    state = ClusterState()
    state.upsert_node(parse_node(node("n1", gpus=4, cpu="16")))
    for p in pods:
        state.upsert_pod(parse_pod(p))
    ctx = make_context(state, FakeTracker(est), FakeActions(), LogRecorder(), settings=settings)
    r3 = Resizer(ctx, pods_on=lambda _n: pods)
    assert plan_at(r3, 1000.0) == []
    assert set(r3.observe(1000.0).nodes) == set()  # nothing observed to plan from
