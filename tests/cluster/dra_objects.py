"""resource.k8s.io/v1 objects shaped as NVIDIA's DRA driver and kube-scheduler write them, as
plain dicts: the unit tests parse them, the e2e tests create them on a real apiserver.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

DRIVER = "gpu.nvidia.com"
API = "resource.k8s.io/v1"


def gpu_uuid(node: str, index: int) -> str:
    """The uuid the DCGM emulator gives GPU `index` of `node` (dcgm_emulator.py), so a test's
    exporter and its slices name the same devices."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/gpu{index}"))


def gpu_device(node: str, index: int, product: str = "NVIDIA A100-SXM4-80GB") -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu_uuid(node, index)},
            "productName": {"string": product},
            "architecture": {"string": "Ampere"},
            "index": {"int": index},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{index + 1:02x}:00.0"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def mig_device(node: str, gpu: int, slot: int, profile: str = "1g.10gb") -> dict[str, Any]:
    return {
        "name": f"gpu-{gpu}-mig-{profile.replace('.', '-')}-{slot}",  # a DNS label: no dots
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{gpu_uuid(node, gpu)[4:]}-{slot}"},
            "parentUUID": {"string": gpu_uuid(node, gpu)},
            "profile": {"string": profile},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": "10Gi"}},
    }


def resource_slice(node: str, devices: list[dict[str, Any]], *, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": API, "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


def gpu_slice(node: str, gpus: int = 4, product: str = "NVIDIA A100-SXM4-80GB") -> dict[str, Any]:
    return resource_slice(node, [gpu_device(node, i, product) for i in range(gpus)])


def device_class(name: str = "gpu.nvidia.com", *, mig: bool = False,
                 extended_resource: str | None = None) -> dict[str, Any]:
    kind = "mig" if mig else "gpu"
    spec: dict[str, Any] = {"selectors": [{"cel": {
        "expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def claim_spec(count: int = 1, device_class_name: str = "gpu.nvidia.com", *, all_devices: bool = False,
               profile: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        exactly["allocationMode"] = "ExactCount"
        exactly["count"] = count
    if profile:
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['{DRIVER}'].profile == '{profile}'"}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def resource_claim(name: str, namespace: str = "default", **spec_kw: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": claim_spec(**spec_kw)}


def claim_template(name: str, namespace: str = "default", **spec_kw: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": claim_spec(**spec_kw)}}


def allocated(claim: dict[str, Any], node: str, devices: list[str], pods: tuple[tuple[str, str], ...] = (), *,
              extended: bool = False) -> dict[str, Any]:
    """The claim as kube-scheduler leaves it: devices allocated on node, reserved for pods (name, uid)."""
    out = {**claim, "status": {
        "allocation": {
            "devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": node, "device": d}
                                    for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods],
    }}
    if extended:
        out["metadata"] = {**claim["metadata"],
                           "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}}
    return out
