"""The one reader of /api/v1/query answers (extender.prometheus.response): what is fatal, what
is dropped and counted, and how NaN and ±Inf come through."""

from __future__ import annotations

import json
import math

import pytest

from extender.prometheus.client import TelemetryError
from extender.prometheus.response import parse_query_answer, parse_query_doc


def answer(result_type: str, *rows: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": result_type, "result": list(rows)}}).encode()


def test_a_matrix_reads_every_pair_as_floats_in_order() -> None:
    a = parse_query_answer(200, answer("matrix", {"metric": {"__name__": "up", "job": "x"},
                                                  "values": [[10, "1"], [11.5, "0.25"]]}), expect=("matrix",))
    assert a.result_type == "matrix" and a.malformed_rows == 0
    [s] = a.series
    assert dict(s.labels) == {"__name__": "up", "job": "x"}
    assert s.samples == ((10.0, 1.0), (11.5, 0.25)) and s.malformed == 0


def test_a_vector_reads_its_one_value() -> None:
    a = parse_query_answer(200, answer("vector", {"metric": {"pod": "p"}, "value": [1700000000.5, "3"]}),
                           expect=("vector",))
    assert a.result_type == "vector" and a.series[0].samples == ((1700000000.5, 3.0),)


def test_nan_and_inf_values_come_through_and_finite_samples_drops_them() -> None:
    [s] = parse_query_answer(200, answer("matrix", {"metric": {}, "values": [
        [1, "NaN"], [2, "+Inf"], [3, "-Inf"], [4, "2"]]})).series
    assert math.isnan(s.samples[0][1]) and s.samples[1][1] == math.inf and s.samples[2][1] == -math.inf
    assert s.finite_samples == ((4.0, 2.0),)


def test_bad_rows_and_pairs_are_dropped_and_counted_never_fatal() -> None:
    a = parse_query_answer(200, answer(
        "matrix",
        "not a row", {"metric": "x"}, {"values": [[1, "1"]]},  # three malformed rows
        {"metric": {"a": "1"}, "values": [["a", "b"], [2.0], None, {"x": 1}, [3, "7"], ["NaN", "1"]]},
        {"metric": {"b": "2"}, "values": "not a list"},
        {"metric": {"c": "3"}},
    ))
    assert a.malformed_rows == 3
    good, no_list, no_values = a.series
    # Four unreadable pairs; a non-finite time is dropped without being counted.
    assert good.samples == ((3.0, 7.0),) and good.malformed == 4
    assert no_list.samples == () and no_values.samples == ()  # kept: the labels may matter to the caller


def test_label_values_are_strings() -> None:
    [s] = parse_query_answer(200, answer("vector", {"metric": {"gpu": 0, "ok": True}, "value": [1, "1"]})).series
    assert dict(s.labels) == {"gpu": "0", "ok": "True"}


@pytest.mark.parametrize(("status", "body", "reason", "message"), [
    (400, b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}', "prometheus_error",
     "HTTP 400: bad_data: parse error at char 3"),
    (503, b'{"status":"error"}', "prometheus_error", "HTTP 503: ?: "),
    (502, b"<html>bad gateway</html>", "bad_response", "HTTP 502, body is not JSON"),
    (200, b"[]", "bad_response", "HTTP 200, body is not a JSON object"),
    (200, b'{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}', "bad_response",
     "data.result is not a matrix or vector"),
    (200, b'{"status":"success","data":{"resultType":"matrix","result":{}}}', "bad_response",
     "data.result is not a matrix or vector"),
    (200, b'{"status":"success","data":[]}', "bad_response", "data.result is not a matrix or vector"),
])
def test_unusable_answers_raise_with_a_reason(status: int, body: bytes, reason: str, message: str) -> None:
    with pytest.raises(TelemetryError) as e:
        parse_query_answer(status, body)
    assert e.value.reason == reason and str(e.value).startswith(message)


def test_the_wrong_result_type_names_what_was_expected_and_the_hint() -> None:
    with pytest.raises(TelemetryError, match=r"^data\.result is not a matrix \(is it a range\?\)$"):
        parse_query_answer(200, answer("vector"), expect=("matrix",), hint="is it a range?")
    with pytest.raises(TelemetryError, match=r"^data\.result is not an instant vector$"):
        parse_query_answer(200, answer("matrix"), expect=("vector",))


def test_an_error_message_is_cut_to_300_characters() -> None:
    with pytest.raises(TelemetryError) as e:
        parse_query_doc(422, {"status": "error", "errorType": "execution", "error": "x" * 1000})
    assert str(e.value) == "HTTP 422: execution: " + "x" * 300
