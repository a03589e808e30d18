"""GPU types in the simulator: cluster files, the Gavel-derived speeds, the engine's clock on a
slow type, the typed placement (one type per job), and neutrality on a cluster of one type."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.cluster_spec import GAVEL, load_cluster, parse_cluster, type_speeds
from benchmarks.sim.engine import EngineSettings
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.typed import TypedPlacement
from benchmarks.sim.variants import build, known, prepare, run_one
from scoring.gpu_types import CLASS_PRIOR

CLUSTERS = Path(__file__).resolve().parents[2] / "benchmarks" / "clusters"
PROFILES = calibrated_profiles()


def test_the_example_cluster_file() -> None:
    spec = load_cluster(CLUSTERS / "three-types-64.yaml")
    s = spec.settings
    assert (s.nodes, s.gpus_per_node) == (16, 4)
    assert [s.node_types.count(t) for t in ("v100", "p100", "k80")] == [4, 6, 6]
    assert spec.describe() == "cluster three-types-64: 64 GPUs (16 v100, 24 p100, 24 k80)"
    # Gavel: ResNet-50 (imagenet) is ~7x faster on a V100 than on a K80; Recommendation (ncf) is not.
    assert s.speed("imagenet", [15]) == pytest.approx(0.139, abs=1e-3)
    assert s.speed("ncf", [15]) > 1.0
    assert s.speed("imagenet", [0, 15]) == s.speed("imagenet", [15])  # spanning: the slowest type


@pytest.mark.parametrize(("doc", "why"), [
    ({"nodes": []}, "non-empty list"),
    ({"nodes": [{"count": 2, "gpus": 4, "gpu": "v100"}, {"count": 2, "gpus": 8, "gpu": "k80"}]}, "same gpus"),
    ({"nodes": [{"count": 2, "gpus": 4, "gpu": "h100"}]}, "no measured speeds"),
    ({"nodes": [{"count": 0, "gpus": 4, "gpu": "v100"}]}, "positive integer"),
    ({"nodes": [{"count": 1, "gpus": 4, "gpu": "v100", "colour": "red"}]}, "unknown keys"),
])
def test_bad_cluster_files_say_why(doc: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_cluster(doc, "bad")


def test_the_class_prior_is_what_gavels_measurements_give() -> None:
    with (GAVEL / "throughputs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    classes = {"vision": {"ResNet-18", "ResNet-50", "CycleGAN"}, "language": {"Transformer", "LM"},
               "recommendation": {"Recommendation"}, "other": {r["model"] for r in rows}}
    for cls, models in classes.items():
        for t in ("k80", "p100"):
            logs = [math.log(float(r[t]) / float(r["v100"])) for r in rows if r["model"] in models]
            assert CLASS_PRIOR[cls][t] == pytest.approx(math.exp(sum(logs) / len(logs)), abs=1e-3)
    speeds = type_speeds()
    assert {a for a, _ in speeds} == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
    assert all(speeds[(a, "v100")] == 1.0 for a, _ in speeds)


def test_a_job_on_a_slow_type_takes_longer_by_its_speed() -> None:
    specs = prepare(generate(GeneratorSettings(jobs=1, hours=0.1, seed=1)), PROFILES, "none")
    app = specs[0].app
    jct = {}
    for t in ("v100", "k80"):
        spec = parse_cluster({"nodes": [{"count": 16, "gpus": 4, "gpu": t}]}, t)
        m, _, _ = run_one(specs, PROFILES, "kube-default", 0, EngineSettings(cluster=spec.settings), "one")
        jct[t] = m.avg_jct
    ratio = type_speeds()[(app, "k80")]
    # The restart (30 s) and the round (60 s) do not scale; the training time does.
    assert jct["k80"] > jct["v100"] * 0.9 / ratio - 200 and jct["k80"] < jct["v100"] * 1.1 / ratio + 200


def test_one_type_is_neutral_and_typeblind_is_the_same_core_without_types() -> None:
    specs = prepare(generate(GeneratorSettings(jobs=30, hours=1.5, seed=3)), PROFILES, "half")
    one = parse_cluster({"nodes": [{"count": 4, "gpus": 4, "gpu": "Tesla-V100-SXM2-16GB"}]}, "v100")
    plain = EngineSettings(cluster=ClusterSettings(nodes=4))
    a, _, _ = run_one(specs, PROFILES, "flowsched", 0, plain, "w")
    b, _, _ = run_one(specs, PROFILES, "flowsched", 0, EngineSettings(cluster=one.settings), "w")
    assert (a.avg_jct, a.makespan) == (b.avg_jct, b.makespan)
    assert known("flowsched-typeblind")
    mixed = parse_cluster({"nodes": [{"count": 2, "gpus": 4, "gpu": "v100"}, {"count": 2, "gpus": 4, "gpu": "k80"}]},
                          "mixed")
    es = EngineSettings(cluster=mixed.settings)
    typed = build("flowsched", PROFILES, 0, es)
    blind = build("flowsched-typeblind", PROFILES, 0, es)
    assert isinstance(typed.policy, TypedPlacement) and not isinstance(blind.policy, TypedPlacement)
    assert blind.settings is not None and not blind.settings.gpu_types.enabled


def test_typed_flowsched_keeps_each_job_on_one_type_when_one_holds_it() -> None:
    specs = prepare(generate(GeneratorSettings(jobs=40, hours=2.0, seed=5)), PROFILES, "half")
    mixed = parse_cluster({"nodes": [{"count": 2, "gpus": 4, "gpu": "v100"}, {"count": 2, "gpus": 4, "gpu": "k80"}]},
                          "mixed")
    es = EngineSettings(cluster=mixed.settings)
    v = build("flowsched", PROFILES, 0, es)
    from benchmarks.sim.engine import Engine
    from benchmarks.sim.variants import gated

    eng = Engine(specs, PROFILES, v.policy, es, control_loops=v.loops, gated=gated(v))
    spans = 0
    orig = eng.start

    def start(job, placement):  # type: ignore[no-untyped-def]
        nonlocal spans
        kinds = {mixed.settings.node_types[n] for n, _ in placement}
        spans += int(len(kinds) > 1 and job.replicas <= 8)
        orig(job, placement)

    eng.start = start  # type: ignore[method-assign]
    eng.run()
    assert eng.done == len(specs) and spans == 0
    book = v.control.builder.types if v.control else None
    assert book is not None and book.measured  # it learned speeds from the jobs that ran


def test_run_pollux_names_the_cluster_file_in_its_header(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import run_pollux

    rc = run_pollux.main(["--cluster", str(CLUSTERS / "three-types-64.yaml"), "--loads", "1.0", "--workloads", "1",
                          "--mix", "none", "--policies", "tiresias", "--procs", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "cluster three-types-64: 64 GPUs (16 v100, 24 p100, 24 k80)" in out
    with pytest.raises(SystemExit):
        run_pollux.main(["--cluster", str(CLUSTERS / "missing.yaml"), "--workloads", "1"])


def test_the_simulated_filter_reads_the_types_of_the_latest_plan_as_the_services_does() -> None:
    """The simulated extender asks scoring.typed_placement.TypePlan.allowed, as the service's
    filter does (extender/http/gpu_type_gate.py): a plan that gives a waiting job the K80s puts it
    there though the V100s are free and faster for it; before any plan, no constraint. (It ran its
    own assignment before, on the free GPUs alone, and parted from the service's.)"""
    from benchmarks.sim.engine import Engine
    from scoring.typed_placement import JobTypes, TypePlan

    mixed = parse_cluster({"nodes": [{"count": 1, "gpus": 4, "gpu": "v100"}, {"count": 1, "gpus": 4, "gpu": "k80"}]},
                          "mixed")
    es = EngineSettings(cluster=mixed.settings)
    from dataclasses import replace

    specs = [replace(s, replicas=2) for s in prepare(generate(GeneratorSettings(jobs=1, hours=0.1, seed=1)), PROFILES,
                                                     "none")]
    placed = {}
    for plan_type in ("k80", None):
        v = build("flowsched", PROFILES, 0, es)
        assert isinstance(v.policy, TypedPlacement) and v.control is not None
        eng = Engine(specs, PROFILES, v.policy, es)
        job = eng.jobs[0]
        book = v.control.builder.types
        if plan_type is not None:
            book.plan = TypePlan(0.0, {"n0": "v100", "n1": "k80"}, {"v100": 4.0, "k80": 4.0}, {"v100": 4.0, "k80": 4.0},
                                 {job.key: JobTypes(None, plan_type, {"v100": 1.0, "k80": 0.5}, (), 0.0,
                                                    float(job.replicas))})
        eng.active[job.idx] = job
        v.policy.on_arrival(job, 0.0)
        v.policy.schedule(eng, 0.0)
        placed[plan_type] = {mixed.settings.node_types[n] for n, _ in job.placement}
    assert placed["k80"] == {"k80"}
    assert placed[None] and len(placed[None]) == 1
