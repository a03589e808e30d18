"""One extender verb = one function here: state + request in, answer out.

These functions gather what they need of the in-memory state into plain arrays and call the
pure policies in `scoring/` (filter and score: the one composition in scoring/pipeline.py);
they do no I/O, so the HTTP layer stays thin and the logic is testable without a server.
Unknown nodes (not in the snapshot yet) pass the filter and get the neutral score: the
extender must never block scheduling because its own view lags.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from extender.http.wire import ExtenderArgs, PreemptionArgs, Victims, WireError
from extender.snapshot.fragment import shared_gpus
from extender.snapshot.objects import (
    MIGRATED_FROM,
    WORKLOAD,
    ObjectError,
    PodInfo,
    Resources,
    controller_kind,
    job_key,
    named_requests,
    pod_claim_names,
    pod_requests,
)
from extender.snapshot.state import ClusterState, NodeView, StateView
from scoring.convergence import Phase
from scoring.nodes import BoolArray, IntArray
from scoring.pipeline import CandidateNodes, Stages, Verdict, explanation, filter_and_score, needs_demand_mix
from scoring.placement import MAX_SCORE, REJECT_TEXT, UNRESOLVABLE, PlacementSettings, PodDemand, Reject
from scoring.preemption import VictimArrays, preferred_candidates
from scoring.workload import WorkloadClass, never_a_victim, workload_class

NEUTRAL_SCORE = MAX_SCORE // 2

log = logging.getLogger("flowsched.decide")


@dataclass(frozen=True)
class Policy:
    placement: PlacementSettings
    stale_after_s: float
    gpu_resource: str = "nvidia.com/gpu"
    rank_margin: int = 0  # filter-only mode: nodes scored this far below the best still pass
    rank_keep: int = 0  # filter-only mode: at most this many of them pass (the best first); 0 = all


def _known_names(view: NodeView) -> list[str]:
    """The names of the view's known rows, in row order."""
    return [n for n, i in zip(view.names, view.idx.tolist(), strict=True) if i >= 0]


def _decide(state: ClusterState, view: NodeView, demand: PodDemand, cls: WorkloadClass, policy: Policy,
            stages: Stages, origin: str | None) -> Verdict:
    """scoring.pipeline's verdict on the view's known rows, from what it reads of the state
    gathered into plain arrays. The filter alone (Stages.FILTER) gathers neither the migration
    origin nor the demand mix: only the score reads them."""
    scored = stages != Stages.FILTER
    reader = state.read()
    shared = reader.shared()
    sharing = bool(shared) and demand.gpus > 0
    known = _known_names(view) if sharing or (scored and origin) else []
    candidates = CandidateNodes(
        nodes=view.arrays,
        telemetry=view.telemetry,
        origin=np.array([n == origin for n in known], dtype=np.bool_) if scored and origin else None,
        shared=shared_gpus(known, shared) if sharing else None,
        mix=reader.demand_mix() if scored and needs_demand_mix(policy.placement, cls, demand) else None,
        gather=view.take,
    )
    verdict = filter_and_score(candidates, demand, cls, policy.placement, stages)
    if verdict.fragment_error is not None:
        log.warning("fragmentation term skipped (plain best fit used): %s", verdict.fragment_error)
    return verdict


def _demand(pod: PodInfo) -> PodDemand:
    r = pod.requests
    return PodDemand(gpus=r.gpus, cpu=r.cpu_m, mem=r.mem)


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What the verbs read of the Pod kube-scheduler sends: its demand and its migration origin.

    parse_pod builds the whole PodInfo the snapshot keeps (times, labels, the migration mark as
    JSON); the verbs need only this, so they read only this (a third of parse_pod's time).
    """

    demand: PodDemand
    migrated_from: str | None
    meta: Mapping[str, Any]
    nominated: str | None = None  # status.nominatedNodeName: where it preempted (ClusterState.view)

    @property
    def workload(self) -> WorkloadClass:
        """Its flowsched.io/workload (annotation, else label), else its owner's default."""
        ann, labels = self.meta.get("annotations") or {}, self.meta.get("labels") or {}
        explicit = ann.get(WORKLOAD) or labels.get(WORKLOAD)
        return workload_class(explicit if isinstance(explicit, str) else None, controller_kind(self.meta))

    def origin(self, state: ClusterState, now: float) -> str | None:
        """The pod's own annotation, else the migrator's record for its job (the replacement pod
        a Job/operator creates carries no annotation of ours)."""
        if self.migrated_from:
            return self.migrated_from
        return state.read().migration_origin(job_key(self.meta), now) if state.read().has_migrations() else None

    def verdict(self, state: ClusterState, names: Sequence[str], policy: Policy, now: float,
                stages: Stages) -> tuple[NodeView, Verdict]:
        """This pod's verdict on the candidate names (their known rows) and the view it read."""
        view = state.read().view(names, now, policy.stale_after_s, self.nominated)
        origin = self.origin(state, now) if stages != Stages.FILTER else None
        return view, _decide(state, view, self.demand, self.workload, policy, stages, origin)


def _dra_gpus(reader: StateView, meta: Mapping[str, Any], spec: Mapping[str, Any], status: Any,
              gpu_resource: str) -> float:
    """The whole GPUs a pod asks for through DRA: its unallocated ResourceClaims', and (KEP-5004)
    its requests of extended resources DeviceClasses map onto GPUs, other than gpu_resource (read
    already). A pod with no claims on a cluster with no GPU DeviceClass costs one dict lookup and
    one attribute read."""
    gpus = 0.0
    claims = pod_claim_names(spec, status if isinstance(status, Mapping) else None)
    if claims:
        gpus += reader.claim_demand(str(meta.get("namespace") or "default"), claims).gpus
    mapped = reader.dra_extended_resources
    if mapped:
        gpus += named_requests(spec, mapped, skip=gpu_resource)
    return gpus


def ask_of(raw: Mapping[str, Any], gpu_resource: str, reader: StateView | None = None) -> PodAsk:
    """reader: the snapshot, to read what the pod asks for through DRA (None: only gpu_resource)."""
    try:
        meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            raise ObjectError("metadata and spec must be objects")
        r = pod_requests(spec, gpu_resource)
        if reader is not None:
            dra = _dra_gpus(reader, meta, spec, raw.get("status"), gpu_resource)
            if dra:
                r = Resources(r.gpus + dra, r.cpu_m, r.mem)
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        if not isinstance(annotations, Mapping) or not isinstance(labels, Mapping):
            # read later by workload and origin, outside this try: a list here was a 500 there
            raise ObjectError("metadata.annotations and metadata.labels must be objects")
        migrated_from = annotations.get(MIGRATED_FROM)
        status = raw.get("status")
        nominated = status.get("nominatedNodeName") if isinstance(status, Mapping) else None
    except (ObjectError, TypeError, ValueError, AttributeError) as e:
        raise WireError(f"Pod: {e}") from e
    # Each quantity is finite, but a sum of huge ones (containers + overhead) can overflow.
    if not (math.isfinite(r.gpus) and math.isfinite(r.cpu_m) and math.isfinite(r.mem)):
        raise WireError("Pod: resource requests overflow (sum of containers and overhead is not finite)")
    return PodAsk(PodDemand(gpus=r.gpus, cpu=r.cpu_m, mem=r.mem),
                  migrated_from if isinstance(migrated_from, str) else None, meta,
                  nominated if isinstance(nominated, str) and nominated else None)


@dataclass(frozen=True)
class FilterAnswer:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    unknown: int
    rejected: dict[str, int]  # nodes rejected per reason text, listed in the maps above or not


MemoKey = tuple[str, bytes]  # "uid/resourceVersion", the pod's JSON


class ScoreMemo:
    """Scores that filter computed for the nodes it passed, for the prioritize call that follows.

    kube-scheduler calls prioritize right after filter with the same pod and a subset of the
    nodes filter passed; answering it from this memo skips a second parse, gather and score
    (about half of the extender's time per pod). Entries are keyed by pod UID, resourceVersion
    and the pod as sent (a client may send other content under the same UID and
    resourceVersion), and live ttl_s: a changed pod or a late call is computed afresh.
    """

    def __init__(self, ttl_s: float = 2.0, size: int = 256) -> None:
        self.ttl_s, self.size = ttl_s, size
        self._entries: OrderedDict[MemoKey, tuple[float, dict[str, int]]] = OrderedDict()
        self.hits = 0

    @staticmethod
    def key(pod: Mapping[str, Any]) -> MemoKey | None:
        meta = pod.get("metadata") or {}
        uid, rv = meta.get("uid"), meta.get("resourceVersion")
        if not (uid and rv):
            return None
        try:  # the pod as sent, exactly (~2 µs to encode a typical pod; compared by the dict's hash)
            return (f"{uid}/{rv}", orjson.dumps(pod))
        except (TypeError, orjson.JSONEncodeError):
            return None  # not re-encodable (cannot come from JSON): no memo

    def put(self, key: MemoKey, now: float, scores: dict[str, int]) -> None:
        self._entries[key] = (now, scores)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def scores_for(self, key: MemoKey, now: float, names: Sequence[str]) -> list[int] | None:
        hit = self._entries.get(key)
        if hit is None or now - hit[0] > self.ttl_s:
            return None
        scores = list(map(hit[1].get, names))
        if None in scores:
            return None
        self.hits += 1
        return scores  # type: ignore[return-value]  # None was ruled out just above


_REJECTS = tuple(r for r in Reject if r != Reject.OK)


def _rejected(reasons: IntArray) -> dict[Reject, int]:
    return _rejected_of(np.bincount(reasons, minlength=len(Reject)).tolist())


def _rejected_of(counts: list[int]) -> dict[Reject, int]:
    """The rejection counts from a bincount of the reasons (Reject.OK left out)."""
    return {r: counts[r] for r in _REJECTS if counts[r]}


def _rejections(names: Sequence[str], reasons: IntArray, ok: BoolArray, rejected: Mapping[Reject, int]
                ) -> tuple[dict[str, str], dict[str, str]]:
    """FailedNodes and FailedAndUnresolvableNodes, one dict.fromkeys per reject reason."""
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if not rejected:
        return failed, unresolvable
    # Vectorised by reason code: a per-node Python loop cost ~10 ms at 5,000 nodes.
    name_arr = np.asarray(names, dtype=object)
    for reject in rejected:
        target = unresolvable if reject in UNRESOLVABLE else failed
        target.update(dict.fromkeys(name_arr[reasons == reject].tolist(), REJECT_TEXT[reject]))
    return failed, unresolvable


def _passed(names: Sequence[str], keep: BoolArray) -> list[str]:
    # Indexing the kept positions beats compress() over every name when few pass (ranked).
    return _passed_at(names, np.flatnonzero(keep))


def _passed_at(names: Sequence[str], positions: IntArray) -> list[str]:
    return list(map(names.__getitem__, positions.tolist()))


def decide_filter(state: ClusterState, args: ExtenderArgs, policy: Policy, now: float,
                  memo: ScoreMemo | None = None) -> FilterAnswer:
    ask = ask_of(args.pod, policy.gpu_resource, state.read())
    names = args.names
    key = ScoreMemo.key(args.pod) if memo is not None else None
    # With a memo, the scores too: the prioritize call that follows is answered from it.
    view, verdict = ask.verdict(state, names, policy, now, Stages.FILTER if key is None else Stages.BOTH)
    assert verdict.reason is not None  # filter stages always give reasons
    reasons = np.zeros(len(names), dtype=np.int64)
    known = view.idx >= 0
    reasons[known] = verdict.reason
    ok = reasons == Reject.OK
    passed = _passed(names, ok)
    rejected = _rejected(reasons)
    failed, unresolvable = _rejections(names, reasons, ok, rejected)
    if memo is not None and key is not None and verdict.terms is not None:
        scores = np.full(len(names), NEUTRAL_SCORE, dtype=np.int64)
        scores[known] = verdict.terms.score
        memo.put(key, now, dict(zip(passed, scores[ok].tolist(), strict=True)))
    return FilterAnswer(passed, failed, unresolvable, int((~known).sum()), _texts(rejected))


def _texts(rejected: Mapping[Reject, int]) -> dict[str, int]:
    return {REJECT_TEXT[r]: n for r, n in rejected.items()}


def decide_filter_ranked(state: ClusterState, args: ExtenderArgs, policy: Policy, now: float) -> FilterAnswer:
    """Filter-only mode: the filter also ranks, in one call per pod (docs/hot-path.md).

    Of the nodes the filter passes, only those scored within policy.rank_margin of the best
    pass; scores are exactly decide_prioritize's, unknown nodes included (neutral). While some
    node passes, the rejected ones are counted but listed in neither failure map: kube-scheduler
    reads those maps only when no node passes (to explain the failure and to pick preemption
    candidates), and listing thousands of names cost both sides more than the ranking did.
    When none passes, every rejection is listed, exactly as decide_filter lists it.
    """
    ask = ask_of(args.pod, policy.gpu_resource, state.read())
    names = args.names
    # Only the feasible rows are scored (at 5,000 names about 40 % of them: 10 % less time).
    view, verdict = ask.verdict(state, names, policy, now, Stages.RANK)
    assert verdict.reason is not None and verdict.terms is not None and verdict.scored is not None
    known_reasons = verdict.reason
    unknown = len(names) - known_reasons.shape[0]
    known = view.idx >= 0 if unknown else None
    if known is None:
        reasons = known_reasons  # every name known: row i is name i
    else:
        reasons = np.zeros(len(names), dtype=np.int64)
        reasons[known] = known_reasons
    counts = np.bincount(reasons, minlength=len(Reject)).tolist()
    rejected = _rejected_of(counts)
    if not counts[Reject.OK]:  # no node passes (unknown nodes pass: none is unknown here)
        failed, unresolvable = _rejections(names, reasons, reasons == Reject.OK, rejected)
        return FilterAnswer([], failed, unresolvable, unknown, _texts(rejected))
    rows, row_scores = verdict.scored, verdict.terms.score
    if known is None:  # the passing rows are the names' positions; the best of them stay
        top = row_scores >= row_scores.max() - policy.rank_margin
        at, at_scores = rows[top], row_scores[top]
    else:
        ok = reasons == Reject.OK
        scores = np.full(len(names), NEUTRAL_SCORE, dtype=np.int64)
        scores[np.flatnonzero(known)[rows]] = row_scores
        at = np.flatnonzero(ok & (scores >= scores[ok].max() - policy.rank_margin))
        at_scores = scores[at]
    if 0 < policy.rank_keep < at.size:  # the best first, ties in kube-scheduler's order
        at = np.sort(at[np.argsort(-at_scores, kind="stable")[: policy.rank_keep]])
    return FilterAnswer(_passed_at(names, at), {}, {}, unknown, _texts(rejected))


@dataclass(frozen=True)
class ScoreAnswer:
    names: Sequence[str]
    scores: list[int]
    unknown: int


def decide_prioritize(state: ClusterState, args: ExtenderArgs, policy: Policy, now: float,
                      memo: ScoreMemo | None = None) -> ScoreAnswer:
    names = args.names
    key = ScoreMemo.key(args.pod) if memo is not None else None
    if memo is not None and key is not None:
        remembered = memo.scores_for(key, now, names)
        if remembered is not None:
            # Unknown candidates are counted and logged on every prioritize call, memo or not.
            return ScoreAnswer(names, remembered, state.read().count_unknown(names))
    view, verdict = ask_of(args.pod, policy.gpu_resource, state.read()).verdict(state, names, policy, now, Stages.SCORE)
    assert verdict.terms is not None  # Stages.SCORE always scores
    scores = np.full(len(names), NEUTRAL_SCORE, dtype=np.int64)
    known = view.idx >= 0
    scores[known] = verdict.terms.score
    return ScoreAnswer(names, scores.tolist(), int((~known).sum()))


def decide_preempt(state: ClusterState, args: PreemptionArgs) -> dict[str, Victims]:
    """Keep kube-scheduler's candidate nodes whose victims are cheapest to disturb."""
    if not args.victims:
        return {}
    pods_by_uid = state.read().pods_by_uid(uid for v in args.victims.values() for uid in v.uids)
    # Inference pods are never victims of flowsched's preemption: drop the candidate nodes whose
    # victim set holds one (flowsched may drop candidates, never edit a set).
    nodes = [n for n in args.victims if not any(
        (p := pods_by_uid.get(uid)) is not None and never_a_victim(workload_class(p.workload, p.owner_kind))
        for uid in args.victims[n].uids)]
    nodes = _freeing_dra_gpus(state, args, nodes, pods_by_uid)
    if not nodes:
        return {}
    node_ix, ckpt, growing, prio = [], [], [], []
    for j, node in enumerate(nodes):
        for uid in args.victims[node].uids:
            p = pods_by_uid.get(uid)
            conv = state.read().convergence(p.job) if p else None
            node_ix.append(j)
            # A victim the snapshot no longer holds, or holds terminating, is already on its way
            # out (kube-scheduler's cache lags the watch): disturbing it costs nothing more.
            ckpt.append(p is None or p.checkpointable or p.terminating)
            growing.append(bool(conv and conv.phase == Phase.GROWING))
            prio.append(float(p.priority) if p else 0.0)
    victims = VictimArrays(
        node=np.asarray(node_ix, dtype=np.int64),
        checkpointable=np.asarray(ckpt, dtype=np.bool_),
        growing=np.asarray(growing, dtype=np.bool_),
        priority=np.asarray(prio, dtype=np.float64),
    )
    pdb = np.asarray([args.victims[n].pdb_violations for n in nodes], dtype=np.int64)
    keep = preferred_candidates(victims, pdb)
    return {n: args.victims[n] for n, k in zip(nodes, keep.tolist(), strict=True) if k}


def _freeing_dra_gpus(state: ClusterState, args: PreemptionArgs, nodes: list[str],
                      pods_by_uid: Mapping[str, PodInfo]) -> list[str]:
    """For a preemptor that asks GPUs through ResourceClaims: the candidate nodes whose victims
    free a GPU. A claim frees its devices only when every pod reserving it goes, so evicting one
    user of a shared claim frees nothing, and an eviction that frees no device earns no credit.
    A preemptor without claims (one dict lookup), or a node with a victim the snapshot does not
    hold (it may lag), keeps every candidate."""
    spec, status = args.pod.get("spec"), args.pod.get("status")
    claims = pod_claim_names(spec, status if isinstance(status, Mapping) else None) \
        if isinstance(spec, Mapping) else None
    if not claims:
        return nodes
    reader = state.read()
    meta = args.pod.get("metadata") or {}
    if reader.claim_demand(str(meta.get("namespace") or "default"), claims).gpus <= 0:
        return nodes
    kept = []
    for node in nodes:
        uids = args.victims[node].uids
        victims = [pods_by_uid.get(u) for u in uids]
        if any(v is None for v in victims):
            kept.append(node)
            continue
        known = [v for v in victims if v is not None]
        held = [f"{v.namespace}/{c}" for v in known for c in v.claims or ()]
        if any(v.requests.gpus > 0 for v in known) or reader.dra_frees(held, uids).get(node, 0) > 0:
            kept.append(node)
    return kept


def explain(state: ClusterState, pod: PodInfo, names: Sequence[str], policy: Policy, now: float
            ) -> list[dict[str, Any]]:
    """Per node: filter verdict and the score with its terms (for /debug/explain)."""
    view = state.read().view(names, now, policy.stale_after_s)
    demand = _demand(pod)
    if pod.claims:  # as ask_of reads it: what its unallocated ResourceClaims ask for
        extra = state.read().claim_demand(pod.namespace, pod.claims).gpus
        demand = PodDemand(gpus=demand.gpus + extra, cpu=demand.cpu, mem=demand.mem)
    cls = workload_class(pod.workload, pod.owner_kind)
    origin = pod.migrated_from or state.read().migration_origin(pod.job, now)
    rows = iter(explanation(_decide(state, view, demand, cls, policy, Stages.BOTH, origin)))
    out: list[dict[str, Any]] = []
    for name, i in zip(names, view.idx.tolist(), strict=True):
        if i < 0:
            out.append({"node": name, "known": False, "filter": "pass (unknown node)", "score": NEUTRAL_SCORE})
            continue
        row = next(rows)
        out.append({
            "node": name, "known": True,
            "filter": "pass" if row.reason == Reject.OK else REJECT_TEXT[row.reason],
            "score": row.score,
            "terms": {"headroom": row.headroom, "utilisation": row.utilisation,
                      "convergence": row.convergence, "penalty": row.penalty},
        })
    out.sort(key=lambda d: (d["filter"] != "pass" and not str(d["filter"]).startswith("pass"), -d["score"]))
    return out
