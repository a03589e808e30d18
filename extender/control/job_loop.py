"""What the loops that plan on whole jobs (admission, migrator, elastic, remedies) share in the
service: their World from the snapshot, and each job's pods as that World had them, which is
what `bind()` later carries an action out on (the pods the plan saw, not the ones a later watch
event brings)."""

from __future__ import annotations

from typing import Any, ClassVar

from extender.control.runtime import ControlContext
from extender.control.world_builder import PodsOf, observe
from scoring.world import World


class JobLoop:
    gpu_pods_only: ClassVar[bool] = False  # the World lists only the jobs that hold or want GPUs
    ctx: ControlContext
    last: dict[str, Any]  # the loop's /debug view of its latest plan
    pods_of: PodsOf

    def world(self, now: float) -> World | None:
        observed = observe(self.ctx.state.read(), self.ctx.world, now, gpu_pods_only=self.gpu_pods_only,
                           last=self.last)
        if observed is None:
            return None
        self.pods_of = observed.pods_of
        return observed.world
