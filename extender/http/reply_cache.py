"""The API front's short-lived copies of job reads (issue 33, finding 13).

The verbs' process already answers GET /v1/jobs/{namespace}/{job} from a reply up to
`job_reply_ttl_s` old, but every forwarded read still costs its API thread, on the GIL the verbs
wait for, an auth check and the send of a large reply: 16 readers of a 4,000-point job moved the
verbs' p99 2.7x on a quiet box. The front keeps each 200 reply for at most that long, keyed by
the method, the target and the Authorization header, so a repeat is answered here and a
different token (or none) is always forwarded and authorised by the verbs' process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

CACHED_PREFIX = b"/v1/jobs/"  # read-only job views; nothing else is kept

Headers = list[tuple[bytes, bytes]]
Key = tuple[bytes, bytes, bytes]


def cache_key(method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> Key | None:
    """The key of a request whose reply may be kept, None for any other request."""
    if method != "GET" or not target.startswith(CACHED_PREFIX):
        return None
    auth = b""
    for name, value in headers:
        if name.lower() == b"authorization":
            if auth:
                return None  # two of them: let the verbs' process judge it
            auth = value
    return b"GET", target, auth


def storable(status: int, headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Only a 200 the API did not mark uncacheable."""
    if status != 200:
        return False
    for name, value in headers:
        if name.lower() == b"cache-control" and (b"no-store" in value.lower() or b"no-cache" in value.lower()):
            return False
    return True


class ReplyCache:
    """An LRU of replies, each kept ttl_s at most, all bodies together under max_bytes."""

    def __init__(self, ttl_s: float, max_bytes: int, max_entries: int = 4096) -> None:
        self.ttl_s, self.max_bytes, self.max_entries = ttl_s, max_bytes, max_entries
        self._items: OrderedDict[Key, tuple[float, Headers, bytes]] = OrderedDict()
        self.bytes = 0

    def get(self, key: Key, now: float) -> tuple[Headers, bytes] | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= now:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return item[1], item[2]

    def put(self, key: Key, headers: Headers, body: bytes, now: float) -> None:
        if self.ttl_s <= 0 or len(body) > self.max_bytes // 4:
            return  # one reply may not take the whole cache
        if key in self._items:
            self._drop(key)
        self._items[key] = (now + self.ttl_s, headers, body)
        self.bytes += len(body)
        while self.bytes > self.max_bytes or len(self._items) > self.max_entries:
            self._drop(next(iter(self._items)))

    def _drop(self, key: Key) -> None:
        self.bytes -= len(self._items.pop(key)[2])

    def __len__(self) -> int:
        return len(self._items)
