"""What an apiserver answer means, with no I/O: a Response (status, body, headers) read against
the Request that produced it, into a result or a typed error (extender.kube.errors).

The classification (map_api_error) is the control loops' contract: 408, 409, 429, 5xx other than
501, and any failure that never reached an answer (refused, timed out) are TemporaryError,
after at least retry_s or the server's Retry-After if longer; every other status is a
PermanentError. A 404 means "gone" wherever the caller says the object may have gone away.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.kube.errors import ApiError, PermanentError, TemporaryError
from extender.kube.requests import Request


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def api_error(request: Request, response: Response) -> ApiError:
    return ApiError(request.method, request.target, response.status, response.text, dict(response.headers))


def checked(request: Request, response: Response) -> Response:
    """The response when it is a success; else raises its ApiError."""
    if not response.ok:
        raise api_error(request, response)
    return response


def json_body(request: Request, response: Response) -> dict[str, Any]:
    """The decoded JSON of a success ({} when empty); else raises its ApiError."""
    text = checked(request, response).text
    out: dict[str, Any] = json.loads(text) if text else {}
    return out


def json_or_none(request: Request, response: Response) -> dict[str, Any] | None:
    """A read of an object that may not exist: None on 404, else as json_body."""
    return None if response.status == 404 else json_body(request, response)


# ---- classification into TemporaryError / PermanentError ----
def _status(e: Exception) -> int | None:
    s = getattr(e, "status", None)
    return int(s) if isinstance(s, int) else None


def _retry_after(e: Exception, default: float) -> float:
    headers = getattr(e, "headers", None) or {}
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
        return float(value) if value is not None else default
    except (TypeError, ValueError, AttributeError):
        return default


def _message(e: Exception) -> str:
    body = getattr(e, "body", None)
    if body:
        try:
            return str(json.loads(body).get("message", body))[:300]
        except (ValueError, AttributeError):
            return str(body)[:300]
    return str(e)[:300]


def map_api_error(e: Exception, what: str, retry_s: float = 30.0) -> Exception:
    """A failed call -> TemporaryError (retry later) or PermanentError. Read by duck typing
    (status, headers, body) so that the generated client's ApiException maps as an ApiError does;
    anything without a status (connection refused, timeouts) is temporary."""
    status = _status(e)
    msg = f"{what}: {status or type(e).__name__} {_message(e)}"
    if status is None or status in (408, 409, 429) or (status >= 500 and status != 501):
        # 500 from the eviction endpoint can also mean several PDBs cover the pod: an operator
        # must fix that, but retrying slowly costs nothing and is what kubectl drain does.
        return TemporaryError(msg, max(_retry_after(e, retry_s), retry_s))
    return PermanentError(msg)


def classified(request: Request, response: Response, what: str, retry_s: float = 30.0) -> Response:
    """The response when it is a success; else raises its TemporaryError / PermanentError."""
    if not response.ok:
        e = api_error(request, response)
        raise map_api_error(e, what, retry_s) from e
    return response


def eviction_accepted(request: Request, response: Response, *, uid: str, what: str, retry_s: float = 30.0) -> bool:
    """True: evicted (or, for a dry run, it would be). False: the pod is gone, or the name now
    belongs to another pod (409 failing the uid precondition). A refusal raises (429 from a
    PodDisruptionBudget: TemporaryError, never forced)."""
    if response.status == 404:
        return False
    if response.status == 409 and uid and "precondition" in _message(api_error(request, response)).lower():
        return False
    classified(request, response, what, retry_s)
    return True


def patch_applied(request: Request, response: Response, *, what: str, retry_s: float = 30.0) -> bool:
    """True: patched. False: the object is gone (404). Other failures raise, classified."""
    if response.status == 404:
        return False
    classified(request, response, what, retry_s)
    return True


# ---- authentication.k8s.io/v1 TokenReview ----
@dataclass(frozen=True)
class TokenReviewStatus:
    authenticated: bool
    username: str
    error: str = ""


def token_review_status(request: Request, response: Response) -> TokenReviewStatus:
    """What the apiserver said of the token; a refused review (403: flowsched may not create
    TokenReviews) raises its ApiError."""
    status = json_body(request, response).get("status")
    if not isinstance(status, dict):
        return TokenReviewStatus(False, "", "no status")
    user = status.get("user") or {}
    return TokenReviewStatus(bool(status.get("authenticated")), str(user.get("username") or ""),
                             str(status.get("error") or ""))
