"""The control kernel (scoring.kernel): one round of the loops, its budgets, its notes and its one
meaning of dry run, on hand-built Worlds."""

from __future__ import annotations

import math
from dataclasses import replace

from scoring.actions import IdleReport, IdleWarn, Reclaim, Resize, ResizeHeld, Scale
from scoring.compose import Memory
from scoring.convergence import Phase
from scoring.idle import IdleMemory
from scoring.kernel import BUDGET, DONE, DRY_RUN, GONE, LOOP_ORDER, SKIPPED, plan_loop, run_round
from scoring.safety import Budget
from scoring.settings import CoreSettings, SafetySettings
from scoring.world import IdlePod, JobState, NodeState, PendingPod, ResizeNode, ResizeRow, World


def job(key: str, gpus_on: dict[str, float], *, elastic: tuple[int, int] | None = None) -> JobState:
    ns = key.split("/", 1)[0]
    return JobState(key=key, namespace=ns, gpus_on=gpus_on, live_gpus=int(sum(gpus_on.values())), per_pod=1,
                    checkpointable=True, elastic=elastic, running=True, settling=False, runtime_s=3600.0,
                    attained_gpu_s=3600.0)


def elastic_world(now: float = 1000.0) -> World:
    # One elastic job on 1 of 8 GPUs, nothing else: the optimizer grows it.
    return World(now, (NodeState("n0", 8.0, 1.0),), (job("t/a", {"n0": 1.0}, elastic=(1, 8)),), ())


def core(dry_run: bool) -> CoreSettings:
    return CoreSettings(safety=SafetySettings(dry_run=dry_run))


def test_the_loop_order_runs_all_six_loops() -> None:
    assert LOOP_ORDER == ("elastic", "admission", "migrator", "resizer", "idle", "remedies")


def test_a_dry_run_spends_and_notes_as_a_real_run_and_carries_nothing_out() -> None:
    carried: list[Scale] = []

    def carry(_loop: str, a: object) -> str:
        assert isinstance(a, Scale)
        carried.append(a)
        return DONE

    rounds = {}
    for dry in (True, False):
        budgets = {"elastic": Budget(16, 300)}
        rounds[dry] = (run_round(elastic_world(), ["elastic"], budgets, Memory(), core(dry), carry_out=carry),
                       budgets["elastic"].remaining(1000.0))
    (dry_round, dry_left), (real_round, real_left) = rounds[True], rounds[False]
    assert dry_round.actions("elastic") == real_round.actions("elastic") != ()
    assert [o.outcome for o in dry_round.outcomes["elastic"]] == [DRY_RUN]
    assert [o.outcome for o in real_round.outcomes["elastic"]] == [DONE]
    assert len(carried) == 1  # only the real run carried it out
    assert dry_left == real_left == {"interval": 15, "hour": 299}
    assert dry_round.memory.scaled == real_round.memory.scaled  # the same note for the later loops
    assert dry_round.memory.scaled["t/a"].gpus == carried[0].gpus


def test_a_later_loop_sees_the_earlier_loops_notes() -> None:
    # The optimizer grows t/a in the round; the World the migrator plans on has it rescaled now
    # and its promised pods waiting (the shell's World does not show them yet).
    base = elastic_world()

    def world_for(loop: str) -> World:
        return base

    def carry(loop: str, a: object) -> str:
        return DONE

    done = run_round(world_for, ["elastic", "migrator"], {"elastic": Budget(16, 300), "migrator": Budget(1, 6)},
                     Memory(), core(False), carry_out=carry)
    seen_world = done.memory.applied(base)
    grown = done.actions("elastic")[0]
    assert isinstance(grown, Scale)
    assert seen_world.jobs[0].since_scaled_s == 0.0
    assert len([p for p in seen_world.pending if p.job == "t/a"]) == grown.gpus - 1


def test_an_exhausted_budget_refuses_budgeted_actions_but_not_notices() -> None:
    budgets = {"elastic": Budget(0, 300)}
    done = run_round(elastic_world(), ["elastic"], budgets, Memory(), core(False), carry_out=lambda _l, _a: DONE)
    assert [o.outcome for o in done.outcomes["elastic"]] == [BUDGET]
    # Idle notices spend nothing: they go out with no budget left.
    pod = IdlePod("t/nb", "t", "notebook", 1.0, None, (0.0,))
    w = World(10_000.0, (), (), (), gpu_pods=(pod,))
    mem = Memory(idle=IdleMemory(idle_since={"t/nb": 0.0}))
    out = run_round(w, ["idle"], {"idle": Budget(0, 0)}, mem, core(False), carry_out=lambda _l, _a: DONE)
    assert [type(o.action) for o in out.outcomes["idle"]] == [IdleReport]
    assert [o.outcome for o in out.outcomes["idle"]] == [DONE]


def test_gone_spends_skipped_does_not_and_neither_is_noted() -> None:
    for result, left in ((GONE, 15), (SKIPPED, 16)):
        budgets = {"elastic": Budget(16, 300)}
        done = run_round(elastic_world(), ["elastic"], budgets, Memory(), core(False),
                         carry_out=lambda _l, _a, r=result: r)
        assert budgets["elastic"].remaining(1000.0)["interval"] == left
        assert done.memory.scaled == {}


def test_idle_evictions_spend_the_migrators_budget_when_both_run() -> None:
    pod = IdlePod("t/nb", "t", "notebook", 1.0, "1h", (0.0,))
    w = World(10_000.0, (), (), (), gpu_pods=(pod,), gpu_pods_waiting=1)
    mem = Memory(idle=IdleMemory(idle_since={"t/nb": 0.0}, reported=frozenset({"t/nb"}),
                                 warned_at={"t/nb": 1000.0}))
    migrator, idle = Budget(1, 6), Budget(5, 50)
    done = run_round(w, ["idle"], {"migrator": migrator, "idle": idle}, mem, core(False),
                     enabled=("migrator", "idle"), carry_out=lambda _l, _a: DONE)
    assert [type(o.action) for o in done.outcomes["idle"]] == [Reclaim]
    assert migrator.remaining(10_000.0)["interval"] == 0 and idle.remaining(10_000.0)["interval"] == 5


def test_a_warning_counts_only_once_delivered() -> None:
    pod = IdlePod("t/nb", "t", "notebook", 1.0, "1h", (0.0,))
    w = World(10_000.0, (), (), (), gpu_pods=(pod,), gpu_pods_waiting=1)
    mem = Memory(idle=IdleMemory(idle_since={"t/nb": 0.0}, reported=frozenset({"t/nb"})))
    for dry, warned in ((True, False), (False, True)):
        done = run_round(w, ["idle"], {"idle": Budget(1, 6)}, mem, core(dry), carry_out=lambda _l, _a: DONE)
        assert [type(o.action) for o in done.outcomes["idle"]] == [IdleWarn]
        assert ("t/nb" in done.memory.idle.warned_at) is warned


def row(pod: str, request_m: float, phase: Phase, progress: float, **kw: object) -> ResizeRow:
    base = ResizeRow(pod, pod + "-uid", "t/" + pod.split("/")[1], "main", request_m, None, request_m, 0.0, math.inf,
                     True, math.inf, False, None, False, phase, progress)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_the_resizer_plans_from_the_world_decreases_first_and_tells_a_held_resize_once() -> None:
    nodes = (ResizeNode("n0", 16_000.0, 0.0, (
        row("t/up", 4000.0, Phase.GROWING, 0.5), row("t/down", 8000.0, Phase.COMPLETING, 0.01),
        row("t/held", 2000.0, Phase.GROWING, 0.5, in_flight=True, pending=("Infeasible", "no room")))),)
    w = World(100.0, (), (), (), resize_nodes=nodes)
    p = plan_loop("resizer", w, CoreSettings(), Memory(), 4)
    kinds = [(type(a).__name__, a.kind) for a in p.actions]
    assert kinds[0] == ("ResizeHeld", "resize_pending")
    resizes = [a for a in p.actions if isinstance(a, Resize)]
    assert [a.kind for a in resizes] == ["resize-down", "resize-up"]  # the decrease makes room for the raise
    again = plan_loop("resizer", w, CoreSettings(), p.memory, 4)
    assert not any(isinstance(a, ResizeHeld) for a in again.actions)  # told once per reason


def test_plans_are_pure_the_same_inputs_give_the_same_plan() -> None:
    w = World(1000.0, (NodeState("n0", 8.0, 8.0),), (job("t/a", {"n0": 8.0}),),
              (PendingPod("t/b-0", "t/b", 4.0, 600.0),))
    for loop in LOOP_ORDER:
        a = plan_loop(loop, w, CoreSettings(), Memory(), 3, LOOP_ORDER)
        b = plan_loop(loop, w, CoreSettings(), Memory(), 3, LOOP_ORDER)
        assert a.actions == b.actions and a.memory == b.memory


def test_a_remedy_is_told_once_per_hold_s_while_its_diagnosis_holds() -> None:
    from scoring.bottleneck import Bottleneck, Diagnosis, JobShape

    d = Diagnosis("t/a", Bottleneck.INPUT, 0.95, ("cpu at its limit",), JobShape(workers=1, ps=0, nodes=1))
    settings = core(dry_run=True)  # a dry run notes it too: its /debug preview holds the job the same way
    hold = settings.safety.hold_s
    memory, told = Memory(), []
    for now in (1000.0, 1030.0, 1000.0 + hold - 1, 1000.0 + hold):
        world = World(now, (NodeState("n0", 8.0, 1.0),), (replace(job("t/a", {"n0": 1.0}), diagnosis=d),), ())
        done = run_round(world, ["remedies"], {}, memory, settings, carry_out=lambda _l, _a: DONE)
        memory = done.memory
        told.append([(a.kind, a.job) for a in done.actions("remedies")])
    assert told == [[("give-cpu", "t/a")], [], [], [("give-cpu", "t/a")]]
