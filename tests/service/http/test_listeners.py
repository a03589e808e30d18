"""Two listeners (issue 33, DESIGN.md §12): the verbs on kube-scheduler's port, on an event loop,
connection pool and in-flight cap of their own; everything tenants call on api_port. Each test
fails on the code before the split (one listener, one loop, one cap)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import orjson
from fastapi import APIRouter

from extender.http.app import build_app
from extender.http.extender_app import ExtenderApp
from extender.http.listeners import ApiListener, VerbsServer
from extender.http.server import server_config
from extender.http.server_limits import ServerLimits
from extender.metrics import build_metrics
from extender.settings import Settings
from tests.k8s_factories import pod
from tests.service.http.test_slow_clients import FAST, free_port, small_cluster

PRIORITIZE = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "n1"]})


def _asgi(app: ExtenderApp, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    """One request through the ASGI route, from loopback."""
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return await c.request(method, path, content=body)

    r = asyncio.run(call())
    return r.status_code, r.content


def _app(routers: list[APIRouter] | None = None) -> ExtenderApp:
    return build_app(Settings(kube=False), small_cluster(), build_metrics(), routers=routers or [])


def test_each_listener_answers_only_its_own_paths_and_both_answer_the_probes() -> None:
    app = _app()
    verbs, api = app.listener("verbs"), app.listener("api")
    assert _asgi(verbs, "POST", "/prioritize", PRIORITIZE)[0] == 200
    assert _asgi(api, "POST", "/prioritize", PRIORITIZE)[0] == 404
    for path in ("/metrics", "/debug/status", "/ui", "/v1/jobs"):
        assert _asgi(verbs, "GET", path, b"")[0] == 404, path
    assert _asgi(api, "GET", "/metrics", b"")[0] == 200
    for view in (verbs, api):
        assert _asgi(view, "GET", "/healthz", b"")[0] == 200
        assert _asgi(view, "GET", "/readyz", b"")[0] == 200
    assert api.direct_paths == frozenset() and "/prioritize" in verbs.direct_paths


def test_the_api_listener_at_its_in_flight_cap_leaves_the_verbs_their_own() -> None:
    """Finding 4: 64 cheap tenant requests took every slot, and the verbs got 503."""
    app = _app()
    verbs, api = app.listener("verbs"), app.listener("api")
    api.in_flight = api.max_in_flight
    assert _asgi(api, "GET", "/metrics", b"")[0] == 503
    assert _asgi(verbs, "POST", "/prioritize", PRIORITIZE)[0] == 200
    # The watches wait for verbs on whichever view answers them.
    assert app.verbs_in_flight == verbs.verbs_in_flight == 0


@contextmanager
def two_listeners(app: ExtenderApp, limits: ServerLimits = FAST) -> Iterator[tuple[int, int, VerbsServer]]:
    port, api_port = free_port(), free_port()
    api = ApiListener(server_config(app.listener("api"), host="127.0.0.1", port=api_port, limits=limits,
                                    log_level="warning", lifespan="off"))
    assert api.start()
    server = VerbsServer(server_config(app.listener("verbs"), host="127.0.0.1", port=port, limits=limits,
                                       log_level="warning"), api)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "verbs server did not start"
        time.sleep(0.02)
    try:
        yield port, api_port, server
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive() and not api.thread.is_alive(), "a listener did not stop"


def test_a_tenant_request_that_holds_the_api_loop_does_not_hold_the_verbs() -> None:
    """Findings 5 and 13: one expensive tenant call ran on the loop kube-scheduler waits on."""
    router = APIRouter()
    holding = threading.Event()

    @router.get("/v1/hold")
    async def hold() -> dict[str, bool]:
        holding.set()
        time.sleep(1.5)  # the API's loop is held (as by a 385 ms /preempt or a large job read)
        return {"ok": True}

    with two_listeners(_app([router])) as (port, api_port, _server):
        held = threading.Thread(target=lambda: httpx.get(f"http://127.0.0.1:{api_port}/v1/hold", timeout=10))
        held.start()
        assert holding.wait(5)
        start = time.monotonic()
        r = httpx.post(f"http://127.0.0.1:{port}/prioritize", content=PRIORITIZE, timeout=10)
        took = time.monotonic() - start
        held.join(10)
    assert r.status_code == 200 and took < 0.5, took


def test_tenant_connections_at_the_api_cap_leave_the_verbs_port_open() -> None:
    """Findings 1 and 4: connections pinned on the one port starved kube-scheduler's."""
    limits = ServerLimits(header_timeout_s=30, body_timeout_s=30, keep_alive_s=5, max_connections=16,
                          graceful_shutdown_s=2)
    with two_listeners(_app(), limits) as (port, api_port, _server):
        pinned = []
        try:
            for _ in range(40):  # every one mid-body: busy, so none is evicted to make room
                s = socket.create_connection(("127.0.0.1", api_port), timeout=5)
                s.sendall(b"POST /v1/progress HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
                pinned.append(s)
            codes = [httpx.post(f"http://127.0.0.1:{port}/prioritize", content=PRIORITIZE, timeout=5).status_code
                     for _ in range(20)]
        finally:
            for s in pinned:
                s.close()
    assert codes == [200] * 20


def test_sigterm_on_the_verbs_server_stops_the_api_listener_first() -> None:
    app = _app()
    with two_listeners(app) as (_port, api_port, server):
        assert httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=5).status_code == 200
        server.handle_exit(15, None)
        deadline = time.monotonic() + 10
        while server.api.thread.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_the_two_ports_must_differ() -> None:
    try:
        Settings(kube=False, port=9000, api_port=9000)
    except ValueError as e:
        assert "api_port must differ" in str(e)
    else:
        raise AssertionError("one port for both listeners was accepted")
