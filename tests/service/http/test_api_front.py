"""The API port's front process (issue 33, DESIGN.md §12): every tenant connection is taken, bounded
and budgeted by a process of its own, which forwards what passes to the verbs' process over a Unix
socket. Real processes and sockets: the verbs' listener and the API's Unix-socket listener in this
process (as under `flowsched serve`), the front started by ApiFront."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from extender.http.api_front import FrontConfig
from extender.http.app import build_app
from extender.http.extender_app import ExtenderApp
from extender.http.front_process import ApiFront, FrontPeer, bind_listener, private_socket_path
from extender.http.listeners import ApiListener, VerbsServer
from extender.http.reply_cache import ReplyCache, cache_key, storable
from extender.http.server import server_config
from extender.http.server_limits import ServerLimits
from extender.http.upstream import FRONT_PEER_HEADER, encode_request
from extender.metrics import build_metrics
from extender.service import build_service
from extender.settings import Settings
from tests.k8s_factories import pod
from tests.service.http.test_slow_clients import FAST, free_port, small_cluster

PRIORITIZE = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "n1"]})


def _app() -> ExtenderApp:
    return build_app(Settings(kube=False), small_cluster(), build_metrics())


@contextmanager
def served(app: ExtenderApp, limits: ServerLimits = FAST, restarts: int = 5, rate_per_client_s: float = 50.0,
           refusal_delay_s: float = 0.0, upstream: Callable[[Any], Any] = lambda a: a,
           refusals: Any = None) -> Iterator[tuple[int, int, VerbsServer]]:
    """The verbs on one port, the API behind its front on another, as `flowsched serve` wires them;
    `upstream` wraps what the verbs' process serves to the front."""
    port, api_port = free_port(), free_port()
    uds = private_socket_path()
    api = ApiListener(server_config(upstream(FrontPeer(app.listener("api"))), host="", port=0, uds=uds, limits=limits,
                                    log_level="warning", lifespan="off"))
    assert api.start()
    front = ApiFront(FrontConfig(uds=uds, limits=limits, max_in_flight=64, per_client=16,
                                 rate_per_client_s=rate_per_client_s, max_body_bytes=1 << 20,
                                 verb_paths=tuple(app.verbs), log_level="warning", nice=0,
                                 refusal_delay_s=refusal_delay_s),
                     bind_listener("127.0.0.1", api_port), restarts=restarts, refusals=refusals)
    assert front.start(), "the API front did not start"
    app.live_checks["api_front"] = front.alive
    server = VerbsServer(server_config(app.listener("verbs"), host="127.0.0.1", port=port, limits=limits,
                                       log_level="warning"), api, front)
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
        thread.join(20)
        front.terminate(force=True)
        front.wait(5)
        front.close()
        assert not thread.is_alive() and not api.thread.is_alive(), "a listener did not stop"


def test_the_front_forwards_the_api_names_the_peer_and_refuses_the_verbs() -> None:
    app = _app()
    with served(app) as (port, api_port, _server):
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        assert api.get("/healthz").json() == {"ok": True}
        assert api.get("/metrics").status_code == 200
        # /debug/* answers loopback only: the front named this client's address, not its own socket's.
        assert api.get("/debug/status").status_code == 200
        r = api.post("/prioritize", content=PRIORITIZE)
        assert r.status_code == 404 and "for kube-scheduler alone" in r.text
        assert api.get("/v1/jobs/team-a/nope", params={"x": "y"}).status_code in (401, 404)
        assert httpx.post(f"http://127.0.0.1:{port}/prioritize", content=PRIORITIZE, timeout=10).status_code == 200


def test_a_tenant_cannot_name_its_own_peer() -> None:
    """The peer header is the front's word alone: a client's own is dropped before it is set."""
    raw = encode_request("GET", b"/debug/status", [(b"host", b"x"), (FRONT_PEER_HEADER, b"127.0.0.1")], b"",
                         "10.1.2.3")
    assert raw.count(FRONT_PEER_HEADER) == 1 and b"x-flowsched-peer: 10.1.2.3\r\n" in raw


def test_the_per_peer_rate_is_applied_in_the_front_and_its_429s_are_slow() -> None:
    """A client looping on 429s spent as much CPU as the front could answer (finding 13's probe)."""
    with served(_app(), rate_per_client_s=0.5, refusal_delay_s=0.2) as (_port, api_port, _server):  # bursts of 1
        client = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        start = time.monotonic()
        codes = [client.get("/metrics").status_code for _ in range(6)]
        took = time.monotonic() - start
        probes = [client.get("/healthz").status_code for _ in range(20)]
    assert codes[0] == 200 and codes.count(429) >= 4, codes
    assert took >= 0.2 * codes.count(429), took
    assert probes == [200] * 20


def test_a_header_flood_on_the_api_port_costs_the_verbs_process_no_cpu() -> None:
    """Issue 33, finding 2 (the p99 6-40x of idle): with the API's connections in the verbs'
    process, its thread parsed every flooding header line and held the GIL the verbs wait for:
    0.53 s of this process's CPU in this test with the API on a thread (0.005 s with the front)."""
    flood = ("import socket, time\n"
             "end = time.monotonic() + 1.5\n"
             "while time.monotonic() < end:\n"
             "    try:\n"
             "        with socket.create_connection(('127.0.0.1', %d), timeout=1) as s:\n"
             "            s.sendall(b'GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n')\n"
             "            while time.monotonic() < end:\n"
             "                s.sendall(b'X-B: c\\r\\n' * 64)\n"
             "    except OSError:\n"
             "        pass\n")
    with served(_app()) as (port, api_port, _server):
        before = resource.getrusage(resource.RUSAGE_SELF)
        attacker = subprocess.run([sys.executable, "-c", flood % api_port], timeout=30, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_SELF)
        assert attacker.returncode == 0, attacker.stderr
        assert httpx.post(f"http://127.0.0.1:{port}/prioritize", content=PRIORITIZE, timeout=10).status_code == 200
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert used < 0.1, f"the verbs' process spent {used:.2f}s of CPU on a 1.5 s flood of the API port"


def test_a_dead_front_is_restarted_on_the_same_socket() -> None:
    app = _app()
    with served(app) as (port, api_port, server):
        assert server.front is not None and server.front.proc is not None
        first = server.front.proc.pid
        server.front.proc.kill()
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the front was not restarted"
            time.sleep(0.1)
        assert server.front.proc.pid != first and not server.should_exit
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()["down"] == []


def test_a_front_that_keeps_dying_stops_the_verbs_server_with_a_failure() -> None:
    with served(_app(), restarts=0) as (_port, _api_port, server):
        assert server.front is not None and server.front.proc is not None
        server.front.proc.kill()
        deadline = time.monotonic() + 10
        while not server.should_exit:
            assert time.monotonic() < deadline, "the verbs server did not notice"
            time.sleep(0.05)
        assert server.failed


def test_the_probes_on_both_ports_say_when_the_front_is_down() -> None:
    app = _app()
    with served(app) as (port, _api_port, _server):
        app.live_checks["api_front"] = lambda: False  # served() set the real one
        for path in ("/healthz", "/readyz"):
            r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert r.status_code == 503 and "api_front" in r.text, (path, r.text)


def test_sigterm_stops_the_front_then_the_api_then_the_verbs() -> None:
    app = _app()
    with served(app) as (_port, _api_port, server):
        assert server.front is not None and server.front.proc is not None
        proc = server.front.proc
        server.handle_exit(15, None)
        assert proc.wait(15) in (0, -15)  # uvicorn re-raises the SIGTERM it handled
        deadline = time.monotonic() + 15
        while server.api.thread.is_alive():
            assert time.monotonic() < deadline, "the API listener did not stop"
            time.sleep(0.05)
        # The forwarded requests' socket and its private directory are removed on the way out.
        assert not Path(server.front.config.uds).parent.exists()


class _Counted:
    """The verbs' process's API as the front reaches it, counting the requests that arrive."""

    def __init__(self, app: Any) -> None:
        self.app, self.seen = app, []  # type: list[tuple[str, str]]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


def test_repeated_job_reads_are_answered_by_the_front_and_another_token_is_forwarded(tmp_path: Path) -> None:
    """Finding 13 on a quiet box: every forwarded read of a 4,000-point job cost the verbs'
    process (its API thread, on the verbs' GIL) a large reply: p99 2.71x idle. Repeats within
    job_reply_ttl_s are answered by the front; a different or missing token reaches the verbs'
    process, which authorises it."""
    (tmp_path / "tokens").write_text("tok-a team-a\ntok-b team-b\n")
    service = build_service(Settings(kube=False, progress_db=str(tmp_path / "p.sqlite"), progress_auth="static",
                                     static_tokens_file=str(tmp_path / "tokens")))
    counted: list[_Counted] = []

    def count(app: Any) -> Any:
        counted.append(_Counted(app))
        return counted[0]

    points = [{"step": 10 * k, "loss": 3.0 - 0.01 * k, "timestamp": time.time() - 300 + k} for k in range(50)]
    a, b = {"Authorization": "Bearer tok-a"}, {"Authorization": "Bearer tok-b"}
    with served(service.app, upstream=count) as (_port, api_port, _server):
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        r = api.post("/v1/progress", headers=a, json={"namespace": "team-a", "job": "big", "points": points})
        assert r.status_code == 200, r.text
        seen = counted[0].seen
        first = api.get("/v1/jobs/team-a/big", headers=a)
        assert first.status_code == 200 and first.json()["points"] == 50, first.text
        forwarded = len(seen)
        repeats = [api.get("/v1/jobs/team-a/big", headers=a) for _ in range(20)]
        assert [r.status_code for r in repeats] == [200] * 20 and {r.content for r in repeats} == {first.content}
        assert len(seen) == forwarded, "a repeat within the TTL reached the verbs' process"
        # Another token, or none, is the verbs' process's to judge: forwarded every time.
        assert api.get("/v1/jobs/team-a/big", headers=b).status_code == 403
        assert api.get("/v1/jobs/team-a/big", headers=b).status_code == 403
        assert api.get("/v1/jobs/team-a/big").status_code == 401
        assert len(seen) == forwarded + 3
        # Only the job reads are kept: other GETs and every POST go through.
        api.get("/metrics")
        api.get("/metrics")
        assert len(seen) == forwarded + 5
        time.sleep(1.1)  # past the TTL: read afresh
        assert api.get("/v1/jobs/team-a/big", headers=a).status_code == 200
        assert len(seen) == forwarded + 6


def test_the_front_keeps_only_200_job_reads_under_its_byte_cap() -> None:
    h = [(b"authorization", b"Bearer x")]
    assert cache_key("GET", b"/v1/jobs/a/b", h) == (b"GET", b"/v1/jobs/a/b", b"Bearer x")
    assert cache_key("POST", b"/v1/jobs/a/b", h) is None and cache_key("GET", b"/metrics", h) is None
    assert cache_key("GET", b"/v1/jobs/a/b", h + h) is None
    assert not storable(404, []) and not storable(200, [(b"cache-control", b"no-store")]) and storable(200, [])
    cache = ReplyCache(ttl_s=1.0, max_bytes=400)
    for i in range(5):
        cache.put((b"GET", b"/v1/jobs/a/%d" % i, b""), [], b"x" * 100, now=0.0)
    assert cache.bytes == 400 and len(cache) == 4 and cache.get((b"GET", b"/v1/jobs/a/0", b""), 0.5) is None
    assert cache.get((b"GET", b"/v1/jobs/a/4", b""), 0.5) == ([], b"x" * 100)
    assert cache.get((b"GET", b"/v1/jobs/a/4", b""), 1.0) is None and cache.bytes == 300  # expired, dropped
    cache.put((b"GET", b"/v1/jobs/a/big", b""), [], b"x" * 101, now=0.0)  # over a quarter: not kept
    assert len(cache) == 3
