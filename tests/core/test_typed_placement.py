"""The service's GPU-type placement core on arrays: per-type step times into speeds, and the types a
job's pods may bind to (scoring.step_samples, scoring.typed_placement)."""

from __future__ import annotations

import math

import pytest

from scoring.gpu_types import ANY, GpuTypeSettings, allowed_types
from scoring.settings import CoreSettings
from scoring.step_samples import MeasuredSteps, record_type_sample, type_speeds
from scoring.typed_placement import plan_types
from scoring.world import JobState, NodeState, World

S = GpuTypeSettings(fallback_s=600.0, min_share=0.5)


def test_step_times_per_type_are_kept_only_on_one_type_while_steady() -> None:
    m = MeasuredSteps()
    record_type_sample(m, "v100", 2.0, 4, settling=False)
    record_type_sample(m, "", 1.0, 4, settling=False)  # spans types: nothing
    record_type_sample(m, "k80", 1.0, 4, settling=True)  # mid-change: nothing
    record_type_sample(m, "k80", math.nan, 4, settling=False)
    assert m.by_type == {"v100": {4: 0.5}} and m.samples == {}


def test_speeds_compare_types_at_one_gpu_count() -> None:
    # 4 GPUs on both: the count measured on most types; 0.5 s vs 2.0 s a step -> 4x.
    assert type_speeds({"v100": {4: 0.5, 2: 0.9}, "k80": {4: 2.0}}) == {"k80": 0.5, "v100": 2.0}
    # Only other counts on one type: the nearest count scaled as ideal data parallelism (x 4/2).
    sp = type_speeds({"v100": {4: 0.5}, "p100": {2: 1.0}})
    assert sp == {"p100": pytest.approx(2.0), "v100": pytest.approx(2.0)}
    assert type_speeds({}) == {} and type_speeds({"v100": {}}) == {}


def node(name: str, t: str, gpus: float = 4.0, used: float = 0.0) -> NodeState:
    return NodeState(name, gpus, used, t)


def job(key: str, *, on: dict[str, float] | None = None, gpus: int = 4, cls: str = "vision",
        measured: dict[str, float] | None = None, wait_s: float = math.nan) -> JobState:
    return JobState(key=key, namespace=key.split("/")[0], gpus_on=on or {}, live_gpus=gpus, per_pod=gpus,
                    checkpointable=True, elastic=None, running=bool(on), settling=not on, runtime_s=math.nan,
                    attained_gpu_s=0.0, model_class=cls, gpu_measured=measured or {}, wait_s=wait_s)


def core() -> CoreSettings:
    return CoreSettings(gpu_types=S)


def test_untyped_world_gives_no_constraint() -> None:
    w = World(100.0, (node("a", "v100"), node("b", "v100")), (job("ns/x", wait_s=5.0),), ())
    plan = plan_types(w, core())
    assert not plan.typed and plan.allowed("ns/x", 100.0, S) == ()


def test_jobs_get_the_type_where_they_gain_most_and_fall_back_after_the_bound() -> None:
    # One V100 and one K80 node, both free: the vision job gains ~6.6x on a V100, the
    # recommendation job runs faster on a K80 (Gavel's measurements): each gets its own.
    nodes = (node("v", "v100"), node("k", "k80"))
    w = World(1000.0, nodes, (job("ns/vis", wait_s=10.0), job("ns/rec", cls="recommendation", wait_s=10.0)), ())
    plan = plan_types(w, core())
    assert plan.typed and plan.room == {"v100": 4.0, "k80": 4.0}
    assert plan.allowed("ns/vis", 1000.0, S) == ("v100",)
    assert plan.allowed("ns/rec", 1000.0, S) == ("k80",)
    # The V100 is full: the vision job waits for it (a K80 gives it under min_share of its speed) ...
    w = World(1000.0, (node("v", "v100", used=4.0), node("k", "k80")),
              (job("ns/held", on={"v": 4.0}), job("ns/vis", wait_s=10.0)), ())
    plan = plan_types(w, core())
    assert plan.allowed("ns/held", 1000.0, S) == ("v100",)  # a job never leaves (or spans) its type
    assert plan.allowed("ns/vis", 1000.0, S) == ("v100",)
    # ... until it has waited fallback_s: then a type within min_share of its fastest, a P100 here.
    w = World(1000.0, (node("v", "v100", used=4.0), node("p", "p100"), node("k", "k80")),
              (job("ns/held", on={"v": 4.0}), job("ns/vis", wait_s=10.0)), ())
    plan = plan_types(w, core())
    assert plan.allowed("ns/vis", 1000.0, S) == ("p100",)  # room at 0.76 of its speed: offered at once
    assert plan.allowed("ns/vis", 1000.0 - 10.0 + 600.0, S) == ("v100", "p100")


def test_a_job_falls_back_only_to_types_within_min_share_of_its_fastest() -> None:
    """The typed demo (generated-0, seed 1, main 67c7dcf): an ImageNet-like elastic job, shrunk and
    requeued, waited fallback_s for the full V100s and P100s, took 7 K80s (0.14 of its V100
    speed), and kept that type, as a running job does, for 917,000 s; at 7f654b3 a job that is not
    elastic did the same on 24 K80s for 613,713 s. After the bound a job falls back only to the
    types within min_share of its fastest that can hold it (an elastic job: its fewest GPUs)."""
    from dataclasses import replace

    nodes = (node("v", "v100", used=4.0), node("k", "k80"))
    rigid = job("ns/vis", wait_s=10.0)
    elastic = replace(job("ns/ela", wait_s=10.0), elastic=(1, 8))
    w = World(1000.0, nodes, (job("ns/held", on={"v": 4.0}), rigid, elastic), ())
    plan = plan_types(w, core())
    later = 1000.0 - 10.0 + 600.0
    assert plan.allowed("ns/vis", later, S) == ("v100",)
    assert plan.allowed("ns/ela", 1000.0, S) == ("v100",)
    assert plan.allowed("ns/ela", later, S) == ("v100",)
    sp = {"k80": 0.2, "p100": 0.7, "v100": 1.0}
    assert allowed_types("v100", sp, 600.0, S, elastic_min=1) == ("v100", "p100")
    assert allowed_types(None, sp, 0.0, S, elastic_min=1) == ("v100", "p100")
    assert allowed_types("v100", sp, 600.0, S) == ("v100", "p100")
    assert allowed_types("v100", sp, 600.0, GpuTypeSettings(min_share=0.0)) == ("v100", "p100", "k80")
    # Not elastic, 8 GPUs: only the K80s hold them, so any type rather than wait forever.
    assert allowed_types("v100", sp, 600.0, S, 8, {"k80": 24.0, "p100": 4.0, "v100": 4.0}) == ("v100", "p100", "k80")
    cap = {"k80": 24.0, "p100": 4.0, "v100": 4.0}
    assert allowed_types("v100", sp, 600.0, S, 8, cap, elastic_min=1) == ("v100", "p100")  # it can shrink to fit
    # Its minimum, 8 GPUs, fits the K80s alone: any type rather than wait forever.
    assert allowed_types("v100", sp, 600.0, S, 8, cap, elastic_min=8) == ("v100", "p100", "k80")


def test_an_elastic_job_whose_pods_ask_more_than_every_type_spans_them_as_in_the_simulator() -> None:
    # Its pods ask 12 GPUs of a 4 + 4 cluster: they span the types (at the slower's speed) rather
    # than wait on one type that cannot hold them, whatever its minimum; the simulator's filter
    # (benchmarks/sim/typed.py) tests the job's ask now, and so does the service's.
    from dataclasses import replace

    big = replace(job("ns/big", gpus=12, wait_s=10.0), elastic=(1, 16))
    plan = plan_types(World(1000.0, (node("v", "v100"), node("k", "k80")), (big,), ()), core())
    assert plan.jobs["ns/big"].gpus == 12.0 and plan.jobs["ns/big"].elastic_min == 1.0
    assert plan.allowed("ns/big", 1000.0, S) == (ANY,)
    small = replace(job("ns/small", gpus=4, wait_s=10.0), elastic=(1, 16))
    plan = plan_types(World(1000.0, (node("v", "v100"), node("k", "k80")), (small,), ()), core())
    assert plan.allowed("ns/small", 1000.0, S) == ("v100",)


def test_a_job_the_plan_has_not_seen_gets_its_type_alone_and_its_plan_type_wins() -> None:
    w = World(0.0, (node("v", "v100", used=4.0), node("k", "k80")), (), ())
    plan = plan_types(w, core())
    # Arrived since the plan: a language job loses over half its speed on a K80 -> waits for V100.
    assert plan.allowed("ns/new", 5.0, S, model_class="language", gpus=4, created_at=4.0) == ("v100",)
    assert plan.allowed("ns/new", 700.0, S, model_class="language", gpus=4, created_at=4.0) == ("v100",)
    # Its elastic plan named a type: that one.
    assert plan.allowed("ns/new", 5.0, S, pinned="k80", model_class="language", gpus=4, created_at=4.0) == ("k80",)
    # Larger than every type: it may only span them.
    assert plan.allowed("ns/big", 5.0, S, model_class="language", gpus=6, created_at=4.0) == (ANY,)


def test_measured_speeds_override_the_prior() -> None:
    # A "vision" job that measured itself barely faster on the V100 than on the K80 is no longer
    # kept off the K80 (0.9 of its best there >= min_share).
    w = World(0.0, (node("v", "v100", used=4.0), node("k", "k80")),
              (job("ns/held", on={"v": 4.0}), job("ns/odd", measured={"v100": 1.0, "k80": 0.9}, wait_s=1.0)), ())
    plan = plan_types(w, core())
    assert plan.jobs["ns/odd"].measured == ("k80", "v100")
    assert plan.allowed("ns/odd", 0.0, S) == ("k80",)


def test_the_migrator_frees_gpus_only_of_a_type_the_waiting_pod_may_bind_to() -> None:
    """Admission's typed rule (8634af8) for the migrator: it counted a waiting pod's GPUs as on one
    type and would evict a slow job from a K80 for a vision pod that binds only to a V100, an
    eviction that serves nothing (scoring.migrator_plan.pending_nodes)."""
    from dataclasses import replace

    from scoring.convergence import ConvergenceEstimate, Phase
    from scoring.migrator_plan import plan_migrations_for
    from scoring.world import PendingPod

    slow = ConvergenceEstimate(phase=Phase.COMPLETING, low_count=2, progress=0.01, growth_efficiency=math.nan,
                               remaining_steps=math.nan, remaining_seconds=math.nan, step_rate=2.0, points_used=50,
                               last_step=500.0)

    def held(key: str, on: str, growth: float) -> JobState:
        return replace(job(key, on={on: 4.0}), runtime_s=7200.0, settling=False,
                       estimate=replace(slow, progress=growth))

    nodes = (node("v", "v100", used=4.0), node("k", "k80", used=4.0))
    vis = job("ns/vis", wait_s=60.0)
    pod = (PendingPod("ns/vis-0", "ns/vis", 4.0, 60.0),)
    k_slow, v_slow = held("ns/k-slow", "k", 0.001), held("ns/v-slow", "v", 0.01)
    w = World(1000.0, nodes, (k_slow, v_slow, vis), pod)
    assert plan_types(w, core()).allowed("ns/vis", 1000.0, S) == ("v100",)
    # The K80 job grows slower, so type-blind it went first; now the V100 job goes.
    assert [a.job for a in plan_migrations_for(w, core()).actions] == ["ns/v-slow"]
    assert plan_migrations_for(replace(w, jobs=(k_slow, vis)), core()).actions == ()
    # One type (types off): by count, as before.
    blind = CoreSettings(gpu_types=replace(S, enabled=False))
    assert [a.job for a in plan_migrations_for(w, blind).actions] == ["ns/k-slow"]
    # An elastic job's pods carry its elastic plan's type, which the World does not: by count.
    ela = replace(vis, elastic=(1, 4))
    assert [a.job for a in plan_migrations_for(replace(w, jobs=(k_slow, v_slow, ela)), core()).actions] == ["ns/k-slow"]
