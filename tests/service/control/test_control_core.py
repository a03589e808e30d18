"""The control core on Worlds built directly: every loop honours both namespace opt-outs, the
composition rules hold, and the reported gradient noise moves the planned batch size."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from scoring.control import plan_elastic_for
from scoring.convergence import ConvergenceEstimate, Phase
from scoring.elastic import GradientNoise
from scoring.migrator_plan import plan_migrations_for
from scoring.safety import (
    EXCLUDED,
    HELD_MIGRATED,
    HELD_SCALED,
    NO_WHOLE_POD_SIZE,
    OPTED_OUT,
    SHRINKABLE,
    elastic_refusal,
    migrator_refusal,
    resizer_refusal,
)
from scoring.settings import CoreSettings
from scoring.world import JobState, NodeState, PendingPod, Throughput, World

# The elastic rules here are tested on jobs that report no throughput table, without the
# exploration cap (elastic.explore_factor), which has its own test below, and with a near-linear
# prior (no fixed compute, a 0.1 sync share) and the 30 % hysteresis they were written for, under
# which growing pays.
DEFAULTS = CoreSettings()
S = replace(DEFAULTS, elastic=replace(DEFAULTS.elastic, explore_factor=0.0, compute_fraction=0.0, sync_fraction=0.1,
                                      sync_per_gpu_fraction=0.0, min_gain=0.30))
LABELS = {"frozen": {"flowsched.io/migrate": "false"}, "open": {"flowsched.io/migrate": "true"}}


def est(phase: Phase, growth: float) -> ConvergenceEstimate:
    return ConvergenceEstimate(phase=phase, low_count=2, progress=growth, growth_efficiency=math.nan,
                               remaining_steps=math.nan, remaining_seconds=math.nan, step_rate=2.0, points_used=50,
                               last_step=500.0)


def job(key: str, node: str = "n0", gpus: float = 2, **kw: object) -> JobState:
    ns = key.split("/")[0]
    base = JobState(key=key, namespace=ns, gpus_on={node: gpus}, live_gpus=int(gpus), per_pod=1, checkpointable=True,
                    elastic=None, running=True, settling=False, runtime_s=7200.0, attained_gpu_s=7200.0 * gpus,
                    estimate=est(Phase.COMPLETING, 0.01))
    return replace(base, **kw)  # type: ignore[arg-type]


def world(*jobs: JobState, pending: tuple[PendingPod, ...] = ()) -> World:
    nodes = (NodeState("n0", 4, sum(j.gpus_on.get("n0", 0) for j in jobs)),
             NodeState("n1", 4, sum(j.gpus_on.get("n1", 0) for j in jobs)))
    return World(0.0, nodes, tuple(sorted(jobs, key=lambda j: j.key)), pending, LABELS)


BIG = (PendingPod("open/big-0", "open/big", 4.0, 3600.0),)


@pytest.mark.parametrize(("ns", "why"), [("kube-system", EXCLUDED), ("frozen", OPTED_OUT)])
def test_every_loop_honours_both_namespace_opt_outs(ns: str, why: str) -> None:
    j = job(f"{ns}/a", elastic=(1, 4))
    w = world(j)
    assert migrator_refusal(j, w, S.safety, elastic_on=True) == why
    assert elastic_refusal(j, w, S.safety, migrator_on=True) == why
    assert resizer_refusal(ns, w, S.safety) == why
    # Through the plans: a slow job holding the GPUs a waiting pod needs is not moved, and the
    # optimizer does not plan for it (its GPUs are not capacity either).
    mw = world(job(f"{ns}/a", gpus=4), job("open/b", node="n1", gpus=4, estimate=est(Phase.GROWING, 1.0)),
               pending=BIG)
    plan = plan_migrations_for(mw, S)
    assert plan.actions == () and plan.refusals[f"{ns}/a"] == why
    ep = plan_elastic_for(w, S)
    assert ep.actions == () and ep.refusals == {f"{ns}/a": why}
    # The same job in an open namespace is moved / planned.
    assert [a.job for a in plan_migrations_for(replace(mw, jobs=tuple(
        replace(x, key=x.key.replace(ns, "open"), namespace="open") for x in mw.jobs)), S).actions] == ["open/a"]


def test_composition_the_migrator_leaves_shrinkable_and_recently_scaled_jobs_to_the_optimizer() -> None:
    shrinkable = job("open/e", gpus=4, elastic=(1, 4))
    w = world(shrinkable, job("open/busy", node="n1", gpus=4, estimate=est(Phase.GROWING, 1.0)), pending=BIG)
    assert migrator_refusal(shrinkable, w, S.safety, elastic_on=True) == SHRINKABLE
    assert migrator_refusal(shrinkable, w, S.safety, elastic_on=False) is None  # no optimizer: it may move it
    assert plan_migrations_for(w, S, elastic_on=True).actions == ()
    assert [a.job for a in plan_migrations_for(w, S, elastic_on=False).actions] == ["open/e"]
    scaled = job("open/s", elastic=(2, 4), since_scaled_s=60.0)
    assert migrator_refusal(scaled, world(scaled), S.safety, elastic_on=True) == HELD_SCALED
    moved = job("open/m", elastic=(1, 4), since_migration_s=60.0)
    assert elastic_refusal(moved, world(moved), S.safety, migrator_on=True) == HELD_MIGRATED
    assert elastic_refusal(moved, world(moved), S.safety, migrator_on=False) is None


def test_budget_left_caps_the_migrators_moves() -> None:
    w = world(job("open/a", gpus=4), job("open/b", node="n1", gpus=4),
              pending=(*BIG, PendingPod("open/big-1", "open/big", 4.0, 3600.0)))
    assert len(plan_migrations_for(w, S, max_moves=2).actions) == 2
    assert len(plan_migrations_for(w, S, max_moves=1).actions) == 1
    assert plan_migrations_for(w, S, max_moves=0).actions == ()


def test_reported_gradient_noise_moves_the_planned_batch() -> None:
    def planned(grad_var: float) -> tuple[int, int]:
        j = job("open/pt", gpus=2, elastic=(1, 4), checkpointable=False, estimate=est(Phase.GROWING, 1.0),
                batch_size=256, batch_range=(64, 4096), noise=GradientNoise(1.0, grad_var * 256 / 64, 64),
                step_samples={2: 0.5})
        [a] = plan_elastic_for(world(j), S).actions
        return a.gpus, a.batch_size

    quiet, noisy = planned(0.001), planned(1000.0)
    assert quiet[1] < 256 < noisy[1]  # more gradient noise: larger batches stay efficient
    # Without a report the batch is the job's own and never changes.
    plain = job("open/pt", gpus=2, elastic=(1, 4), checkpointable=False, estimate=est(Phase.GROWING, 1.0))
    assert all(a.batch_size == 0 for a in plan_elastic_for(world(plain), S).actions)


def test_a_job_that_changes_its_batch_live_is_rebatched_at_its_size() -> None:
    # Held at its 2 GPUs (rescaled a minute ago), with gradient noise that favours larger batches:
    # a job that adopts a planned batch only at a restart is left alone; one that says batch_live
    # gets a larger batch at its size (a "rebatch": no restart, so the cooldown does not hold it).
    def actions(live: bool) -> list[tuple[str, int, int, str]]:
        j = job("open/pt", gpus=2, elastic=(1, 4), checkpointable=False, estimate=est(Phase.GROWING, 1.0),
                batch_size=256, batch_range=(64, 4096), noise=GradientNoise(1.0, 1000.0 * 256 / 64, 64),
                step_samples={2: 0.5}, since_scaled_s=60.0, batch_live=live)
        return [(a.kind, a.gpus, a.batch_size, a.reason) for a in plan_elastic_for(world(j), S).actions]

    assert actions(False) == []
    [(kind, gpus, batch, reason)] = actions(True)
    assert kind == "rebatch" and gpus == 2 and batch > 256
    assert f"batch gain {S.elastic.batch_gain:.0%}" in reason  # the Event says why it moved at its size


def test_the_service_world_forgets_what_it_measured_of_a_job_gone_an_hour() -> None:
    """A long-running service kept every elastic job's step samples it had ever seen; a job with no
    live pod for forget_after_s is dropped, one whose pods come back within it keeps them."""
    from extender.control.world_builder import WorldBuilder
    from extender.snapshot.objects import parse_node, parse_pod
    from scoring.step_samples import MeasuredSteps
    from tests.k8s_factories import node, pod

    n0 = (parse_node(node("n0")),)
    t = parse_pod(pod("train-0", gpus=1, node_name="n0", namespace="open", phase="Running", owner=("Job", "train")))
    b = WorldBuilder(_NoEstimates(), lambda: {})
    b.build((t,), n0, {}, 0.0)
    b.measured["open/job-train"] = MeasuredSteps(samples={2: 1.0})
    b.build((), n0, {}, 3000.0)  # evicted, its new pods not there yet: kept
    assert b.measured == {"open/job-train": MeasuredSteps(samples={2: 1.0})}
    b.build((t,), n0, {}, 3500.0)
    b.build((), n0, {}, 3500.0 + b.forget_after_s + 1.0)
    assert b.measured == {} and b.last_seen == {}


def test_the_service_world_marks_inference_jobs_and_no_loop_touches_them() -> None:
    from extender.control.world_builder import WorldBuilder
    from extender.snapshot.objects import parse_node, parse_pod
    from tests.k8s_factories import node, pod

    p = parse_pod(pod("web-0", gpus=1, node_name="n0", namespace="open", phase="Running",
                      owner=("ReplicaSet", "web-abc"), annotations={"flowsched.io/checkpointable": "true"}))
    t = parse_pod(pod("train-0", gpus=1, node_name="n0", namespace="open", phase="Running",
                      owner=("Job", "train"), annotations={"flowsched.io/checkpointable": "true"}))
    w = WorldBuilder(_NoEstimates(), lambda: {}).build((p, t), (parse_node(node("n0")),), {}, 0.0)
    kinds = {j.key: j.workload for j in w.jobs}
    assert kinds == {"open/replicaset-web-abc": "inference", "open/job-train": "training"}
    web = w.job("open/replicaset-web-abc")
    assert web is not None and migrator_refusal(web, w, S.safety, elastic_on=False) is not None


class _NoEstimates:
    def snapshot(self) -> dict[str, ConvergenceEstimate]:
        return {}


@pytest.mark.parametrize(("mode", "within", "largest"),
                         [("always", 1.0, 8), ("free", 1.0, 5), ("free", 8.0, 8), ("never", 8.0, 1)])
def test_a_waiting_job_is_grown_only_as_grow_waiting_allows(mode: str, within: float, largest: int) -> None:
    # n0: 3 GPUs held by a running elastic job, 1 free; n1: 4 free. The waiting job asks for 1.
    running = job("open/run", gpus=3, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0))
    waiting = job("open/new", gpus=1, elastic=(1, 8), gpus_on={}, running=False, settling=True,
                  runtime_s=math.nan, attained_gpu_s=0.0, estimate=None)
    s = replace(S, elastic=replace(S.elastic, grow_waiting=mode, grow_waiting_within=within))
    plan = plan_elastic_for(world(running, waiting), s)
    [offered] = [o for o in plan.options if o.key == "open/new"]
    feasible = [g for g in range(offered.rate.shape[0]) if g > 0 and np.isfinite(offered.rate[g]).any()]
    assert max(feasible) == largest  # "always" counts on the running job's 3 GPUs coming back


def test_remaining_work_is_attained_service_scaled_by_the_planned_steps_left() -> None:
    j = job("open/a", gpus=2, planned_steps=2000.0)  # 500 of 2000 steps done in 4 GPU-hours
    assert j.remaining_gpu_s() == pytest.approx(4 * 3600.0 * 1500 / 500)
    assert math.isnan(job("open/b").remaining_gpu_s())  # no planned end reported
    assert math.isnan(job("open/c", planned_steps=2000.0, estimate=None).remaining_gpu_s())
    assert job("open/d", planned_steps=100.0).remaining_gpu_s() == 0.0  # past its planned end


def test_srpt_weight_favours_the_job_with_less_work_left_and_leaves_unknown_ones_alone() -> None:
    growing = est(Phase.GROWING, 1.0)
    short = job("open/short", elastic=(1, 8), estimate=growing, planned_steps=550.0)  # 0.4 GPU-h left
    long = job("open/long", node="n1", elastic=(1, 8), estimate=growing, planned_steps=5000.0)  # 36 GPU-h
    unknown = job("open/unknown", node="n1", elastic=(1, 8), estimate=growing)

    def weights(power: float) -> dict[str, float]:
        s = replace(S, elastic=replace(S.elastic, srpt_power=power, srpt_rank_p=0.0))
        return {o.key: o.weight for o in plan_elastic_for(world(short, long, unknown), s).options}

    assert set(weights(0.0).values()) == {1.0}  # off
    w = weights(0.5)
    assert w["open/short"] == pytest.approx(1.4 ** -0.5) and w["open/long"] == pytest.approx(37.0 ** -0.5)
    assert w["open/unknown"] == 1.0


def test_rank_weights_give_the_dp_hesrpt_shares_by_rank_not_size() -> None:
    from scoring.control import rank_weights
    p = 0.5  # q = 2: heSRPT's shares are (2i - 1) / m^2, largest job i = 1
    w = rank_weights(np.array([100.0, 1.0, 10.0, 20.0]), p)
    q = 1.0 / (1.0 - p)
    # maximising sum w_i k^p with sum k = 1 gives k_i proportional to w_i^q: heSRPT's shares
    k = w ** q / (w ** q).sum()
    assert k == pytest.approx(np.array([1.0, 7.0, 5.0, 3.0]) / 16.0)
    assert w.max() == 1.0 and w[1] == 1.0  # the least work left weighs most
    # only the order counts: the same ranks give the same weights whatever the sizes
    assert rank_weights(np.array([1e6, 0.1, 2.0, 3.0]), p) == pytest.approx(w)
    unknown = np.array([100.0, np.nan, 10.0])
    assert rank_weights(unknown, p)[1] == 1.0  # "smallest": new work first
    med = rank_weights(unknown, p, "median")
    assert med[0] < med[1] < 1.0 or med[0] < med[2] < 1.0  # ranked beside the median, not first
    assert rank_weights(np.zeros(0), p).size == 0
    # ties share their ranks' shares: equal jobs weigh the same, and all-unknown is neutral
    tied = rank_weights(np.array([100.0, 5.0, 5.0, 1.0]), p)
    assert tied[1] == tied[2] and tied[0] < tied[1] < tied[3] == 1.0
    k2 = tied ** q / (tied ** q).sum()
    assert k2 == pytest.approx(np.array([1.0, 4.0, 4.0, 7.0]) / 16.0)  # (3 + 5) / 2 each
    for how in ("smallest", "median"):
        assert rank_weights(np.full(3, np.nan), p, how).tolist() == [1.0, 1.0, 1.0]
        both = rank_weights(np.array([10.0, np.nan, np.nan]), p, how)
        assert both[1] == both[2]


def test_rank_weights_reach_the_optimizer_only_when_switched_on() -> None:
    assert S.elastic.srpt_rank_p == 0.7 and S.elastic.srpt_rank_unknown == "median"  # on by default
    growing = est(Phase.GROWING, 1.0)
    short = job("open/short", elastic=(1, 8), estimate=growing, planned_steps=550.0)
    long = job("open/long", node="n1", elastic=(1, 8), estimate=growing, planned_steps=5000.0)

    def weights(p: float) -> dict[str, float]:
        s = replace(S, elastic=replace(S.elastic, srpt_rank_p=p))
        return {o.key: o.weight for o in plan_elastic_for(world(short, long), s).options}

    assert set(weights(0.0).values()) == {1.0}
    w = weights(0.5)  # two jobs: shares 1/4 and 3/4, weights their square roots
    assert w["open/short"] == 1.0 and w["open/long"] == pytest.approx(3.0 ** -0.5)
    with pytest.raises(ValueError, match="srpt_rank_p"):
        replace(S.elastic, srpt_rank_p=1.0)


def test_a_job_with_no_planned_end_ranks_by_its_predicted_end_when_that_weighs_enough() -> None:
    """Half the default end mix declares no planned end; they ranked as unknown work (the median)
    even when their early-stopping end was predicted (admission already ordered them by it)."""
    from scoring.control import work_left_gpu_s
    from scoring.stopping import EndReason, JobEnd

    growing = est(Phase.GROWING, 1.0)
    stops = JobEnd(300.0, 200.0, 500.0, 600.0, 400.0, 1000.0, EndReason.EARLY_STOPPING, 0.4)
    short = job("open/short", elastic=(1, 8), estimate=growing, planned_steps=550.0)  # 0.4 GPU-h left
    long = job("open/long", node="n1", elastic=(1, 8), estimate=growing, planned_steps=5000.0)  # 36 GPU-h
    early = job("open/early", node="n1", elastic=(1, 8), estimate=replace(growing, end=stops))  # 600 s x 2 GPUs
    assert work_left_gpu_s(early, 0.1) == 1200.0 and math.isnan(work_left_gpu_s(early, 0.5))
    assert work_left_gpu_s(short, 2.0) == short.remaining_gpu_s()  # a planned end whatever the setting
    waiting = replace(early, gpus_on={}, running=False)
    assert math.isnan(work_left_gpu_s(waiting, 0.1))
    off = S.elastic.srpt_rank_min_evidence  # the default: never
    assert off > 1.0 and math.isnan(work_left_gpu_s(early, off))

    def weights(min_evidence: float, share: float = 1.0) -> dict[str, float]:
        s = replace(S, elastic=replace(S.elastic, srpt_rank_p=0.5, srpt_rank_min_evidence=min_evidence,
                                       srpt_rank_predicted_share=share))
        return {o.key: o.weight for o in plan_elastic_for(world(short, long, early), s).options}

    # 0.33 GPU-h left: the least work, the largest weight; weighed too little, it is unknown work
    # ranked beside the median of the known, between the short job and the long one.
    by_end = weights(0.1)
    assert by_end["open/early"] == 1.0 and by_end["open/long"] < by_end["open/short"] < 1.0
    unknown = weights(0.5)
    assert unknown["open/short"] == 1.0 and unknown["open/early"] < 1.0 and unknown["open/long"] < unknown["open/early"]
    assert weights(0.1, share=0.0) == unknown == weights(off, share=0.5)
    # Counted by half: each weight the geometric mean of the two rankings (scoring.control.srpt_weights).
    half = weights(0.1, share=0.5)
    for key, w in half.items():
        assert w == pytest.approx(math.sqrt(by_end[key] * unknown[key]))
    assert unknown["open/early"] < half["open/early"] < by_end["open/early"]
    with pytest.raises(ValueError, match="srpt_rank_min_evidence"):
        replace(S.elastic, srpt_rank_min_evidence=-0.1)
    with pytest.raises(ValueError, match="srpt_rank_predicted_share"):
        replace(S.elastic, srpt_rank_predicted_share=1.5)


def test_a_waiting_job_is_planned_at_a_size_whose_pods_fit_node_by_node() -> None:
    # n0: an elastic job at its top holds 2 of 4; n1: a fixed job holds 2 of 4. 4 GPUs are free,
    # 2 per node: the DP (it counts GPUs) plans the waiting job at 4, one 4-GPU pod that fits no node.
    held = job("open/held", elastic=(1, 2), estimate=est(Phase.GROWING, 1.0))
    fixed = job("open/fixed", node="n1")
    waiting = job("open/wait", gpus_on={}, live_gpus=4, elastic=(1, 4), running=False, settling=False,
                  runtime_s=math.nan, attained_gpu_s=0.0, estimate=None, pod_chunk=4, gated_pods=(4.0,),
                  wait_s=600.0)

    def planned(fit: bool) -> int:
        s = replace(S, elastic=replace(S.elastic, fit_waiting=fit))
        plan = plan_elastic_for(world(held, fixed, waiting), s)
        assert plan.plan is not None
        return {d.key: d.gpus for d in plan.plan.decisions}["open/wait"]

    assert planned(False) == 4  # what the counting DP says: it would wait with 4 GPUs idle
    assert planned(True) == 2  # the largest size whose pods fit: 2 GPUs on one node
    s = replace(S, elastic=replace(S.elastic, fit_waiting=True))
    [scale] = [a for a in plan_elastic_for(world(held, fixed, waiting), s).actions if a.job == "open/wait"]
    assert (scale.gpus, scale.from_gpus) == (2, 4)  # its pods are replaced by ones that fit


def test_a_growing_job_grows_only_as_far_as_its_pods_fit() -> None:
    # n0: the elastic job holds 2, a fixed one 1 (1 free); n1: a fixed job holds 2 (2 free). The DP
    # grows the elastic job to 5 GPUs (pods 4 + 1), but with its own 2 back n0 has 3 free: its
    # largest size that fits is 3, one 3-GPU pod on n0.
    grow = job("open/grow", elastic=(1, 8), estimate=est(Phase.GROWING, 1.0), pod_chunk=4)
    small = job("open/small", gpus=1)
    fixed = job("open/fixed", node="n1")

    def planned(fit: bool) -> int:
        s = replace(S, elastic=replace(S.elastic, fit_waiting=fit))
        plan = plan_elastic_for(world(grow, small, fixed), s)
        assert plan.plan is not None
        return {d.key: d.gpus for d in plan.plan.decisions}["open/grow"]

    assert planned(False) == 5
    assert planned(True) == 3


def test_the_migrator_reads_a_planned_end_as_the_time_left_and_nothing_else() -> None:
    from scoring.migrator_plan import migration_arrays
    ending = job("open/ending", planned_steps=600.0)  # 100 steps at 2 steps/s: 50 s left
    _, arrays, _ = migration_arrays(world(ending, job("open/other", node="n1")), S, elastic_on=False)
    assert arrays.remaining_s[0] == pytest.approx(50.0) and math.isnan(arrays.remaining_s[1])


def test_a_job_in_its_cooldown_grows_into_free_gpus_only() -> None:
    # "a" was rescaled 100 s ago to the 2 GPUs it runs at (its plan carried out). n0: a's 2 and 2
    # free; n1: "b", another elastic job, holds 4. a may grow into the 2 free GPUs, not into b's.
    a = job("open/a", gpus=2, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0), since_scaled_s=100.0,
            planned_gpus=2)
    b = job("open/b", node="n1", gpus=4, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0))

    def planned(a: JobState, grow: bool = True) -> dict[str, int]:
        # b, known at one size only, would also grow on the prior with GPUs free (min_gain_explore,
        # tested on its own): off here, where the hold after a rescale is the subject.
        s = replace(S, elastic=replace(S.elastic, grow_in_cooldown=grow, min_gain_explore=1.0))
        return {x.job: x.gpus for x in plan_elastic_for(world(a, b), s).actions}

    assert planned(a) == {"open/a": 4}
    # Held where it is, as before the setting; the 2 GPUs left free go to b, which has run at its
    # size for two hours with no job waiting (elastic.min_gain_idle), and not before that.
    assert planned(a, grow=False) == {"open/b": 6}
    b = replace(b, runtime_s=1800.0)  # within its cooldown at its size: min_gain as always
    assert planned(a, grow=False) == {}
    # Its latest plan (8 GPUs) not carried out yet: held, not planned again.
    assert planned(replace(a, planned_gpus=8)) == {}
    # Out of its cooldown, the optimizer may take b's GPUs for it as for any job.
    assert planned(replace(a, since_scaled_s=1000.0)).get("open/a", 0) >= 4


def test_a_rescale_must_pay_back_its_restart_before_the_planned_end() -> None:
    # A lone job on 2 of 8 GPUs, growing would double its speed. 500 of its steps done at 2 steps/s:
    # with 60 s to its planned end a restart (restart_s 120) cannot pay back; with an hour it can.
    def planned(steps: float, to_end: bool = True) -> list[int]:
        j = job("open/a", gpus=2, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0), planned_steps=steps)
        s = replace(S, elastic=replace(S.elastic, horizon_to_end=to_end))
        return [x.gpus for x in plan_elastic_for(world(j), s).actions]

    assert planned(500.0 + 2.0 * 60) == []
    assert planned(500.0 + 2.0 * 60, to_end=False) == [8]
    assert planned(500.0 + 2.0 * 3600) == [8]
    assert planned(math.nan) == [8]  # no planned end: the settings' horizon


def test_a_job_with_no_whole_pod_size_in_its_range_is_refused_and_the_rest_planned() -> None:
    # "bad" runs one 4-GPU pod on n0 but is annotated 1-2: no size in its range is a whole pod, so
    # it has no option at all. It is refused, held at its size (its 4 GPUs counted as others'),
    # and "good" is planned as if it were not there: it grows into n1's 3 free GPUs.
    bad = job("open/bad", gpus=4, per_pod=4, elastic=(1, 2), estimate=est(Phase.GROWING, 1.0))
    good = job("open/good", node="n1", gpus=1, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0))
    alone = plan_elastic_for(world(good), S)
    both = plan_elastic_for(world(bad, good), S)
    assert [(a.job, a.gpus) for a in alone.actions] == [("open/good", 8)]  # n0 free too
    assert both.plan is not None and both.plan.feasible
    assert [(a.job, a.gpus) for a in both.actions] == [("open/good", 4)]
    assert both.refusals == {"open/bad": NO_WHOLE_POD_SIZE}
    assert both.accounting["held_by_others"] == 4.0 and [j.key for j in both.jobs] == ["open/good"]
    assert plan_elastic_for(world(bad), S).actions == ()


def test_a_job_running_on_a_cordoned_node_keeps_its_cooldown_and_settling_hold() -> None:
    # "x" runs 4 GPUs on a cordoned node (not in the World: gpus_on is empty); it was rescaled to 6
    # 60 s ago (cooldown 300 s) and n0 and n1 are free. It is running, not waiting: held at 4.
    x = job("open/x", gpus=4, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0), since_scaled_s=60.0,
            planned_gpus=6)
    cordoned = replace(x, gpus_on={})
    assert plan_elastic_for(world(x), S).actions == ()  # on a schedulable node: held
    assert plan_elastic_for(world(cordoned), S).actions == ()
    # Mid-change (a pod pending) with the shell reporting where its other pods run: held too.
    changing = replace(cordoned, running=False, settling=True, since_scaled_s=math.inf, gpus_elsewhere=4.0)
    assert plan_elastic_for(world(changing), S).actions == ()
    # Its GPUs there count as capacity for its held size: "y" on n0 and n1 is not shrunk for it.
    y = job("open/y", gpus=4, elastic=(1, 8), estimate=est(Phase.GROWING, 1.0))
    y = replace(y, gpus_on={"n0": 4.0, "n1": 4.0}, live_gpus=8)
    plan = plan_elastic_for(world(cordoned, y), S)
    assert plan.actions == () and plan.accounting["held_on_unschedulable_nodes"] == 4.0
    # Out of its cooldown it may be rescaled, as a running job (never stopped: not planned at 0).
    free = replace(cordoned, since_scaled_s=math.inf, planned_gpus=0)
    assert [(a.from_gpus, a.gpus) for a in plan_elastic_for(world(free), S).actions] == [(4, 8)]



def test_a_job_known_only_by_its_measurements_is_offered_at_most_twice_its_largest_measured_size() -> None:
    # Pollux's exploration rule: the prior's near-linear speed-up is not trusted far beyond what
    # the job measured; with a throughput table (what the job reports of every size) no cap.
    base = job("open/run", gpus=1, elastic=(1, 16), estimate=est(Phase.GROWING, 1.0))
    nodes = (NodeState("n0", 8.0, 1.0), NodeState("n1", 8.0, 0.0))
    capped = replace(DEFAULTS, elastic=replace(DEFAULTS.elastic, explore_factor=2.0))

    def top(j: JobState) -> int:
        [o] = plan_elastic_for(World(0.0, nodes, (j,), (), LABELS), capped).options
        return max(g for g in range(o.rate.shape[0]) if g > 0 and np.isfinite(o.rate[g]).any())

    assert top(base) == 2
    assert top(replace(base, step_samples={1: 1.0, 3: 0.4})) == 6
    table = Throughput(np.array([256]), np.vstack([[np.nan], np.full((16, 1), 1.0)]), np.full((17, 1), 256.0))
    assert top(replace(base, throughput=table, batch_size=256)) == 16
