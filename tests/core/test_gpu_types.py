"""scoring.gpu_types and scoring.typed_elastic: type names, per-job speeds, which waiting job gets
which type, the fallback bound, and the typed elastic plan (neutral with one type)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scoring.control import plan_elastic_for
from scoring.gpu_types import (
    ANY,
    CLASS_PRIOR,
    Claim,
    GpuTypeSettings,
    allowed_types,
    assign_types,
    gpu_type_of,
    speeds_for,
    type_weight,
)
from scoring.settings import CoreSettings
from scoring.typed_elastic import job_types, plan_typed_elastic_for
from scoring.world import JobState, NodeState, World

S = CoreSettings()
TYPES = ("k80", "p100", "v100")


@pytest.mark.parametrize(("product", "short"), [
    ("Tesla-V100-SXM2-16GB", "v100"), ("Tesla-K80", "k80"), ("Tesla-P100-PCIE-16GB", "p100"),
    ("NVIDIA-A100-SXM4-40GB", "a100"), ("NVIDIA-A10G", "a10g"), ("NVIDIA-A10", "a10"),
    ("NVIDIA-H100-80GB-HBM3", "h100"), ("NVIDIA-H200", "h200"), ("Tesla-T4", "t4"), ("NVIDIA L4", "l4"),
    ("v100", "v100"), ("Some-New-GPU", "some-new-gpu"), ("", ""),
])
def test_gpu_product_names_map_to_short_types(product: str, short: str) -> None:
    assert gpu_type_of(product) == short


def test_speeds_are_measured_where_the_job_ran_and_the_prior_anchored_elsewhere() -> None:
    prior = speeds_for(TYPES, "vision", {})
    assert prior == dict(CLASS_PRIOR["vision"])
    # It measured twice the prior on a K80: the prior elsewhere scales by the same factor.
    got = speeds_for(TYPES, "vision", {"k80": 2 * CLASS_PRIOR["vision"]["k80"]})
    assert got["k80"] == pytest.approx(2 * CLASS_PRIOR["vision"]["k80"])
    assert got["v100"] == pytest.approx(2.0)
    assert speeds_for(("a100", "v100"), "vision", {})["a100"] == 1.0  # no data: no preference
    assert speeds_for(TYPES, "no-such-class", {}) == dict(CLASS_PRIOR["other"])
    assert type_weight(prior, "v100") == pytest.approx(1 / CLASS_PRIOR["vision"]["k80"])
    assert type_weight(prior, "t4") == 1.0


def test_the_job_that_loses_most_on_the_slow_type_gets_the_fast_one() -> None:
    resnet = Claim("resnet", {"k80": 0.14, "p100": 0.64, "v100": 1.0}, 1)
    bert = Claim("bert", {"k80": 0.49, "p100": 0.86, "v100": 1.0}, 1)
    ncf = Claim("ncf", {"k80": 1.41, "p100": 2.10, "v100": 1.0}, 1)
    room = {"k80": 4.0, "p100": 1.0, "v100": 1.0}
    for order in ([resnet, bert, ncf], [ncf, bert, resnet]):
        got = assign_types(order, room)
        # Shares of each job's fastest: 1 + 0.86 + 0.67, the best sum (ncf on the P100 and bert on
        # the K80 give 1 + 1 + 0.49), whatever the queue order.
        assert got == {"resnet": "v100", "bert": "p100", "ncf": "k80"}
    # A type under min_share of a job's best speed is no room for it: it waits for its fastest.
    assert assign_types([resnet], {"k80": 4.0, "p100": 0.0, "v100": 0.0}, min_share=0.5) == {"resnet": "v100"}
    assert assign_types([resnet], {"k80": 4.0, "p100": 0.0, "v100": 0.0}) == {"resnet": "k80"}


def test_a_waiting_job_keeps_its_type_until_the_bound_then_takes_any_near_its_fastest() -> None:
    s = GpuTypeSettings(fallback_s=600.0)
    sp = {"k80": 0.2, "p100": 0.7, "v100": 1.0}
    assert allowed_types("p100", sp, 10.0, s) == ("p100",)
    assert allowed_types("p100", sp, 600.0, s) == ("v100", "p100")  # the K80 is under min_share (0.5)
    assert allowed_types(None, sp, 0.0, s) == ("v100", "p100")
    cap = {"k80": 24.0, "p100": 24.0, "v100": 16.0}
    assert allowed_types("v100", sp, 0.0, s, 16, cap) == ("v100",)
    assert allowed_types("v100", sp, 0.0, s, 32, cap) == (ANY,)  # no type holds it: it spans at once
    assert allowed_types("p100", {}, 0.0, s) == ()


def _job(key: str, node: str | None, gpus: int, cls: str, **kw: object) -> JobState:
    base = JobState(key=key, namespace="ns", gpus_on={node: float(gpus)} if node else {}, live_gpus=gpus, per_pod=1,
                    checkpointable=True, elastic=(1, 8), running=node is not None, settling=node is None,
                    runtime_s=3600.0 if node else float("nan"), attained_gpu_s=3600.0 * gpus if node else 0.0,
                    model_class=cls, wait_s=float("nan") if node else 120.0)
    return replace(base, **kw)  # type: ignore[arg-type]


def _world(types: tuple[str, str], *jobs: JobState) -> World:
    nodes = tuple(NodeState(f"n{k}", 4.0, sum(j.gpus_on.get(f"n{k}", 0.0) for j in jobs), t)
                  for k, t in enumerate(types))
    return World(0.0, nodes, tuple(sorted(jobs, key=lambda j: j.key)), ())


def test_one_type_plans_exactly_as_untyped() -> None:
    jobs = (_job("ns/a", "n0", 2, "vision"), _job("ns/b", "n1", 1, "language"), _job("ns/c", None, 1, "vision"))
    for types in (("v100", "v100"), ("", "")):
        w = _world(types, *jobs)
        assert plan_typed_elastic_for(w, S).actions == plan_elastic_for(w, S).actions
    w = _world(("v100", "k80"), *jobs)
    off = replace(S, gpu_types=replace(S.gpu_types, enabled=False))
    assert plan_typed_elastic_for(w, off).actions == plan_elastic_for(w, off).actions


def test_typed_plan_keeps_running_jobs_on_their_type_and_names_it() -> None:
    # n0 is a V100 node, n1 a K80 node; a vision job waits: it is given the V100 node's room.
    run_v = _job("ns/lang", "n0", 1, "language")
    run_k = _job("ns/rec", "n1", 1, "recommendation")
    waiting = _job("ns/vis", None, 1, "vision")
    w = _world(("v100", "k80"), run_v, run_k, waiting)
    home = job_types(w, S)
    assert home == {"ns/lang": "v100", "ns/rec": "k80", "ns/vis": "v100"}
    acts = plan_typed_elastic_for(w, S).actions
    assert acts and all(a.gpu_type == home[a.job] for a in acts)
    assert sum(a.gpus for a in acts if a.gpu_type == "v100") <= 4
