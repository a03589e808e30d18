"""The DRA GPUs of each node: its devices (from ResourceSlices), which claims hold which of them
(from ResourceClaims) and what a claim asks for (through DeviceClasses).

DraBook takes no lock: ClusterState (state.py) calls it under its own and is its only writer.
Each write returns the nodes whose counts changed, so the caller updates only their columns.
Counts are in whole GPUs, as the node columns count device-plugin GPUs: a GPU is used when a
claim holds it or any MIG slice of it (it can no longer be given whole). A claim is one
allocation however many pods reserve it, so a shared claim counts once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from extender.snapshot.dra import (
    GPU_CLASS,
    IMPLICIT_EXTENDED,
    MIG_CLASS,
    ClaimInfo,
    Device,
    DeviceClassInfo,
    DeviceKind,
    DeviceRequest,
    Slice,
)


@dataclass(frozen=True)
class DraNode:
    """One node's DRA GPUs. counted: the used GPUs the node columns add (claims kube-scheduler
    made for mapped extended resources left out: the pods' own requests count those)."""

    capacity: int = 0  # whole GPUs (a MIG-partitioned GPU counts as one)
    used: int = 0  # whole GPUs held by any claim, whole or through a slice
    counted: int = 0
    free_mig: Mapping[str, int] = field(default_factory=dict)  # profile -> free slices


@dataclass(frozen=True)
class ClaimDemand:
    """What a pod's unallocated claims ask for: whole GPUs and MIG slices by profile."""

    gpus: float = 0.0
    mig: Mapping[str, int] = field(default_factory=dict)
    claims: int = 0  # GPU claims it uses (allocated or not): it is a GPU pod when > 0


@dataclass(frozen=True)
class FrozenDra:
    """The book as the control view reads it (dra_control.py): shallow copies taken under the
    state's lock at C speed, read outside it (a node's device dict is replaced on change, never
    changed in place, so sharing it is safe)."""

    claims: tuple[ClaimInfo, ...]
    devices: Mapping[str, Mapping[str, Device]]  # node -> device name -> device
    pool_node: Mapping[str, str]
    classes: Mapping[str, DeviceClassInfo]
    nodes: Mapping[str, DraNode]
    pod_counted: str


def request_kind(classes: Mapping[str, DeviceClassInfo], request: DeviceRequest) -> tuple[DeviceKind | None, str]:
    """Whether a request asks for whole GPUs or MIG slices (None: neither), and the MIG profile."""
    c = classes.get(request.device_class)
    if c is not None:
        return c.kind, request.profile or c.profile
    builtin = {GPU_CLASS: DeviceKind.GPU, MIG_CLASS: DeviceKind.MIG}
    return builtin.get(request.device_class), request.profile


def counted_by_pods(classes: Mapping[str, DeviceClassInfo], pod_counted: str, c: ClaimInfo) -> bool:
    """Whether the pods' own requests count this claim's GPUs already: kube-scheduler's claim for a
    mapped extended resource that is the one the snapshot reads from pods (pod_counted)."""
    if not c.extended:
        return False
    for r in c.requests:
        cls = classes.get(r.device_class)
        if cls is None or cls.extended_resource != pod_counted:
            return False
    return True


class DraBook:
    def __init__(self, pod_counted_resource: str = "nvidia.com/gpu") -> None:
        # The extended resource the snapshot counts from pods' own requests (the device-plugin GPU
        # resource): a claim kube-scheduler made for it is not counted again.
        self._pod_counted = pod_counted_resource
        self._slices: dict[str, Slice] = {}
        self._slices_on: dict[str, set[str]] = defaultdict(set)  # node -> its slices' names
        self._classes: dict[str, DeviceClassInfo] = {}
        self._claims: dict[str, ClaimInfo] = {}  # "namespace/name"
        self._pool_node: dict[str, str] = {}  # the GPU driver's pools (one per node)
        self._devices: dict[str, dict[str, Device]] = {}  # node -> device name -> device
        self._claims_on: dict[str, set[str]] = defaultdict(set)  # node -> claim keys allocated there
        self._claim_node: dict[str, str] = {}  # claim key -> the node it is counted on
        self._unplaced: set[str] = set()  # allocated claims whose pool no slice has placed yet
        self._nodes: dict[str, DraNode] = {}
        self._uuids: dict[str, tuple[str, Device]] = {}  # device uuid -> (node, device)
        # Replaced, never changed in place: the verbs read it on every call (empty: no mapping).
        self._extended: frozenset[str] = frozenset()

    # ---- writes: each returns the nodes whose DraNode changed ----
    def upsert_slice(self, s: Slice) -> set[str]:
        old = self._slices.get(s.name)
        if old == s:
            return set()  # a resync or a status-only change
        if old is not None:
            self._slices_on[old.node].discard(s.name)
        self._slices[s.name] = s
        self._slices_on[s.node].add(s.name)
        return self._reindex_nodes({s.node} | ({old.node} if old else set()))

    def delete_slice(self, name: str) -> set[str]:
        old = self._slices.pop(name, None)
        if old is None:
            return set()
        self._slices_on[old.node].discard(name)
        return self._reindex_nodes({old.node})

    def upsert_class(self, c: DeviceClassInfo) -> set[str]:
        if self._classes.get(c.name) == c:
            return set()
        self._classes[c.name] = c
        return self._classes_changed()

    def delete_class(self, name: str) -> set[str]:
        if self._classes.pop(name, None) is None:
            return set()
        return self._classes_changed()

    def _classes_changed(self) -> set[str]:
        # KEP-5004: a class maps its extendedResourceName, and always its implicit name. Only
        # whole-GPU classes: a mapped MIG slice is not a whole GPU (docs/dra.md: not supported).
        self._extended = frozenset(
            name for x in self._classes.values() if x.kind == DeviceKind.GPU
            for name in (x.extended_resource, IMPLICIT_EXTENDED + x.name) if name)
        # Which extended-resource claims count depends on the classes' mapping.
        return self._recount({n for n, keys in self._claims_on.items()
                              if any(self._claims[k].extended for k in keys)})

    def _pods_count(self, c: ClaimInfo) -> bool:
        return counted_by_pods(self._classes, self._pod_counted, c)

    def upsert_claim(self, c: ClaimInfo) -> set[str]:
        old = self._claims.get(c.key)
        if old == c:
            return set()
        self._claims[c.key] = c
        touched = self._unplace(c.key)
        touched |= self._place(c)
        return self._recount(touched)

    def delete_claim(self, key: str) -> set[str]:
        if self._claims.pop(key, None) is None:
            return set()
        return self._recount(self._unplace(key))

    def replace_all(self, kind: str, objects: Iterable[object]) -> set[str]:
        """A relist of one kind: the listed objects become the whole truth for it."""
        touched: set[str] = set()
        items = list(objects)
        if kind == "resourceslices":
            keep = {s.name for s in items if isinstance(s, Slice)}
            for name in [n for n in self._slices if n not in keep]:
                touched |= self.delete_slice(name)
            for s in items:
                if isinstance(s, Slice):
                    touched |= self.upsert_slice(s)
        elif kind == "deviceclasses":
            keep = {c.name for c in items if isinstance(c, DeviceClassInfo)}
            for name in [n for n in self._classes if n not in keep]:
                self.delete_class(name)
            for c in items:
                if isinstance(c, DeviceClassInfo):
                    self.upsert_class(c)
        elif kind == "resourceclaims":
            keep = {c.key for c in items if isinstance(c, ClaimInfo)}
            for key in [k for k in self._claims if k not in keep]:
                touched |= self.delete_claim(key)
            for c in items:
                if isinstance(c, ClaimInfo):
                    touched |= self.upsert_claim(c)
        return touched

    def _place(self, c: ClaimInfo) -> set[str]:
        """Count an allocated claim on its node; one whose pool no slice has placed waits."""
        if not c.allocated and not c.node:
            return set()
        node = self._node_of(c)
        if not node:
            self._unplaced.add(c.key)
            return set()
        self._claims_on[node].add(c.key)
        self._claim_node[c.key] = node
        return {node}

    def _unplace(self, key: str) -> set[str]:
        self._unplaced.discard(key)
        node = self._claim_node.pop(key, None)
        if node is None:
            return set()
        self._claims_on[node].discard(key)
        return {node}

    def _node_of(self, c: ClaimInfo) -> str:
        """The node holding a claim's devices: its allocation's node selector, else its pool's node."""
        if c.node:
            return c.node
        for a in c.allocated:
            node = self._pool_node.get(a.pool)
            if node:
                return node
        return ""

    def _reindex_nodes(self, nodes: set[str]) -> set[str]:
        nodes.discard("")
        for node in nodes:
            devices: dict[str, Device] = {}
            for name in self._slices_on.get(node, ()):
                sl = self._slices[name]
                if sl.devices:
                    self._pool_node[sl.pool] = node
                    devices.update((d.name, d) for d in sl.devices)
            for d in self._devices.pop(node, {}).values():
                if d.uuid and self._uuids.get(d.uuid, ("",))[0] == node:
                    del self._uuids[d.uuid]
            if devices:
                self._devices[node] = devices
                self._uuids.update((d.uuid, (node, d)) for d in devices.values() if d.uuid)
        # A claim read before the slice of its pool: place it now.
        for key in list(self._unplaced):
            self._unplaced.discard(key)
            nodes |= self._place(self._claims[key])
        return self._recount(nodes)

    def _recount(self, nodes: set[str]) -> set[str]:
        changed = set()
        for node in nodes:
            new = self._count(node)
            if self._nodes.get(node, DraNode()) != new:
                changed.add(node)
                if new == DraNode():
                    self._nodes.pop(node, None)
                else:
                    self._nodes[node] = new
        return changed

    def _count(self, node: str) -> DraNode:
        devices = self._devices.get(node, {})
        whole = {d.uuid or d.name for d in devices.values() if d.kind == DeviceKind.GPU}
        parents = {d.parent_uuid for d in devices.values() if d.kind == DeviceKind.MIG and d.parent_uuid}
        used: set[str] = set()  # GPUs held, whole or through a slice
        counted: set[str] = set()
        held_whole: set[str] = set()
        held_slices: set[str] = set()
        for key in self._claims_on.get(node, ()):
            c = self._claims[key]
            pods_count = self._pods_count(c)
            for a in c.allocated:
                d = devices.get(a.device)
                if d is None:
                    continue
                if d.kind == DeviceKind.GPU:
                    gpu = d.uuid or d.name
                    held_whole.add(gpu)
                else:
                    gpu = d.parent_uuid or d.name
                    held_slices.add(d.name)
                used.add(gpu)
                if not pods_count:
                    counted.add(gpu)
        # A slice is free unless a claim holds it or its whole GPU (static MIG: slices of one GPU
        # do not overlap).
        free_mig: dict[str, int] = defaultdict(int)
        for d in devices.values():
            if d.kind == DeviceKind.MIG and d.name not in held_slices and d.parent_uuid not in held_whole:
                free_mig[d.profile] += 1
        return DraNode(capacity=len(whole | parents), used=len(used), counted=len(counted),
                       free_mig=MappingProxyType(dict(sorted(free_mig.items()))))

    # ---- reads ----
    def node(self, name: str) -> DraNode | None:
        return self._nodes.get(name)

    def has_gpus(self) -> bool:
        return bool(self._nodes)

    def nodes(self) -> Mapping[str, DraNode]:
        return MappingProxyType(dict(self._nodes))

    @property
    def extended_resources(self) -> frozenset[str]:
        """The extended resource names DeviceClasses map onto whole GPUs (KEP-5004): each GPU class's
        extendedResourceName and its implicit `deviceclass.resource.kubernetes.io/<class>`."""
        return self._extended

    def device(self, uuid: str) -> tuple[str, Device] | None:
        """(node, device) of a device uuid (DCGM exporter's UUID label)."""
        return self._uuids.get(uuid)

    def gpu_uuids(self, claim_key: str) -> tuple[str, ...]:
        """The physical GPUs a claim's allocation holds, by uuid (a MIG slice: its parent's, as DCGM
        labels a MIG instance's series with its GPU's UUID)."""
        c = self._claims.get(claim_key)
        if c is None or not c.allocated:
            return ()
        devices = self._devices.get(self._node_of(c), {})
        out = []
        for a in c.allocated:
            d = devices.get(a.device)
            if d is not None:
                u = d.uuid if d.kind == DeviceKind.GPU else d.parent_uuid
                if u and u not in out:
                    out.append(u)
        return tuple(out)

    def claim_count(self) -> int:
        return len(self._claims)

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._claims.get(f"{namespace}/{name}")

    def _kind(self, request: DeviceRequest) -> tuple[DeviceKind | None, str]:
        return request_kind(self._classes, request)

    def frozen(self) -> FrozenDra:
        return FrozenDra(tuple(self._claims.values()), dict(self._devices), dict(self._pool_node),
                         dict(self._classes), MappingProxyType(dict(self._nodes)), self._pod_counted)

    def demand(self, namespace: str, names: Iterable[str]) -> ClaimDemand:
        """What a pod's claims still ask for: an allocated claim asks for nothing more (its devices
        are counted on its node already, and kube-scheduler keeps its pods there)."""
        gpus = 0.0
        mig: dict[str, int] = defaultdict(int)
        claims = 0
        for name in names:
            c = self._claims.get(f"{namespace}/{name}")
            if c is None:
                continue
            kinds = [(r, *self._kind(r)) for r in c.requests]
            if any(k is not None for _r, k, _p in kinds):
                claims += 1
            if c.allocated:
                continue
            for r, kind, profile in kinds:
                if kind == DeviceKind.GPU:
                    gpus += r.count
                elif kind == DeviceKind.MIG:
                    mig[profile] += r.count
        return ClaimDemand(gpus=gpus, mig=MappingProxyType(dict(mig)), claims=claims)

    def frees(self, claim_keys: Iterable[str], leaving: set[str]) -> dict[str, int]:
        """node -> whole GPUs freed if the pods with uids `leaving` go: a claim frees its devices only
        when every pod reserving it is among them (a shared claim stays while one user remains)."""
        out: dict[str, int] = defaultdict(int)
        for key in claim_keys:
            c = self._claims.get(key)
            if c is None or not c.allocated or c.extended or not set(c.reserved_for) <= leaving:
                continue
            node = self._node_of(c)
            devices = self._devices.get(node, {})
            out[node] += len({d.uuid or d.name for a in c.allocated
                              if (d := devices.get(a.device)) is not None and d.kind == DeviceKind.GPU})
        return dict(out)
