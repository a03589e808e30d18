"""Dynamic Resource Allocation objects (resource.k8s.io/v1) into the facts flowsched needs (sans I/O).

NVIDIA's DRA driver (driver `gpu.nvidia.com`, one pool per node) publishes each node's GPUs as
ResourceSlice devices: a whole GPU, or a MIG slice carrying its parent's `parentUUID` and its
`profile`. Pods get them through ResourceClaims, which kube-scheduler's DynamicResources plugin
allocates (`status.allocation`) and reserves for the pods using them (`status.reservedFor`).
DeviceClasses name what a request asks for, and (KEP-5004) may map an extended resource name
onto DRA devices. See DESIGN.md §9 and docs/dra.md.

Everything here reads plain dicts once, at watch time; dra_book.py keeps the parsed objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from extender.snapshot.objects import ObjectError, parse_quantity

DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaims")  # watched beside nodes and pods
GPU_DRIVER = "gpu.nvidia.com"
# The NVIDIA driver's classes; a class of another name counts as GPU or MIG when its CEL
# selectors name the driver (and, for MIG, the MIG device type).
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
# The claim kube-scheduler creates for a pod's DRA-backed extended resources (KEP-5004): the pod's
# own request counts those GPUs already, so the claim must not count them again.
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# KEP-5004: every DeviceClass also maps this name + its own name, with or without extendedResourceName.
IMPLICIT_EXTENDED = "deviceclass.resource.kubernetes.io/"
_PROFILE_IN_CEL = re.compile(r"""\.profile\s*==\s*["']([^"']+)["']""")


class DeviceKind(Enum):
    GPU = "gpu"  # a whole GPU
    MIG = "mig"  # a MIG slice of a GPU


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice of the GPU driver."""

    name: str
    uuid: str
    product: str = ""
    architecture: str = ""
    parent_uuid: str = ""  # MIG: the GPU it is a slice of
    profile: str = ""  # MIG: e.g. "1g.10gb"
    memory: float = 0.0  # bytes (capacity "memory")

    @property
    def kind(self) -> DeviceKind:
        return DeviceKind.MIG if self.parent_uuid or self.profile else DeviceKind.GPU


@dataclass(frozen=True)
class Slice:
    name: str
    node: str  # "" for a slice not bound to one node (none of the GPU driver's)
    driver: str
    pool: str
    devices: tuple[Device, ...]  # the GPU driver's devices only (other drivers' slices: none)


@dataclass(frozen=True)
class DeviceClassInfo:
    name: str
    kind: DeviceKind | None  # None: not a GPU class
    extended_resource: str = ""  # spec.extendedResourceName (KEP-5004), "" none
    profile: str = ""  # a MIG profile its selectors pin


@dataclass(frozen=True)
class DeviceRequest:
    name: str
    device_class: str
    count: int  # devices asked for (ExactCount); 1 for allocationMode All (at least one)
    all_devices: bool = False  # allocationMode: All
    profile: str = ""  # a MIG profile its CEL selectors pin


@dataclass(frozen=True)
class AllocatedDevice:
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class ClaimInfo:
    namespace: str
    name: str
    uid: str
    requests: tuple[DeviceRequest, ...]
    allocated: tuple[AllocatedDevice, ...]  # the GPU driver's devices in status.allocation
    node: str  # the allocation's node ("" unallocated, or not pinned to one node)
    reserved_for: tuple[str, ...]  # uids of the pods reserving it
    extended: bool = False  # kube-scheduler's claim for a pod's mapped extended resources

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _obj(v: Any, what: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ObjectError(f"{what} must be an object")
    return v


def _list(v: Any, what: str) -> Sequence[Any]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ObjectError(f"{what} must be a list")
    return v


def _name(meta: Mapping[str, Any]) -> str:
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("metadata.name missing")
    return name


def _attribute(attrs: Mapping[str, Any], key: str, driver: str) -> str:
    """A device attribute's value as text; the key bare or qualified by the driver's domain."""
    a = attrs.get(key)
    if a is None:
        a = attrs.get(f"{driver}/{key}")
    if not isinstance(a, Mapping):
        return ""
    for field_ in ("string", "version", "int", "bool"):
        if field_ in a:
            return str(a[field_])
    return ""


def parse_device(d: Mapping[str, Any], driver: str) -> Device:
    if not isinstance(d, Mapping):
        raise ObjectError("device must be an object")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("device name missing")
    attrs = _obj(d.get("attributes"), "device attributes")
    memory = _obj(_obj(d.get("capacity"), "device capacity").get("memory"), "capacity memory").get("value")
    return Device(
        name=name,
        uuid=_attribute(attrs, "uuid", driver),
        product=_attribute(attrs, "productName", driver),
        architecture=_attribute(attrs, "architecture", driver),
        parent_uuid=_attribute(attrs, "parentUUID", driver),
        profile=_attribute(attrs, "profile", driver),
        memory=parse_quantity(memory) if memory is not None else 0.0,
    )


def parse_resource_slice(obj: Mapping[str, Any], driver: str = GPU_DRIVER) -> Slice:
    if not isinstance(obj, Mapping):
        raise ObjectError("resourceslice must be an object")
    meta, spec = _obj(obj.get("metadata"), "metadata"), _obj(obj.get("spec"), "spec")
    name = _name(meta)
    slice_driver = str(spec.get("driver") or "")
    pool = _obj(spec.get("pool"), "spec.pool")
    devices = tuple(parse_device(d, driver) for d in _list(spec.get("devices"), "spec.devices")) \
        if slice_driver == driver else ()
    return Slice(name=name, node=str(spec.get("nodeName") or ""), driver=slice_driver,
                 pool=str(pool.get("name") or ""), devices=devices)


def _cel_texts(selectors: Any) -> list[str]:
    out = []
    for s in _list(selectors, "selectors"):
        expr = _obj(_obj(s, "selector").get("cel"), "selector cel").get("expression")
        if isinstance(expr, str):
            out.append(expr)
    return out


def _profile_of(cel: Sequence[str]) -> str:
    for text in cel:
        m = _PROFILE_IN_CEL.search(text)
        if m:
            return m.group(1)
    return ""


def parse_device_class(obj: Mapping[str, Any], driver: str = GPU_DRIVER) -> DeviceClassInfo:
    if not isinstance(obj, Mapping):
        raise ObjectError("deviceclass must be an object")
    meta, spec = _obj(obj.get("metadata"), "metadata"), _obj(obj.get("spec"), "spec")
    name = _name(meta)
    cel = _cel_texts(spec.get("selectors"))
    kind: DeviceKind | None = None
    if name == MIG_CLASS:
        kind = DeviceKind.MIG
    elif name == GPU_CLASS:
        kind = DeviceKind.GPU
    elif any(driver in text for text in cel):
        kind = DeviceKind.MIG if any("mig" in text.lower() for text in cel) else DeviceKind.GPU
    ext = spec.get("extendedResourceName")
    return DeviceClassInfo(name=name, kind=kind, extended_resource=ext if isinstance(ext, str) else "",
                           profile=_profile_of(cel))


def _request(r: Mapping[str, Any]) -> DeviceRequest:
    """One spec.devices.requests entry. v1 puts the class under `exactly`; a `firstAvailable`
    list (prioritized alternatives) is read as its first alternative, the one DRA prefers."""
    name = str(r.get("name") or "")
    exact = r.get("exactly")
    if exact is None:
        alternatives = _list(r.get("firstAvailable"), "firstAvailable")
        exact = alternatives[0] if alternatives else r  # v1beta1 kept the fields on the request
    exact = _obj(exact, "request")
    mode = str(exact.get("allocationMode") or "ExactCount")
    count = exact.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ObjectError(f"bad device count: {count!r}")
    return DeviceRequest(name=name, device_class=str(exact.get("deviceClassName") or ""),
                         count=1 if mode == "All" else count, all_devices=mode == "All",
                         profile=_profile_of(_cel_texts(exact.get("selectors"))))


def _allocation_node(allocation: Mapping[str, Any]) -> str:
    """The node an allocation is pinned to: its nodeSelector's `metadata.name In [node]` field."""
    sel = _obj(allocation.get("nodeSelector"), "nodeSelector")
    for term in _list(sel.get("nodeSelectorTerms"), "nodeSelectorTerms"):
        for f in _list(_obj(term, "term").get("matchFields"), "matchFields"):
            f = _obj(f, "matchField")
            values = _list(f.get("values"), "values")
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return ""


def parse_resource_claim(obj: Mapping[str, Any], driver: str = GPU_DRIVER) -> ClaimInfo:
    if not isinstance(obj, Mapping):
        raise ObjectError("resourceclaim must be an object")
    meta = _obj(obj.get("metadata"), "metadata")
    spec, status = _obj(obj.get("spec"), "spec"), _obj(obj.get("status"), "status")
    name = _name(meta)
    requests = tuple(_request(_obj(r, "request"))
                     for r in _list(_obj(spec.get("devices"), "spec.devices").get("requests"), "requests"))
    allocation = _obj(status.get("allocation"), "status.allocation")
    results = _list(_obj(allocation.get("devices"), "allocation.devices").get("results"), "results")
    allocated = tuple(AllocatedDevice(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
                      for r in map(lambda x: _obj(x, "result"), results) if r.get("driver") == driver)
    reserved = tuple(str(c.get("uid") or c.get("name") or "")
                     for c in map(lambda x: _obj(x, "reservedFor"), _list(status.get("reservedFor"), "reservedFor"))
                     if c.get("resource", "pods") == "pods")
    annotations = _obj(meta.get("annotations"), "annotations")
    return ClaimInfo(namespace=str(meta.get("namespace") or "default"), name=name,
                     uid=str(meta.get("uid") or ""), requests=requests, allocated=allocated,
                     node=_allocation_node(allocation), reserved_for=reserved,
                     extended=str(annotations.get(EXTENDED_CLAIM_ANNOTATION, "")).lower() == "true")
