"""How the candidate nodes share their GPUs, gathered as the arrays the placement pipeline reads.

scoring/pipeline.py judges a shared node by its physical GPUs (scoring/sharing.py) and gives
GPU pods the fragmentation headroom in physical GPUs (scoring/fragment_term.py); both need,
per candidate row, what only the snapshot knows: the node's physical GPU count and how many
replicas each physical GPU is advertised as. Nodes shared through MIG or HAMi get 0 replicas
(the fragmentation term leaves them their plain best-fit headroom: their slices and vGPUs do
not map to shares of one GPU the way replicas do). No I/O, no clock: called by the verbs in
extender/http/verbs.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from extender.snapshot.sharing import Mode, NodeSharing
from scoring.pipeline import SharedGpus


def replicas_per_gpu(sharing: NodeSharing) -> int:
    """Replicas per physical GPU of a shared node the fragmentation term models; 0 for MIG and HAMi."""
    if sharing.mode in (Mode.TIME_SLICING, Mode.MPS):
        return max(1, sharing.replicas_per_gpu)
    return 0


def shared_gpus(known: Sequence[str], shared: Mapping[str, NodeSharing]) -> SharedGpus | None:
    """The rows of `known` (the candidate rows' node names) whose node shares GPUs; None when
    none does."""
    rows: list[int] = []
    physical: list[float] = []
    replicas: list[int] = []
    for r, name in enumerate(known):
        sh = shared.get(name)
        if sh is not None:
            rows.append(r)
            physical.append(float(sh.physical_gpus) if sh.physical_gpus else np.nan)
            replicas.append(replicas_per_gpu(sh))
    if not rows:
        return None
    return SharedGpus(np.asarray(rows, dtype=np.int64), np.asarray(physical, dtype=np.float64),
                      np.asarray(replicas, dtype=np.int64))
