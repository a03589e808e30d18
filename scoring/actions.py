"""The control loops' actions, one frozen dataclass per kind, carried from plan to execution.

A loop's pure plan (scoring.kernel) returns these; both shells carry them out as they are (the
service: extender/control/, the simulator: benchmarks/sim/control.py) and render what they show
(/debug, Events, logs) from them, so nothing is turned into an untyped dict and parsed back.

Every action names `key` (what a shell backs off and deduplicates by), `kind` (the metric's
action label, as the service has always exported it), `target` (the object, for humans),
`reason` (why, in numbers) and `budgeted` (False for a notice that changes no workload: an
Event; it spends no budget but still waits for leadership and is skipped in a dry run).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar


def render(action: ControlAction) -> dict[str, Any]:
    """The action as /debug shows it: its fields, NaN as None (JSON has no NaN)."""
    out = asdict(action)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


class OnJob:
    """An action on a whole job: backed off, deduplicated and shown by the job's key."""

    job: str

    @property
    def key(self) -> str:
        return self.job

    @property
    def target(self) -> str:
        return self.job


class OnPod:
    """An action on one pod. `key_prefix` keeps a pod's notices and an action on the same pod
    apart in the shells' back-off and de-duplication."""

    pod: str
    key_prefix: ClassVar[str] = ""

    @property
    def key(self) -> str:
        return self.key_prefix + self.pod

    @property
    def target(self) -> str:
        return self.pod


# -- admission ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Release(OnJob):
    """Remove flowsched's scheduling gate from every gated pod of `job` (a whole gang at once)."""

    job: str
    pods: int  # gated pods released together
    gpus: float
    queue: int
    reason: str
    kind: ClassVar[str] = "admit"
    budgeted: ClassVar[bool] = True


@dataclass(frozen=True)
class Preempt(OnJob):
    """Evict `job` (every pod) so that `for_job` fits; carried out like a migration."""

    job: str
    for_job: str
    freed_gpus: float
    attained_gpu_s: float
    reason: str
    count: int = 1  # the job's flowsched-caused restarts including this one (the eviction mark's count)
    kind: ClassVar[str] = "preempt"
    budgeted: ClassVar[bool] = True


# -- migrator -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Evict(OnJob):
    """Evict every pod of `job` (it restarts from its checkpoint wherever kube-scheduler puts it)."""

    job: str
    origin: str  # the node it holds most GPUs on (scored down for its replacement)
    count: int  # this job's migrations including this one
    freed_gpus: float
    benefit_gpus: float
    served: tuple[str, ...]  # pending pods that fit once it is gone
    relocation: tuple[str | None, ...]
    reason: str
    attained_gpu_s: float = math.nan  # the job's attained service now (recorded in its eviction mark)
    kind: ClassVar[str] = "evict"
    budgeted: ClassVar[bool] = True


# -- elastic optimizer --------------------------------------------------------------------
@dataclass(frozen=True)
class Scale(OnJob):
    """Run `job` at `gpus` GPUs (`gpus // per_pod` pods) and global batch `batch_size`."""

    job: str
    gpus: int
    from_gpus: int
    batch_size: int  # 0: the job's own
    from_batch: int
    per_pod: int
    lo: int
    hi: int
    reason: str
    attained_gpu_s: float = math.nan  # the job's attained service at the plan (recorded with it)
    gpu_type: str = ""  # the GPU type its pods are to run on (a typed plan); "": any
    budgeted: ClassVar[bool] = True

    @property
    def kind(self) -> str:
        return "scale-up" if self.gpus > self.from_gpus else ("scale-down" if self.gpus < self.from_gpus
                                                              else "rebatch")

    @property
    def replicas(self) -> int:
        return self.gpus // max(1, self.per_pod)


# -- resizer ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resize(OnPod):
    """Set the CPU request of `container` of pod `pod` to `to_m` millicores in place (its limit
    keeps `limit_ratio` x the request when it has one)."""

    pod: str  # namespace/name
    uid: str
    job: str
    node: str
    container: str
    from_m: float
    to_m: float
    limit_ratio: float | None
    original_m: float  # its request when it started (written once, before the first resize)
    had_original: bool  # flowsched already recorded it
    reason: str
    budgeted: ClassVar[bool] = True

    @property
    def kind(self) -> str:
        return "resize-up" if self.to_m > self.from_m else "resize-down"


@dataclass(frozen=True)
class ResizeHeld(OnPod):
    """A notice: the kubelet holds a resize of `pod` back (`pending`: Infeasible or Deferred)."""

    pod: str
    uid: str
    container: str
    pending: str
    reason: str
    kind: ClassVar[str] = "resize_pending"
    budgeted: ClassVar[bool] = False
    key_prefix: ClassVar[str] = "pending/"


# -- idle GPUs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class IdleReport(OnPod):
    """A notice: pod `pod` held idle GPUs for the idle window (once per idle spell)."""

    pod: str
    gpus: float
    reason: str
    kind: ClassVar[str] = "idle_event"
    budgeted: ClassVar[bool] = False
    key_prefix: ClassVar[str] = "idle/"


@dataclass(frozen=True)
class IdleWarn(OnPod):
    """A notice: the opted-in idle notebook `pod` may be evicted warning_s after this is delivered."""

    pod: str
    reason: str
    kind: ClassVar[str] = "idle_warn"
    budgeted: ClassVar[bool] = False
    key_prefix: ClassVar[str] = "warn/"


@dataclass(frozen=True)
class Reclaim(OnPod):
    """Evict the warned idle notebook `pod` so waiting GPU pods get its GPUs."""

    pod: str
    reason: str
    kind: ClassVar[str] = "evict"
    budgeted: ClassVar[bool] = True
    key_prefix: ClassVar[str] = "evict/"


# -- remedies of bottleneck diagnosis (scoring.remedy) ---------------------------------------
@dataclass(frozen=True)
class GiveCpu(OnJob):
    """The resizer should raise the CPU of this job's opted-in pods (within their cpu-max)."""

    job: str
    reason: str
    kind: ClassVar[str] = "give-cpu"
    budgeted: ClassVar[bool] = True


@dataclass(frozen=True)
class Consolidate(OnJob):
    """Evict this checkpointable job so it restarts on `target_node`, which has room for all of it."""

    job: str
    target_node: str
    gpus: float
    from_nodes: int
    reason: str
    kind: ClassVar[str] = "consolidate"
    budgeted: ClassVar[bool] = True


@dataclass(frozen=True)
class AddPs(OnJob):
    """Run one more parameter server (TFJob PS replicas `from_ps` -> `ps`, within its flowsched.io/ps range)."""

    job: str
    ps: int
    from_ps: int
    reason: str
    kind: ClassVar[str] = "add-ps"
    budgeted: ClassVar[bool] = True


@dataclass(frozen=True)
class MoveReplica(OnJob):
    """Evict the slow replica of a checkpointable job (it is recreated where kube-scheduler puts it)."""

    job: str
    pod: str
    node: str
    reason: str
    kind: ClassVar[str] = "move-replica"
    budgeted: ClassVar[bool] = True


Remedy = GiveCpu | Consolidate | AddPs | MoveReplica
ControlAction = Release | Preempt | Evict | Scale | Resize | ResizeHeld | IdleReport | IdleWarn | Reclaim | Remedy
