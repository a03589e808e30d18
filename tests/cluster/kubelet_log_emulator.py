"""KubeletLogEmulator: the kubelet's container-log endpoint, and nothing else, for fake nodes.

It is an emulator, not a kubelet: no container runs and nothing writes the lines but the test.
The real kube-apiserver serves `GET /api/v1/namespaces/{ns}/pods/{pod}/log` by proxying to
the kubelet of the pod's node at `https://{node InternalIP}:{status.daemonEndpoints.kubeletEndpoint.Port}
/containerLogs/{ns}/{pod}/{container}?follow=..&timestamps=..&sinceTime=..`; this server answers
that request from lines the test writes, so a client of the apiserver's log endpoint (flowsched's
log follower) goes through the real apiserver's authorisation, proxy and streaming. Without a
kubelet CA configured the apiserver does not verify the kubelet's serving certificate, so a
self-signed one is enough.

Per container it keeps instances (a restart starts a new one, as restartCount does); `follow`
streams new lines until the instance ends (`end`, as when the container exits) or the client
goes. Lines carry the time they were written (RFC 3339 with nanoseconds, as the kubelet's).
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.cluster.controlplane import OPENSSL, free_port

Key = tuple[str, str, str]  # namespace, pod, container


def kubelet_ts(t: float) -> str:
    dt = datetime.fromtimestamp(t, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{round((t % 1) * 1e9) % 1_000_000_000:09d}Z"


def _parse_since(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class _Instance:
    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.ended = False


class KubeletLogEmulator:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self._cond = threading.Condition()
        self._logs: dict[Key, list[_Instance]] = {}
        self.requests: list[dict[str, Any]] = []  # every request as received (path and query), for asserts
        self._server: ThreadingHTTPServer | None = None

    # ---- what the test does ----
    def write(self, namespace: str, pod: str, container: str, *lines: str, at: float | None = None) -> None:
        with self._cond:
            inst = self._current((namespace, pod, container))
            for line in lines:
                inst.lines.append((at if at is not None else time.time(), line))
            self._cond.notify_all()

    def end(self, namespace: str, pod: str, container: str) -> None:
        """The container exits: its follow streams end."""
        with self._cond:
            self._current((namespace, pod, container)).ended = True
            self._cond.notify_all()

    def restart(self, namespace: str, pod: str, container: str) -> None:
        """A new container instance (the test also raises restartCount in the pod's status)."""
        with self._cond:
            key = (namespace, pod, container)
            self._current(key).ended = True
            self._logs[key].append(_Instance())
            self._cond.notify_all()

    def _current(self, key: Key) -> _Instance:
        return self._logs.setdefault(key, [_Instance()])[-1]

    def node_status(self) -> dict[str, Any]:
        """What a fake Node's status needs for the apiserver to reach this server."""
        return {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}}}

    # ---- serving ----
    def start(self) -> KubeletLogEmulator:
        self.workdir.mkdir(parents=True, exist_ok=True)
        key, crt = self.workdir / "kubelet.key", self.workdir / "kubelet.crt"
        subprocess.run([OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(crt), "-days", "2", "-subj", "/CN=kubelet-log-emulator",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
        emu = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                emu._serve(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, name="kubelet-log-emulator", daemon=True).start()
        return self

    def stop(self) -> None:
        with self._cond:
            for insts in self._logs.values():
                for inst in insts:
                    inst.ended = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append({"path": url.path, "query": q})
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            h.send_error(404, "not an emulated endpoint")
            return
        key: Key = (parts[1], parts[2], parts[3])
        follow = q.get("follow") == "true"
        stamps = q.get("timestamps") == "true"
        since = _parse_since(q["sinceTime"]) if q.get("sinceTime") else None
        with self._cond:
            insts = self._logs.get(key)
            inst = insts[-1] if insts else None
        if inst is None:
            h.send_error(404, f"no container {key}")
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Connection", "close")
        h.end_headers()
        sent = 0
        with contextlib.suppress(OSError):
            while True:
                with self._cond:
                    batch = inst.lines[sent:]
                    sent = len(inst.lines)
                    done = inst.ended or not follow
                    if not batch and not done:
                        self._cond.wait(0.5)
                        continue
                for ts, text in batch:
                    if since is not None and ts < since:
                        continue
                    h.wfile.write(((kubelet_ts(ts) + " " if stamps else "") + text + "\n").encode())
                h.wfile.flush()
                if done and sent == len(inst.lines):
                    return
