"""Workload files: the Pollux artifact's CSVs and the Philly trace population."""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class JobSpec:
    name: str
    arrival: float  # seconds from the start of the workload
    app: str
    replicas: int  # GPUs asked for
    batch_size: int  # global batch size
    priority: int = 0
    checkpointable: bool = True  # flowsched.io/checkpointable: may be evicted and resumed
    elastic_min: int = 0  # 0 = not elastic (flowsched.io/elastic absent)
    elastic_max: int = 0
    namespace: str = "default"  # as the job's pods would be; the safety rules read it
    # How the job ends and what it says of it (benchmarks/sim/ends.py): "planned" reports its planned
    # end (max_steps: its epochs) and ends there, "early" reports an early-stopping rule and ends
    # where it fires on its own curve (or at its epochs' end), "none" reports nothing and ends at
    # its epochs' end.
    end_rule: str = "planned"


def read_workload(path: Path) -> list[JobSpec]:
    """name,time,application,num_replicas,batch_size (the artifact's workloads/*.csv)."""
    with path.open(newline="") as f:
        jobs = [
            JobSpec(r["name"], float(r["time"]), r["application"], int(r["num_replicas"]), int(r["batch_size"]))
            for r in csv.DictReader(f)
        ]
    return sorted(jobs, key=lambda j: j.arrival)


def scale_load(jobs: list[JobSpec], factor: float) -> list[JobSpec]:
    """Compress arrivals by `factor` (2.0 = twice the arrival rate)."""
    return [replace(j, arrival=j.arrival / factor) for j in jobs]


@dataclass(frozen=True)
class PhillyRow:
    arrival: float
    num_gpus: int
    gpu_time: float


def read_philly(path: Path) -> list[PhillyRow]:
    rows: list[PhillyRow] = []
    with path.open(newline="") as f:
        raw = [
            (datetime.fromisoformat(r["timestamp"]), int(float(r["num_gpus"])), float(r["gpu_time"]))
            for r in csv.DictReader(f)
        ]
    t0 = min(r[0] for r in raw)
    for ts, g, gt in raw:
        rows.append(PhillyRow((ts - t0).total_seconds(), g, gt))
    rows.sort(key=lambda r: r.arrival)
    return rows


@dataclass(frozen=True)
class ModelLimits:
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int


def philly_jobs(rows: list[PhillyRow], limits: dict[str, ModelLimits], seed: int = 0) -> tuple[list[JobSpec], int]:
    """Every Philly job, with its arrival and GPU count from the trace and a model assigned by
    GPU-hours as the artifact's workload.py does (<1 h cifar10/ncf, <10 h deepspeech2 or bert,
    <100 h yolov3, else imagenet). Batch size = the model's base batch per GPU x GPUs (the
    artifact's commented-out "as users submit them" rule), capped at the largest validated
    batch; GPUs beyond what that batch can feed are capped too. Returns (jobs, jobs capped)."""
    rng = random.Random(seed)
    jobs: list[JobSpec] = []
    capped = 0
    for i, row in enumerate(rows):
        if row.gpu_time < 3600:
            app = rng.choice(["cifar10", "ncf"])
        elif row.gpu_time < 10 * 3600:
            app = "deepspeech2" if rng.random() < 0.5 else "bert"
        elif row.gpu_time < 100 * 3600:
            app = "yolov3"
        else:
            app = "imagenet"
        lim = limits[app]
        gpus = max(1, row.num_gpus)
        most = max(1, lim.max_batch_size // lim.min_local_bsz)
        if gpus > most:
            gpus, capped = most, capped + 1
        batch = min(lim.init_batch_size * gpus, lim.max_batch_size)
        jobs.append(JobSpec(f"{app}-{i}", row.arrival, app, gpus, batch))
    return jobs, capped
