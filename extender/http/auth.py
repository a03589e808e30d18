"""Who may report progress: bearer tokens checked by a Kubernetes TokenReview, or static.

A pod reports with its own service-account token, so the TokenReview's username
system:serviceaccount:<namespace>:<name> names the only namespace it may write. A static
shared token (opt-in, for clusters without TokenReview) maps to a set of namespaces.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube import requests
from extender.kube.client import send
from extender.kube.responses import token_review_status

ALL_NAMESPACES = "*"
_SA_PREFIX = "system:serviceaccount:"


class AuthError(Exception):
    """status 401 (who are you?), 403 (not allowed) or 503 (cannot check now)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Identity:
    username: str
    namespaces: frozenset[str]  # {"*"} = all

    def may_write(self, namespace: str) -> bool:
        return ALL_NAMESPACES in self.namespaces or namespace in self.namespaces


class Authenticator(Protocol):
    async def authenticate(self, token: str, peer: str = "") -> Identity:
        """The token's identity; raises AuthError(401) for a bad token, (503) if unverifiable."""
        ...


@dataclass(frozen=True)
class ReviewResult:
    authenticated: bool
    username: str
    error: str = ""


# A blocking call: token -> what the apiserver said. Real one: kubernetes_token_reviewer().
TokenReviewer = Callable[[str], ReviewResult]


def service_account_namespace(username: str) -> str | None:
    """'system:serviceaccount:<ns>:<name>' -> ns; None for any other kind of user."""
    if not username.startswith(_SA_PREFIX):
        return None
    ns, sep, name = username[len(_SA_PREFIX):].partition(":")
    return ns if ns and sep and name and ":" not in name else None


def _token_key(token: str) -> str:
    # Cache keys are digests so the cache does not hold live credentials.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class ReviewLimits:
    """Bounds on what unauthenticated callers can make flowsched ask the apiserver."""

    timeout_s: float = 5.0  # a review slower than this is a 503 (the client retries later)
    threads: int = 4  # reviews run here, never on the pool that SQLite's writes use
    negative_ttl_s: float = 10.0  # a rejected token is answered from memory this long
    rate_per_s: float = 20.0  # new reviews per second, bursts of 2x; beyond: 503 at once
    max_pending: int = 16  # reviews queued or running; beyond: 503 at once
    # Of those, one peer address may start this many per second (bursts of 2x): random tokens from
    # one client no longer use up the global budget that new pods' first reports need (issue 33,
    # finding 6). A pod's token is reviewed once a minute at most (the cache), so 2/s is plenty.
    per_client_rate_per_s: float = 2.0
    max_clients: int = 4096  # peers whose budgets are remembered (least recently seen forgotten)


class TokenReviewAuthenticator:
    """Verifies tokens with a TokenReview and caches the answers.

    Accepted tokens are cached for ttl_s, rejected ones for limits.negative_ttl_s; concurrent
    checks of one token share one review. Reviews run on a small pool of their own with a
    timeout, and new ones are rate-limited: any stranger can send a bearer token, and eight
    slow reviews once held the shared pool long enough to delay a cached caller's SQLite
    write by 9.5 s (issue 18)."""

    def __init__(
        self,
        review: TokenReviewer,
        limits: ReviewLimits | None = None,
        ttl_s: float = 60.0,
        max_cached: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._review = review
        self._limits = limits or ReviewLimits()
        self._ttl_s = ttl_s
        self._max_cached = max_cached
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Identity | AuthError]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[ReviewResult]] = {}
        self._pool = ThreadPoolExecutor(max_workers=self._limits.threads, thread_name_prefix="tokenreview")
        self._tokens = 2.0 * self._limits.rate_per_s
        self._refilled = clock()
        self._clients: OrderedDict[str, tuple[float, float]] = OrderedDict()  # peer -> (tokens, refilled)
        self.reviews = 0  # TokenReviews sent (for tests and metrics)

    def _remember(self, key: str, until: float, answer: Identity | AuthError) -> None:
        self._cache[key] = (until, answer)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)

    def _take_token(self, now: float) -> bool:
        burst = 2.0 * self._limits.rate_per_s
        self._tokens = min(burst, self._tokens + (now - self._refilled) * self._limits.rate_per_s)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _take_client_token(self, peer: str, now: float) -> bool:
        """One review from the budget of `peer` (a token bucket per peer address)."""
        rate = self._limits.per_client_rate_per_s
        burst = 2.0 * rate
        tokens, refilled = self._clients.pop(peer, (burst, now))
        tokens = min(burst, tokens + (now - refilled) * rate)
        took = tokens >= 1.0
        self._clients[peer] = (tokens - 1.0 if took else tokens, now)
        while len(self._clients) > self._limits.max_clients:
            self._clients.popitem(last=False)
        return took

    async def _reviewed(self, key: str, token: str, now: float, peer: str = "") -> ReviewResult:
        fut = self._pending.get(key)  # a review of this token already under way: share it
        if fut is None:
            if peer and not self._take_client_token(peer, now):
                raise AuthError(503, "too many token reviews from this client; retry later")
            if len(self._pending) >= self._limits.max_pending or not self._take_token(now):
                raise AuthError(503, "too many token reviews in progress; retry later")
            self.reviews += 1
            fut = asyncio.get_running_loop().run_in_executor(self._pool, self._review, token)
            self._pending[key] = fut
            fut.add_done_callback(lambda _f: self._pending.pop(key, None))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self._limits.timeout_s)
        except TimeoutError as e:
            raise AuthError(503, "cannot verify token now: TokenReview timed out") from e
        except Exception as e:  # the apiserver is down or refuses us: not the client's fault
            raise AuthError(503, f"cannot verify token now: {type(e).__name__}") from e

    async def authenticate(self, token: str, peer: str = "") -> Identity:
        """peer: the client's address, whose own review budget a new token spends ("" : none)."""
        if not token:
            raise AuthError(401, "missing bearer token")
        key = _token_key(token)
        hit = self._cache.get(key)
        now = self._clock()
        if hit is not None and hit[0] > now:
            if isinstance(hit[1], AuthError):
                raise AuthError(hit[1].status, hit[1].message)
            return hit[1]
        result = await self._reviewed(key, token, now, peer)
        try:
            identity = self._identity(result)
        except AuthError as e:
            if self._limits.negative_ttl_s > 0:
                self._remember(key, now + self._limits.negative_ttl_s, e)
            raise
        self._remember(key, now + self._ttl_s, identity)
        return identity

    @staticmethod
    def _identity(result: ReviewResult) -> Identity:
        if result.error and not result.authenticated:
            raise AuthError(401, f"token rejected: {result.error[:200]}")
        if not result.authenticated:
            raise AuthError(401, "token rejected")
        ns = service_account_namespace(result.username)
        if ns is None:
            raise AuthError(403, f"{result.username[:200]} is not a service account; report with the pod's token")
        return Identity(result.username, frozenset({ns}))


class StaticTokenAuthenticator:
    """Opt-in shared tokens: token -> namespaces it may write ("*" = all)."""

    def __init__(self, tokens: Mapping[str, frozenset[str]]) -> None:
        self._tokens = [(t.encode(), ns) for t, ns in tokens.items() if t]

    async def authenticate(self, token: str, peer: str = "") -> Identity:
        if not token:
            raise AuthError(401, "missing bearer token")
        offered = token.encode()
        found: frozenset[str] | None = None
        for known, namespaces in self._tokens:  # compare against all: no timing hint of which
            if hmac.compare_digest(known, offered):
                found = namespaces
        if found is None:
            raise AuthError(401, "token rejected")
        return Identity("static-token", found)


def kubernetes_token_reviewer(api_client: Any, audiences: list[str] | None = None,
                              timeout_s: float = 5.0) -> TokenReviewer:
    """A TokenReviewer creating authentication.k8s.io/v1 TokenReviews through the given ApiClient
    (a refusal raises ApiError: the authenticator answers 503)."""

    def review(token: str) -> ReviewResult:
        req = requests.token_review(token, audiences)
        status = token_review_status(req, send(api_client, req, timeout_s=timeout_s))
        return ReviewResult(authenticated=status.authenticated, username=status.username, error=status.error)

    return review


def bearer_token(authorization: str | None) -> str:
    """The token of an 'Authorization: Bearer <token>' header, '' when absent or another scheme."""
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
