"""Stand-ins for what a controller reads and writes, for the control-loop unit tests.

The tracker fake serves fixed convergence estimates; the actions fake records annotations
instead of patching pods (the real writes are exercised against kube-apiserver in tests/e2e).
"""

from __future__ import annotations

from typing import Any


class FakeTracker:
    def __init__(self, est: dict[str, Any]) -> None:
        self.est = est

    def snapshot(self) -> dict[str, Any]:
        return dict(self.est)


class FakeActions:
    def __init__(self) -> None:
        self.api_client = object()
        self.annotations: list[tuple[str, str, dict[str, Any]]] = []

    def annotate_pod(self, ns: str, name: str, ann: dict[str, Any]) -> bool:
        self.annotations.append((ns, name, ann))
        return True
