"""Kubernetes Events for control-loop actions: core/v1 Events, reason Flowsched*, reporting
component flowsched. Recording never raises: a failure is logged and counted, the loop goes on.

    recorder = EventRecorder(api_client, instance="flowsched-7c9-abcde", failures=counter)
    recorder.record(ObjectRef("team-a", "train-0", uid), "FlowschedMigrated", "evicted: ...")
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.kube import requests
from extender.kube.client import send
from extender.kube.responses import checked

log = logging.getLogger("flowsched.events")

COMPONENT = "flowsched"
MAX_MESSAGE = 1024  # the API rejects longer notes in events.k8s.io; keep core/v1 to the same


@dataclass(frozen=True)
class ObjectRef:
    namespace: str
    name: str
    uid: str = ""
    kind: str = "Pod"
    api_version: str = "v1"


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(obj: ObjectRef, reason: str, message: str, *, type_: str, action: str, instance: str,
               now: datetime) -> dict[str, Any]:
    if not reason.startswith("Flowsched"):
        raise ValueError(f"event reason {reason!r} must start with 'Flowsched'")
    if type_ not in ("Normal", "Warning"):
        raise ValueError(f"event type must be Normal or Warning, not {type_!r}")
    involved: dict[str, Any] = {"kind": obj.kind, "apiVersion": obj.api_version, "namespace": obj.namespace,
                                "name": obj.name}
    if obj.uid:
        involved["uid"] = obj.uid
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{obj.name}.{secrets.token_hex(8)}", "namespace": obj.namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "action": action,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": _ts(now), "lastTimestamp": _ts(now), "eventTime": _micro(now),
        "count": 1,
    }


class EventRecorder:
    def __init__(self, api_client: Any, instance: str, failures: _Counter | None = None,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api_client = api_client
        self.instance, self.failures, self.wall = instance, failures, wall
        self.recorded = 0
        self.failed = 0

    def record(self, obj: ObjectRef, reason: str, message: str, *, type_: str = "Normal",
               action: str = "Flowsched") -> bool:
        """True when the apiserver accepted the Event; never raises for API failures."""
        body = event_body(obj, reason, message, type_=type_, action=action, instance=self.instance,
                          now=self.wall())
        req = requests.create_event(obj.namespace, body)
        try:
            checked(req, send(self.api_client, req, timeout_s=10))
        except Exception as e:
            self.failed += 1
            if self.failures is not None:
                self.failures.inc()
            log.warning("could not record %s event on %s/%s: %s", reason, obj.namespace, obj.name, e)
            return False
        self.recorded += 1
        log.info("event %s on %s/%s: %s", reason, obj.namespace, obj.name, message)
        return True


class LogRecorder:
    """A recorder for runs without a cluster: the event goes to the log only."""

    def __init__(self) -> None:
        self.events: list[tuple[ObjectRef, str, str]] = []

    def record(self, obj: ObjectRef, reason: str, message: str, *, type_: str = "Normal",
               action: str = "Flowsched") -> bool:
        event_body(obj, reason, message, type_=type_, action=action, instance="log", now=datetime.now(UTC))
        self.events.append((obj, reason, message))
        log.info("event %s on %s/%s: %s", reason, obj.namespace, obj.name, message)
        return True


class Recorder(Protocol):
    def record(self, obj: ObjectRef, reason: str, message: str, *, type_: str = "Normal",
               action: str = "Flowsched") -> bool: ...
