"""Evicting a whole job, the one way the control loops stop running work (the migrator's moves
and admission's preemptions alike): re-check every pod's opt-in, ask the apiserver whether every
pod may be evicted now (a dry-run eviction each, PodDisruptionBudgets apply; a refusal is raised
before anything is written), mark the pods (the flowsched.io/migration annotation every
replica's pod watch turns into the job's record: origin, count, attained service), evict through
policy/v1 Eviction (a 429 is a TemporaryError, never forced), withdraw the mark when refused, one
Event per evicted pod.

A refusal after some pods went (a PDB that allows one disruption at a time passes every dry run
but refuses the second real eviction) is not an error: the result is *partial*, the pods that
went are reported (the caller counts them and the loop spends its budget), and each pod left
running gets a FlowschedPartialEviction Warning Event. Leadership is checked before every write
(`still_leader`): a replica that lost the Lease part-way stops at once; with pods already evicted
the outcome is "lost_leadership" (charged and counted), otherwise a LostLeadership error (nothing
evicted; a mark already written on a pod not yet evicted stays there, as no write follows the
loss)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.control.errors import LeaderGuard
from extender.control.events import ObjectRef, Recorder
from extender.control.kube_actions import EVICTED, KubeActions
from extender.control.loop import PodRef
from extender.control.mark_store import MarkStore
from extender.kube.errors import LostLeadership, PermanentError, TemporaryError
from extender.snapshot.objects import EVICTED_FROM, MIGRATION, PodInfo

log = logging.getLogger("flowsched.eviction")

GONE = "gone"
PARTIAL = "partial"
PARTIAL_REASON = "FlowschedPartialEviction"
LOST_LEADERSHIP = "lost_leadership"  # the loop's NOT_LEADER label


@dataclass(frozen=True)
class Eviction:
    """What evict_job did: the pods evicted and, when it stopped part-way, those left running."""

    evicted: tuple[PodInfo, ...] = ()
    left: tuple[PodInfo, ...] = ()  # not evicted after a refusal part-way (empty: the whole job went)
    why: str = ""  # why the rest were not evicted
    lost_leadership: bool = False  # stopped because this replica is no longer the leader

    @property
    def outcome(self) -> str:
        """The loop's outcome label: "evicted", "partial", "lost_leadership" (some pods went) or
        "gone" (nothing was evicted)."""
        if not self.evicted:
            return GONE
        if self.lost_leadership:
            return LOST_LEADERSHIP
        return PARTIAL if self.left else EVICTED


def _checkpointable(p: PodInfo) -> str | None:
    return None if p.checkpointable else f"{p.key} is not annotated flowsched.io/checkpointable=true"


def evict_job(state: Any, actions: KubeActions | None, recorder: Recorder, key: str,
              pods: Sequence[PodRef], mark: Mapping[str, Any] | None, reason: str, event_reason: str,
              message: str, *, still_leader: Callable[[], bool],
              refusal: Callable[[PodInfo], str | None] = _checkpointable,
              marks: MarkStore | None = None) -> Eviction:
    """Evicts the job's pods. Raises TemporaryError/PermanentError when nothing was evicted (a
    refusal, the dry runs' included); a refusal after some pods went returns a partial Eviction.
    An empty one: the job was already gone.
    refusal: why a pod, read fresh from the snapshot, may not be evicted (None: it may); by
    default its checkpointable opt-in. mark None: no migration mark (the pod does not move, it
    gives its GPUs back, e.g. an idle notebook). still_leader: checked before every write.
    marks: where the mark is saved once a pod carrying it was evicted (mark_store.py), so that it
    outlives the pods."""
    if actions is None:
        raise PermanentError("no cluster: the loop can only plan")
    targets: list[PodInfo] = []
    for ref in pods:
        current = state.read().pod(ref.uid)
        # The last line of defence: never evict a pod that has not opted in, whatever the plan.
        if current is None:
            continue
        why = refusal(current)
        if why is not None:
            raise PermanentError(why)
        if current.terminating:
            continue
        targets.append(current)
    # Before any write, the whole job: would the apiserver evict each pod now? (Each is checked
    # on its own, so a budget of one disruption passes them all; that case ends partial below.)
    targets = [p for p in targets if actions.check_evictable(p.namespace, p.name, p.uid) != GONE]
    if not targets:
        return Eviction()
    text = json.dumps(dict(mark)) if mark is not None else None
    guard = LeaderGuard(still_leader)
    evicted: list[PodInfo] = []
    i = 0
    try:
        for i, p in enumerate(targets):
            try:
                if text is not None:
                    guard(f"marking {p.key}")
                    if not actions.annotate_pod(p.namespace, p.name, {MIGRATION: text, EVICTED_FROM: p.node}):
                        continue
                guard(f"evicting {p.key}")
                outcome = actions.evict(p.namespace, p.name, p.uid)
            except LostLeadership:
                raise
            except (TemporaryError, PermanentError) as e:
                try:  # refused (a PDB, ...): withdraw the mark so cooldown and counts stay true
                    if text is not None:
                        guard(f"withdrawing the mark of {p.key}")
                        actions.annotate_pod(p.namespace, p.name, {MIGRATION: None, EVICTED_FROM: None})
                except LostLeadership:
                    log.warning("not leader any more: the migration mark of %s stays", p.key)
                except (TemporaryError, PermanentError) as e2:
                    log.warning("could not withdraw the migration mark of %s: %s", p.key, e2)
                if not evicted:
                    raise
                return _partial(recorder, guard, key, evicted, targets[i:], len(targets), str(e), message)
            if outcome == EVICTED:
                evicted.append(p)
                guard(f"the {event_reason} Event of {p.key}")
                recorder.record(ObjectRef(p.namespace, p.name, p.uid), event_reason,
                                f"Evicted from {p.node} {message}: {reason}", action="Evict")
    except LostLeadership as e:
        log.warning("%s: %s (%d of %d pods evicted)", key, e, len(evicted), len(targets))
        if not evicted:
            raise
        left = tuple(q for q in targets[i:] if q not in evicted)
        return Eviction(tuple(evicted), left, str(e), lost_leadership=True)
    finally:
        if evicted and mark is not None and marks is not None and still_leader():
            _save_mark(marks, key, mark)  # not after losing the Lease: the new leader's watch sees the pods' mark
    return Eviction(tuple(evicted))


def _save_mark(marks: MarkStore, key: str, mark: Mapping[str, Any]) -> None:
    """The eviction is done: a store that cannot be written is logged, not raised (the pods carry
    the mark; only a replica started after they are gone would not learn it)."""
    try:
        marks.save(key, mark)
    except Exception as e:
        log.warning("%s: could not save its migration mark (a replica started after its pods are gone "
                    "would not know it): %s", key, e)


def _partial(recorder: Recorder, guard: LeaderGuard, key: str, evicted: list[PodInfo], left: Sequence[PodInfo],
             total: int, why: str, message: str) -> Eviction:
    log.warning("%s: evicted %d of %d pods, then refused: %s", key, len(evicted), total, why)
    for q in left:
        try:
            guard(f"the {PARTIAL_REASON} Event of {q.key}")
        except LostLeadership as e:
            return Eviction(tuple(evicted), tuple(left), f"{why}; {e}", lost_leadership=True)
        recorder.record(ObjectRef(q.namespace, q.name, q.uid), PARTIAL_REASON,
                        f"{len(evicted)} of {total} pods of {key} were evicted {message}, then an eviction was "
                        f"refused ({why}); this pod runs on, the job is partly evicted", type_="Warning",
                        action="Evict")
    return Eviction(tuple(evicted), tuple(left), why)
