"""Which progress source a pod asks for, read from its annotations (pure).

    flowsched.io/progress: logs | prometheus   (absent: the SDK posts to /v1/progress, as before)
    flowsched.io/loss-regex: <Python regex with (?P<loss>..) and optionally (?P<step>..)>   (logs)
    flowsched.io/progress-container: <container name>  (logs; default: the first container)
    flowsched.io/loss-metric: <PromQL instant-vector selector>   (prometheus, required there)

and the job's stopping rule, for jobs that do not post a `training` object (DESIGN.md §11):

    flowsched.io/max-steps: <integer >= 1>          the planned end
    flowsched.io/target-metric: <number>            the loss value the job stops at
    flowsched.io/early-stopping: patience=<int>[,min_delta=<number>]   on the loss it reports

An unknown source or a prometheus source without a metric is kept as a spec with `problem`
set, so the follower can say why nothing is read (logged once, and shown at /debug) instead of
silently ignoring the pod.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scoring.stopping import EarlyStopping

PROGRESS = "flowsched.io/progress"
LOSS_REGEX = "flowsched.io/loss-regex"
LOSS_METRIC = "flowsched.io/loss-metric"
PROGRESS_CONTAINER = "flowsched.io/progress-container"
MAX_STEPS = "flowsched.io/max-steps"
TARGET_METRIC = "flowsched.io/target-metric"
EARLY_STOPPING = "flowsched.io/early-stopping"
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
    # Its stopping rule (flowsched.io/max-steps, target-metric, early-stopping); None: not declared
    # (a malformed one is left out, with `rule_problem` saying why).
    max_steps: float | None = None
    target: float | None = None
    early_stopping: EarlyStopping | None = None
    rule_problem: str | None = None


def parse_early_stopping(text: str) -> EarlyStopping:
    """"patience=8,min_delta=0.001" -> EarlyStopping on the reported loss; ValueError says what is wrong."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{EARLY_STOPPING}: expected name=value pairs, got {part.strip()!r}")
        fields[name.strip()] = value.strip()
    unknown = set(fields) - {"patience", "min_delta"}
    if unknown:
        raise ValueError(f"{EARLY_STOPPING}: unknown field(s) {', '.join(sorted(unknown))} (patience, min_delta)")
    if "patience" not in fields or not fields["patience"].isdigit():
        raise ValueError(f"{EARLY_STOPPING}: patience must be an integer >= 1")
    try:
        min_delta = float(fields.get("min_delta", "0"))
    except ValueError:
        raise ValueError(f"{EARLY_STOPPING}: min_delta must be a number") from None
    return EarlyStopping(patience=int(fields["patience"]), min_delta=min_delta)


def parse_stopping_rule(ann: Mapping[str, Any]) -> tuple[float | None, float | None, EarlyStopping | None, str | None]:
    """(max_steps, target, early_stopping, problem) from a pod's annotations; a malformed value
    is left out and named in `problem`."""
    problems: list[str] = []
    max_steps = target = None
    es = None
    raw = str(ann.get(MAX_STEPS, "")).strip()
    if raw:
        # float of the digits, not of int(): 309 digits and more passed int() and overflowed float(),
        # and 4,301 and more passed neither; such a value is now a problem named, as any other.
        if raw.isdigit() and math.isfinite(steps := float(raw)) and steps >= 1:
            max_steps = steps
        else:
            problems.append(f"{MAX_STEPS}={raw!r}: expected an integer >= 1")
    raw = str(ann.get(TARGET_METRIC, "")).strip()
    if raw:
        try:
            target = float(raw)
        except ValueError:
            target = math.nan
        if not math.isfinite(target):
            problems.append(f"{TARGET_METRIC}={raw!r}: expected a finite number")
            target = None
    raw = str(ann.get(EARLY_STOPPING, "")).strip()
    if raw:
        try:
            es = parse_early_stopping(raw)
        except ValueError as e:
            problems.append(str(e))
    return max_steps, target, es, "; ".join(problems) or None


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
    max_steps, target, es, rule_problem = parse_stopping_rule(ann)
    return ProgressSpec(source=source, container=container, restarts=restarts, running=running,
                        loss_regex=ann.get(LOSS_REGEX) or None, loss_metric=metric, problem=problem,
                        max_steps=max_steps, target=target, early_stopping=es, rule_problem=rule_problem)
