"""Reads an answer of Prometheus' /api/v1/query into typed series; pure (no I/O).

The answer is usable when it is a JSON object with "status": "success" and a data.result list
of one of the expected result types ("vector": one `value` pair a series, "matrix": `values`
pairs); otherwise `parse_query_answer` raises TelemetryError:
    bad_response      the body is not JSON, not a JSON object, or the result is of another type
    prometheus_error  Prometheus said "status": "error" (its errorType and error are in the message)

Inside a usable answer nothing is fatal; what cannot be read is dropped and counted, so each
caller decides what a bad row costs:
- a row that is not an object, or whose "metric" is not an object: `QueryAnswer.malformed_rows`;
- a sample pair whose time or value is not a number: `Series.malformed`;
- a sample whose time is not finite: dropped silently (Prometheus never sends one).
Values keep NaN and ±Inf (Prometheus sends them as "NaN", "+Inf", "-Inf"): some callers count
them, others drop them. Label values are strings, as the API defines them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from extender.prometheus.client import TelemetryError

ResultType = Literal["vector", "matrix"]

_NAMES: dict[tuple[ResultType, ...], str] = {
    ("vector",): "an instant vector",
    ("matrix",): "a matrix",
    ("matrix", "vector"): "a matrix or vector",
    ("vector", "matrix"): "a matrix or vector",
}


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    samples: tuple[tuple[float, float], ...]  # (unix seconds, value), in the answer's order
    malformed: int = 0  # sample pairs that could not be read (dropped)

    @property
    def finite_samples(self) -> tuple[tuple[float, float], ...]:
        """The samples whose value is a finite number (NaN is no reading)."""
        return tuple(s for s in self.samples if math.isfinite(s[1]))


@dataclass(frozen=True)
class QueryAnswer:
    result_type: ResultType
    series: tuple[Series, ...]
    malformed_rows: int = 0  # rows that were not an object with an object "metric" (dropped)


def parse_query_answer(status: int, body: bytes, expect: tuple[ResultType, ...] = ("vector", "matrix"),
                       hint: str = "") -> QueryAnswer:
    """The answer (HTTP `status`, raw `body`) as series; TelemetryError when it is unusable as a
    whole. `hint` is added to the wrong-result-type message (what the user should check)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise TelemetryError("bad_response", f"HTTP {status}, body is not JSON: {e}") from e
    return parse_query_doc(status, doc, expect, hint)


def parse_query_doc(status: int, doc: Any, expect: tuple[ResultType, ...] = ("vector", "matrix"),
                    hint: str = "") -> QueryAnswer:
    """As parse_query_answer, for an answer already decoded from JSON."""
    if not isinstance(doc, dict):
        raise TelemetryError("bad_response", f"HTTP {status}, body is not a JSON object")
    if doc.get("status") != "success":
        raise TelemetryError("prometheus_error",
                             f"HTTP {status}: {doc.get('errorType', '?')}: {str(doc.get('error', ''))[:300]}")
    data = doc.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    if kind not in expect or not isinstance(data, dict) or not isinstance(data.get("result"), list):
        what = _NAMES.get(expect) or " or ".join(expect)
        raise TelemetryError("bad_response", f"data.result is not {what}" + (f" ({hint})" if hint else ""))
    series: list[Series] = []
    malformed_rows = 0
    for row in data["result"]:
        labels = row.get("metric") if isinstance(row, dict) else None
        if not isinstance(labels, dict):
            malformed_rows += 1
            continue
        samples, malformed = _samples(row)
        series.append(Series({str(k): str(v) for k, v in labels.items()}, samples, malformed))
    result_type: ResultType = "vector" if kind == "vector" else "matrix"
    return QueryAnswer(result_type, tuple(series), malformed_rows)


def _samples(row: Mapping[str, Any]) -> tuple[tuple[tuple[float, float], ...], int]:
    """A row's readable (time, value) pairs and how many were not. A matrix row has "values", a
    vector row one "value"; either is read whatever the resultType says."""
    if "values" in row:
        pairs = row["values"] if isinstance(row["values"], list) else []
    elif "value" in row:
        pairs = [row["value"]]
    else:
        pairs = []
    out: list[tuple[float, float]] = []
    malformed = 0
    for pair in pairs:
        try:
            ts, value = float(pair[0]), float(pair[1])  # Prometheus sends values as strings
        except (TypeError, ValueError, IndexError, KeyError):
            malformed += 1
            continue
        if math.isfinite(ts):
            out.append((ts, value))
    return tuple(out), malformed
