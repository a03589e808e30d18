"""The admission plan on Worlds built directly: gangs, least-attained-service order, the
starvation bound, preemption for long-waiting work, and namespaces flowsched may not hold."""

from __future__ import annotations

import math
from dataclasses import replace

from scoring.admission import plan_admission_for, queue_of
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.settings import CoreSettings
from scoring.world import JobState, NodeState, PendingPod, World

S = CoreSettings()
H = 3600.0


def gated(key: str, pods: tuple[float, ...], wait_s: float, attained: float = 0.0) -> JobState:
    return JobState(key=key, namespace=key.split("/")[0], gpus_on={}, live_gpus=int(sum(pods)), per_pod=1,
                    checkpointable=True, elastic=None, running=False, settling=True, runtime_s=math.nan,
                    attained_gpu_s=attained, gated_pods=pods, wait_s=wait_s)


def running(key: str, node: str, gpus: float, attained: float, runtime_s: float = 2 * H, **kw: object) -> JobState:
    base = JobState(key=key, namespace=key.split("/")[0], gpus_on={node: gpus}, live_gpus=int(gpus), per_pod=1,
                    checkpointable=True, elastic=None, running=True, settling=False, runtime_s=runtime_s,
                    attained_gpu_s=attained)
    return replace(base, **kw)  # type: ignore[arg-type]


def world(*jobs: JobState, free: tuple[float, float] = (4, 4), pending: tuple[PendingPod, ...] = (),
          labels: dict[str, dict[str, str]] | None = None) -> World:
    nodes = (NodeState("n0", 4, 4 - free[0]), NodeState("n1", 4, 4 - free[1]))
    return World(0.0, nodes, tuple(sorted(jobs, key=lambda j: j.key)), pending, labels or {})


def test_a_gang_is_released_only_when_all_its_pods_fit() -> None:
    big = gated("a/big", (1.0, 1.0, 1.0, 1.0), wait_s=100)
    assert [a.job for a in plan_admission_for(world(big, free=(2, 1)), S).admits] == []
    assert [(a.job, a.pods) for a in plan_admission_for(world(big, free=(2, 2)), S).admits] == [("a/big", 4)]
    # Pods kube-scheduler already sees go first: a waiting ungated pod takes 2 of the 4.
    seen = (PendingPod("a/other-0", "a/other", 2.0, 500.0),)
    assert plan_admission_for(world(big, free=(2, 2), pending=seen), S).admits == ()


def test_least_attained_service_first_then_the_longest_waiting() -> None:
    old = gated("a/old", (4.0,), wait_s=900, attained=20 * H)  # queue 1: it ran before
    new1 = gated("a/new1", (4.0,), wait_s=100)
    new2 = gated("a/new2", (4.0,), wait_s=300)
    assert queue_of(20 * H, S.admission.queue_thresholds_gpu_s) == 1 and queue_of(0.0, (16 * H,)) == 0
    plan = plan_admission_for(world(old, new1, new2, free=(4, 4)), S)
    assert [a.job for a in plan.admits] == ["a/new2", "a/new1"]  # room for two: queue 0, oldest first
    assert [o[0] for o in plan.order] == ["a/new2", "a/new1", "a/old"]


def test_a_smaller_job_goes_ahead_of_one_that_does_not_fit_unless_that_one_starves() -> None:
    big = gated("a/big", (4.0, 4.0), wait_s=600)
    small = gated("a/small", (2.0,), wait_s=60)
    assert [a.job for a in plan_admission_for(world(big, small, free=(4, 2)), S).admits] == ["a/small"]
    starving = replace(big, wait_s=9 * H)  # > 8 x max(attained, 1 GPU-hour)
    plan = plan_admission_for(world(starving, small, free=(4, 2)), S)
    assert plan.admits == () and "held" in dict((j, d) for j, _, _, d in plan.order)["a/small"]


def test_long_waiting_work_preempts_checkpointable_jobs_of_later_queues_only() -> None:
    waiting = gated("a/new", (4.0,), wait_s=120)
    served = running("a/served", "n0", 4, attained=30 * H)  # queue 1
    young = running("a/young", "n1", 4, attained=1 * H)  # queue 0: same as the waiting job
    plan = plan_admission_for(world(waiting, served, young, free=(0, 0)), S)
    assert [(p.job, p.for_job) for p in plan.preempts] == [("a/served", "a/new")]
    assert plan.admits == ()  # admitted once the GPUs are free, next interval
    assert plan_admission_for(world(replace(waiting, wait_s=10), served, young, free=(0, 0)), S).preempts == ()
    fixed = replace(served, checkpointable=False)
    assert plan_admission_for(world(waiting, fixed, young, free=(0, 0)), S).preempts == ()
    fresh = replace(served, runtime_s=60.0)  # just started: not preempted yet
    assert plan_admission_for(world(waiting, fresh, young, free=(0, 0)), S).preempts == ()
    off = replace(S, admission=replace(S.admission, preempt=False))
    assert plan_admission_for(world(waiting, served, young, free=(0, 0)), off).preempts == ()
    # Never more victims than the budget allows, and none in a namespace flowsched may not touch.
    assert plan_admission_for(world(waiting, served, young, free=(0, 0)), S, max_preempts=0).preempts == ()
    serving = replace(served, workload="inference")
    assert plan_admission_for(world(waiting, serving, young, free=(0, 0)), S).preempts == ()
    other = replace(served, key="kube-system/served", namespace="kube-system")
    assert plan_admission_for(world(waiting, other, young, free=(0, 0)), S).preempts == ()


def test_namespaces_flowsched_may_not_touch_are_never_held() -> None:
    held = gated("frozen/job", (4.0, 4.0, 4.0), wait_s=5)
    plan = plan_admission_for(world(held, free=(0, 0), labels={"frozen": {"flowsched.io/migrate": "false"}}), S)
    assert [a.job for a in plan.admits] == ["frozen/job"]
    assert [a.job for a in plan_admission_for(world(replace(held, key="kube-system/j", namespace="kube-system"),
                                                     free=(0, 0)), S).admits] == ["kube-system/j"]


def growing(remaining_s: float = math.nan, low: float = math.nan, high: float = math.nan) -> ConvergenceEstimate:
    """A job still improving, 900 steps in at a step a second; its time to the plateau and its
    interval as given (unknown by default)."""
    return ConvergenceEstimate(phase=Phase.GROWING, low_count=0, progress=0.5, growth_efficiency=math.nan,
                               remaining_steps=math.nan, remaining_seconds=remaining_s, step_rate=1.0, points_used=40,
                               last_step=900.0, remaining_steps_low=low, remaining_steps_high=high)


def _ran_before(key: str, wait_s: float, *, planned: float = math.nan, remaining_s: float = math.nan,
                low: float = math.nan, high: float = math.nan) -> JobState:
    e = growing(remaining_s, low, high)
    return replace(gated(key, (4.0,), wait_s=wait_s), estimate=e, planned_steps=planned)


def test_within_its_queue_a_job_predicted_to_end_soon_goes_first_if_the_evidence_is_strong() -> None:
    first = gated("a/first", (4.0,), wait_s=900)  # never reported: no prediction

    def admitted(other: JobState) -> list[str]:
        return [a.job for a in plan_admission_for(world(first, other, free=(4, 0)), S).admits]

    assert admitted(_ran_before("a/end", 100, planned=1000.0)) == ["a/end"]  # 100 s to its planned end
    assert admitted(_ran_before("a/end", 100, planned=90_000.0)) == ["a/first"]  # far from it
    # No planned end: its time to the plateau counts only when the learnt interval weighs at least
    # min_evidence (0.1: spanning up to about 500x).
    assert admitted(_ran_before("a/end", 100, remaining_s=100.0, low=90.0, high=110.0)) == ["a/end"]
    assert admitted(_ran_before("a/end", 100, remaining_s=100.0, low=10.0, high=1000.0)) == ["a/end"]  # 91x
    assert admitted(_ran_before("a/end", 100, remaining_s=100.0, low=0.0, high=10_000.0)) == ["a/first"]
    strict = replace(S, admission=replace(S.admission, min_evidence=0.5))  # 2x at most
    wide = _ran_before("a/end", 100, remaining_s=100.0, low=10.0, high=1000.0)
    assert [a.job for a in plan_admission_for(world(first, wide, free=(4, 0)), strict).admits] == ["a/first"]
    plan = plan_admission_for(world(first, _ran_before("a/end", 100, planned=1000.0), free=(4, 0)), S)
    assert "predicted to end in 100s" in plan.admits[0].reason


def test_a_job_about_to_reach_its_planned_end_is_not_preempted() -> None:
    waiting = gated("a/new", (4.0,), wait_s=120)
    e = growing()
    ending = running("a/served", "n0", 4, attained=30 * H, estimate=e, planned_steps=1000.0)  # 100 s left
    assert plan_admission_for(world(waiting, ending, free=(0, 0)), S).preempts == ()
    later = replace(ending, planned_steps=100_000.0)
    assert [p.job for p in plan_admission_for(world(waiting, later, free=(0, 0)), S).preempts] == ["a/served"]


def test_within_a_queue_the_least_predicted_work_goes_first_and_attained_service_where_nothing_is_predicted() -> None:
    # Three preempted jobs in queue 0: one predicted to need 2 GPU-h more (4 GPUs x 1800 s to its
    # planned end), one with 1 GPU-h attained and no prediction, one with 3 GPU-h attained and none.
    short = replace(_ran_before("a/short", 100, planned=2700.0), attained_gpu_s=5 * H)
    little = replace(gated("a/little", (4.0,), wait_s=50), attained_gpu_s=1 * H)
    much = replace(gated("a/much", (4.0,), wait_s=800), attained_gpu_s=3 * H)
    plan = plan_admission_for(world(short, little, much, free=(0, 0)), S)
    assert [o[0] for o in plan.order] == ["a/little", "a/short", "a/much"]
    old = replace(S, admission=replace(S.admission, order="finish_first"))  # waited longest first
    assert [o[0] for o in plan_admission_for(world(short, little, much, free=(0, 0)), old).order] == \
        ["a/much", "a/short", "a/little"]


def test_among_equals_the_job_with_the_most_work_left_is_preempted() -> None:
    waiting = gated("a/new", (4.0,), wait_s=120)
    e = growing()
    # Both in queue 1; the one with less attained has far more left to its planned end.
    near = running("a/near", "n0", 4, attained=40 * H, estimate=e, planned_steps=5_000.0)
    far = running("a/far", "n1", 4, attained=20 * H, estimate=e, planned_steps=100_000.0)
    assert [p.job for p in plan_admission_for(world(waiting, near, far, free=(0, 0)), S).preempts] == ["a/far"]


def test_queued_by_predicted_remaining_work_a_long_job_yields_before_it_has_attained_as_much() -> None:
    from scoring.admission import job_queue
    waiting = gated("a/new", (4.0,), wait_s=120)
    e = growing()
    # 1 GPU-h attained (queue 0 by attained service) but 4 GPUs x 99,100 s to its planned end.
    long = running("a/long", "n0", 4, attained=1 * H, estimate=e, planned_steps=100_000.0)
    unknown = running("a/unknown", "n1", 4, attained=2 * H)  # no prediction: its attained service
    one = (16 * H,)  # Tiresias' one threshold, under either rule
    by_att = replace(S, admission=replace(S.admission, queue_by="attained", queue_thresholds_gpu_s=one))
    by_left = replace(S, admission=replace(S.admission, queue_by="remaining", queue_thresholds_gpu_s=one))
    assert job_queue(long, 4.0, by_att.admission) == 0 and job_queue(long, 4.0, by_left.admission) == 1
    assert job_queue(unknown, 4.0, by_left.admission) == 0
    assert plan_admission_for(world(waiting, long, unknown, free=(0, 0)), by_att).preempts == ()
    assert [p.job for p in plan_admission_for(world(waiting, long, unknown, free=(0, 0)), by_left).preempts] == \
        ["a/long"]
    # 30 GPU-h attained, 100 s (0.1 GPU-h) left: queue 1 by attained service, queue 0 by what is left.
    ending = replace(long, attained_gpu_s=30 * H, planned_steps=1000.0)
    assert job_queue(ending, 4.0, by_att.admission) == 1 and job_queue(ending, 4.0, by_left.admission) == 0


def test_on_a_typed_cluster_a_gang_is_released_only_where_the_type_filter_lets_it_bind() -> None:
    """The typed demo (generated-0, seed 1, main 59e7613): a 24-GPU gang released because 24 GPUs
    were free across types waited 197,000 s in kube-scheduler's queue for one type to hold it,
    and meanwhile held no room a starving rule could keep for it. Admission now asks the same
    types as the extender's filter (scoring.typed_placement.TypePlan.allowed)."""
    nodes = (NodeState("v0", 4, 4, "v100"), NodeState("k0", 4, 0, "k80"))
    vision = replace(gated("a/vision", (4.0,), wait_s=100), model_class="vision")
    rec = replace(gated("a/rec", (4.0,), wait_s=50), model_class="recommendation")
    plan = plan_admission_for(World(0.0, nodes, (rec, vision), ()), S)
    # The vision job waits for a V100 (a K80 gives it 0.15 of its speed); the recommendation job,
    # fastest on a K80, takes it, though it waited less.
    assert [a.job for a in plan.admits] == ["a/rec"]
    assert plan_admission_for(World(0.0, nodes, (vision,), ()), S).admits == ()
    # An elastic job's pods carry the type of its elastic plan, which the World does not: by count.
    elastic = replace(vision, elastic=(1, 4))
    assert [a.job for a in plan_admission_for(World(0.0, nodes, (elastic,), ()), S).admits] == ["a/vision"]
    # On one type (or types off) the same World by count admits it.
    blind = replace(S, gpu_types=replace(S.gpu_types, enabled=False))
    assert [a.job for a in plan_admission_for(World(0.0, nodes, (vision,), ()), blind).admits] == ["a/vision"]
    # Preemption frees GPUs only where the job may bind: a queue-1 job on the K80 is not evicted
    # for it, one on the V100 is.
    k_old = replace(running("a/k-old", "k0", 4, attained=30 * H), model_class="vision")
    v_old = replace(running("a/v-old", "v0", 4, attained=30 * H), model_class="vision")
    full = (NodeState("v0", 4, 4, "v100"), NodeState("k0", 4, 4, "k80"))
    plan = plan_admission_for(World(0.0, full, (k_old, vision), ()), S)
    assert plan.preempts == ()
    plan = plan_admission_for(World(0.0, full, (k_old, v_old, vision), ()), S)
    assert [p.job for p in plan.preempts] == ["a/v-old"]


def test_a_node_of_no_known_type_counts_with_each_type_as_the_filter_lets_pods_bind_there() -> None:
    """The extender's filter passes nodes of no known GPU type for every job (gpu_type_gate:
    filter_by_type), so admission and the migrator count them with each type (a62a70c shared
    scoring.typed_placement.node_masks; admission had left them out: a vision gang waited for a V100
    beside a free node it could bind to)."""
    nodes = (NodeState("v0", 4, 4, "v100"), NodeState("k0", 4, 0, "k80"), NodeState("u0", 4, 0, ""))
    vision = replace(gated("a/vision", (4.0,), wait_s=100), model_class="vision")
    assert [a.job for a in plan_admission_for(World(0.0, nodes, (vision,), ()), S).admits] == ["a/vision"]
    # Without the untyped node it still waits for a V100 (the K80 alone is not its type).
    assert plan_admission_for(World(0.0, nodes[:2], (vision,), ()), S).admits == ()
    # The untyped node is full: nothing of its type is free, so it waits.
    busy = (*nodes[:2], NodeState("u0", 4, 4, ""))
    assert plan_admission_for(World(0.0, busy, (vision,), ()), S).admits == ()


def test_a_starving_job_keeps_only_the_nodes_of_its_types() -> None:
    # Two V100 nodes, one half used, and a free K80 node: the starving 8-GPU vision gang keeps the
    # V100s (nothing behind it takes them) but a recommendation job may still start on the K80.
    nodes = (NodeState("v0", 4, 2, "v100"), NodeState("v1", 4, 0, "v100"), NodeState("k0", 4, 0, "k80"))
    starving = replace(gated("a/big", (4.0, 4.0), wait_s=9 * H), model_class="vision")
    small = replace(gated("a/small", (2.0,), wait_s=60), model_class="vision")
    rec = replace(gated("a/rec", (4.0,), wait_s=30), model_class="recommendation")
    plan = plan_admission_for(World(0.0, nodes, (rec, small, starving), ()), S)
    assert [a.job for a in plan.admits] == ["a/rec"]
    assert "held" in dict((j, d) for j, _, _, d in plan.order)["a/small"]
