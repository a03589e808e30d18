"""kube.client through the real kubernetes ApiClient against a local HTTP server standing in for
the apiserver: what goes on the wire (method, path, query, headers, body) and what comes back,
the streaming calls (a watch, a followed log) included."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from extender.kube import client, requests
from extender.kube.errors import ApiError


class Apiserver(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []
    answers: dict[str, tuple[int, bytes]] = {}

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append({"method": self.command, "path": self.path, "content_type": self.headers.get("Content-Type"),
                          "accept": self.headers.get("Accept"), "body": json.loads(body) if body else None})
        status, out = self.answers.get(self.path.split("?")[0], (200, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "9")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PATCH = do_PUT = _answer

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[Any]:
    from kubernetes import client as k8s

    server = ThreadingHTTPServer(("127.0.0.1", 0), Apiserver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Apiserver.seen, Apiserver.answers = [], {}
    cfg = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    yield k8s.ApiClient(cfg)
    server.shutdown()


def test_a_dry_run_eviction_and_a_merge_patch_go_out_as_built(api: Any) -> None:
    resp = client.send(api, requests.evict_pod("t", "p", "u1", dry_run=True), timeout_s=5)
    assert resp.status == 200 and resp.ok
    patch = client.send(api, requests.patch_pod_metadata("t", "p", annotations={"a": None}), timeout_s=5)
    assert patch.ok
    evict, annotate = Apiserver.seen
    assert evict["method"] == "POST" and evict["path"] == "/api/v1/namespaces/t/pods/p/eviction?dryRun=All"
    assert evict["content_type"] == "application/json" and evict["body"]["deleteOptions"] == {
        "preconditions": {"uid": "u1"}}
    assert annotate["content_type"] == requests.MERGE_PATCH
    assert annotate["body"] == {"metadata": {"annotations": {"a": None}}}


def test_query_values_are_encoded_once(api: Any) -> None:
    client.send(api, requests.list_pods_on_node("gpu-1"), timeout_s=5)
    client.send(api, requests.resize_pod("t", "p", "main", {"requests": {"cpu": "2"}}), timeout_s=5)
    listed, resized = Apiserver.seen
    assert listed["path"] == "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1"
    assert resized["path"] == "/api/v1/namespaces/t/pods/p/resize?fieldManager=flowsched"
    assert resized["content_type"] == requests.STRATEGIC_MERGE_PATCH


def test_a_refusal_comes_back_as_a_response_with_its_headers(api: Any) -> None:
    Apiserver.answers["/api/v1/namespaces/t/pods/p/eviction"] = (429, b'{"message": "pdb"}')
    resp = client.send(api, requests.evict_pod("t", "p"), timeout_s=5)
    assert resp.status == 429 and resp.body == b'{"message": "pdb"}' and resp.headers.get("Retry-After") == "9"


def test_streams_read_as_they_arrive_and_refusals_raise(api: Any) -> None:
    Apiserver.answers["/api/v1/pods"] = (200, b'{"type":"ADDED"}\n{"type":"BOOKMARK"}\n')
    resp = client.open_stream(api, requests.watch_objects("pods", "7", 30), connect_timeout_s=5, read_timeout_s=5)
    try:
        assert b"".join(resp.stream(65536, decode_content=False)).splitlines() == [b'{"type":"ADDED"}',
                                                                                 b'{"type":"BOOKMARK"}']
    finally:
        resp.release_conn()
    assert Apiserver.seen[0]["path"] == ("/api/v1/pods?allowWatchBookmarks=true&resourceVersion=7&timeoutSeconds=30"
                                         "&watch=true")
    Apiserver.answers["/api/v1/namespaces/t/pods/p/log"] = (403, b'{"message": "forbidden"}')
    with pytest.raises(ApiError) as e:
        client.open_stream(api, requests.follow_pod_log("t", "p", "c", since="2026-01-01T00:00:00Z"),
                           connect_timeout_s=5, read_timeout_s=5)
    assert e.value.status == 403 and e.value.message == "forbidden"
    assert Apiserver.seen[-1]["accept"] == "*/*"
    assert Apiserver.seen[-1]["path"].endswith("timestamps=true&sinceTime=2026-01-01T00%3A00%3A00Z")


def test_the_token_reviewer_and_the_log_opener_use_it(api: Any) -> None:
    from extender.http.auth import ReviewResult, kubernetes_token_reviewer
    from extender.progress.log_follower import LogReadError, kube_log_opener

    Apiserver.answers["/apis/authentication.k8s.io/v1/tokenreviews"] = (201, json.dumps(
        {"status": {"authenticated": True, "user": {"username": "system:serviceaccount:a:b"}}}).encode())
    assert kubernetes_token_reviewer(api, ["x"])("tok") == ReviewResult(True, "system:serviceaccount:a:b", "")
    assert Apiserver.seen[-1]["body"]["spec"] == {"token": "tok", "audiences": ["x"]}
    Apiserver.answers["/api/v1/namespaces/t/pods/p/log"] = (200, b"2026-01-01T00:00:00Z loss=1\nlast")
    assert list(kube_log_opener(api)("t", "p", "c", None, 5.0)) == [b"2026-01-01T00:00:00Z loss=1", b"last"]
    Apiserver.answers["/api/v1/namespaces/t/pods/p/log"] = (404, b'{"message": "no pod"}')
    with pytest.raises(LogReadError, match="GET pods/p/log -> 404"):
        list(kube_log_opener(api)("t", "p", "c", None, 5.0))
