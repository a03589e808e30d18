"""Which progress source a pod asks for, read from its annotations (pure).

    flowsched.io/progress: logs | prometheus   (absent: the SDK posts to /v1/progress, as before)
    flowsched.io/loss-regex: <Python regex with (?P<loss>..) and optionally (?P<step>..)>   (logs)
    flowsched.io/progress-container: <container name>  (logs; default: the first container)
    flowsched.io/loss-metric: <PromQL instant-vector selector>   (prometheus, required there)

An unknown source or a prometheus source without a metric is kept as a spec with `problem`
set, so the follower can say why nothing is read (logged once, and shown at /debug) instead of
silently ignoring the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROGRESS = "flowsched.io/progress"
LOSS_REGEX = "flowsched.io/loss-regex"
LOSS_METRIC = "flowsched.io/loss-metric"
PROGRESS_CONTAINER = "flowsched.io/progress-container"
SOURCES = ("logs", "prometheus")


@dataclass(frozen=True)
class ProgressSpec:
    source: str  # "logs" | "prometheus" | what the annotation said, when `problem` is set
    container: str  # the container whose log is read
    restarts: int  # that container's restartCount: a change means a new container instance
    running: bool  # that container is running now (its log can be followed)
    loss_regex: str | None = None
    loss_metric: str | None = None
    problem: str | None = None  # why this pod's progress cannot be read; None when it can


def parse_progress_spec(meta: Mapping[str, Any], spec: Mapping[str, Any],
                        status: Mapping[str, Any]) -> ProgressSpec | None:
    ann = meta.get("annotations") or {}
    source = str(ann.get(PROGRESS, "")).strip().lower()
    if not source:
        return None
    containers = [c.get("name", "") for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    container = str(ann.get(PROGRESS_CONTAINER) or (containers[0] if containers else ""))
    restarts, running = 0, False
    for cs in status.get("containerStatuses") or []:
        if isinstance(cs, Mapping) and cs.get("name") == container:
            restarts = int(cs.get("restartCount") or 0)
            running = "running" in (cs.get("state") or {})
    problem = None
    metric = str(ann.get(LOSS_METRIC, "")).strip() or None
    if source not in SOURCES:
        problem = f"{PROGRESS}={source!r}: expected one of {', '.join(SOURCES)}"
    elif source == "prometheus" and metric is None:
        problem = f"{PROGRESS}=prometheus needs {LOSS_METRIC}"
    elif source == "logs" and container not in containers:
        problem = f"no container named {container!r} to read the log of"
    return ProgressSpec(source=source, container=container, restarts=restarts, running=running,
                        loss_regex=ann.get(LOSS_REGEX) or None, loss_metric=metric, problem=problem)
