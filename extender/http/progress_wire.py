"""POST /v1/progress's body: its models, the checks that need no clock and no store, and the
checked form the API front forwards (extender.http.api_front).

The front parses and validates each report (pydantic, the metrics re-encoded as stored) in its
own process and forwards a compact form: a small JSON head (names, scalars, blob lengths) and the
points' metrics blobs as they will be stored, so the verbs' process only slices bytes before
the store insert. Validating a batch of 100 points x 64 long metric names held the verbs'
process's GIL ~6 ms in one call, and a token within its quota moved the verbs' p99 7.6x
(issue 33, finding 7). A bad report is forwarded as its error, so the verbs' process still
checks the token first (401 before 400) and counts the answer.

No FastAPI here: the front imports this module.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
)

from scoring.stopping import EarlyStopping

NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
JOB_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


def _utf8(text: str) -> str:
    """Refuse what JSON can carry but UTF-8 (SQLite, logs, replies) cannot: lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode text (lone surrogate at {e.start})") from None
    return text


MetricName = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_utf8)]


def _int_as_float(x: object) -> object:
    """A JSON integer as a float; one beyond the float range (10**400) is a field error, not a 500."""
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:
            raise ValueError("number beyond the float range") from None
    return x


# A number, integer or not, read as a float (bools and strings are refused as by StrictFloat).
Number = Annotated[StrictFloat, BeforeValidator(_int_as_float)]


class PointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: StrictInt = Field(ge=0, le=2**63 - 1)
    loss: StrictFloat | None  # null, NaN and inf are rejected per point; a string is a 400
    timestamp: StrictFloat | None = None
    metrics: dict[MetricName, StrictFloat | None] | None = Field(default=None, max_length=64)


class EarlyStoppingIn(BaseModel):
    """Lightning's EarlyStopping(monitor, min_delta, patience, mode): each reported point carrying
    the monitored series (the loss when metric is null, else metrics[metric]) is one evaluation."""

    model_config = ConfigDict(extra="forbid")

    patience: StrictInt = Field(ge=1, le=2**31)
    min_delta: Number = Field(default=0.0, ge=0, allow_inf_nan=False)
    metric: MetricName | None = None
    higher_is_better: StrictBool | None = None  # null: the job's direction

    def rule(self) -> EarlyStopping:
        return EarlyStopping(self.patience, float(self.min_delta), self.metric, self.higher_is_better)


class TrainingIn(BaseModel):
    """What the job reports about its batch (for the elastic optimizer); every field optional."""

    model_config = ConfigDict(extra="forbid")

    batch_size: StrictInt | None = Field(default=None, ge=1, le=2**31)
    batch_min: StrictInt | None = Field(default=None, ge=1, le=2**31)
    batch_max: StrictInt | None = Field(default=None, ge=1, le=2**31)
    grad_sqr: Number | None = Field(default=None, ge=0, allow_inf_nan=False)
    grad_var: Number | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_steps: StrictInt | None = Field(default=None, ge=1, le=2**63 - 1)
    batch_live: StrictBool | None = None  # adopts a planned batch while it runs (no restart needed)
    # The value of the reported metric at which the job stops (its own units and direction).
    target_metric: Number | None = Field(default=None, allow_inf_nan=False)
    early_stopping: EarlyStoppingIn | None = None
    # The largest batch one GPU holds (its memory's limit): a larger share of the global batch runs
    # as accumulated micro-batches, which the step-time model then counts (docs/elastic.md).
    batch_local_max: StrictInt | None = Field(default=None, ge=1, le=2**31)


class ReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(min_length=1, max_length=63, pattern=NAMESPACE_PATTERN)
    job: str = Field(min_length=1, max_length=253, pattern=JOB_PATTERN)
    pod: Annotated[str, AfterValidator(_utf8)] | None = Field(default=None, max_length=253)
    higher_is_better: StrictBool | None = None
    points: list[PointIn] = Field(min_length=1)
    training: TrainingIn | None = None




def parse_json(raw: bytes) -> Any:
    """orjson first; on failure the stdlib, which also reads NaN/Infinity literals."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as first:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise first from None


def validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"




class BadReport(Exception):
    """A report refused whole: its HTTP status and the message the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class CheckedPoint:
    """A point past the clock-free checks: a finite loss, a finite timestamp or none, and its
    finite side metrics as the store keeps them (orjson), or None."""

    step: int
    loss: float
    timestamp: float | None
    metrics: bytes | None


@dataclass(frozen=True)
class CheckedReport:
    namespace: str
    job: str
    pod: str | None
    higher_is_better: bool | None
    training: TrainingIn | None
    points: tuple[CheckedPoint, ...]
    received: int  # points in the body, refused ones included
    reasons: dict[str, int]  # refused points (and dropped side metrics) by reason
    metric_names: frozenset[str]


def _refuse(reasons: dict[str, int], reason: str, n: int = 1) -> None:
    reasons[reason] = reasons.get(reason, 0) + n


def check_report(raw: bytes, max_points: int) -> CheckedReport:
    """The body's report with its points past the checks that need no clock: a NaN, inf or null
    loss or a non-finite timestamp refuses the point, a non-finite side metric is dropped.
    Raises BadReport (400 not JSON or not a report, 413 over max_points)."""
    try:
        report = ReportIn.model_validate(parse_json(raw))
    except orjson.JSONDecodeError as e:
        raise BadReport(400, f"body is not valid JSON: {e}") from None
    except ValidationError as e:
        raise BadReport(400, validation_message(e)) from None
    if len(report.points) > max_points:
        raise BadReport(413, f"points: more than {max_points}")
    t = report.training
    if t is not None and t.batch_min and t.batch_max and t.batch_min > t.batch_max:
        raise BadReport(400, "training: batch_min is above batch_max")
    points: list[CheckedPoint] = []
    reasons: dict[str, int] = {}
    names: set[str] = set()
    for p in report.points:
        if p.loss is None:
            _refuse(reasons, "loss_null")
        elif math.isnan(p.loss):
            _refuse(reasons, "loss_nan")
        elif math.isinf(p.loss):
            _refuse(reasons, "loss_inf")
        elif p.timestamp is not None and not math.isfinite(p.timestamp):
            _refuse(reasons, "timestamp_not_finite")
        else:
            blob = None
            if p.metrics:
                finite = {k: v for k, v in p.metrics.items() if v is not None and math.isfinite(v)}
                if len(finite) < len(p.metrics):  # a bad side metric does not spoil the loss
                    _refuse(reasons, "metric_not_finite", len(p.metrics) - len(finite))
                if finite:
                    blob = orjson.dumps(finite)
                    names.update(finite)
            points.append(CheckedPoint(p.step, p.loss, p.timestamp, blob))
    return CheckedReport(report.namespace, report.job, report.pod, report.higher_is_better, report.training,
                         tuple(points), len(report.points), reasons, frozenset(names))


MAX_POINTS_PER_REQUEST = 10_000

# The checked form (named in the front's FRONT_FORM_HEADER): one line of JSON (no newline
# inside: orjson writes none), then the metrics blobs back to back, their lengths in the head
# (-1: none). Re-encoded metrics may be longer than the client's JSON ("1" -> "1.0"), never twice.
CHECKED_FORM = "checked-report/1"
CHECKED_BODY_FACTOR = 2


def encode_checked(report: CheckedReport | BadReport) -> bytes:
    if isinstance(report, BadReport):
        return orjson.dumps({"error": [report.status, report.message]}) + b"\n"
    head = {"namespace": report.namespace, "job": report.job, "pod": report.pod,
            "higher_is_better": report.higher_is_better,
            "training": report.training.model_dump() if report.training is not None else None,
            "received": report.received, "reasons": report.reasons, "names": sorted(report.metric_names),
            "points": [[p.step, p.loss, p.timestamp, -1 if p.metrics is None else len(p.metrics)]
                       for p in report.points]}
    return b"".join([orjson.dumps(head), b"\n", *(p.metrics for p in report.points if p.metrics is not None)])


def decode_checked(body: bytes) -> CheckedReport:
    """The front's checked form back (its BadReport raised). Only the front sends it, over the
    verbs' process's private socket; a malformed one is a bug there: ValueError."""
    end = body.find(b"\n")
    if end < 0:
        raise ValueError("checked report: no head")
    try:
        head = orjson.loads(body[:end])
        if "error" in head:
            status, message = head["error"]
            raise BadReport(int(status), str(message))
        at = end + 1
        points = []
        for step, loss, ts, size in head["points"]:
            blob = None
            if size >= 0:
                blob = body[at:at + size]
                at += size
            points.append(CheckedPoint(int(step), float(loss), None if ts is None else float(ts), blob))
        if at != len(body):
            raise ValueError(f"checked report: {len(body) - at} bytes past its points")
        training = TrainingIn.model_validate(head["training"]) if head["training"] is not None else None
        return CheckedReport(head["namespace"], head["job"], head["pod"], head["higher_is_better"], training,
                             tuple(points), int(head["received"]), dict(head["reasons"]), frozenset(head["names"]))
    except (KeyError, TypeError, orjson.JSONDecodeError, ValidationError) as e:
        raise ValueError(f"checked report: {e}") from e
