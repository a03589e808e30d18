"""The control kernel: one round of all six loops, pure, for both shells.

    plan_loop(loop, world, settings, memory, budget_left, enabled) -> Plan
    run_round(world, due, budgets, memory, settings, enabled=..., carry_out=None) -> Round

Each loop's plan is a pure function of the World, the settings, the kernel's Memory (what must
outlive a round: the actions noted for composition, the idle loop's idle times and warnings, the
resizer's reported pending resizes, the remedies told) and the actions its budget still allows; it reads no clock
(`world.now` is the time), does no I/O and sets no metric. The shells keep the Memory a round
returns and pass it to the next one.

Composition (LOOP_ORDER): the elastic optimizer sizes jobs, admission releases gated ones (the
optimizer's new pods among them) in least-attained-service order, the migrator sees the result;
then the resizer, the idle loop and the remedies of bottleneck diagnosis. A later loop sees the
World as the earlier loops' actions left it: the shell's `world` source gives the World after
it carried them out (a real cluster or the simulator's engine), and the kernel applies its notes
on top (a job just rescaled counts as rescaled now, one just evicted as migrated now with its new
count, a rescale's pods not created yet wait as pods; scoring.compose), so a dry run, which
carries nothing out, previews the composition, not each loop alone.

Budgets (scoring.safety.Budget, owned by the shell, which may persist them): each loop's own,
keyed by its name; admission's preemptions also spend PREEMPT_BUDGET; the idle loop's evictions
spend the migrator's budget when both run (SHARED_BUDGET: one eviction budget for both, the
round started once by its owner). A loop without a budget in the mapping is unbounded (the
remedies: each job at most once per hold_s).

Dry run (settings.safety.dry_run) has one meaning in both shells: the plan is made, budgets are
spent and notes taken exactly as if the actions were carried out, and nothing is carried out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scoring.actions import ControlAction, Evict, IdleReport, IdleWarn, Preempt, Reclaim, Release, Scale
from scoring.admission import plan_admission_for
from scoring.compose import Memory
from scoring.idle import IdlePlan, plan_idle, warning_delivered
from scoring.migrator_plan import plan_migrations_for
from scoring.remedy import plan_remedies
from scoring.resize_loop import plan_resizes
from scoring.safety import Budget
from scoring.settings import CoreSettings
from scoring.typed_elastic import plan_typed_elastic_for
from scoring.world import IdlePod, World

LOOP_ORDER = ("elastic", "admission", "migrator", "resizer", "idle", "remedies")
PREEMPT_BUDGET = "admission-preemptions"  # admission's preemption budget (the loops' own are their names)
SHARED_BUDGET = {"idle": "migrator"}  # loop -> the loop whose budget it spends when both run
UNBUDGETED = frozenset({"remedies"})  # no budget of their own: each job is told at most once per hold_s

# What carrying an action out came to, as the kernel counts it: DONE spends its budget and is
# noted; GONE (nothing was there) spends its budget, as the service has always charged it, but is
# not noted; SKIPPED (a shell's back-off, lost leadership, a refusal) spends and notes nothing.
DONE, GONE, SKIPPED = "done", "gone", "skipped"
DRY_RUN, BUDGET = "dry_run", "budget_exhausted"


@dataclass(frozen=True)
class Plan:
    loop: str
    actions: tuple[ControlAction, ...]  # in the order they are to be carried out
    memory: Memory
    refusals: Mapping[str, str] = field(default_factory=dict)  # job -> the rule that kept it out
    view: Mapping[str, Any] = field(default_factory=dict)  # the plan as /debug shows it
    detail: Any = None  # the loop's own plan object (MigratorPlan, ElasticLoopPlan, ...), for the shell's gauges


def plan_loop(loop: str, world: World, settings: CoreSettings, memory: Memory, budget_left: int,
              enabled: Collection[str] = (), preempt_left: int | None = None) -> Plan:
    """One loop's plan. `enabled`: the loops that run (the composition rules apply only between
    loops that both run); `preempt_left`: admission's preemption budget (None: budget_left)."""
    if loop == "elastic":
        ep = plan_typed_elastic_for(world, settings, migrator_on="migrator" in enabled)  # untyped: plan_elastic_for
        return Plan(loop, ep.actions, memory, ep.refusals, ep.describe(world), ep)
    if loop == "migrator":
        mp = plan_migrations_for(world, settings, max_moves=budget_left, elastic_on="elastic" in enabled)
        return Plan(loop, mp.actions, memory, mp.refusals, mp.describe(world), mp)
    if loop == "admission":
        # Preemptions come first in the loop's budget too: never plan more than it lets through.
        left = budget_left if preempt_left is None else min(preempt_left, budget_left)
        ap = plan_admission_for(world, settings, max_admits=budget_left, max_preempts=left)
        # Preemptions first: they free what the waiting job needs for the next interval.
        acts: tuple[Preempt | Release, ...] = (*ap.preempts, *ap.admits)
        return Plan(loop, acts, memory, {}, ap.describe(world.now), ap)
    if loop == "resizer":
        rp = plan_resizes(world, settings, memory.resize_reported)
        return Plan(loop, rp.actions, replace(memory, resize_reported=rp.reported), {}, rp.describe(world.now), rp)
    if loop == "idle":
        ip = plan_idle(world.gpu_pods, memory.idle, world.now, world.gpu_pods_waiting, budget_left, settings.idle,
                       settings.safety, world.namespace_labels)
        by_key = {p.key: p for p in world.gpu_pods}
        return Plan(loop, idle_actions(ip, by_key, world.now, world.gpu_pods_waiting, settings),
                    replace(memory, idle=ip.memory), dict(ip.refused),
                    {**ip.describe(world.now), "waiting_gpu_pods": world.gpu_pods_waiting}, ip)
    if loop == "remedies":
        # A remedy is a recommendation to a person: told once per hold_s while the diagnosis holds,
        # not every diagnosis interval.
        rem = tuple(a for a in plan_remedies(world, settings.bottleneck, settings.safety)
                    if world.now - memory.remedied.get(a.job, -math.inf) >= settings.safety.hold_s)
        return Plan(loop, rem, memory, {}, {"at": world.now, "remedies": [a.reason for a in rem]}, rem)
    raise ValueError(f"unknown control loop {loop!r}; known: {', '.join(LOOP_ORDER)}")


def idle_actions(ip: IdlePlan, pods: Mapping[str, IdlePod], now: float, waiting: int, settings: CoreSettings
                 ) -> tuple[ControlAction, ...]:
    """The idle plan's notices and evictions, each with its reason in numbers."""
    s = settings.idle
    since = ip.memory.idle_since
    out: list[ControlAction] = []
    for key in ip.report:
        out.append(IdleReport(key, pods[key].gpus, (
            f"its {pods[key].gpus:g} GPU(s) stayed under {s.threshold_pct:g} % utilisation for "
            f"{now - since[key]:.0f}s (window {s.window_s:.0f}s)")))
    for key in ip.warn:
        out.append(IdleWarn(key, (
            f"idle for {now - since[key]:.0f}s, past its {s.reclaim_key}={pods[key].reclaim}: it may be evicted "
            f"from {s.warning_s:.0f}s from now while GPU pods wait")))
    for key in ip.evict:
        out.append(Reclaim(key, (
            f"idle for {now - since[key]:.0f}s (under {s.threshold_pct:g} %), opted in with "
            f"{s.reclaim_key}={pods[key].reclaim}, {waiting} GPU pod(s) waiting")))
    return tuple(out)


# -- the round ----------------------------------------------------------------------------
WorldSource = Callable[[str], World | None]  # the World for a loop now (None: no plan this round)
CarryOut = Callable[[str, ControlAction], str]  # carry one action out: DONE, GONE or SKIPPED (or a shell label)


@dataclass(frozen=True)
class Outcome:
    action: ControlAction
    outcome: str  # DONE, GONE, SKIPPED, DRY_RUN, BUDGET, or the shell's own label for a done action


@dataclass(frozen=True)
class Round:
    plans: Mapping[str, Plan]  # the loops that planned, by name
    outcomes: Mapping[str, tuple[Outcome, ...]]
    memory: Memory

    def actions(self, loop: str) -> tuple[ControlAction, ...]:
        p = self.plans.get(loop)
        return p.actions if p is not None else ()


def budget_key(loop: str, enabled: Collection[str]) -> str:
    """The budget `loop` spends: its own, or the one it shares when its owner runs too."""
    owner = SHARED_BUDGET.get(loop)
    return owner if owner is not None and owner in enabled else loop


def budget_of(loop: str, budgets: Mapping[str, Budget], enabled: Collection[str]) -> Budget | None:
    key = budget_key(loop, enabled)
    return budgets.get(key) if key in budgets else budgets.get(loop)


def run_round(world: World | WorldSource, due: Sequence[str], budgets: Mapping[str, Budget], memory: Memory,
              settings: CoreSettings, *, enabled: Collection[str] | None = None,
              carry_out: CarryOut | None = None) -> Round:
    """Every loop in `due`, in LOOP_ORDER: its World (as the earlier loops left it), its plan
    within its budget, each action carried out (`carry_out`; nothing in a dry run or without
    one) and noted. `budgets` are spent in place; the new Memory comes back in the Round."""
    on = set(due) if enabled is None else set(enabled)
    unknown = [x for x in due if x not in LOOP_ORDER]
    if unknown:
        raise ValueError(f"unknown control loops {unknown}; known: {', '.join(LOOP_ORDER)}")
    dry = settings.safety.dry_run or carry_out is None
    plans: dict[str, Plan] = {}
    outcomes: dict[str, tuple[Outcome, ...]] = {}
    for loop in (x for x in LOOP_ORDER if x in due):
        w = world(loop) if callable(world) else world
        if w is None:
            continue
        now = w.now
        memory = memory.forget(now, settings.safety.hold_s)
        w = memory.applied(w)
        budget = budget_of(loop, budgets, on)
        if budget is not None and budget is budgets.get(loop):
            budget.new_interval()  # a shared budget's round is started by its owner only
        preempt = budgets.get(PREEMPT_BUDGET) if loop == "admission" else None
        if preempt is not None:
            preempt.new_interval()
        plan = plan_loop(loop, w, settings, memory, budget.left(now) if budget is not None else 1 << 30, on,
                         preempt.left(now) if preempt is not None else None)
        memory = plan.memory
        done: list[Outcome] = []
        for a in plan.actions:
            extra = preempt if isinstance(a, Preempt) else None
            if a.budgeted and ((budget is not None and not budget.allows(now))
                               or (extra is not None and not extra.allows(now))):
                done.append(Outcome(a, BUDGET))
                continue
            result = DRY_RUN if dry or carry_out is None else carry_out(loop, a)
            done.append(Outcome(a, result))
            if result == SKIPPED:
                continue
            if a.budgeted:  # gone counts as spent, as the service has always charged it
                for b in (budget, extra):
                    if b is not None:
                        b.spend(now)
            if result == GONE:
                continue
            if isinstance(a, IdleWarn):
                # A warning counts from its delivery only: a dry run delivers none.
                if result != DRY_RUN:
                    memory = replace(memory, idle=warning_delivered(memory.idle, a.pod, now))
                continue
            memory = memory.note(a, now)
        plans[loop] = replace(plan, memory=memory)
        outcomes[loop] = tuple(done)
    return Round(plans, outcomes, memory)


__all__ = ["BUDGET", "DONE", "DRY_RUN", "GONE", "LOOP_ORDER", "PREEMPT_BUDGET", "SHARED_BUDGET", "SKIPPED",
           "UNBUDGETED", "CarryOut", "ControlAction", "Evict", "Memory", "Outcome", "Plan", "Round", "Scale",
           "WorldSource", "budget_key", "plan_loop", "run_round"]
