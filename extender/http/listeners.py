"""Two listeners (DESIGN.md §12): kube-scheduler's verbs on `port`, on the main thread's event
loop; everything tenants call (progress API, job status, webhook, /metrics, UI, docs, debug) on
`api_port`.

Under `flowsched serve` the API port is a front process of its own (extender.http.api_front):
it takes every tenant connection, bounds it and applies the per-peer budgets, and forwards what
passes over a Unix socket to this process, where a thread with an event loop of its own (the
ApiListener here) answers it from the same ClusterState, progress store and report book as the
verbs. So a flood costs the front's CPU and GIL, not this process's; what reaches this one is
what a peer's budget allows (issue 33: with the API's connections in this process, a header
flood took the verbs' p99 6-40x).

The verbs' server runs the app's lifespan (the service's start and stop) and supervises the
front (restarted if it dies, the process exits after too many deaths). On SIGTERM the front
stops accepting and drains, then the API thread, then the verbs' server drains and stops the
service, so no tenant write lands in a closed store.
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

from extender.http.front_process import ApiFront
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
    """The verbs' server: it stops the API front and listener with itself, waits for them to
    drain before its own lifespan stops the service, restarts the front if it dies, and exits
    (status 1) if the API listener dies or the front keeps dying."""

    def __init__(self, config: uvicorn.Config, api: ApiListener, front: ApiFront | None = None) -> None:
        super().__init__(config)
        self.api, self.front = api, front
        self.failed = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.front is not None:
            self.front.terminate(force=self.force_exit)
        else:
            self.api.stop()
        if self.force_exit:  # a second SIGTERM: neither waits for open requests
            self.api.server.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit:
            if self.api.failed:
                log.error("the API listener stopped; exiting so that the pod is restarted whole")
                self.should_exit = self.failed = True
            elif self.front is not None and not self.front.check():
                log.error("the API front keeps dying; exiting so that the pod is restarted whole")
                self.should_exit = self.failed = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = float(self.api.server.config.timeout_graceful_shutdown or 0) + 1.0
        if self.front is not None:  # the front first: what it still forwards is answered
            self.front.terminate(force=self.force_exit)
            await asyncio.to_thread(self.front.wait, grace + 1.0)
            # Here, not after run(): uvicorn re-raises the SIGTERM it handled once serve() ends.
            self.front.close()
        self.api.stop()
        await asyncio.to_thread(self.api.join, grace)
        await super().shutdown(sockets)


def serve_listeners(verbs: uvicorn.Config, api: uvicorn.Config, switch_interval_s: float | None = None,
                    front: ApiFront | None = None) -> int:
    """Run both listeners (and the API's front, if given) until SIGTERM; the exit status (2 when
    the API listener or its front cannot start, 1 when one dies for good).

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
    if front is not None and not front.start():
        log.error("the API front on port %s did not start", front.sock.getsockname()[1])
        front.terminate(force=True)
        front.wait(5.0)
        front.close()
        listener.stop()
        return 2
    server = VerbsServer(verbs, listener, front)
    try:
        server.run()
    finally:
        if front is not None:
            front.terminate()
            front.wait(5.0)
            front.close()
        listener.stop()
        listener.join(5.0)
    return 1 if server.failed or (listener.failed and not server.should_exit) else 0
