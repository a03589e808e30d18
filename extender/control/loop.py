"""The service's control rounds: each round, the kernel (scoring.kernel.run_round) plans every
loop that is due and this shell carries out its typed actions; nothing here decides.

A controller (see `Controller`) is what the service knows of one loop: `world(now)` builds its
part of the World (the shell's reads: snapshot, namespaces, pods; None until there is a basis
for a plan, TemporaryError to skip the interval), `bind(action)` names the pods a typed action
is carried out on (as the World it planned from had them), `planned(plan)` sets its gauges and
its /debug view from the kernel's plan, and `act(action, now)` performs one action and returns
an outcome label or raises TemporaryError / PermanentError.

`ControlRounds.run_round` owns the round: which loops are due (each at its own interval, on a
monotonic clock), leadership (no plan unless `leader.is_leader`), the budgets (scoring.safety.Budget,
one per loop and admission's preemptions, loaded from the budget store before the round and saved
after every loop that carried an action out), the kernel's Memory between rounds, and one meaning of
dry run (settings.safety.dry_run: planned, budgeted and noted, never carried out). The kernel asks
for each loop's World as the earlier loops left it, and calls back `carry_out(loop, action)`.

Each `ControlLoop` is one loop's book around carrying out: leadership checked again before each
action (one action is many API calls); back-off (a TemporaryError(delay) parks that action's key
for delay seconds, a PermanentError for permanent_backoff_s; a parked key is reported `backoff`,
not retried, and spends no budget); metrics flowsched_control_actions_total{loop,action,outcome},
flowsched_control_ticks_total{loop,result}, flowsched_control_leader{loop}; the recent planned ticks
and performed actions for /debug. An exception building a World or planning is logged and counted,
the round goes on.

Time comes from `clock` (wall seconds), so tests drive `run_round()` with a fake clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.control.budget_store import BudgetStore
from extender.control.mark_store import MarkStore
from extender.kube.errors import PermanentError, TemporaryError
from extender.periodic import PeriodicRunner
from extender.snapshot.objects import MigrationMark
from scoring import kernel
from scoring.actions import ControlAction, Preempt, render
from scoring.kernel import BUDGET, DRY_RUN, PREEMPT_BUDGET, SKIPPED, Memory, Plan
from scoring.safety import Budget
from scoring.settings import CoreSettings
from scoring.world import World

log = logging.getLogger("flowsched.control")

BACKOFF = "backoff"
RETRY = "retry_later"
FAILED = "failed"
NOT_LEADER = "lost_leadership"
NOT_CARRIED = (BACKOFF, RETRY, FAILED, NOT_LEADER)  # the shell's labels for an action it did not carry out


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

    def world(self, now: float) -> World | None: ...

    def bind(self, action: ControlAction) -> Action: ...

    def planned(self, plan: Plan) -> None: ...

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
    """One loop's book: its interval, its budget, its back-offs, its recent ticks, and how one of
    its actions is carried out (`carry_out`, the kernel's callback)."""

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
        budgeted: bool = True,  # False: no budget of its own in the kernel's round (the remedies)
    ) -> None:
        self.controller, self.leader, self.metrics = controller, leader, metrics
        self.name = controller.name
        self.interval_s, self.dry_run = interval_s, dry_run
        self.permanent_backoff_s = permanent_backoff_s
        self.clock = clock
        self.budget = Budget(per_interval, per_hour)
        self.budgeted = budgeted
        self.backoff: dict[str, tuple[float, str]] = {}  # key -> (until, why)
        self.history: deque[Tick] = deque(maxlen=history)
        self.performed: deque[Outcome] = deque(maxlen=history)  # real actions only, newest last
        # This round's carried-out (or skipped) outcomes, in the kernel's order, until tick().
        self.carried: list[Outcome] = []

    def count(self, action: Action, outcome: str) -> None:
        self.metrics.actions.labels(self.name, action.kind, outcome).inc()

    def carry_out(self, plan: ControlAction, now: float) -> str:
        """The kernel's callback for one action: the controller's act() within leadership and
        back-off. Returns the outcome label (kernel.GONE when nothing was there) or kernel.SKIPPED
        (parked, leadership lost, refused): a skipped action spends no budget."""
        action = self.controller.bind(plan)
        parked = self.backoff.get(action.key)
        if parked is not None:
            return self._skip(Outcome(action, BACKOFF, f"until {parked[0]:.0f}: {parked[1]}"))
        if not self.leader.is_leader:
            return self._skip(Outcome(action, NOT_LEADER))
        try:
            result = self.controller.act(action, now)
        except TemporaryError as e:
            self.backoff[action.key] = (now + e.delay_s, str(e))
            log.info("%s: %s %s deferred %.0fs: %s", self.name, action.kind, action.target, e.delay_s, e)
            return self._skip(Outcome(action, RETRY, str(e)))
        except PermanentError as e:
            self.backoff[action.key] = (now + self.permanent_backoff_s, str(e))
            log.warning("%s: %s %s failed: %s", self.name, action.kind, action.target, e)
            return self._skip(Outcome(action, FAILED, str(e)))
        except Exception as e:  # a controller bug: treat as permanent for this key, keep looping
            log.exception("%s: %s %s raised", self.name, action.kind, action.target)
            self.backoff[action.key] = (now + self.permanent_backoff_s, repr(e))
            return self._skip(Outcome(action, FAILED, f"{type(e).__name__}: {e}"[:300]))
        out = Outcome(action, result)
        self.carried.append(out)
        self.performed.append(out)
        return result

    def _skip(self, out: Outcome) -> str:
        self.carried.append(out)
        return SKIPPED

    def tick(self, now: float, leader: bool, dry_run: bool, outcomes: Sequence[kernel.Outcome]) -> Tick:
        """The round's tick of this loop from the kernel's outcomes: DRY_RUN and BUDGET are the
        kernel's; every other one was carried out (or skipped) here, in the same order."""
        tick = Tick(at=now, leader=leader, dry_run=dry_run)
        carried = iter(self.carried)
        self.carried = []
        for o in outcomes:
            if o.outcome in (DRY_RUN, BUDGET):
                out = Outcome(self.controller.bind(o.action), o.outcome,
                              f"budget left {self.budget.remaining(now)}" if o.outcome == BUDGET else "")
                if o.outcome == DRY_RUN:
                    log.info("%s (dry run) would %s %s: %s", self.name, out.action.kind, out.action.target,
                             out.action.reason)
            else:
                out = next(carried)
            tick.outcomes.append(out)
            self.count(out.action, out.outcome)
        return tick

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
    """The one rounds runner: each round, every loop whose interval has come, planned by the kernel
    in scoring.kernel.LOOP_ORDER and carried out here. One loop's slow action delays the others'
    round; that is the price of their never planning on the same snapshot. The schedule runs on
    `mono` (a monotonic clock): a wall clock stepped back must not stop the loops until it catches up."""

    def __init__(self, loops: Sequence[ControlLoop], core: CoreSettings, leader: Leadership,
                 metrics: ControlMetrics, *, dry_run: bool = True, clock: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic, budget_store: BudgetStore | None = None,
                 mark_store: MarkStore | None = None,
                 seed_marks: Callable[[Mapping[str, MigrationMark]], int] | None = None) -> None:
        rank = {name: i for i, name in enumerate(kernel.LOOP_ORDER)}
        self.loops = sorted(loops, key=lambda lp: rank.get(lp.name, len(rank)))
        self.by_name = {lp.name: lp for lp in self.loops}
        self.core = replace(core, safety=replace(core.safety, dry_run=dry_run))  # one meaning of dry run
        self.leader, self.metrics, self.dry_run = leader, metrics, dry_run
        self.clock, self.mono = clock, mono
        self.budget_store = budget_store
        # The saved eviction marks, read into the state (seed_marks) once, the first round this
        # replica leads: its pod watch has told it every mark since it started (mark_store.py).
        self.mark_store, self.seed_marks = mark_store, seed_marks
        self.marks_restored = mark_store is None or seed_marks is None
        a = core.admission
        # Admission's preemptions spend their own budget as well as the loop's (scoring.kernel).
        self.preempt_budget = Budget(a.max_preemptions_per_interval, a.max_preemptions_per_hour)
        self.memory = Memory()  # what the kernel remembers between rounds
        self.last_round: kernel.Round | None = None
        self._last = {lp.name: -math.inf for lp in self.loops}  # when each loop last ran, on `mono`
        self.runner = PeriodicRunner("control-rounds", self.run_round, lambda _took: self._wait_s(), clock=self.mono)

    def budgets(self) -> dict[str, Budget]:
        out = {lp.name: lp.budget for lp in self.loops if lp.budgeted}
        if "admission" in out:
            out[PREEMPT_BUDGET] = self.preempt_budget
        return out

    def due(self, now: float) -> list[str]:
        return [lp.name for lp in self.loops if now - self._last[lp.name] >= lp.interval_s - 1e-6]

    def run_round(self) -> list[str]:
        """Runs the loops that are due; returns their names."""
        due = self.due(self.mono())
        for name in due:
            self._last[name] = self.mono()
        if not due:
            return []
        now = self.clock()
        leader = bool(self.leader.is_leader)
        for name in due:
            self.metrics.leader.labels(name).set(1.0 if leader else 0.0)
        if not leader:
            for name in due:
                self.metrics.ticks.labels(name, "not_leader").inc()
            return due
        self._restore_marks()
        error = self._restore_budgets(now)
        if error:
            for name in due:
                self._failed(name, now, error)
            return due
        for lp in self.loops:
            lp.backoff = {k: v for k, v in lp.backoff.items() if v[0] > now}
            lp.carried = []  # a round that failed midway left its outcomes unread
        skipped: dict[str, str] = {}
        previous: list[str] = []  # the loop before: its spends are saved before the next World

        def world(loop: str) -> World | None:
            self._save_budgets(previous[-1] if previous else None, now)
            previous.append(loop)
            try:
                return self.by_name[loop].controller.world(now)
            except TemporaryError as e:
                log.info("%s: interval skipped: %s", loop, e)
                skipped[loop] = str(e)[:300]
            except Exception as e:
                log.exception("%s: building the World failed", loop)
                skipped[loop] = f"{type(e).__name__}: {e}"[:300]
            return None

        try:
            done = kernel.run_round(world, due, self.budgets(), self.memory, self.core,
                                    enabled=list(self.by_name),
                                    carry_out=lambda loop, a: self.by_name[loop].carry_out(a, now))
        except Exception as e:  # a planning bug: this round is lost, the next one plans afresh
            log.exception("control round failed")
            for name in due:
                self._failed(name, now, f"{type(e).__name__}: {e}")
            return due
        self._save_budgets(previous[-1] if previous else None, now)
        self.memory, self.last_round = done.memory, done
        for name in due:
            if name in skipped:
                self._failed(name, now, skipped[name])
            else:
                self._record(name, now, done.plans.get(name), done.outcomes.get(name, ()))
        return due

    def _record(self, name: str, now: float, plan: Plan | None, outcomes: Sequence[kernel.Outcome]) -> None:
        lp = self.by_name[name]
        if plan is not None:
            try:
                lp.controller.planned(plan)  # gauges and the /debug view, from the kernel's plan
            except Exception:
                log.exception("%s: recording the plan failed", name)
        tick = lp.tick(now, True, self.dry_run, outcomes)
        acted = any(o.outcome not in (DRY_RUN, BUDGET, BACKOFF) for o in tick.outcomes)
        self.metrics.ticks.labels(name, "acted" if acted else ("planned" if tick.outcomes else "idle")).inc()
        if tick.outcomes:
            lp.history.append(tick)

    def _failed(self, name: str, now: float, error: str) -> None:
        lp = self.by_name[name]
        lp.history.append(Tick(at=now, leader=True, dry_run=self.dry_run, error=error))
        self.metrics.ticks.labels(name, "error").inc()

    def _restore_marks(self) -> None:
        """Until it has worked once. Unreadable: the round goes on (the pods' own marks still
        count; only jobs whose evicted pods are gone lose theirs) and the next round tries again."""
        if self.marks_restored or self.mark_store is None or self.seed_marks is None:
            return
        try:
            saved = self.mark_store.load()
        except Exception as e:
            log.warning("the saved eviction marks are unreadable (tried again next round): %s", e)
            return
        taken = self.seed_marks(saved)
        self.marks_restored = True
        log.info("eviction marks restored: %d saved, %d taken (the pod watch knew the others)", len(saved), taken)

    def _restore_budgets(self, now: float) -> str:
        """The hourly budgets outlive this leader (budget_store.py): loaded before every round (the
        Lease may have changed hands since the last one). An unreadable store plans nothing: acting
        on a budget it cannot read could exceed it."""
        if self.budget_store is None:
            return ""
        try:
            saved = self.budget_store.load()
        except Exception as e:
            log.warning("round skipped, the saved budgets are unreadable: %s", e)
            return f"saved budget unreadable: {e}"[:300]
        for key, b in self.budgets().items():
            b.restore(saved.get(key, ()), now)
        return ""

    def _save_budgets(self, name: str | None, now: float) -> None:
        """After a loop carried an action out: the budget it spent (and the preemptions') as it
        stands. Dry-run spends are never saved: switching to --act must not find the hour spent."""
        if self.budget_store is None or self.dry_run or name is None:
            return
        real = [o.action.plan for o in self.by_name[name].carried
                if o.action.plan is not None and o.action.plan.budgeted and o.outcome not in NOT_CARRIED]
        if not real:
            return
        budgets = self.budgets()
        keys = [kernel.budget_key(name, self.by_name)]  # the idle loop spends the migrator's
        if any(isinstance(a, Preempt) for a in real):
            keys.append(PREEMPT_BUDGET)
        for key in keys:
            try:
                self.budget_store.save(key, budgets[key].spent_times(now))
            except Exception as e:  # the action is done; the in-memory budget still holds
                log.warning("%s: could not save the budget (a restart would forget this action): %s", key, e)
                self.metrics.budget_save_failures.labels(name).inc()

    def _wait_s(self) -> float:
        """Until the next loop is due (no loops: a minute, to check the stop flag)."""
        now = self.mono()
        nxt = min((self._last[lp.name] + lp.interval_s for lp in self.loops), default=now + 60)
        return max(nxt - now, 0.05)

    def start(self) -> ControlRounds:
        self.runner.start()
        return self

    def stop(self) -> None:
        self.runner.stop(join_s=10)
