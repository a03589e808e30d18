"""GPU telemetry joined to DRA devices by uuid (DCGM exporter's `UUID` label), sans I/O.

DCGM labels each series with its node's hostname and the GPU's UUID. On a DRA cluster the
ResourceSlices say, authoritatively, which node publishes which uuid and which claim holds it,
so two things the labels alone miss are recovered here:
- series filed under a hostname that is not a Kubernetes node name go to the node whose slices
  publish their GPUs (when all of them point at one node that has no series of its own);
- a pod using ResourceClaims is attributed the GPUs its claims hold, where the exporter did not
  map it to a pod (dcgm-exporter maps DRA devices only with KUBERNETES_ENABLE_DRA, with gaps),
  so the idle loop and /debug read its utilisation as they read a device-plugin pod's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace

from extender.telemetry.source import TelemetryReading


def join_by_uuid(reading: TelemetryReading, known_nodes: Collection[str], device_nodes: Mapping[str, str],
                 pod_gpus: Mapping[str, tuple[str, ...]]) -> TelemetryReading:
    """reading with its nodes renamed and its pods attributed through DRA devices.

    known_nodes: the snapshot's node names; device_nodes: uuid -> node, from the ResourceSlices;
    pod_gpus: "namespace/name" -> uuids of the GPUs its claims hold."""
    renamed: dict[str, str] = {}
    for name in reading.nodes:
        if name in known_nodes:
            continue
        targets = {device_nodes.get(u) for u, (n, _g) in reading.uuids.items() if n == name}
        if len(targets) == 1:
            target = next(iter(targets))
            if target is not None and target in known_nodes and target not in reading.nodes:
                renamed[name] = target
    nodes = {renamed.get(n, n): t for n, t in reading.nodes.items()} if renamed else reading.nodes
    uuids = {u: (renamed.get(n, n), g) for u, (n, g) in reading.uuids.items()} if renamed else reading.uuids
    pods = {p: tuple((renamed.get(n, n), g) for n, g in where) for p, where in reading.pods.items()}
    pod_util = dict(reading.pod_util)
    for key, gpu_uuids in pod_gpus.items():
        if key in pods:
            continue  # the exporter's own attribution stands
        where = tuple(sorted(uuids[u] for u in gpu_uuids if u in uuids))
        if not where:
            continue
        pods[key] = where
        vals = [v for n, g in where if g < len(nodes[n].util_pct) and not math.isnan(v := nodes[n].util_pct[g])]
        if vals:
            pod_util[key] = sum(vals) / len(vals)
    return replace(reading, nodes=nodes, pods=pods, pod_util=pod_util, uuids=uuids)
