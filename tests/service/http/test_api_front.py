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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson

from extender.http.api_front import FrontConfig
from extender.http.app import build_app
from extender.http.extender_app import ExtenderApp
from extender.http.front_process import ApiFront, FrontPeer, bind_listener, private_socket_path
from extender.http.listeners import ApiListener, VerbsServer
from extender.http.server import server_config
from extender.http.server_limits import ServerLimits
from extender.http.upstream import FRONT_PEER_HEADER, encode_request
from extender.metrics import build_metrics
from extender.settings import Settings
from tests.k8s_factories import pod
from tests.service.http.test_slow_clients import FAST, free_port, small_cluster

PRIORITIZE = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "n1"]})


def _app() -> ExtenderApp:
    return build_app(Settings(kube=False), small_cluster(), build_metrics())


@contextmanager
def served(app: ExtenderApp, limits: ServerLimits = FAST, restarts: int = 5, rate_per_client_s: float = 50.0,
           refusal_delay_s: float = 0.0) -> Iterator[tuple[int, int, VerbsServer]]:
    """The verbs on one port, the API behind its front on another, as `flowsched serve` wires them."""
    port, api_port = free_port(), free_port()
    uds = private_socket_path()
    api = ApiListener(server_config(FrontPeer(app.listener("api")), host="", port=0, uds=uds, limits=limits,
                                    log_level="warning", lifespan="off"))
    assert api.start()
    front = ApiFront(FrontConfig(uds=uds, limits=limits, max_in_flight=64, per_client=16,
                                 rate_per_client_s=rate_per_client_s, max_body_bytes=1 << 20,
                                 verb_paths=tuple(app.verbs), log_level="warning", nice=0,
                                 refusal_delay_s=refusal_delay_s),
                     bind_listener("127.0.0.1", api_port), restarts=restarts)
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
