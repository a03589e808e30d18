"""Evicting a whole job, the one way the control loops stop running work (the migrator's moves
and admission's preemptions alike): re-check every pod's opt-in, mark the pods (the
flowsched.io/migration annotation every replica's pod watch turns into the job's record: origin,
count, attained service), evict through policy/v1 Eviction (PodDisruptionBudgets apply; a 429 is
a TemporaryError, never forced), withdraw the mark when refused, one Event per evicted pod."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from extender.control.errors import PermanentError, TemporaryError
from extender.control.events import ObjectRef, Recorder
from extender.control.kube_actions import EVICTED, KubeActions
from extender.k8s_objects import EVICTED_FROM, MIGRATION, PodInfo

log = logging.getLogger("flowsched.eviction")

GONE = "gone"


def _checkpointable(p: PodInfo) -> str | None:
    return None if p.checkpointable else f"{p.key} is not annotated flowsched.io/checkpointable=true"


def evict_job(state: Any, actions: KubeActions | None, recorder: Recorder, key: str,
              pods: Sequence[Mapping[str, Any]], mark: Mapping[str, Any] | None, reason: str, event_reason: str,
              message: str, refusal: Callable[[PodInfo], str | None] = _checkpointable) -> list[PodInfo]:
    """The pods evicted (empty: the job was already gone). Raises TemporaryError/PermanentError.
    refusal: why a pod, read fresh from the snapshot, may not be evicted (None: it may); by
    default its checkpointable opt-in. mark None: no migration mark (the pod does not move, it
    gives its GPUs back, e.g. an idle notebook)."""
    if actions is None:
        raise PermanentError("no cluster: the loop can only plan")
    targets: list[PodInfo] = []
    for ref in pods:
        current = state.pod(ref["uid"])
        # The last line of defence: never evict a pod that has not opted in, whatever the plan.
        if current is None:
            continue
        why = refusal(current)
        if why is not None:
            raise PermanentError(why)
        if current.terminating:
            continue
        targets.append(current)
    if not targets:
        return []
    text = json.dumps(dict(mark)) if mark is not None else None
    evicted: list[PodInfo] = []
    for p in targets:
        if text is not None and not actions.annotate_pod(p.namespace, p.name, {MIGRATION: text, EVICTED_FROM: p.node}):
            continue
        try:
            outcome = actions.evict(p.namespace, p.name, p.uid)
        except (TemporaryError, PermanentError):
            try:  # refused (a PDB, ...): withdraw the mark so cooldown and counts stay true
                if text is not None:
                    actions.annotate_pod(p.namespace, p.name, {MIGRATION: None, EVICTED_FROM: None})
            except (TemporaryError, PermanentError) as e2:
                log.warning("could not withdraw the migration mark of %s: %s", p.key, e2)
            if evicted:
                log.warning("%s: evicted %d of %d pods before a refusal", key, len(evicted), len(targets))
            raise
        if outcome == EVICTED:
            evicted.append(p)
            recorder.record(ObjectRef(p.namespace, p.name, p.uid), event_reason,
                            f"Evicted from {p.node} {message}: {reason}", action="Evict")
    return evicted
