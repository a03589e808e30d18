"""Slow, idle, oversized and many clients against the real server (uvicorn with flowsched's
protocol), in-process on loopback, and `flowsched serve` as a process for SIGTERM and the
open-file limit (issue 18, findings 2, 4 and 5)."""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest

from extender.http.app import build_app
from extender.http.extender_app import ExtenderApp
from extender.http.guarded_protocol import guarded_protocol
from extender.http.server import FlowschedServer, server_config
from extender.http.server_limits import ServerLimits
from extender.metrics import build_metrics
from extender.settings import Settings
from extender.snapshot.objects import parse_node
from extender.snapshot.state import ClusterState
from tests.k8s_factories import node, pod

FAST = ServerLimits(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=5, max_connections=2048,
                    graceful_shutdown_s=2)
FILTER = orjson.dumps({"Pod": pod("p"), "NodeNames": ["n0", "n1"]})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def small_cluster() -> ClusterState:
    state = ClusterState()
    for name in ("n0", "n1"):
        state.upsert_node(parse_node(node(name)))
    state.mark_synced()
    return state


@contextmanager
def serving(limits: ServerLimits, app: ExtenderApp | None = None, **settings: object) -> Iterator[int]:
    if app is None:
        app = build_app(Settings(kube=False, **settings), small_cluster(), build_metrics())  # type: ignore[arg-type]
    port = free_port()
    server = FlowschedServer(server_config(app, host="127.0.0.1", port=port, limits=limits, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(15)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the server closes the connection within `seconds` (EOF or reset)."""
    sock.settimeout(seconds)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def post(port: int, path: str = "/filter", body: bytes = FILTER) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}{path}", content=body, timeout=10)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout() -> None:
    with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
        assert closed_within(s, 5.0)


def test_dripped_headers_are_cut_off_at_the_header_timeout() -> None:
    with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        closed = False
        while time.monotonic() - start < 5 and not closed:
            try:
                s.sendall(b"X")  # one byte of a header name every 50 ms: never completes
            except OSError:
                closed = True
                break
            closed = closed_within(s, 0.05)
        assert closed


def test_an_incomplete_body_is_cut_off_at_the_body_timeout() -> None:
    with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"Pod\":")
        assert closed_within(s, 5.0)


def test_normal_keep_alive_clients_are_served_across_the_deadlines() -> None:
    with serving(FAST) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        for _ in range(3):
            assert c.post("/filter", content=FILTER).status_code == 200
            time.sleep(0.7)  # longer than the header timeout, shorter than keep-alive


def test_oversized_bodies_are_refused_before_they_are_read() -> None:
    with serving(FAST) as port:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 62914560\r\n\r\n")
            s.settimeout(5)
            assert s.recv(4096).startswith(b"HTTP/1.1 413")
        def chunks() -> Iterator[bytes]:
            for _ in range(5):
                yield b" " * (1 << 20)
        r = httpx.post(f"http://127.0.0.1:{port}/prioritize", content=chunks(), timeout=10)
        assert r.status_code == 413  # no Content-Length: counted as it arrives
        assert post(port).status_code == 200


def test_at_the_connection_cap_the_longest_idle_connection_makes_room(caplog: pytest.LogCaptureFixture) -> None:
    limits = ServerLimits(header_timeout_s=30, body_timeout_s=30, max_connections=32)
    with caplog.at_level(logging.WARNING, logger="flowsched.http"), serving(limits) as port:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
        for s in idle[::2]:  # half of them start a request and never finish its headers
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(10):
                assert post(port).status_code == 200
        finally:
            for s in idle:
                s.close()
    assert "connection cap 32 reached" in caplog.text


def test_the_cap_is_lowered_to_fit_the_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    from extender.http.server_limits import effective_max_connections

    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert effective_max_connections(100_000) == 1024 - 128
        assert effective_max_connections(100) == 100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert issubclass(guarded_protocol(FAST, 10), object)


# ---- `flowsched serve` as a process ----

def _serve(tmp_path: Path, port: int, env_extra: dict[str, str], nofile: int | None = None,
           api_port: int | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWSCHED_")}
    env.update({"FLOWSCHED_PROGRESS_DB": str(tmp_path / "p.sqlite"), **env_extra})
    log = tmp_path / "serve.log"

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    argv = [sys.executable, "-c", "import sys; from extender.cli import main; sys.exit(main())",
            "serve", "--no-kube", "--host", "127.0.0.1", "--port", str(port),
            "--api-port", str(api_port or free_port())]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=limit)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, log
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "flowsched serve did not come up"
        time.sleep(0.1)


def test_sigterm_with_an_incomplete_body_exits_within_the_shutdown_bound(tmp_path: Path) -> None:
    port = free_port()
    # A body timeout longer than the test: only the bounded shutdown can end the request.
    proc, log = _serve(tmp_path, port, {"FLOWSCHED_BODY_TIMEOUT_S": "600", "FLOWSCHED_SHUTDOWN_TIMEOUT_S": "2"})
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"Pod\":")
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            # uvicorn re-raises the SIGTERM it caught once shut down: exit by that signal is normal.
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
        assert "timeout graceful shutdown exceeded" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_1100_idle_connections_under_a_1024_file_limit_leave_normal_requests_served(tmp_path: Path) -> None:
    """Tenants' idle connections land on the API port's front (issue 33), a process with files of
    its own: the verbs keep theirs, and the API port still serves newcomers."""
    port, api_port = free_port(), free_port()
    proc, log = _serve(tmp_path, port, {}, nofile=1024, api_port=api_port)
    idle: list[socket.socket] = []
    try:
        for _ in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", api_port), timeout=10))
        codes = []
        for i in range(100):
            try:
                if i % 2:
                    codes.append(httpx.post(f"http://127.0.0.1:{port}/filter", content=FILTER, timeout=10).status_code)
                else:
                    codes.append(httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=10).status_code)
            except httpx.HTTPError as e:
                codes.append(repr(e))  # type: ignore[arg-type]
        assert codes == [200] * 100, codes
    finally:
        for s in idle:
            s.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text()
    # the front's 1,024 files - 128 kept free
    assert "lowered to 896 to fit the open-file limit" in text
    assert "connection cap 896 reached" in text


class _RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


def test_writes_of_one_loop_turn_leave_in_one_send_and_close_flushes_first() -> None:
    import asyncio

    from extender.http.direct import OneSendPerTurn

    async def scenario() -> tuple[list[bytes], list[bytes], list[bytes], bool]:
        raw = _RecordingTransport()
        t = OneSendPerTurn(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b'{"NodeNames": []}')
        before_turn = list(raw.writes)
        await asyncio.sleep(0)  # the turn ends: one send with both
        after_turn = list(raw.writes)
        big = b"x" * (OneSendPerTurn.FLUSH_BYTES + 1)
        t.write(big)  # over the bound: sent at once (flow control still sees it)
        t.write(b"tail")
        t.close()  # the buffered tail goes before the close
        assert t.get_extra_info("peername") == "extra:peername"
        return before_turn, after_turn, raw.writes[1:], raw.closed

    before_turn, after_turn, rest, closed = asyncio.run(scenario())
    assert before_turn == []
    assert after_turn == [b'HTTP/1.1 200 OK\r\n\r\n{"NodeNames": []}']
    assert [len(w) for w in rest] == [OneSendPerTurn.FLUSH_BYTES + 1, 4] and closed


def test_large_and_closing_responses_arrive_whole_through_the_one_send_transport() -> None:
    with serving(FAST) as port:
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert metrics.status_code == 200 and "flowsched_extender_requests_total" in metrics.text
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                      + str(len(FILTER)).encode() + b"\r\n\r\n" + FILTER)
            s.settimeout(5)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and orjson.loads(body)["NodeNames"] == ["n0", "n1"]


# ---- the verbs' direct path (extender.http.direct.DirectApp): answered from the protocol,
# without an ASGI cycle; everything a client can see must be what the ASGI route answers ----

def _asgi(app: ExtenderApp, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    import asyncio

    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "client": ("127.0.0.1", 1),
             "headers": [(b"content-length", str(len(body)).encode())]}
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    return int(sent[0]["status"]), bytes(sent[-1]["body"])  # type: ignore[call-overload]


def _read_response(s: socket.socket, buf: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """One response off a socket: head, body, and whatever followed it."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk
        rest += chunk
    return head, rest[:length], rest[length:]


def _request(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_direct_verbs_answer_byte_for_byte_what_the_asgi_route_answers() -> None:
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())
    preempt = orjson.dumps({"Pod": pod("p"), "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "u1"}],
                                                                            "NumPDBViolations": 0}}})
    cases = [("/filter", FILTER), ("/filter-ranked", FILTER), ("/prioritize", FILTER), ("/preempt", preempt),
             ("/filter-ranked", b"{not json"), ("/filter", b'{"Pod": 3}'), ("/prioritize", b"[]")]
    direct_answer, answered = app.direct_answer, []

    def counted(path: str, body: bytes) -> tuple[int, bytes, object]:
        answered.append(path)
        return direct_answer(path, body)

    app.direct_answer = counted  # type: ignore[method-assign,assignment]
    statuses = []
    with serving(FAST, app) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(5)
        for path, body in cases:
            want_status, want_body = _asgi(app, "POST", path, body)
            s.sendall(_request(path, body))
            head, got, rest = _read_response(s)
            assert not rest and head.startswith(b"HTTP/1.1 %d " % want_status), (path, body, head)
            assert b"content-type: application/json" in head and got == want_body, (path, body)
            statuses.append(want_status)
        assert app.in_flight == 0
    assert answered == [p for p, _ in cases]  # every one of them went the direct way
    assert statuses == [200, 200, 200, 200, 400, 400, 400]


def test_pipelined_verbs_are_answered_in_order_on_one_connection() -> None:
    ranked = orjson.dumps({"Pod": pod("q", gpus=8), "NodeNames": ["n0", "n1"]})  # fits nowhere: 0 passed
    with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(5)
        s.sendall(_request("/filter", FILTER) + _request("/metrics", b"") .replace(b"POST", b"GET", 1)
                  + _request("/filter-ranked", ranked) + _request("/prioritize", b"{"))
        rest = b""
        heads, bodies = [], []
        for _ in range(4):
            head, body, rest = _read_response(s, rest)
            heads.append(head.split(b"\r\n")[0])
            bodies.append(body)
        assert heads == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK", b"HTTP/1.1 400 Bad Request"]
        assert orjson.loads(bodies[0])["NodeNames"] == ["n0", "n1"]
        assert b"flowsched_extender_requests_total" in bodies[1]
        assert orjson.loads(bodies[2])["NodeNames"] == []
        assert b"malformed JSON" in bodies[3]


def test_direct_verbs_keep_the_guards_in_flight_cap_method_close_and_disconnect() -> None:
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())
    with serving(FAST, app) as port:
        app.in_flight = app.max_in_flight  # as if that many requests were under way
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            s.sendall(_request("/filter-ranked", FILTER))
            head, body, _ = _read_response(s)
            assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head and b"connection: close" in head
            assert closed_within(s, 5.0)
        app.in_flight = 0
        assert httpx.get(f"http://127.0.0.1:{port}/filter-ranked", timeout=10).status_code == 405
        with socket.create_connection(("127.0.0.1", port)) as s:  # HTTP/1.0: answered, then closed
            s.settimeout(5)
            s.sendall(_request("/filter", FILTER).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
            head, body, _ = _read_response(s)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head
            assert orjson.loads(body)["NodeNames"] == ["n0", "n1"] and closed_within(s, 5.0)
        with socket.create_connection(("127.0.0.1", port)) as s:  # a client gone mid-body
            s.sendall(_request("/filter", FILTER)[:-5])
            deadline = time.monotonic() + 5
            while app.in_flight != 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while app.in_flight:
            assert time.monotonic() < deadline, "the request of a closed connection stayed in flight"
            time.sleep(0.01)
        assert post(port, "/filter-ranked").status_code == 200
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'flowsched_extender_requests_total{code="503",verb="any"} 1.0' in text


def test_a_direct_verb_that_raises_gets_a_500_and_the_server_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    app = build_app(Settings(kube=False), small_cluster(), build_metrics())

    def broken(path: str, body: bytes) -> tuple[int, bytes, object]:
        app.in_flight -= 1
        raise RuntimeError("boom")

    direct_answer = app.direct_answer
    app.direct_answer = broken  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.ERROR, logger="flowsched.http"), serving(FAST, app) as port:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            s.sendall(_request("/filter", FILTER))
            head, body, _ = _read_response(s)
            assert head.startswith(b"HTTP/1.1 500") and body == b"Internal Server Error"
            assert b"connection: close" in head and closed_within(s, 5.0)
        app.direct_answer = direct_answer  # type: ignore[method-assign]
        assert post(port).status_code == 200 and app.in_flight == 0
    assert "answering /filter failed" in caplog.text


def test_deadlines_hold_on_a_kept_alive_connection_whose_requests_arm_no_timer() -> None:
    """The deadline timer is moved only when a deadline comes sooner than it fires: after quick
    requests on one connection, a dripped body is still cut at the body timeout, and an idle
    connection is still closed."""
    limits = ServerLimits(header_timeout_s=0.3, body_timeout_s=0.5, keep_alive_s=1, max_connections=2048,
                          graceful_shutdown_s=2)
    request = (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
               + str(len(FILTER)).encode() + b"\r\n\r\n" + FILTER)
    with serving(limits) as port:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            for _ in range(5):
                s.sendall(request)
                assert s.recv(65536).startswith(b"HTTP/1.1 200")
            s.sendall(request[: len(request) - 10])  # the body's last bytes never come
            t0 = time.monotonic()
            assert closed_within(s, 3.0)
            assert 0.4 <= time.monotonic() - t0 < 1.3  # the body timeout, not the 1.3 s idle one
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            s.sendall(request)
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert closed_within(s, 5.0)
            assert 0.9 <= time.monotonic() - t0 < 2.5  # uvicorn's keep-alive (ours, 1.3 s, is a backstop)
