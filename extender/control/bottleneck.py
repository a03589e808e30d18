"""Why is each job slow? The service's bottleneck diagnosis, off the request path (docs/bottlenecks.md).

Every interval: read per-pod CPU use and limit, network bytes/s and GPU utilisation from
Prometheus (extender.telemetry.pod_usage: cAdvisor and dcgm-exporter series), each running GPU
job's step rate and its trend from the progress store, and its shape (pods, nodes, PS/worker roles
from the Kubeflow replica-type label) from the watched snapshot; diagnose each job with the
control core's classifier (scoring.bottleneck); keep the latest diagnosis per job for the World
(JobState.diagnosis: the resizer's World and the remedies loop, extender/control/remedies.py),
GET /v1/jobs/{ns}/{job}; record a FlowschedBottleneck
Event on the job's first pod when its diagnosis changes; export the gauge
flowsched_job_bottleneck{namespace,job,bottleneck} = confidence (one series per job).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.control.events import EventRecorder, LogRecorder, ObjectRef, Recorder
from extender.control.runtime import default_identity
from extender.periodic import PeriodicRunner
from extender.progress.store import JobHistory
from extender.prometheus.config import DiagnosisConfig
from extender.snapshot.objects import PodInfo
from extender.snapshot.state import ClusterState
from extender.telemetry.pod_usage import PodUsage, PodUsageReader
from scoring.bottleneck import (
    PS,
    WORKER,
    Bottleneck,
    BottleneckSettings,
    Diagnosis,
    JobSignals,
    diagnose,
    step_rate_and_trend,
)

log = logging.getLogger("flowsched.bottleneck")

# Kubeflow training-operator's replica-type label (TFJob: ps, worker, chief, master, evaluator;
# PyTorchJob: master, worker), and the label older tf-operator releases used.
ROLE_LABELS = ("training.kubeflow.org/replica-type", "tf-replica-type")
REASON = "FlowschedBottleneck"


class UsageReader(Protocol):
    def read(self) -> tuple[dict[str, PodUsage], dict[str, str]]: ...


PodSteps = Mapping[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]


class Histories(Protocol):
    def history(self, namespace: str, job: str) -> JobHistory | None: ...

    def pod_steps(self, namespace: str, job: str, since_ts: float) -> PodSteps: ...


def role_of(pod: PodInfo) -> str:
    for label in ROLE_LABELS:
        if str(pod.labels.get(label, "")).lower() == "ps":
            return PS
    return WORKER


def job_signals(job: str, pods: Sequence[PodInfo], usage: Mapping[str, PodUsage], history: JobHistory | None,
                now: float, window_s: float, pod_steps: PodSteps | None = None) -> JobSignals:
    """One job's JobSignals from its running pods, their usage, its progress history and (when its
    pods report their own progress, e.g. asynchronous PS training) each pod's steps."""
    pods = sorted(pods, key=lambda p: p.name)
    per_pod = pod_steps or {}
    pod_rate = np.array([step_rate_and_trend(*per_pod[p.name], now, window_s)[0] if p.name in per_pod
                         else math.nan for p in pods], dtype=np.float64)
    u = [usage.get(p.key, PodUsage()) for p in pods]
    # A pod without GPUs (a PS, a launcher) has no GPU utilisation, even if DCGM says something.
    gpu = np.array([x.gpu_util if p.requests.gpus > 0 else math.nan for p, x in zip(pods, u, strict=True)])
    rate, trend = (step_rate_and_trend(history.steps, history.timestamps, now, window_s) if history is not None
                   else (math.nan, math.nan))
    return JobSignals(
        job=job, pods=tuple(p.name for p in pods), roles=tuple(role_of(p) for p in pods),
        nodes=tuple(p.node for p in pods), gpu_util=gpu,
        cpu_used=np.array([x.cpu_cores for x in u]), cpu_limit=np.array([x.cpu_limit_cores for x in u]),
        net_bytes_s=np.array([x.net_bytes_s for x in u]), pod_step_rate=pod_rate,
        step_rate=rate, step_trend=trend)


def running_jobs(pods: Sequence[PodInfo]) -> dict[str, list[PodInfo]]:
    """Jobs with a running GPU pod -> their bound, running, non-terminating pods."""
    jobs: dict[str, list[PodInfo]] = {}
    for p in pods:
        if p.node and p.phase == "Running" and not p.terminating:
            jobs.setdefault(p.job, []).append(p)
    return {j: ps for j, ps in jobs.items() if any(p.requests.gpus > 0 for p in ps)}


class BottleneckDiagnoser:
    def __init__(self, state: ClusterState, store: Histories, reader: UsageReader, settings: BottleneckSettings,
                 config: DiagnosisConfig, recorder: Recorder, registry: CollectorRegistry,
                 clock: Callable[[], float] = time.time) -> None:
        self.state, self.store, self.reader, self.settings = state, store, reader, settings
        self.config, self.recorder, self.clock = config, recorder, clock
        self.gauge = Gauge("flowsched_job_bottleneck", "Each job's diagnosed bottleneck (value: confidence)",
                           ["namespace", "job", "bottleneck"], registry=registry)
        self.changes = Counter("flowsched_bottleneck_changes", "Diagnosis changes by the new bottleneck",
                               ["bottleneck"], registry=registry)
        self.read_errors = Counter("flowsched_bottleneck_read_errors", "Usage queries that failed, by quantity",
                                   ["quantity"], registry=registry)
        self._latest: dict[str, Diagnosis] = {}
        self._lock = threading.Lock()
        self.runner = PeriodicRunner("bottleneck", self.refresh_once, config.interval_s, logger=log)
        self.last_errors: dict[str, str] = {}

    def get(self, job: str) -> Diagnosis | None:
        with self._lock:
            return self._latest.get(job)

    def snapshot(self) -> dict[str, Diagnosis]:
        with self._lock:
            return dict(self._latest)

    def refresh_once(self) -> dict[str, Diagnosis]:
        now = self.clock()
        usage, errors = self.reader.read()
        self.last_errors = errors
        for q in errors:
            self.read_errors.labels(q).inc()
        pods, _, _ = self.state.read().control_view()
        out: dict[str, Diagnosis] = {}
        for job, its in sorted(running_jobs(pods).items()):
            ns, _, name = job.partition("/")
            window = self.config.window_s
            try:
                history = self.store.history(ns, name)
                steps = self.store.pod_steps(ns, name, now - 2 * window)
            except Exception as e:  # a store failure leaves the step rates unknown, never zero
                log.warning("progress history of %s unreadable: %s", job, e)
                history, steps = None, {}
            out[job] = diagnose(job_signals(job, its, usage, history, now, window, steps), self.settings)
        with self._lock:
            before, self._latest = self._latest, out
        self._publish(before, out, {j: ps for j, ps in running_jobs(pods).items()})
        return out

    def _publish(self, before: Mapping[str, Diagnosis], after: Mapping[str, Diagnosis],
                 pods: Mapping[str, list[PodInfo]]) -> None:
        for job, old in before.items():
            new = after.get(job)
            if new is None or new.kind != old.kind:
                ns, _, name = job.partition("/")
                with contextlib.suppress(KeyError):  # never set (a failed round)
                    self.gauge.remove(ns, name, str(old.kind))
        for job, d in after.items():
            ns, _, name = job.partition("/")
            self.gauge.labels(ns, name, str(d.kind)).set(d.confidence)
            prev = before.get(job)
            was = prev.kind if prev is not None else None
            if d.kind == was or (was is None and d.kind == Bottleneck.UNKNOWN):
                continue
            self.changes.labels(str(d.kind)).inc()
            first = min(pods[job], key=lambda p: p.name)
            msg = (f"job {job}: {d.kind} ({d.confidence:.0%})" + (f", was {was}" if was is not None else "")
                   + (f" at {d.where}" if d.where else "") + "; " + "; ".join(d.evidence))
            self.recorder.record(ObjectRef(first.namespace, first.name, first.uid), REASON, msg,
                                 type_="Normal", action="Diagnose")

    def describe(self) -> dict[str, Any]:
        return {"jobs": {j: d.as_dict() for j, d in sorted(self.snapshot().items())},
                "read_errors": dict(self.last_errors)}

    # ---- the thread (one bad round never ends diagnosis: the runner logs it and goes on) ----
    def start(self) -> None:
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop(join_s=10)


def build_diagnoser(settings: Any, state: ClusterState, store: Histories, api_client: Any,
                    registry: CollectorRegistry) -> BottleneckDiagnoser | None:
    """None unless settings.diagnosis.enabled; then it needs telemetry.prometheus_url (ValueError)."""
    cfg: DiagnosisConfig = settings.diagnosis
    if not cfg.enabled:
        return None
    reader = PodUsageReader(settings.telemetry, cfg.window_s)
    recorder: Recorder = (EventRecorder(api_client, default_identity(settings)) if api_client is not None
                          else LogRecorder())
    return BottleneckDiagnoser(state, store, reader, settings.core().bottleneck, cfg, recorder, registry)
