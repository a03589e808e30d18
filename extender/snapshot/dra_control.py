"""DRA GPUs as the control loops count GPUs: in pods' requests and nodes' allocatable.

The control loops (admission, migrator, elastic, idle, remedies) plan from the World, which knows
GPUs only as pods' requests and nodes' allocatable (scoring.world; the simulator's World has no
other kind). StateView.control_view folds the DRA GPUs into both, so the loops count them as they
count device-plugin GPUs and the kernel never learns where a GPU came from:

- A claim's GPUs are its pod's: the whole GPUs its allocation holds, or, unallocated, those it asks
  for. A claim is one allocation however many pods use it, so it is counted once, on one of its
  users (the first by name); what evicting a job frees is then the GPUs of the claims that only
  its own pods use. A claim used by pods of two jobs is no job's: evicting either frees nothing,
  so it earns no credit, as the preempt verb counts it (DraBook.frees).
- A node's GPUs are its device-plugin allocatable plus its DRA GPUs less those held by claims no
  pod above is given (shared across jobs, MIG slices, an allocation whose pods are gone): the
  loops can neither use nor free those, and free GPUs stay exact (allocatable - pods' requests).
- kube-scheduler's claim for a mapped `nvidia.com/gpu` request (KEP-5004) is left out: the pod's
  own request counts it already (dra_book.counted_by_pods).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from extender.snapshot.dra import ClaimInfo, Device, DeviceKind
from extender.snapshot.dra_book import FrozenDra, counted_by_pods, request_kind
from extender.snapshot.objects import NodeInfo, PodInfo


@dataclass(frozen=True)
class DraControl:
    pod_gpus: Mapping[str, float]  # pod uid -> DRA GPUs it holds or asks for
    node_gpus: Mapping[str, float]  # node -> DRA GPUs the loops may plan with
    # Unbound live pods naming a claim the snapshot has not seen: the claim informer can lag the
    # pods' (or the claim is created after its pod); until it arrives their demand is unknown.
    unseen: frozenset[str] = frozenset()
    # node -> its whole GPU devices' productName (the most common one): its GPU type where no
    # nvidia.com/gpu.product label names it (a node whose GPUs come only through DRA)
    node_products: Mapping[str, str] = field(default_factory=dict)

    def apply(self, pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...]
              ) -> tuple[tuple[PodInfo, ...], tuple[NodeInfo, ...]]:
        """pods and nodes with their DRA GPUs added to requests and allocatable (copies; the
        snapshot's own PodInfo and NodeInfo, which the verbs' columns are built from, stay as read)."""
        def pod(p: PodInfo) -> PodInfo:
            g = self.pod_gpus.get(p.uid, 0.0)
            if p.uid in self.unseen:
                p = dataclasses.replace(p, claims_unseen=True)
            return dataclasses.replace(p, requests=dataclasses.replace(p.requests, gpus=p.requests.gpus + g)) \
                if g else p

        def node(n: NodeInfo) -> NodeInfo:
            g = self.node_gpus.get(n.name, 0.0)
            a = n.allocatable
            if g:
                n = dataclasses.replace(n, allocatable=dataclasses.replace(a, gpus=a.gpus + g))
            product = self.node_products.get(n.name, "")
            return dataclasses.replace(n, gpu_product=product) if product and not n.gpu_product else n

        return tuple(map(pod, pods)), tuple(map(node, nodes))


def _live(p: PodInfo) -> bool:
    return p.phase not in ("Succeeded", "Failed")


def _node_of(dra: FrozenDra, c: ClaimInfo) -> str:
    """As DraBook._node_of: the allocation's node selector, else its pool's node."""
    if c.node:
        return c.node
    return next((n for a in c.allocated if (n := dra.pool_node.get(a.pool, ""))), "")


def control_gpus(dra: FrozenDra, pods: Sequence[PodInfo]) -> DraControl:
    """The DRA GPUs of pods and nodes as the loops count them. Read outside the state's lock: at
    20,000 claim pods this takes a few hundred ms, which the verbs must not wait for."""
    by_uid = {p.uid: p for p in pods}
    naming: dict[str, list[PodInfo]] = defaultdict(list)  # claim key -> live pods naming it in their spec
    for p in pods:
        if p.claims and _live(p):
            for name in p.claims:
                naming[f"{p.namespace}/{name}"].append(p)
    pod_gpus: dict[str, float] = defaultdict(float)
    counted: dict[str, set[str]] = defaultdict(set)  # node -> GPUs claims hold, as the node columns count them
    given: dict[str, set[str]] = defaultdict(set)  # node -> those of them some pod is given
    for c in dra.claims:
        if counted_by_pods(dra.classes, dra.pod_counted, c):
            continue
        node = _node_of(dra, c) if c.allocated else ""
        devices = dra.devices.get(node, {})
        whole: set[str] = set()
        for a in c.allocated:
            dev = devices.get(a.device)
            if dev is None:
                continue
            if dev.kind == DeviceKind.GPU:
                whole.add(dev.uuid or dev.name)
                counted[node].add(dev.uuid or dev.name)
            else:  # a MIG slice holds its GPU: it can no longer be given whole
                counted[node].add(dev.parent_uuid or dev.name)
        users = {p.uid: p for p in naming.get(c.key, ())}
        # A reserving pod the snapshot no longer holds (or finished) holds nothing any more: the
        # resourceclaim controller drops its reservation.
        for u in c.reserved_for:
            reserver = by_uid.get(u)
            if reserver is not None and _live(reserver):
                users[u] = reserver
        if not users or len({p.job for p in users.values()}) > 1:
            continue
        owner = min(users.values(), key=lambda p: p.key)
        if not c.allocated:
            pod_gpus[owner.uid] += float(sum(r.count for r in c.requests
                                             if request_kind(dra.classes, r)[0] == DeviceKind.GPU))
        elif whole and (not owner.node or owner.node == node):
            # An owner not bound yet (kube-scheduler writes the allocation before it binds the
            # pod) asks for them, as a device-plugin pod does until it is bound.
            pod_gpus[owner.uid] += len(whole)
            given[node] |= whole
    seen = {c.key for c in dra.claims}
    unseen = frozenset(p.uid for key, ps in naming.items() if key not in seen for p in ps if not p.node)
    node_gpus = {name: float(n.capacity - len(counted.get(name, set()) - given.get(name, set())))
                 for name, n in dra.nodes.items()}
    return DraControl(MappingProxyType(dict(pod_gpus)), MappingProxyType(node_gpus), unseen,
                      MappingProxyType(node_products(dra.devices)))


def node_products(devices: Mapping[str, Mapping[str, Device]]) -> dict[str, str]:
    """Each node's GPU product from its whole GPU devices' productName attribute: the most common
    one (ties: the first by name), so one odd device does not retype a node."""
    out: dict[str, str] = {}
    for node, devs in devices.items():
        counts = Counter(d.product for d in devs.values() if d.kind == DeviceKind.GPU and d.product)
        if counts:
            out[node] = min(counts, key=lambda p: (-counts[p], p))
    return out
