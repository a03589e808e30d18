"""The server's limits that must hold against a hostile client (issue 33, findings 1-5): no protocol
upgrade, bounded request line and headers, write backpressure, a per-client share of the API's
slots, verb bodies whose work is bounded. Each test fails on the code before them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time

import httpx
import orjson
import pytest

from extender.http import wire
from extender.http.app import build_app
from extender.http.extender_app import ExtenderApp
from extender.metrics import build_metrics
from extender.settings import Settings
from tests.k8s_factories import pod
from tests.service.http.test_slow_clients import FAST, closed_within, serving, small_cluster

PRIORITIZE = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "n1"]})


def _reply_to(port: int, raw: bytes, wait_s: float = 3.0) -> bytes:
    """What the server answers to raw bytes, up to its close (or wait_s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(raw)
        got = b""
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c"])
def test_an_upgrade_request_is_refused_and_closed_not_handed_to_a_websocket_library(upgrade: bytes) -> None:
    """Finding 1: the websockets library took the connection, out of reach of every deadline."""
    with serving(FAST) as port:
        raw = (b"POST /prioritize HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: " + upgrade +
               b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               b"Content-Length: " + str(len(PRIORITIZE)).encode() + b"\r\n\r\n" + PRIORITIZE)
        got = _reply_to(port, raw)
        assert got.startswith(b"HTTP/1.1 400"), got[:200]
        assert b"connection: close" in got.lower()
        # a GET upgrade, as browsers send it, too
        got = _reply_to(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: " + upgrade +
                        b"\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 400"), got[:200]


def test_too_many_header_lines_get_431_and_a_close() -> None:
    """Finding 2: header lines were kept without a count (233 MiB of them: RSS past 2 GiB)."""
    with serving(FAST) as port:
        lines = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
        got = _reply_to(port, b"POST /prioritize HTTP/1.1\r\nHost: x\r\n" + lines +
                        b"Content-Length: " + str(len(PRIORITIZE)).encode() + b"\r\n\r\n" + PRIORITIZE)
        assert got.startswith(b"HTTP/1.1 431"), got[:200]


def test_a_never_ending_header_value_is_cut_at_the_head_limit_not_the_deadline() -> None:
    """Finding 2: a value grown by copying made /prioritize's p50 4 s; here it is cut at 64 KiB."""
    slow_deadline = dataclasses.replace(FAST, header_timeout_s=30.0)
    with serving(slow_deadline) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: ")
        start = time.monotonic()
        got = b""
        try:
            for _ in range(64):  # 4 MiB at most, far past the limit
                s.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
        assert got.startswith(b"HTTP/1.1 431"), got[:200]
        assert time.monotonic() - start < 5


def test_a_long_url_gets_414() -> None:
    with serving(FAST) as port:
        got = _reply_to(port, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 414"), got[:200]
        # Within the limits everything is as before.
        assert httpx.post(f"http://127.0.0.1:{port}/prioritize", content=PRIORITIZE,
                          headers={f"x-h{i}": "v" for i in range(50)}).status_code == 200


def test_a_pipelining_client_that_never_reads_is_stopped_then_closed() -> None:
    """Finding 3: /prioritize pipelined and never read grew RSS 164 -> 2,065 MiB in 54 s: the
    server kept reading and answering into its send buffer. Now it stops reading once the replies
    pile up (the client's sends stall), and closes the connection after write_timeout_s."""
    limits = dataclasses.replace(FAST, write_timeout_s=3.0, keep_alive_s=30, header_timeout_s=30.0,
                                 body_timeout_s=30.0)
    # Replies ~5x the request (a score per name), so the server's send buffers fill first.
    body = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "n1"] * 250})
    request = b"POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    with serving(limits) as port, socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        sent, batch, start = 0, request * 64, time.monotonic()
        at_1s = None
        while (now := time.monotonic() - start) < 2.0:  # send as fast as the server takes it; never read
            if at_1s is None and now >= 1.0:
                at_1s = sent
            try:
                sent += s.send(batch[sent % len(batch):])  # whole requests, in order
            except BlockingIOError:
                time.sleep(0.01)
        assert at_1s is not None
        # Stalled: the second second took (almost) nothing; before, the server read on at ~3 MB/s.
        assert sent - at_1s < 512 * 1024, (at_1s, sent)
        time.sleep(limits.write_timeout_s + 1.0)  # still reading nothing
        s.setblocking(True)
        assert closed_within(s, 5.0), "a connection whose replies are not read was left open"


def _asgi(app: ExtenderApp, method: str, path: str, body: bytes, client: str = "127.0.0.1") -> int:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(client, 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return await c.request(method, path, content=body)

    return asyncio.run(call()).status_code


def test_one_client_holds_at_most_its_share_of_the_api_slots() -> None:
    """Finding 4: 64 connections of one client pinned every slot."""
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())
    api = app.listener("api", per_client=2)
    assert api.per_client is not None
    assert api.per_client.take("10.0.0.1") and api.per_client.take("10.0.0.1")  # two under way
    assert _asgi(api, "GET", "/metrics", b"", client="10.0.0.1") == 503
    assert _asgi(api, "GET", "/healthz", b"", client="10.0.0.1") == 200  # probes are never refused
    assert _asgi(api, "GET", "/metrics", b"", client="10.0.0.2") == 200
    assert api.per_client._held == {"10.0.0.1": 2} and api.in_flight == 0


def test_verb_bodies_past_what_kube_scheduler_sends_get_413_before_any_work() -> None:
    """Finding 5: one 3.1 MiB /preempt of 180,000 victims held the loop 385 ms."""
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())
    per_node = 200
    nodes = wire.MAX_PREEMPT_VICTIMS // per_node + 1
    victims = {f"n{i}": {"Pods": [{"UID": f"u{i}-{j}"} for j in range(per_node)], "NumPDBViolations": 0}
               for i in range(nodes)}
    body = orjson.dumps({"Pod": pod("p"), "NodeNameToMetaVictims": victims})
    assert _asgi(app, "POST", "/preempt", body) == 413
    names = orjson.dumps({"Pod": pod("p"), "NodeNames": [f"n{i}" for i in range(wire.MAX_CANDIDATE_NODES + 1)]})
    assert _asgi(app, "POST", "/prioritize", names) == 413
    assert _asgi(app, "POST", "/filter", names) == 413
    ok = orjson.dumps({"Pod": pod("p"), "NodeNames": [f"n{i}" for i in range(wire.MAX_CANDIDATE_NODES)]})
    assert _asgi(app, "POST", "/prioritize", ok) == 200


def test_a_connection_pipelining_past_the_queue_bound_is_aborted(caplog: pytest.LogCaptureFixture) -> None:
    """Finding 3, the ASGI side: uvicorn queued every request of a read behind the one being
    answered, and read on after each response: thousands of cycles queued per connection."""
    from extender.http.guarded_protocol import MAX_PIPELINED

    with serving(FAST) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * (MAX_PIPELINED + 40))
        got = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := s.recv(65536):
                got += chunk
        assert got.count(b"HTTP/1.1 200") <= MAX_PIPELINED + 1
        # a client that pipelines a few is served in full
    with serving(FAST) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 4 + b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        assert got.count(b"HTTP/1.1 200") == 5


def test_a_peer_refused_again_and_again_is_held_unread_as_it_connects_others_are_not() -> None:
    """A header flood reconnected ~11,000 times in 6 s, each connection parsed to the head bound."""
    with serving(FAST) as port:
        for _ in range(21):
            got = _reply_to(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 400")
        assert _reply_to(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", wait_s=1.0) == b""  # held unread
        with socket.socket() as other:  # another peer address is served as ever
            other.bind(("127.0.0.2", 0))
            other.settimeout(5)
            other.connect(("127.0.0.1", port))
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert other.recv(65536).startswith(b"HTTP/1.1 200")


def test_one_peer_sends_at_most_its_rate_on_the_api_port() -> None:
    """Findings 13 and 7: a closed loop of cheap tenant requests took the CPU the verbs wait for."""
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())
    api = app.listener("api", rate_per_client_s=5.0)
    codes = [_asgi(api, "GET", "/metrics", b"", client="10.0.0.1") for _ in range(12)]
    assert codes.count(200) == 10 and codes[-1] == 429  # a burst of 2 x 5, then refused
    assert _asgi(api, "GET", "/healthz", b"", client="10.0.0.1") == 200  # probes exempt
    assert _asgi(api, "GET", "/metrics", b"", client="10.0.0.2") == 200  # another peer has its own
    verbs = app.listener("verbs")
    assert all(_asgi(verbs, "POST", "/prioritize", PRIORITIZE, client="10.0.0.1") == 200 for _ in range(12))
