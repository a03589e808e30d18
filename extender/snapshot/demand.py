"""The demand mix of the fragmentation term (extender/snapshot/fragment.py), learnt from every
GPU pod the watch sees, once per pod.

DemandBook takes no lock: ClusterState (state.py) calls it under its own and is its only writer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType

from extender.snapshot.objects import NodeInfo, PodInfo
from extender.snapshot.sharing import Mode, NodeSharing
from scoring.fragment_term import pod_kind
from scoring.fragmentation import DemandMix, DemandMixLearner, PodKind
from scoring.placement import PlacementSettings


class DemandBook:
    def __init__(self, placement: PlacementSettings) -> None:
        p = placement
        self._learner = DemandMixLearner(p.fragment_popularity, p.fragment_refresh_every,
                                         p.fragment_weight_exponent, p.fragment_cpu_only)
        self._learnt: set[str] = set()  # uids counted already

    def learn(self, pod: PodInfo, node: NodeInfo | None, shared: Mapping[str, NodeSharing]) -> None:
        """Count the pod in the demand mix once: a GPU pod when first seen, a CPU-only pod once
        it is bound to a GPU node (it competes for that node's CPU, as in FGD's pod lists).
        node: the pod's node if the snapshot holds it; shared: the nodes that share GPUs."""
        if pod.uid in self._learnt:
            return
        if pod.requests.gpus <= 0:
            if self._learner.cpu_only and node is not None and node.allocatable.gpus > 0:
                kind = pod_kind(0.0, pod.requests.cpu_m, 1, cpu_only=True)
                if kind is not None:
                    self._learnt.add(pod.uid)
                    self._learner.observe(kind)
            return
        sharing = shared.get(pod.node) if pod.node else None
        if sharing is None and not pod.node and shared:
            counts: dict[int, int] = defaultdict(int)
            for sh in shared.values():
                if sh.mode in (Mode.TIME_SLICING, Mode.MPS):
                    counts[sh.replicas_per_gpu] += 1
            replicas = max(counts, key=lambda r: (counts[r], r)) if counts else 1
        elif sharing is not None and sharing.mode in (Mode.TIME_SLICING, Mode.MPS):
            replicas = sharing.replicas_per_gpu
        elif sharing is not None:
            return  # MIG or HAMi: not a share of one GPU the term models
        else:
            replicas = 1
        kind = pod_kind(pod.requests.gpus, pod.requests.cpu_m, replicas)
        if kind is not None:
            self._learnt.add(pod.uid)
            self._learner.observe(kind)

    def forget(self, uid: str) -> None:
        """A deleted pod: counted again if it comes back (its count in the mix stays)."""
        self._learnt.discard(uid)

    def mix(self) -> DemandMix:
        return self._learner.mix()

    def counts(self) -> Mapping[PodKind, float]:
        return MappingProxyType(dict(self._learner.counts))
