"""The bounds every listener applies to its connections (docs/hardening.md, issue 18 and 33)."""

from __future__ import annotations

import resource
from dataclasses import dataclass

FD_RESERVE = 128  # files kept free for SQLite, the apiserver watches, Prometheus, logs


@dataclass(frozen=True)
class ServerLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 30  # > kube-scheduler's idle reuse of a connection is not needed; Go re-dials
    max_connections: int = 2048
    graceful_shutdown_s: int = 10
    # The request line and headers (issue 33, finding 2: httptools keeps every header line and grows
    # a value by copying, so 233 MiB of them took 2 GiB): past these, 414 or 431 and a close.
    max_url_bytes: int = 8 * 1024
    max_header_count: int = 100
    max_head_bytes: int = 64 * 1024  # request line + headers (+ at most one read, see data_received)
    # A reply the client does not read (finding 3): reading stops while the send buffer is over
    # the transport's high-water mark, and the connection is closed if it stays so this long.
    write_timeout_s: float = 30.0


def effective_max_connections(wanted: int, reserved: int = 0) -> int:
    """wanted, lowered so that connections cannot exhaust the process's open-file limit;
    `reserved` files are another listener's (its own cap)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - FD_RESERVE - reserved))
