"""Progress reports through the API front (issue 33, finding 7): the front parses and checks each
report and forwards its checked form, so the verbs' process, whose GIL kube-scheduler's calls
wait for, validates nothing (a 100-point batch of 64 long metric names held it ~6 ms in one
pydantic call: the verbs' p99 7.6x idle on a quiet box). Real front process and sockets."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

import extender.http.progress_api as progress_api
from extender.http.progress_api import split_points
from extender.http.progress_wire import CHECKED_FORM, BadReport, check_report, decode_checked, encode_checked
from extender.http.upstream import FRONT_FORM_HEADER
from extender.service import build_service
from extender.settings import Settings
from tests.service.http.test_api_front import served

NAMES = [("m" * 120) + f"{i:03d}" for i in range(64)]


def flood_batch(job: str = "flood-1") -> bytes:
    metrics = dict.fromkeys(NAMES, 1.0)
    return orjson.dumps({"namespace": "team-a", "job": job,
                         "points": [{"step": i, "loss": 1.0, "metrics": metrics} for i in range(100)]})


class _Heard:
    """The requests the verbs' process gets from the front: path, form header, body."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, bytes | None, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        form = dict(scope["headers"]).get(FRONT_FORM_HEADER)
        self.seen.append((scope["path"], form, b"".join(chunks)))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


def _service(tmp_path: Path) -> Any:
    (tmp_path / "tokens").write_text("tok-a team-a\n")
    return build_service(Settings(kube=False, progress_db=str(tmp_path / "p.sqlite"), progress_auth="static",
                                  static_tokens_file=str(tmp_path / "tokens")))


def test_reports_through_the_front_are_checked_there_and_stored_the_same(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    service = _service(tmp_path)
    heard: list[_Heard] = []

    def hear(app: Any) -> Any:
        heard.append(_Heard(app))
        return heard[0]

    def no_parsing(raw: bytes, max_points: int) -> Any:
        raise AssertionError("the verbs' process parsed a report the front had checked")

    monkeypatch.setattr(progress_api, "check_report", no_parsing)  # the verbs' process's reference only
    now = time.time()
    body = (b'{"namespace": "team-a", "job": "j", "pod": "w-0", "training": {"batch_size": 64}, "points": ['
            b'{"step": 1, "loss": 2.0, "timestamp": %f, "metrics": {"acc": 0.5, "bad": NaN}},'
            b'{"step": 2, "loss": NaN},'
            b'{"step": 3, "loss": 1.5, "timestamp": %f},'
            b'{"step": 4, "loss": 1.0}]}') % (now - 10, now + 7200)
    a = {"Authorization": "Bearer tok-a", "Content-Type": "application/json"}
    with served(service.app, upstream=hear) as (_port, api_port, _server):
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        r = api.post("/v1/progress", headers=a, content=body)
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == 2 and r.json()["rejected"] == 2
        assert r.json()["reasons"] == {"metric_not_finite": 1, "loss_nan": 1, "timestamp_future": 1}
        # A bad body: the token is still checked first (by the verbs' process), then the front's 400.
        assert api.post("/v1/progress", content=b"{not json").status_code == 401
        bad = api.post("/v1/progress", headers=a, content=b'{"namespace": "team-a", "job": "j", "points": []}')
        assert bad.status_code == 400 and "points" in bad.json()["error"]
        huge = api.post("/v1/progress", headers=a, content=b" " * (service.settings.progress_max_body_bytes + 1))
        assert huge.status_code == 413
        got = api.get("/v1/jobs/team-a/j", headers=a).json()
        acc = service.store.metric_series("team-a", "j", "acc")
        assert service.store.metric_series("team-a", "j", "bad") is None
    progress = [(form, raw) for path, form, raw in heard[0].seen if path == "/v1/progress"]
    assert progress and all(form == CHECKED_FORM.encode() for form, _ in progress)
    assert all(raw != body for _, raw in progress), "the client's JSON reached the verbs' process"
    assert got["points"] == 2 and got["training"]["batch_size"] == 64
    assert acc is not None and list(acc[0]) == [1.0] and list(acc[1]) == [0.5]


def test_a_tenant_cannot_send_the_checked_form_itself(tmp_path: Path) -> None:
    """Only requests the front forwards (marked by the Unix-socket listener) are read as checked:
    the same bytes and header sent straight to the API are a JSON body, refused."""
    service = _service(tmp_path)
    forged = encode_checked(check_report(flood_batch(), 10_000))
    with TestClient(service.app.listener("api")) as client:
        r = client.post("/v1/progress", content=forged, headers={"Authorization": "Bearer tok-a",
                                                                 FRONT_FORM_HEADER.decode(): CHECKED_FORM})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_the_checked_form_round_trips_and_is_cheap_to_read() -> None:
    """What the verbs' process does per forwarded batch (decode, clock checks) against what the
    front does (parse, validate, re-encode): a small fraction, so no long GIL hold."""
    raw = flood_batch()
    checked = check_report(raw, 10_000)
    wire = encode_checked(checked)
    assert decode_checked(wire) == checked
    kept, reasons = split_points(decode_checked(wire), time.time())
    assert len(kept.rows) == 100 and reasons == {} and kept.names == frozenset(NAMES)
    blob = kept.rows[0][4]
    assert blob is not None and orjson.loads(blob) == dict.fromkeys(NAMES, 1.0)
    with pytest.raises(BadReport) as e:
        decode_checked(encode_checked(BadReport(413, "too big")))
    assert (e.value.status, e.value.message) == (413, "too big")

    def best(fn: Any) -> float:
        times = []
        for _ in range(7):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    front = best(lambda: encode_checked(check_report(raw, 10_000)))
    verbs = best(lambda: split_points(decode_checked(wire), time.time()))
    assert verbs < front / 5, f"verbs' side {verbs * 1000:.2f} ms vs front {front * 1000:.2f} ms"
    assert math.isfinite(front)
