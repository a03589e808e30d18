"""Who may start a request on a port: the per-peer budgets of the API port (issue 33).

Shared by the in-process app (extender.http.app) and the API port's front process
(extender.http.api_front), which applies them before anything reaches the verbs' process.
No FastAPI here: the front imports this at start-up, and a restarted front must listen fast.
"""

from __future__ import annotations

PROBES = frozenset({"/healthz", "/readyz"})  # never refused for load: a refused probe restarts the pod
UNRATED = frozenset({*PROBES, "/webhook/gate"})  # probes; the apiserver's pod creations

BUSY = b'{"error":"too many requests in flight; retry"}'
CLIENT_BUSY = b'{"error":"too many requests in flight from this client; retry"}'
CLIENT_RATE = b'{"error":"too many requests from this client; retry"}'
ELSEWHERE = {
    "verbs": b'{"error":"this port serves kube-scheduler\'s verbs only; the API is on api_port"}',
    "api": b'{"error":"the extender verbs are served on port, for kube-scheduler alone"}',
}


class PeerRate:
    """A token bucket per peer address: `rate_per_s` requests a second, bursts of twice that.
    A closed loop of cheap tenant requests otherwise takes as much CPU as it can, which the verbs
    then wait for (issue 33, figures in docs/hardening.md)."""

    def __init__(self, rate_per_s: float, peers: int = 4096) -> None:
        self.rate, self.burst, self.peers = rate_per_s, 2.0 * rate_per_s, peers
        self._buckets: dict[str, tuple[float, float]] = {}  # peer -> (tokens, refilled)

    def take(self, peer: str, now: float) -> bool:
        tokens, refilled = self._buckets.get(peer, (self.burst, now))
        tokens = min(self.burst, tokens + (now - refilled) * self.rate)
        if len(self._buckets) >= self.peers and peer not in self._buckets:
            self._buckets.clear()
        took = tokens >= 1.0
        self._buckets[peer] = (tokens - 1.0 if took else tokens, now)
        return took


class ClientSlots:
    """The most requests one peer address may have in flight: a few slow clients cannot take
    every slot of the port (finding 4)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._held: dict[str, int] = {}

    def take(self, peer: str) -> bool:
        held = self._held.get(peer, 0)
        if held >= self.most:
            return False
        self._held[peer] = held + 1
        return True

    def give_back(self, peer: str) -> None:
        left = self._held[peer] - 1
        if left:
            self._held[peer] = left
        else:
            del self._held[peer]
