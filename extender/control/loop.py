"""ControlLoop: one controller's interval, only while this replica holds the Lease; ControlRounds runs them.

A controller is three methods (see `Controller`): `observe(now)` gathers what it decides from
(the shell's reads: snapshot, namespaces, pods), `plan(observed, budget_left)` returns the
actions (a call into the pure control core, scoring.control), `act(action, now)` performs one
and returns an outcome label or raises TemporaryError / PermanentError. The loop owns
everything around them:

- leadership: no plan, no action unless `leader.is_leader` (checked again before each action);
- dry run: actions are planned, budgeted, logged and kept for /debug, never performed;
- budgets (scoring.safety.Budget): at most per_interval actions a tick and per_hour in any
  sliding hour; the planner is told how many are left;
- back-off: a TemporaryError(delay) parks that action's key for delay seconds, a PermanentError
  for permanent_backoff_s; a key in back-off is reported as such, not retried;
- metrics: flowsched_control_actions_total{loop,action,outcome}, flowsched_control_ticks_total
  {loop,result}, flowsched_control_leader{loop}; an exception in observe() or plan() is logged
  and counted, the loop goes on (a TemporaryError from observe(), e.g. namespaces unreadable,
  just skips the interval).

The service runs its loops in one thread, a round at a time (`ControlRounds`): every loop whose
interval has come, in scoring.kernel.LOOP_ORDER (the elastic optimizer, admission, then the
migrator), then the others. A later loop builds its World after an earlier one acted and sees
that action (`on_acted` notes it for the World builder), as the simulator composes them; two
loops never plan on the same snapshot at the same moment.

Time comes from `clock` (wall seconds), so tests drive `run_once()` with a fake clock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.control.budget_store import BudgetStore
from extender.kube.errors import PermanentError, TemporaryError
from scoring.actions import ControlAction, render
from scoring.safety import Budget

log = logging.getLogger("flowsched.control")

DRY_RUN = "dry_run"
BUDGET = "budget_exhausted"
BACKOFF = "backoff"
RETRY = "retry_later"
FAILED = "failed"
NOT_LEADER = "lost_leadership"


@dataclass(frozen=True)
class PodRef:
    """A pod an action is carried out on, as the snapshot had it when the action was planned."""

    namespace: str
    name: str
    uid: str
    node: str | None = None
    gates: tuple[str, ...] = ()  # its scheduling gates other than flowsched's (kept when released)
    gpus: float = 0.0


@dataclass(frozen=True)
class Action:
    key: str  # back-off and dedup key, e.g. "namespace/job"
    kind: str  # "evict", "resize", ... (the metric's action label)
    target: str  # the object acted on, for humans: "namespace/pod"
    reason: str  # why, in numbers
    # False for a notice that changes no workload (an Event): it still waits for leadership and
    # is still skipped in dry run, but it spends no budget.
    budgeted: bool = True
    plan: ControlAction | None = None  # the kernel's typed action, carried out as it is
    pods: tuple[PodRef, ...] = ()  # the pods it acts on

    @classmethod
    def of(cls, plan: ControlAction, pods: tuple[PodRef, ...] = ()) -> Action:
        return cls(plan.key, plan.kind, plan.target, plan.reason, plan.budgeted, plan, pods)

    def as_dict(self) -> dict[str, Any]:
        detail = render(self.plan) if self.plan is not None else {}
        if self.pods:
            detail["pods"] = [asdict(p) for p in self.pods]
        return {"key": self.key, "kind": self.kind, "target": self.target, "reason": self.reason, "detail": detail}


class Controller(Protocol):
    name: str

    def observe(self, now: float) -> Any: ...

    def plan(self, observed: Any, budget_left: int) -> Sequence[Action]: ...

    def act(self, action: Action, now: float) -> str: ...


class Leadership(Protocol):
    @property
    def is_leader(self) -> bool: ...


@dataclass(frozen=True)
class ControlMetrics:
    actions: Counter
    ticks: Counter
    leader: Gauge
    budget_save_failures: Counter

    @classmethod
    def build(cls, registry: CollectorRegistry) -> ControlMetrics:
        return cls(
            actions=Counter("flowsched_control_actions", "Control-loop actions by outcome",
                            ["loop", "action", "outcome"], registry=registry),
            ticks=Counter("flowsched_control_ticks", "Control-loop intervals by result", ["loop", "result"],
                          registry=registry),
            leader=Gauge("flowsched_control_leader", "1 while this replica runs the loop as leader", ["loop"],
                         registry=registry),
            budget_save_failures=Counter("flowsched_control_budget_save_failures",
                                         "Real actions whose budget spend could not be saved", ["loop"],
                                         registry=registry),
        )


@dataclass
class Outcome:
    action: Action
    outcome: str
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {**self.action.as_dict(), "outcome": self.outcome, "error": self.error or None}


@dataclass
class Tick:
    at: float
    leader: bool
    dry_run: bool
    outcomes: list[Outcome] = field(default_factory=list)
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "leader": self.leader, "dry_run": self.dry_run, "error": self.error or None,
                "actions": [o.as_dict() for o in self.outcomes]}


class ControlLoop:
    def __init__(
        self,
        controller: Controller,
        leader: Leadership,
        metrics: ControlMetrics,
        *,
        interval_s: float,
        dry_run: bool = True,
        per_interval: int = 1,
        per_hour: int = 6,
        permanent_backoff_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        history: int = 50,
        on_acted: Callable[[Action, float], None] | None = None,  # performed, or would be (dry run)
        budget_store: BudgetStore | None = None,
    ) -> None:
        self.controller, self.leader, self.metrics = controller, leader, metrics
        self.name = controller.name
        self.interval_s, self.dry_run = interval_s, dry_run
        self.permanent_backoff_s = permanent_backoff_s
        self.clock = clock
        self.budget = Budget(per_interval, per_hour)
        # False when the budget is another loop's (idle reclamation spends the migrator's): only
        # its owner starts a new interval, so the two together stay within per_interval.
        self.owns_budget = True
        self.on_acted = on_acted  # told of every action performed, or planned in a dry run (the World's notes)
        # The hourly budget outlives this leader (budget_store.py): loaded before every plan (the
        # Lease may have changed hands between two ticks), saved after every real action.
        self.budget_store = budget_store
        self.backoff: dict[str, tuple[float, str]] = {}  # key -> (until, why)
        self.history: deque[Tick] = deque(maxlen=history)
        self.performed: deque[Outcome] = deque(maxlen=history)  # real actions only, newest last

    def _count(self, action: Action, outcome: str) -> None:
        self.metrics.actions.labels(self.name, action.kind, outcome).inc()

    def run_once(self) -> Tick:
        now = self.clock()
        leader = bool(self.leader.is_leader)
        self.metrics.leader.labels(self.name).set(1.0 if leader else 0.0)
        tick = Tick(at=now, leader=leader, dry_run=self.dry_run)
        if not leader:
            self.metrics.ticks.labels(self.name, "not_leader").inc()
            return tick
        if self.budget_store is not None:
            try:
                self.budget.restore(self.budget_store.load().get(self.name, ()), now)
            except Exception as e:  # acting on a budget it cannot read could exceed it: plan nothing
                log.warning("%s: interval skipped, the saved budget is unreadable: %s", self.name, e)
                tick.error = f"saved budget unreadable: {e}"[:300]
                self.metrics.ticks.labels(self.name, "error").inc()
                self.history.append(tick)
                return tick
        if self.owns_budget:
            self.budget.new_interval()
        self.backoff = {k: v for k, v in self.backoff.items() if v[0] > now}
        try:
            observed = self.controller.observe(now)
            planned = list(self.controller.plan(observed, self.budget.left(now)))
        except TemporaryError as e:
            log.info("%s: interval skipped: %s", self.name, e)
            tick.error = str(e)[:300]
            self.metrics.ticks.labels(self.name, "error").inc()
            self.history.append(tick)
            return tick
        except Exception as e:
            log.exception("%s: planning failed", self.name)
            tick.error = f"{type(e).__name__}: {e}"[:300]
            self.metrics.ticks.labels(self.name, "error").inc()
            self.history.append(tick)
            return tick
        for action in planned:
            tick.outcomes.append(self._one(action, now))
        acted = any(o.outcome not in (DRY_RUN, BUDGET, BACKOFF) for o in tick.outcomes)
        self.metrics.ticks.labels(self.name, "acted" if acted else ("planned" if planned else "idle")).inc()
        if planned:
            self.history.append(tick)
        return tick

    def _one(self, action: Action, now: float) -> Outcome:
        parked = self.backoff.get(action.key)
        if parked is not None:
            out = Outcome(action, BACKOFF, f"until {parked[0]:.0f}: {parked[1]}")
        elif action.budgeted and not self.budget.allows(now):
            out = Outcome(action, BUDGET, f"budget left {self.budget.remaining(now)}")
        elif self.dry_run:
            if action.budgeted:
                self.budget.spend(now)
            out = Outcome(action, DRY_RUN)
            log.info("%s (dry run) would %s %s: %s", self.name, action.kind, action.target, action.reason)
            # Noted as if done (in memory only), so the round's later loops plan on what acting
            # would have left: a dry run previews the composition, not each loop alone.
            self._note(action, now)
        elif not self.leader.is_leader:
            out = Outcome(action, NOT_LEADER)
        else:
            try:
                result = self.controller.act(action, now)
            except TemporaryError as e:
                self.backoff[action.key] = (now + e.delay_s, str(e))
                out = Outcome(action, RETRY, str(e))
                log.info("%s: %s %s deferred %.0fs: %s", self.name, action.kind, action.target, e.delay_s, e)
            except PermanentError as e:
                self.backoff[action.key] = (now + self.permanent_backoff_s, str(e))
                out = Outcome(action, FAILED, str(e))
                log.warning("%s: %s %s failed: %s", self.name, action.kind, action.target, e)
            except Exception as e:  # a controller bug: treat as permanent for this key, keep looping
                log.exception("%s: %s %s raised", self.name, action.kind, action.target)
                self.backoff[action.key] = (now + self.permanent_backoff_s, repr(e))
                out = Outcome(action, FAILED, f"{type(e).__name__}: {e}"[:300])
            else:
                if action.budgeted:
                    self.budget.spend(now)
                    self._save_budget(now)
                out = Outcome(action, result)
                self.performed.append(out)
                if result != "gone":  # nothing was there to change: nothing for the others to see
                    self._note(action, now)
        self._count(action, out.outcome)
        return out

    def _note(self, action: Action, now: float) -> None:
        if self.on_acted is None:
            return
        try:
            self.on_acted(action, now)
        except Exception:  # the note is bookkeeping: never let it undo the outcome
            log.exception("%s: noting %s %s failed", self.name, action.kind, action.target)

    def _save_budget(self, now: float) -> None:
        if self.budget_store is None:
            return
        try:
            self.budget_store.save(self.name, self.budget.spent_times(now))
        except Exception as e:  # the action is done; the in-memory budget still holds
            log.warning("%s: could not save the budget (a restart would forget this action): %s", self.name, e)
            self.metrics.budget_save_failures.labels(self.name).inc()

    def status(self) -> dict[str, Any]:
        """Read by the HTTP thread while the rounds' thread runs the loop: it iterates copies
        (a dict or deque changing size under an iteration would raise)."""
        history, backoff, performed = list(self.history), dict(self.backoff), list(self.performed)
        last = history[-1].as_dict() if history else None
        return {"interval_s": self.interval_s, "dry_run": self.dry_run,
                "budget_left": self.budget.remaining(self.clock()),
                "backoff": {k: {"until": v[0], "why": v[1]} for k, v in backoff.items()},
                "last_planned_tick": last, "performed": [o.as_dict() for o in performed],
                "recent": [t.as_dict() for t in history]}


class ControlRounds:
    """Runs loops in one thread: each round, every loop whose interval has come, in `order`
    (scoring.kernel.LOOP_ORDER first, then the others as configured). One loop's slow action
    delays the others' round; that is the price of their never planning on the same snapshot.
    The schedule runs on `mono` (a monotonic clock): a wall clock stepped back must not stop the
    loops until it catches up."""

    def __init__(self, loops: Sequence[ControlLoop], order: Sequence[str],
                 mono: Callable[[], float] = time.monotonic) -> None:
        rank = {name: i for i, name in enumerate(order)}
        self.loops = sorted(loops, key=lambda lp: rank.get(lp.name, len(rank)))  # stable: the rest keep their order
        self.mono = mono
        self._last = [-math.inf] * len(self.loops)  # when each loop last ran, on `mono`
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self, now: float) -> list[int]:
        return [i for i, lp in enumerate(self.loops) if now - self._last[i] >= lp.interval_s - 1e-6]

    def run_round(self) -> list[str]:
        """Runs the loops that are due, in order; returns their names."""
        ran: list[str] = []
        for i in self.due(self.mono()):
            lp = self.loops[i]
            self._last[i] = self.mono()
            try:
                lp.run_once()
            except Exception:  # never let one loop stop the others
                log.exception("%s: tick failed", lp.name)
            ran.append(lp.name)
        return ran

    def _wait_s(self) -> float:
        """Until the next loop is due (no loops: a minute, to check the stop flag)."""
        now = self.mono()
        nxt = min((last + lp.interval_s for last, lp in zip(self._last, self.loops, strict=True)), default=now + 60)
        return max(nxt - now, 0.05)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_round()
            self._stop.wait(self._wait_s())

    def start(self) -> ControlRounds:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="control-rounds", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
