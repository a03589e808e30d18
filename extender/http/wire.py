"""kube-scheduler's extender/v1 JSON, both directions (sans I/O).

The Go structs have no json tags, so keys are Go field names; Go decodes them
case-insensitively, so we accept any casing and always reply in the exact Go spelling.
Source: k8s.io/kube-scheduler/extender/v1/types.go (DESIGN.md §2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import add
from typing import Any

import orjson


class WireError(ValueError):
    """The request does not have extender/v1's shape; the message names the field."""


class WireTooLarge(WireError):
    """More candidates or victims than kube-scheduler sends: answered 413, before any work."""


# What kube-scheduler sends in names mode (nodeCacheCapable: true), with headroom: Kubernetes
# supports 5,000 nodes, and the body limit is sized for 10,000 (docs/hardening.md). Preemption
# offers max(100, 10%) of the nodes by default (500 at 5,000) with at most the kubelet's default
# 110 pods each. Past these a call's work (385 ms for 180,000 victims, issue 33 finding 5) is
# refused, not done.
MAX_CANDIDATE_NODES = 10_000
MAX_PREEMPT_VICTIMS = 60_000


def _get_ci(obj: Mapping[str, Any], name: str) -> Any:
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: Sequence[str] | None  # names mode (nodeCacheCapable)
    nodes: Sequence[Mapping[str, Any]] | None  # full-Node mode: the NodeList items

    @property
    def names(self) -> list[str]:
        if self.node_names is not None:
            return list(self.node_names)
        return [str(n["metadata"]["name"]) for n in self.nodes or []]


def _require_object(v: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise WireError(f"{field}: expected an object")
    return v


def _parse_pod(body: Mapping[str, Any]) -> Mapping[str, Any]:
    pod = _require_object(_get_ci(body, "Pod"), "Pod")
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise WireError("Pod.metadata.name: expected a string")
    return pod


def _all_str(items: list[Any]) -> bool:
    # str.join type-checks every item in C: 4x faster than set(map(type, ...)) at 5,000 names.
    try:
        "".join(items)
    except TypeError:
        return False
    return True


def parse_extender_args(body: Any) -> ExtenderArgs:
    body = _require_object(body, "ExtenderArgs")
    pod = _parse_pod(body)
    names = _get_ci(body, "NodeNames")
    nodes = _get_ci(body, "Nodes")
    node_names: list[str] | None = None
    node_items: list[Mapping[str, Any]] | None = None
    if names is not None:
        if not isinstance(names, list) or not _all_str(names):
            raise WireError("NodeNames: expected a list of strings")
        if len(names) > MAX_CANDIDATE_NODES:
            raise WireTooLarge(f"NodeNames: {len(names)} names, more than {MAX_CANDIDATE_NODES}")
        node_names = names
    elif nodes is not None:
        items = _require_object(nodes, "Nodes").get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError("Nodes.items: expected a list")
        if len(items) > MAX_CANDIDATE_NODES:
            raise WireTooLarge(f"Nodes.items: {len(items)} nodes, more than {MAX_CANDIDATE_NODES}")
        for i, item in enumerate(items):
            meta = item.get("metadata") if isinstance(item, Mapping) else None
            if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
                raise WireError(f"Nodes.items[{i}].metadata.name: expected a string")
        node_items = items
    else:
        node_names = []  # kube-scheduler never sends neither, but an empty list is the honest reading
    return ExtenderArgs(pod=pod, node_names=node_names, nodes=node_items)


@dataclass(frozen=True)
class Victims:
    uids: Sequence[str]
    pods: Sequence[Mapping[str, Any]]  # full pods when sent in full form, else empty
    pdb_violations: int


@dataclass(frozen=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    victims: Mapping[str, Victims]
    meta_form: bool


def _parse_victims(node: str, v: Any, full: bool) -> Victims:
    field = f"{'NodeNameToVictims' if full else 'NodeNameToMetaVictims'}[{node}]"
    v = _require_object(v, field)
    pods = _get_ci(v, "Pods") or []
    if not isinstance(pods, list):
        raise WireError(f"{field}.Pods: expected a list")
    pdb = _get_ci(v, "NumPDBViolations") or 0
    if not isinstance(pdb, int) or isinstance(pdb, bool) or not 0 <= pdb < 2**63:
        # Go's int64, and a count: beyond it was an OverflowError in the verb (answered as our bug)
        raise WireError(f"{field}.NumPDBViolations: expected an integer in 0..2**63-1")
    uids: list[str] = []
    for i, p in enumerate(pods):
        if not isinstance(p, Mapping):
            raise WireError(f"{field}.Pods[{i}]: expected an object")
        if full:
            meta = p.get("metadata")
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
        else:
            uid = _get_ci(p, "UID")
        if not isinstance(uid, str):
            raise WireError(f"{field}.Pods[{i}].{'metadata.uid' if full else 'UID'}: expected a string")
        uids.append(uid)
    return Victims(uids=uids, pods=pods if full else [], pdb_violations=pdb)


def parse_preemption_args(body: Any) -> PreemptionArgs:
    body = _require_object(body, "ExtenderPreemptionArgs")
    pod = _parse_pod(body)
    meta = _get_ci(body, "NodeNameToMetaVictims")
    full = _get_ci(body, "NodeNameToVictims")
    src, is_full = (meta, False) if meta is not None else (full, True)
    if src is None:
        return PreemptionArgs(pod=pod, victims={}, meta_form=True)
    src = _require_object(src, "NodeNameToVictims" if is_full else "NodeNameToMetaVictims")
    if len(src) > MAX_CANDIDATE_NODES:
        raise WireTooLarge(f"{len(src)} candidate nodes, more than {MAX_CANDIDATE_NODES}")
    total = sum(len(pods) for v in src.values() if isinstance(v, Mapping)
                and isinstance(pods := _get_ci(v, "Pods"), list))
    if total > MAX_PREEMPT_VICTIMS:
        raise WireTooLarge(f"{total} victims, more than {MAX_PREEMPT_VICTIMS}")
    victims = {str(node): _parse_victims(str(node), v, is_full) for node, v in src.items()}
    return PreemptionArgs(pod=pod, victims=victims, meta_form=not is_full)


# ---- replies (exact Go field names) ----

def filter_result(
    args: ExtenderArgs,
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    if args.nodes is not None:
        keep = set(passed)
        items = [n for n in args.nodes if n["metadata"]["name"] in keep]
        nodes: Any = {"metadata": {}, "items": items}
        names: Any = None
    else:
        nodes, names = None, list(passed)
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def host_priority_list(names: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    return [{"Host": n, "Score": int(s)} for n, s in zip(names, scores, strict=True)]


_SCORE_TAIL = tuple(f'","Score":{s}' for s in range(11))


def encode_host_priority_list(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """The JSON of host_priority_list, byte for byte, without building a dict per node.

    Node names are DNS-1123 subdomains (the apiserver enforces it) and need no escaping; the
    length check spots any name that did (or any non-ASCII one) and takes the general path.
    """
    if len(names) != len(scores):
        raise ValueError("names and scores differ in length")
    if not names:
        return b"[]"
    plain = len(orjson.dumps(names)) == sum(map(len, names)) + 3 * len(names) + 1
    if not plain or min(scores) < 0 or max(scores) > 10:
        return orjson.dumps(host_priority_list(names, scores))
    body = '},{"Host":"'.join(map(add, names, map(_SCORE_TAIL.__getitem__, scores)))
    return ('[{"Host":"' + body + "}]").encode()


def preemption_result(kept: Mapping[str, Victims]) -> dict[str, Any]:
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in v.uids], "NumPDBViolations": v.pdb_violations}
            for node, v in kept.items()
        }
    }
