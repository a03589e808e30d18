"""Workload classes: defaults from the owner, inference placement, and inference never a victim
(safety refusals for the migrator and elastic optimizer, preemption candidates)."""

from __future__ import annotations

import numpy as np

from extender.http.verbs import Policy, decide_filter, decide_preempt, decide_prioritize
from extender.http.wire import ExtenderArgs, PreemptionArgs, Victims
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from scoring.placement import PlacementSettings
from scoring.safety import INFERENCE, elastic_refusal, migrator_refusal
from scoring.settings import SafetySettings
from scoring.workload import WorkloadClass, placement_for, workload_class
from scoring.world import JobState, World
from tests.k8s_factories import node, pod


def test_class_defaults_from_the_owner_and_explicit_values_win() -> None:
    assert workload_class(None, "ReplicaSet") == WorkloadClass.INFERENCE
    assert workload_class(None, "Deployment") == WorkloadClass.INFERENCE
    assert workload_class(None, "StatefulSet") == WorkloadClass.NOTEBOOK
    assert workload_class(None, "Notebook") == WorkloadClass.NOTEBOOK
    assert workload_class(None, "PyTorchJob") == WorkloadClass.TRAINING
    assert workload_class(None, "") == WorkloadClass.TRAINING
    assert workload_class("Inference", "Job") == WorkloadClass.INFERENCE
    assert workload_class("nonsense", "StatefulSet") == WorkloadClass.NOTEBOOK  # bad value: owner default


def test_pod_parsing_reads_owner_kind_and_label_or_annotation() -> None:
    p = parse_pod(pod("web-1", owner=("ReplicaSet", "web-abc")))
    assert p.owner_kind == "ReplicaSet" and workload_class(p.workload, p.owner_kind) == WorkloadClass.INFERENCE
    q = parse_pod(pod("nb", labels={"flowsched.io/workload": "notebook"}))
    assert q.workload == "notebook"


def test_inference_spreads_and_has_a_lower_utilisation_bound() -> None:
    base = PlacementSettings()
    inf = placement_for(base, WorkloadClass.INFERENCE)
    assert not inf.pack_gpus and inf.saturation_util_pct == base.inference_util_pct
    assert placement_for(base, WorkloadClass.TRAINING) is base


def _state() -> ClusterState:
    s = ClusterState()
    for name in ("n1", "n2"):
        s.upsert_node(parse_node(node(name, gpus=4)))
    s.upsert_pod(parse_pod(pod("busy", gpus=3, node_name="n1", phase="Running")))
    s.set_node_telemetry("n1", [10.0, 10.0, 10.0, 10.0], [np.nan] * 4, sampled_at=100.0)
    s.set_node_telemetry("n2", [70.0, 70.0, 70.0, 70.0], [np.nan] * 4, sampled_at=100.0)
    return s


def test_inference_pod_skips_gpus_above_its_bound_and_spreads() -> None:
    s = _state()
    policy = Policy(placement=PlacementSettings(), stale_after_s=60.0)
    web = pod("web-1", gpus=1, owner=("ReplicaSet", "web-abc"))
    train = pod("train-1", gpus=1, owner=("PyTorchJob", "t"))
    args = ExtenderArgs(pod=web, node_names=["n1", "n2"], nodes=None)
    ans = decide_filter(s, args, policy, now=101.0)
    assert ans.passed == ["n1"] and "n2" in ans.unresolvable  # 70 % > 60 % inference bound
    ans_train = decide_filter(s, ExtenderArgs(pod=train, node_names=["n1", "n2"], nodes=None), policy, now=101.0)
    assert ans_train.passed == ["n1", "n2"]  # training's bound is 90 %
    # spread: with equal telemetry the emptier node scores higher for inference, lower for training
    s.set_node_telemetry("n2", [10.0, 10.0, 10.0, 10.0], [np.nan] * 4, sampled_at=100.0)
    inf = decide_prioritize(s, ExtenderArgs(pod=web, node_names=["n1", "n2"], nodes=None), policy, now=101.0)
    tr = decide_prioritize(s, ExtenderArgs(pod=train, node_names=["n1", "n2"], nodes=None), policy, now=101.0)
    assert inf.scores[1] > inf.scores[0]
    assert tr.scores[0] > tr.scores[1]


def test_preemption_never_offers_an_inference_victim() -> None:
    s = ClusterState()
    s.upsert_pod(parse_pod(pod("web", gpus=4, node_name="n1", phase="Running", uid="u-web",
                               owner=("ReplicaSet", "web-abc"))))
    s.upsert_pod(parse_pod(pod("job", gpus=4, node_name="n2", phase="Running", uid="u-job",
                               owner=("PyTorchJob", "j"))))
    args = PreemptionArgs(pod=pod("p", gpus=4), meta_form=True, victims={
        "n1": Victims(uids=["u-web"], pods=[], pdb_violations=0),
        "n2": Victims(uids=["u-job"], pods=[], pdb_violations=5),
    })
    assert list(decide_preempt(s, args)) == ["n2"]  # despite its PDB violations
    only_web = PreemptionArgs(pod=args.pod, meta_form=True, victims={"n1": args.victims["n1"]})
    assert decide_preempt(s, only_web) == {}


def _job(workload: str) -> JobState:
    return JobState(key="default/j", namespace="default", gpus_on={"n1": 2.0}, live_gpus=2, per_pod=1,
                    checkpointable=True, elastic=(1, 4), running=True, settling=False, runtime_s=100.0,
                    attained_gpu_s=200.0, workload=workload)


def test_inference_jobs_are_refused_by_the_migrator_and_elastic_optimizer() -> None:
    world = World(now=0.0, nodes=(), jobs=(), pending=())
    s = SafetySettings()
    assert migrator_refusal(_job("inference"), world, s, elastic_on=False) == INFERENCE
    assert elastic_refusal(_job("inference"), world, s, migrator_on=False) == INFERENCE
    assert migrator_refusal(_job("training"), world, s, elastic_on=False) is None
    assert elastic_refusal(_job("training"), world, s, migrator_on=False) is None
