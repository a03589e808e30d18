"""benchmarks.sim.variants: the integrated flowsched runs both control loops, they do not fight,
and the demo's flowsched is not binpack."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.engine import Engine, EngineSettings, SimJob
from benchmarks.sim.entry import demo_main
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.variants import INTEGRATED, build, loops_of, prepare
from scoring.safety import SHRINKABLE

PROFILES = calibrated_profiles()


def test_names() -> None:
    assert loops_of("flowsched") == INTEGRATED and "elastic" in INTEGRATED
    assert loops_of("flowsched-placement") == ()
    assert loops_of("flowsched+elastic+las") == ("elastic", "las")
    assert loops_of("binpack") is None
    with pytest.raises(ValueError):
        loops_of("flowsched+migrator+las")
    with pytest.raises(ValueError):
        build("nonesuch", PROFILES)


def test_integrated_runs_both_loops_and_they_do_not_fight() -> None:
    # Half the jobs (those that fit the 16 GPUs) are not elastic, so the migrator has work.
    specs = prepare(generate(GeneratorSettings(jobs=40, hours=2.0, seed=2)), PROFILES, "half")
    v = build("flowsched", PROFILES, 0)
    assert v.control is not None and v.settings is not None and v.control.loops == INTEGRATED
    hold = v.settings.safety.hold_s
    eng = Engine(specs, PROFILES, v.policy, EngineSettings(cluster=ClusterSettings(nodes=4)), control_loops=v.loops)
    resized_at: dict[int, float] = {}
    evicted_at: dict[int, float] = {}
    bad: list[str] = []
    real_evict, real_resize = eng.evict, eng.resize

    def evict(job: SimJob) -> bool:
        t = resized_at.get(job.idx)
        if t is not None and eng.now - t < hold:
            bad.append(f"evicted {job.spec.name} {eng.now - t:.0f} s after a resize")
        if job.spec.elastic_max > 0 and job.gpus > max(1, job.spec.elastic_min):
            bad.append(f"evicted {job.spec.name}, which the optimizer could shrink")
        evicted_at[job.idx] = eng.now
        return real_evict(job)

    def resize(job: SimJob, replicas: int, batch_size: int | None = None) -> bool:
        t = evicted_at.get(job.idx)
        if t is not None and eng.now - t < hold:
            bad.append(f"resized {job.spec.name} {eng.now - t:.0f} s after an eviction")
        resized_at[job.idx] = eng.now
        return real_resize(job, replicas, batch_size)

    eng.evict, eng.resize = evict, resize  # type: ignore[method-assign]
    eng.run()
    assert all(j.completion is not None for j in eng.jobs)
    stats = v.control.stats
    assert stats.resizes > 0, "the optimizer never acted"
    assert stats.migrations > 0, "the migrator never acted"
    assert stats.refused.get(SHRINKABLE, 0) > 0  # the composition rule was exercised
    assert not bad, bad
    for j in eng.jobs:  # only opted-in jobs were touched
        if j.spec.elastic_max == 0:
            assert j.replicas == j.spec.replicas and j.batch_size == j.spec.batch_size


def test_demo_flowsched_is_the_integrated_policy_and_differs_from_binpack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = demo_main(["--out", str(tmp_path), "--jobs", "40", "--hours", "2", "--workloads", "1", "--seeds", "1",
                    "--policies", "binpack,flowsched", "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "checkpointable" in out and "elastic" in out  # the assumption is printed with the table
    with (tmp_path / "runs.csv").open() as f:
        rows = {r["policy"]: r for r in csv.DictReader(f)}
    fs, bp = rows["flowsched"], rows["binpack"]
    assert int(fs["restarts"]) > 0 and int(bp["restarts"]) == 0
    assert float(fs["avg_jct"]) != pytest.approx(float(bp["avg_jct"]), rel=1e-3)
