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
        self.write_timeout_s = 5.0
        self.annotations: list[tuple[str, str, dict[str, Any]]] = []

    def annotate_pod(self, ns: str, name: str, ann: dict[str, Any]) -> bool:
        self.annotations.append((ns, name, ann))
        return True

    def check_evictable(self, ns: str, name: str, uid: str = "") -> str:
        """A dry-run eviction: every pod may go (a test that needs a refusal overrides it)."""
        return "evicted"


def make_context(state: Any, tracker: Any, actions: Any, recorder: Any, *, settings: Any = None,
                 namespace_labels: dict[str, dict[str, str]] | None = None, clock: Any = None) -> Any:
    """A ControlContext over a fake tracker and actions: the real WorldBuilder and core settings."""
    from prometheus_client import CollectorRegistry

    from extender.control.leader import AlwaysLeader
    from extender.control.runtime import ControlContext
    from extender.control.world_builder import WorldBuilder
    from extender.settings import Settings

    settings = settings or Settings(kube=False)
    labels = namespace_labels if namespace_labels is not None else {}
    world = WorldBuilder(tracker, lambda: labels)
    extra = {"clock": clock} if clock is not None else {}
    return ControlContext(settings=settings, core=settings.core(), world=world, state=state, tracker=tracker,
                          actions=actions, recorder=recorder, registry=CollectorRegistry(), leader=AlwaysLeader(),
                          identity="test", **extra)


def plan_at(controller: Any, now: float, budget_left: int = 100) -> Any:
    """What the ControlLoop does in one tick, minus acting: observe, then plan."""
    return controller.plan(controller.observe(now), budget_left)


class MemoryBudgetStore:
    """extender.control.budget_store.BudgetStore in a dict (the real one is a Lease; tested against
    the real apiserver in tests/service/control/test_control_leader.py)."""

    def __init__(self) -> None:
        self.saved: dict[str, list[float]] = {}
        self.unreadable = False

    def load(self) -> dict[str, list[float]]:
        if self.unreadable:
            raise OSError("budget store unreadable")
        return {k: list(v) for k, v in self.saved.items()}

    def save(self, loop: str, times: Any) -> None:
        self.saved[loop] = list(times)
