"""The one thin I/O shell both sources use: a bounded GET with timeouts and optional auth."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

from extender.prometheus.config import TelemetryConfig


class TelemetryError(Exception):
    """A whole read failed; `reason` is a short metric label (connect, timeout, http, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def make_client(cfg: TelemetryConfig) -> httpx.Client:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cfg.ca_file) if cfg.ca_file else True
    # One timeout for connect and read: a hung endpoint costs at most query_timeout_s per call.
    return httpx.Client(timeout=httpx.Timeout(cfg.query_timeout_s), verify=verify, follow_redirects=False)


def auth_headers(cfg: TelemetryConfig) -> dict[str, str]:
    if not cfg.bearer_token_file:
        return {}
    try:
        token = Path(cfg.bearer_token_file).read_text().strip()
    except OSError as e:
        raise TelemetryError("auth", f"cannot read bearer token file {cfg.bearer_token_file}: {e.strerror}") from e
    return {"Authorization": f"Bearer {token}"} if token else {}


def bounded_get(client: httpx.Client, url: str, *, params: dict[str, str] | None, headers: dict[str, str],
                limit: int) -> tuple[int, bytes]:
    """(status, body); raises TelemetryError for transport failures and bodies over `limit` bytes."""
    try:
        with client.stream("GET", url, params=params, headers=headers) as resp:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise TelemetryError("too_large", f"{url}: response of {declared} bytes is over {limit}")
            chunks: list[bytes] = []
            size = 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise TelemetryError("too_large", f"{url}: response over {limit} bytes")
                chunks.append(chunk)
            return resp.status_code, b"".join(chunks)
    except httpx.TimeoutException as e:
        raise TelemetryError("timeout", f"{url}: timed out ({type(e).__name__})") from e
    except httpx.TransportError as e:
        raise TelemetryError("connect", f"{url}: {type(e).__name__}: {e}") from e
