"""Two listeners in one process (DESIGN.md §12): kube-scheduler's verbs on `port`, on the main
thread's event loop; everything tenants call (progress API, job status, webhook, /metrics, UI,
docs, debug) on `api_port`, on a thread with an event loop, a connection pool and an in-flight
cap of its own.

Why a thread and not a second process: the API reads the same ClusterState, progress store and
report book as the verbs; a process would need all of them shared. Why not a second server on
the verbs' loop: a tenant's request (a large job read, a slow body, 1,000 open connections) would
then hold the loop kube-scheduler waits on (issue 33, findings 1-5 and 13). The two loops still
share the GIL; the API's heavy pages already hand it back (extender/http/debug.py's duty cycle),
and the figures in docs/hardening.md measure what is left.

The verbs' server runs the app's lifespan (the service's start and stop); on SIGTERM both stop
accepting at once, the API drains within its graceful time, then the verbs' server drains and
stops the service, so no tenant write lands in a closed store.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
import time
from types import FrameType

import uvicorn

from extender.http.server import FlowschedServer

log = logging.getLogger("flowsched.http")

START_TIMEOUT_S = 30.0


class ApiListener:
    """The API's uvicorn server on a thread of its own (its own event loop)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self.server = FlowschedServer(config)
        self.thread = threading.Thread(target=self._run, name="flowsched-api", daemon=True)
        self.failed = False

    def _run(self) -> None:
        try:
            self.server.run()
        except BaseException:  # uvicorn exits (SystemExit) when it cannot bind
            self.failed = True
            raise
        finally:
            if not self.server.should_exit:  # ended on its own: the process must not go on half-served
                self.failed = True

    def start(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Started and listening; False if it could not (the reason is in the log)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self) -> None:
        self.server.should_exit = True  # read by its loop's next tick (0.1 s)

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)


class VerbsServer(FlowschedServer):
    """The verbs' server: it stops the API listener with itself, waits for it to drain before
    its own lifespan stops the service, and exits if the API listener dies."""

    def __init__(self, config: uvicorn.Config, api: ApiListener) -> None:
        super().__init__(config)
        self.api = api

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.api.stop()
        if self.force_exit:  # a second SIGTERM: neither waits for open requests
            self.api.server.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.api.failed and not self.should_exit:
            log.error("the API listener stopped; exiting so that the pod is restarted whole")
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.api.stop()
        grace = float(self.api.server.config.timeout_graceful_shutdown or 0) + 1.0
        await asyncio.to_thread(self.api.join, grace)
        await super().shutdown(sockets)


def serve_listeners(verbs: uvicorn.Config, api: uvicorn.Config, switch_interval_s: float | None = None) -> int:
    """Run both listeners until SIGTERM; the exit status (2 when the API listener cannot start).

    switch_interval_s: the interpreter's GIL switch interval while they run. A busy API thread
    keeps the GIL for the whole interval whenever the verbs' loop wakes for a call (5 ms by
    default: the verbs' p50 under a tenant flood was that interval, docs/hardening.md)."""
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
    listener = ApiListener(api)
    if not listener.start():
        log.error("the API listener on %s:%d did not start", api.host, api.port)
        listener.stop()
        return 2
    server = VerbsServer(verbs, listener)
    server.run()
    listener.stop()
    listener.join(5.0)
    return 1 if listener.failed and not server.should_exit else 0
