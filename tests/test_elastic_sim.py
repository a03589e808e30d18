"""benchmarks.sim.elastic: the optimizer as a control loop obeys DESIGN §7 in the simulator."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.sim.cluster import ClusterSettings
from benchmarks.sim.elastic import SimElastic, _fits
from benchmarks.sim.engine import Engine, EngineSettings, SimJob
from benchmarks.sim.generator import GeneratorSettings, calibrated_profiles, generate
from benchmarks.sim.policies import make_policy
from benchmarks.sim.workload import JobSpec

PROFILES = calibrated_profiles()


class Recorder:
    """Wraps engine.resize to record every call the loop makes."""

    def __init__(self, engine: Engine):
        self.calls: list[tuple[SimJob, int, int | None, bool]] = []
        self.engine = engine
        self._resize = engine.resize

        def resize(job: SimJob, replicas: int, batch_size: int | None = None) -> bool:
            ok = self._resize(job, replicas, batch_size)
            self.calls.append((job, replicas, batch_size, ok))
            return ok

        engine.resize = resize  # type: ignore[method-assign]


def _run(specs: list[JobSpec], nodes: int = 4, **kw: object) -> tuple[Engine, SimElastic, Recorder]:
    loop = SimElastic(PROFILES, **kw)  # type: ignore[arg-type]
    eng = Engine(specs, PROFILES, make_policy("flowsched", 0), EngineSettings(cluster=ClusterSettings(nodes=nodes)),
                 control_loops=[loop])
    rec = Recorder(eng)
    eng.run()
    return eng, loop, rec


def test_only_elastic_jobs_are_resized_within_their_range() -> None:
    specs = generate(GeneratorSettings(jobs=30, hours=2.0, seed=3))
    specs = [replace(s, elastic_min=1, elastic_max=8) if i % 2 == 0 else s for i, s in enumerate(specs)]
    eng, loop, rec = _run(specs)
    assert all(j.completion is not None for j in eng.jobs)
    assert loop.stats.resizes > 0 and rec.calls
    for job, replicas, _batch, ok in rec.calls:
        assert job.spec.elastic_max > 0 and ok
        assert job.spec.elastic_min <= replicas <= job.spec.elastic_max
    for j in eng.jobs:
        if j.spec.elastic_max == 0:
            assert j.replicas == j.spec.replicas and j.batch_size == j.spec.batch_size and j.restarts == 0
    assert max(eng.timeline.gpus_allocated) <= eng.cluster.total_gpus


def test_dry_run_plans_but_changes_nothing() -> None:
    specs = [replace(s, elastic_min=1, elastic_max=8) for s in generate(GeneratorSettings(jobs=20, hours=1.0, seed=5))]
    eng, loop, rec = _run(specs, dry_run=True)
    assert loop.stats.plans > 0 and loop.stats.resizes == 0 and not rec.calls
    assert all(j.replicas == j.spec.replicas for j in eng.jobs)


def test_lone_elastic_job_grows_to_the_cluster() -> None:
    spec = JobSpec("c", 0.0, "cifar10", 1, 128, elastic_min=1, elastic_max=16)
    eng, _loop, rec = _run([spec], nodes=4)
    assert rec.calls and rec.calls[0][1] > 1  # scaled out once it ran alone
    assert eng.jobs[0].completion is not None


def test_fits_checks_per_node_fragments() -> None:
    assert _fits([4, 2], [4, 2, 1])
    assert not _fits([3], [2, 2, 2])
    assert _fits([2, 1], [1, 2])
