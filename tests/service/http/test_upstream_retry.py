"""The API front's retry on a reused upstream connection (extender.http.upstream): a POST the
verbs' process read and then dropped the connection on must not be sent again (a progress batch
would be stored twice); a GET may be. A real Unix-socket server that reads each request whole."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extender.http.upstream import Upstream, UpstreamError

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class DropsTheSecond:
    """Answers the first request on each connection; reads the second whole, then closes
    without a word (as a process would that applied it and died, or closed mid-answer)."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for n in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                self.received.append(head.split(b" ", 1)[0] + b" " + body)
                if n == 0:
                    writer.write(OK)
                    await writer.drain()
        except asyncio.IncompleteReadError:
            pass  # the client went
        writer.close()


async def _run(tmp_path: Path, method: str) -> tuple[list[bytes], list[object]]:
    server = DropsTheSecond()
    path = str(tmp_path / "up.sock")
    srv = await asyncio.start_unix_server(server.handle, path)
    up = Upstream(path, timeout_s=5)
    outcomes: list[object] = []
    try:
        for body in (b"first", b"second"):
            try:
                outcomes.append((await up.request(method, b"/v1/progress", [], body, "10.0.0.1"))[0])
            except UpstreamError as e:
                outcomes.append(e)
    finally:
        up.close()
        srv.close()
        await srv.wait_closed()
    return server.received, outcomes


def test_a_post_on_a_reused_connection_is_never_sent_twice(tmp_path: Path) -> None:
    received, outcomes = asyncio.run(_run(tmp_path, "POST"))
    assert received.count(b"POST second") == 1, received  # retried before: applied twice
    assert outcomes[0] == 200 and isinstance(outcomes[1], UpstreamError)


def test_a_get_on_a_reused_connection_is_retried_once(tmp_path: Path) -> None:
    received, outcomes = asyncio.run(_run(tmp_path, "GET"))
    assert received.count(b"GET second") == 2 and outcomes == [200, 200]


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_connection_the_other_side_closed_while_idle_is_not_reused(tmp_path: Path, method: str) -> None:
    """Closed after its answer (a keep-alive that ran out): the next request takes a fresh one,
    POST included, and nothing is sent on the dead one."""

    async def run() -> tuple[list[int], int]:
        conns = 0

        async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal conns
            conns += 1
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            writer.write(OK)
            await writer.drain()
            writer.close()

        path = str(tmp_path / "once.sock")
        srv = await asyncio.start_unix_server(answer_once, path)
        up = Upstream(path, timeout_s=5)
        try:
            codes = [(await up.request(method, b"/x", [], b"b", "p"))[0]]
            await asyncio.sleep(0.1)  # the close reaches this side's reader
            codes.append((await up.request(method, b"/x", [], b"b", "p"))[0])
        finally:
            up.close()
            srv.close()
            await srv.wait_closed()
        return codes, conns

    codes, conns = asyncio.run(run())
    assert codes == [200, 200] and conns == 2


def test_kept_alive_connections_are_reused(tmp_path: Path) -> None:
    """httptools says keep-alive only while the head is parsed: asked after the answer, every
    forwarded request opened a connection of its own."""

    async def run() -> int:
        conns = 0

        async def answer_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal conns
            conns += 1
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(1)
                    writer.write(OK)
                    await writer.drain()
            except asyncio.IncompleteReadError:
                writer.close()

        path = str(tmp_path / "all.sock")
        srv = await asyncio.start_unix_server(answer_all, path)
        up = Upstream(path, timeout_s=5)
        try:
            for _ in range(5):
                assert (await up.request("POST", b"/x", [], b"b", "p"))[0] == 200
        finally:
            up.close()
            srv.close()
            await srv.wait_closed()
        return conns

    assert asyncio.run(run()) == 1
