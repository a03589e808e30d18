"""The simulator's shell keeps a job's step samples by the service's rule (scoring.step_samples) on a
cluster of several GPU types: whenever the core reads them, every sample of a job was measured on
the one type it last ran on, also for the jobs that were requeued onto another type."""

from __future__ import annotations

from pathlib import Path

from benchmarks.sim.cluster_spec import load_cluster
from benchmarks.sim.engine import Engine, EngineSettings
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.variants import build, prepare

CLUSTER = Path(__file__).resolve().parents[2] / "benchmarks" / "clusters" / "three-types-64.yaml"


def test_a_job_moved_to_another_gpu_type_keeps_only_that_types_step_samples() -> None:
    cluster = load_cluster(CLUSTER).settings
    profiles = calibrated_profiles(cluster.gpus_per_node)
    specs = prepare(generate(GeneratorSettings(60, 3.0, 0)), profiles, "all", "default")
    v = build("flowsched", profiles, 0, EngineSettings(cluster=cluster))
    control = v.control
    assert control is not None
    world = control.builder
    last: dict[int, str] = {}
    moved: set[int] = set()
    checked = 0

    def looking(engine: Engine, now: float) -> None:
        nonlocal checked
        control(engine, now)
        for idx, m in world._measured.items():
            types = m.types
            if not types:
                continue
            assert set(types) == set(m.samples), (idx, types, m.samples)
            kinds = set(types.values())
            assert len(kinds) == 1, (idx, types)  # one type's step times: one curve
            kind = kinds.pop()
            if last.get(idx, kind) != kind:
                moved.add(idx)
            last[idx] = kind
            checked += 1

    Engine(specs, profiles, v.policy, EngineSettings(cluster=cluster), control_loops=[looking], gated=True).run()
    assert checked > 0
    assert moved  # the run requeued jobs onto other types (5 at this seed), so the rule was exercised
