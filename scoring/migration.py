"""Which slow-growing, checkpointable jobs to migrate so that waiting work can start (SpeCon).

Pure: numpy over job and node arrays, no I/O, no clock (times come in as ages in seconds).

A job is a candidate only if it opted in (flowsched.io/checkpointable on every pod), its
namespace allows it, all its pods run, it has run at least min_runtime_s, the convergence state
machine calls it slow (COMPLETING by default: G < alpha two windows running), it has been
migrated fewer than max_migrations times and not within cooldown_s (hysteresis), and it is not
predicted to finish within min_remaining_s (then it frees its GPUs by itself, cheaper than a
restart).

No benefit, no move: demands (pending pods, in queue order) are first placed best-fit on the
free GPUs as they are; the rest is "unmet". Evicting candidate j returns its GPUs; its benefit
is the GPUs of unmet demands that then fit. With require_room_elsewhere the job's own pods
must also fit afterwards on nodes other than the ones it leaves (so the move is a move, not a
demotion to the queue). Greedy: the candidate with the largest benefit (ties: slowest growth,
then most remaining time) is chosen, the world updated, repeat up to max_moves.

The settings are the migrator loop's own (scoring.settings.MigratorLoopSettings): the planner
has none of its own.

order="attained" (least-attained-service through eviction; off by default): the move is made
only for demands that have waited at least wait_threshold_s (Demands.wait_s; others count as
met), a candidate must also have attained at least min_attained_gpu_s GPU-seconds
(JobArrays.attained_gpu_s: GPUs x running time, summed over its starts), and among useful
candidates the one with the most attained service goes first (ties: the usual order). The
evicted job's replacement is a new pod and queues behind the pods that were waiting, so it
approximates Tiresias' demotion of long-served jobs with only the migrator's powers; whether
it is slow-growing is still the slow_phases rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from scoring.convergence import Phase
from scoring.settings import MigratorLoopSettings

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_EPS = 1e-9


class Why(IntEnum):
    """Per job: why it was (not) chosen. The first failing rule wins, in this order."""

    CHOSEN = 0
    NOT_OPTED_IN = 1
    NAMESPACE_OPT_OUT = 2
    NOT_RUNNING = 3
    TOO_YOUNG = 4
    NOT_SLOW = 5
    TOO_MANY_MOVES = 6
    COOLDOWN = 7
    ALMOST_DONE = 8
    NO_BENEFIT = 9
    NO_ROOM_ELSEWHERE = 10
    MOVE_LIMIT = 11  # eligible and useful, but max_moves were already chosen this round
    LOW_SERVICE = 12  # order="attained": attained GPU-seconds below min_attained_gpu_s


WHY_TEXT = {w: w.name.lower() for w in Why}


@dataclass(frozen=True)
class JobArrays:
    """J jobs over N nodes. NaN means unknown: unknown runtime is too young, unknown remaining
    time is not 'almost done', unknown growth sorts last among equals."""

    opted_in: BoolArray  # [J] every pod carries flowsched.io/checkpointable: "true"
    allowed: BoolArray  # [J] namespace not excluded / not labelled out
    running: BoolArray  # [J] all pods bound, Running, none terminating
    runtime_s: FloatArray  # [J]
    phase: IntArray  # [J] Phase values
    growth: FloatArray  # [J] growth efficiency G
    remaining_s: FloatArray  # [J] predicted seconds to the plateau
    migrations: IntArray  # [J] times migrated so far
    since_migration_s: FloatArray  # [J] inf if never
    gpus_on: FloatArray  # [J, N] GPUs the job's pods hold on each node
    attained_gpu_s: FloatArray | None = None  # [J] GPU-seconds of service so far (NaN unknown)

    @property
    def count(self) -> int:
        return int(self.opted_in.shape[0])


@dataclass(frozen=True)
class Demands:
    gpus: FloatArray  # [D] per pending pod, in kube-scheduler's queue order
    node: IntArray  # [D] -1: any node; k: only node k (e.g. a growing job's extra GPUs there)
    wait_s: FloatArray | None = None  # [D] seconds each has waited (NaN unknown = not long)
    # [D, N] the nodes each may bind to (its job's GPU types, as the extender's filter allows them);
    # None: every node. GPUs freed on a node a demand may not take serve it nothing.
    allowed: BoolArray | None = None

    @staticmethod
    def pending(gpus: npt.ArrayLike, wait_s: npt.ArrayLike | None = None,
                allowed: npt.ArrayLike | None = None) -> Demands:
        g = np.asarray(gpus, dtype=np.float64).reshape(-1)
        w = None if wait_s is None else np.asarray(wait_s, dtype=np.float64).reshape(-1)
        a = None if allowed is None else np.asarray(allowed, dtype=bool)
        return Demands(g, np.full(g.shape[0], -1, dtype=np.int64), w, a)

    def place_on(self, free: FloatArray, idx: IntArray) -> tuple[IntArray, FloatArray]:
        """place() of the demands `idx`, in their order, each on the nodes it may take."""
        return place(free, self.gpus[idx], self.node[idx], allowed=None if self.allowed is None else self.allowed[idx])


@dataclass(frozen=True)
class Move:
    job: int
    freed_gpus: float
    benefit_gpus: float  # GPUs of unmet demands that fit once the job is gone
    served: tuple[int, ...]  # demand indices
    relocation: tuple[int, ...]  # node per pod chunk where the job fits again (-1 unknown)


@dataclass(frozen=True)
class MigrationPlan:
    moves: tuple[Move, ...]
    why: IntArray  # [J] Why per job
    unmet_before: tuple[int, ...]  # demands that fit nowhere before any move

    @property
    def jobs(self) -> list[int]:
        return [m.job for m in self.moves]


def place(free: FloatArray, gpus: FloatArray, only: IntArray, forbid: BoolArray | None = None,
          allowed: BoolArray | None = None) -> tuple[IntArray, FloatArray]:
    """Best-fit in order (the fullest node that still fits, as the extender's packing does):
    node per demand (-1 = fits nowhere) and the free GPUs left. `allowed` [D, N]: the nodes each
    demand may take (None: any)."""
    left = free.astype(np.float64, copy=True)
    where = np.full(gpus.shape[0], -1, dtype=np.int64)
    for d in range(gpus.shape[0]):
        ok = left + _EPS >= gpus[d]
        if forbid is not None:
            ok &= ~forbid
        if allowed is not None:
            ok &= allowed[d]
        if only[d] >= 0:
            mask = np.zeros_like(ok)
            mask[only[d]] = True
            ok &= mask
        if not ok.any():
            continue
        k = int(np.argmin(np.where(ok, left, np.inf)))
        where[d] = k
        left[k] -= gpus[d]
    return where, left


def _attained(jobs: JobArrays) -> FloatArray:
    if jobs.attained_gpu_s is None:
        return np.full(jobs.count, np.nan)
    return np.asarray(jobs.attained_gpu_s, dtype=np.float64).reshape(-1)


def eligibility(jobs: JobArrays, s: MigratorLoopSettings) -> IntArray:
    """Why per job from the rules alone (CHOSEN = eligible, benefit not yet checked)."""
    if s.order not in ("benefit", "attained"):
        raise ValueError(f"unknown order {s.order!r}: 'benefit' or 'attained'")
    j = jobs.count
    why = np.full(j, Why.CHOSEN, dtype=np.int64)
    slow = np.isin(jobs.phase, np.asarray([int(Phase[p.upper()]) for p in s.slow_phases], dtype=np.int64))
    with np.errstate(invalid="ignore"):
        rules: list[tuple[Why, BoolArray]] = [
            (Why.NOT_OPTED_IN, ~jobs.opted_in),
            (Why.NAMESPACE_OPT_OUT, ~jobs.allowed),
            (Why.NOT_RUNNING, ~jobs.running | (jobs.gpus_on.sum(axis=1) <= 0)),
            (Why.TOO_YOUNG, ~(jobs.runtime_s >= s.min_runtime_s)),
            (Why.NOT_SLOW, ~slow),
            (Why.TOO_MANY_MOVES, jobs.migrations >= s.max_migrations),
            (Why.COOLDOWN, jobs.since_migration_s < s.cooldown_s),
            (Why.ALMOST_DONE, jobs.remaining_s < s.min_remaining_s),
        ]
        if s.order == "attained":  # unknown service is not "much"
            rules.append((Why.LOW_SERVICE, ~(_attained(jobs) >= s.min_attained_gpu_s)))
    undecided = np.ones(j, dtype=bool)
    for reason, mask in rules:
        hit = undecided & mask
        why[hit] = reason
        undecided &= ~hit
    return why


def _evaluate(j: int, jobs: JobArrays, free: FloatArray, unmet: IntArray, demands: Demands,
              s: MigratorLoopSettings) -> tuple[Move | None, Why]:
    row = jobs.gpus_on[j]
    # `free` is raw: below 0 where a node's allocatable fell under what its pods hold. Clamp only
    # after the job's GPUs come back, so an eviction is credited with the GPUs that will exist.
    freed = np.maximum(free + row, 0.0)
    where, left = demands.place_on(freed, unmet)
    served = unmet[where >= 0]
    benefit = float(demands.gpus[served].sum())
    if benefit <= _EPS:
        return None, Why.NO_BENEFIT
    chunks = row[row > 0]
    origin = row > 0
    reloc, _ = place(left, chunks, np.full(chunks.shape[0], -1, dtype=np.int64), forbid=origin)
    if s.require_room_elsewhere and (reloc < 0).any():
        return None, Why.NO_ROOM_ELSEWHERE
    return Move(job=j, freed_gpus=float(row.sum()), benefit_gpus=benefit,
                served=tuple(int(x) for x in served), relocation=tuple(int(x) for x in reloc)), Why.CHOSEN


def plan_migrations(jobs: JobArrays, node_free: npt.ArrayLike, demands: Demands,
                    settings: MigratorLoopSettings, max_moves: int | None = None) -> MigrationPlan:
    """At most `max_moves` moves (default: the loop's per-interval budget, at least one)."""
    most = max(1, settings.max_per_interval) if max_moves is None else max_moves
    # Raw, possibly negative (allocatable dropped below what the pods hold): _evaluate clamps
    # after adding a job's GPUs back; clamping here would credit GPUs that do not exist.
    free = np.asarray(node_free, dtype=np.float64).reshape(-1)
    if jobs.gpus_on.shape != (jobs.count, free.shape[0]):
        raise ValueError(f"gpus_on is {jobs.gpus_on.shape}, expected ({jobs.count}, {free.shape[0]})")
    if demands.gpus.shape != demands.node.shape:
        raise ValueError("demand gpus and node differ in length")
    if demands.allowed is not None and demands.allowed.shape != (demands.gpus.shape[0], free.shape[0]):
        raise ValueError(f"demand allowed is {demands.allowed.shape}, "
                         f"expected ({demands.gpus.shape[0]}, {free.shape[0]})")
    why = eligibility(jobs, settings)
    where, free = demands.place_on(free, np.arange(demands.gpus.shape[0]))  # fits now: no migration
    unmet = np.flatnonzero(where < 0).astype(np.int64)
    if settings.order == "attained":  # only demands that have waited long enough call for a move
        if demands.wait_s is None or demands.wait_s.shape != demands.gpus.shape:
            raise ValueError("order='attained' needs Demands.wait_s, one per demand")
        with np.errstate(invalid="ignore"):
            long_wait = demands.wait_s[unmet] >= settings.wait_threshold_s
        unmet = unmet[long_wait]
    unmet_before = tuple(int(x) for x in unmet)
    candidates = [int(x) for x in np.flatnonzero(why == Why.CHOSEN)]
    moves: list[Move] = []
    if unmet.size == 0:
        why[candidates] = Why.NO_BENEFIT
        return MigrationPlan((), why, unmet_before)
    growth = np.where(np.isfinite(jobs.growth), jobs.growth, np.inf)
    remaining = np.where(np.isfinite(jobs.remaining_s), jobs.remaining_s, 0.0)
    att = _attained(jobs)
    # order="attained": most service first; "benefit": a constant, so the benefit decides.
    served_key = -np.where(np.isfinite(att), att, 0.0) if settings.order == "attained" else np.zeros(jobs.count)
    while candidates:
        evaluated = [(_evaluate(j, jobs, free, unmet, demands, settings), j) for j in candidates]
        useful = [(m, j) for (m, _), j in evaluated if m is not None]
        for (m, reason), j in evaluated:
            if m is None:
                why[j] = reason
        if not useful:
            break
        if len(moves) >= most:
            for _, j in useful:
                why[j] = Why.MOVE_LIMIT
            break
        best, bj = min(useful, key=lambda mj: (served_key[mj[1]], -mj[0].benefit_gpus, growth[mj[1]],
                                              -remaining[mj[1]], mj[1]))
        moves.append(best)
        why[bj] = Why.CHOSEN
        # Commit: the job's GPUs come back, the served demands take theirs, the job lands again
        # (kept raw: a node still short after the eviction stays short for the next candidate).
        freed = free + jobs.gpus_on[bj]
        served = np.asarray(best.served, dtype=np.int64)
        _, freed = demands.place_on(freed, served)
        for k, g in zip(best.relocation, jobs.gpus_on[bj][jobs.gpus_on[bj] > 0], strict=True):
            if k >= 0:
                freed[k] -= g
        free = freed
        unmet = np.setdiff1d(unmet, served).astype(np.int64)
        candidates = [j for _, j in useful if j != bj]
        if unmet.size == 0:
            for j in candidates:
                why[j] = Why.NO_BENEFIT
            break
    return MigrationPlan(tuple(moves), why, unmet_before)
