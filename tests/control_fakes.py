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


# The elastic step-time prior these tests plan with: near-linear (no fixed compute, a 0.1 sync
# share), so that a job known by no measurement grows 4 -> 8 GPUs at the 30 % hysteresis they were
# written for; the default prior, fitted to the Pollux profiles, promises less than the optimizer's
# min_gain there (and the default min_gain, 0.5, asks more than the doubling's restart leaves).
LINEAR_PRIOR: dict[str, float] = {"compute_fraction": 0.0, "sync_fraction": 0.1, "sync_per_gpu_fraction": 0.0,
                                  "min_gain": 0.30}


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
    """What a round does for one loop, minus carrying out: the controller's World, the kernel's
    plan (its Memory kept on the controller between calls, as the rounds runner keeps it), the
    controller's record of the plan, and the actions bound to their pods."""
    from scoring.kernel import Memory, plan_loop

    world = controller.world(now)
    if world is None:
        return []
    memory = controller.__dict__.get("_test_memory", Memory())
    ctx = controller.ctx
    plan = plan_loop(controller.name, memory.applied(world), ctx.core, memory, budget_left, ctx.settings.controllers)
    controller.__dict__["_test_memory"] = plan.memory
    controller.planned(plan)
    return [controller.bind(a) for a in plan.actions]


class OneLoop:
    """The service's rounds runner (extender.control.loop.ControlRounds) over one loop, run at every
    call of run_once() whatever its interval (the runner's schedule is tested on its own)."""

    def __init__(self, loop: Any, core: Any = None, *, budget_store: Any = None, fresh_memory: bool = False) -> None:
        import itertools

        from extender.control.loop import ControlRounds

        ticks = itertools.count(step=1_000_000_000)
        self.loop, self.fresh_memory = loop, fresh_memory  # fresh_memory: each round forgets the last's notes
        core = core if core is not None else loop.controller.ctx.core
        self.rounds = ControlRounds([loop], core, loop.leader, loop.metrics, dry_run=loop.dry_run, clock=loop.clock,
                                    mono=lambda: float(next(ticks)), budget_store=budget_store)

    def run_once(self) -> Any:
        """This round's tick of the loop (an empty one when it planned nothing or did not lead)."""
        from extender.control.loop import Tick
        from scoring.kernel import Memory

        if self.fresh_memory:
            self.rounds.memory = Memory()
        before = list(self.loop.history)
        self.rounds.run_round()
        if len(self.loop.history) != len(before) or (before and self.loop.history[-1] is not before[-1]):
            return self.loop.history[-1]
        return Tick(at=self.loop.clock(), leader=bool(self.loop.leader.is_leader), dry_run=self.loop.dry_run)


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
