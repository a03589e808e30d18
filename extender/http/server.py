"""uvicorn, configured so that a slow, idle or hostile client cannot pin the process: the
guarded protocol (extender.http.guarded_protocol) with the limits of extender.http.server_limits,
no WebSocket protocol, bounded shutdown, and a second SIGTERM that exits at once."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any, Literal

import uvicorn

from extender.http.direct import DirectApp
from extender.http.guarded_protocol import guarded_protocol
from extender.http.server_limits import ServerLimits, effective_max_connections

log = logging.getLogger("flowsched.http")


class FlowschedServer(uvicorn.Server):
    """uvicorn's server where a second SIGTERM (or SIGINT) forces the exit."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in (signal.SIGTERM, signal.SIGINT):
            log.warning("second %s: exiting without waiting for open requests", signal.Signals(sig).name)
            self.force_exit = True
        super().handle_exit(sig, frame)


def server_config(app: Any, *, host: str, port: int, limits: ServerLimits, log_level: str,
                  ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                  loop: str = "auto", lifespan: Literal["on", "off"] = "on", reserved_fds: int = 0,
                  uds: str | None = None) -> uvicorn.Config:
    cap = effective_max_connections(limits.max_connections, reserved_fds)
    if cap < limits.max_connections:
        log.info("max_connections %d lowered to %d to fit the open-file limit", limits.max_connections, cap)
    direct = app if isinstance(app, DirectApp) else None
    return uvicorn.Config(
        app, host=host, port=port, uds=uds, loop=loop, http=guarded_protocol(limits, cap, direct),
        access_log=False, log_level=log_level, lifespan=lifespan,
        ws="none",  # no WebSocket protocol at all: an upgrade is refused (GuardedProtocol)
        timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=limits.graceful_shutdown_s,
        proxy_headers=False,  # the peer address gates /debug/*; no header may claim another
        ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
    )
