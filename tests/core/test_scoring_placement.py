"""scoring.placement and scoring.preemption, on arrays built directly."""

import numpy as np

from scoring.nodes import nodes_from_columns
from scoring.placement import PlacementSettings, PodDemand, Reject, filter_nodes, score_nodes
from scoring.preemption import VictimArrays, preferred_candidates

NAN = np.nan
S = PlacementSettings()


def test_gpu_fit() -> None:
    n = nodes_from_columns([4, 4, 8, 0], [4, 1, 0, 0])
    v = filter_nodes(n, PodDemand(gpus=2), S)
    assert v.reason.tolist() == [Reject.INSUFFICIENT_GPU, 0, 0, Reject.INSUFFICIENT_GPU]
    assert filter_nodes(n, PodDemand(gpus=0), S).passed.all()


def test_saturation_is_per_gpu_and_unknown_is_never_saturated() -> None:
    util = [[99, 99, 99, 5], [99, 99, 99, 99], [NAN, NAN, NAN, NAN], [99, 99, NAN, NAN]]
    n = nodes_from_columns([4, 4, 4, 4], [0, 0, 0, 0], gpu_util=util)
    one = filter_nodes(n, PodDemand(gpus=1), S).reason.tolist()
    assert one == [0, Reject.GPU_SATURATED, 0, 0]  # the 4th node's missing samples might be idle GPUs
    two = filter_nodes(n, PodDemand(gpus=2), S).reason.tolist()
    assert two == [Reject.GPU_SATURATED, Reject.GPU_SATURATED, 0, 0]


def test_padding_beyond_gpu_count_is_not_an_idle_gpu() -> None:
    n = nodes_from_columns([2], [0], gpu_util=[[95, 95, NAN, NAN]])
    assert filter_nodes(n, PodDemand(gpus=1), S).reason.tolist() == [Reject.GPU_SATURATED]


def test_gpu_memory_check_optional() -> None:
    n = nodes_from_columns([2, 2], [0, 0], fb_free_mib=[[1000, 30000], [1000, 2000]])
    assert filter_nodes(n, PodDemand(gpus=1), S).passed.all()
    strict = PlacementSettings(min_fb_free_mib=16000)
    assert filter_nodes(n, PodDemand(gpus=1), strict).reason.tolist() == [0, Reject.INSUFFICIENT_GPU_MEMORY]


def test_scores_bounded_and_unknown_neutral() -> None:
    rng = np.random.default_rng(0)
    alloc = rng.integers(0, 9, 200).astype(float)
    used = np.minimum(alloc, rng.integers(0, 9, 200))
    util = np.where(rng.random((200, 8)) < 0.3, NAN, rng.random((200, 8)) * 100)
    n = nodes_from_columns(alloc, used, gpu_util=util, completing_gpus=np.where(rng.random(200) < .5, NAN, used / 2))
    for g in (0, 1, 3, 8):
        t = score_nodes(n, PodDemand(gpus=g, cpu=1000), S)
        assert t.score.dtype == np.int64 and ((t.score >= 0) & (t.score <= 10)).all()
        for term in (t.headroom, t.utilisation, t.convergence):
            assert np.isfinite(term).all() and ((term >= 0) & (term <= 1)).all()
    blank = nodes_from_columns([4], [2])
    t = score_nodes(blank, PodDemand(gpus=1), S)
    assert t.utilisation[0] == S.neutral and t.convergence[0] == S.neutral


def test_idle_gpus_and_finishing_neighbours_score_higher() -> None:
    n = nodes_from_columns([4, 4], [2, 2], gpu_util=[[90, 90, 90, 90], [10, 5, 0, 0]])
    s = score_nodes(n, PodDemand(gpus=1), S).score
    assert s[1] > s[0]
    n = nodes_from_columns([4, 4], [2, 2], completing_gpus=[0, 2])
    s = score_nodes(n, PodDemand(gpus=1), PlacementSettings(weight_headroom=0, weight_utilisation=0)).score
    assert s[1] > s[0]


def test_pack_vs_spread() -> None:
    n = nodes_from_columns([4, 4], [3, 0])
    packed = score_nodes(n, PodDemand(gpus=1), PlacementSettings(weight_utilisation=0, weight_convergence=0)).score
    spread = score_nodes(n, PodDemand(gpus=1), PlacementSettings(pack_gpus=False, weight_utilisation=0,
                                                                   weight_convergence=0)).score
    assert packed[0] > packed[1] and spread[1] > spread[0]


def test_origin_penalty() -> None:
    n = nodes_from_columns([4, 4], [0, 0])
    s = score_nodes(n, PodDemand(gpus=1), S, origin=np.array([True, False])).score
    assert s[0] < s[1]


def test_scale_invariance_of_gpu_util_units_not_assumed() -> None:
    # scores only depend on the k least busy GPUs: extra busy GPUs do not lower a node
    a = nodes_from_columns([8], [0], gpu_util=[[0, 0, 99, 99, 99, 99, 99, 99]])
    b = nodes_from_columns([2], [0], gpu_util=[[0, 0]])
    sa = score_nodes(a, PodDemand(gpus=2), S).utilisation
    sb = score_nodes(b, PodDemand(gpus=2), S).utilisation
    assert sa[0] == sb[0] == 1.0


def test_preemption_preference_tiers() -> None:
    v = VictimArrays(node=np.array([0, 1, 1, 2, 3]), checkpointable=np.array([False, True, True, True, True]),
                     growing=np.array([False, False, False, True, False]), priority=np.zeros(5))
    keep = preferred_candidates(v, np.array([0, 0, 0, 1]))
    # node 0: one non-checkpointable; node 1: two checkpointable; node 2: one growing; node 3: PDB violation
    assert keep.tolist() == [False, True, False, False]
    assert preferred_candidates(v, np.array([1, 1, 1, 1])).any()
    assert preferred_candidates(VictimArrays(np.array([], dtype=np.int64), np.array([], dtype=bool),
                                             np.array([], dtype=bool), np.array([])), np.array([], dtype=np.int64)
                                ).shape == (0,)


def test_without_telemetry_the_short_path_gives_the_same_verdicts_and_scores() -> None:
    """filter_nodes / score_nodes with telemetry=False (the extender's view found no fresh
    sample) skip the telemetry terms; every verdict and every term must be bit-identical."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        n, width = int(rng.integers(1, 40)), int(rng.integers(0, 9))
        alloc = rng.choice([0.0, 1.0, 2.0, 4.0, 8.0], n)
        used = np.minimum(alloc, rng.choice([0.0, 0.5, 1.0, 2.0, 3.0, 8.0], n))
        nodes = nodes_from_columns(alloc, used, cpu_alloc=rng.uniform(0, 64000, n), cpu_used=rng.uniform(0, 64000, n),
                                   gpu_util=np.full((n, width), NAN), fb_free_mib=np.full((n, width), NAN),
                                   completing_gpus=rng.choice([NAN, 0.0, 1.0], n))
        settings = PlacementSettings(neutral=float(rng.choice([0.5, 0.33, 0.1, 0.7])),
                                     min_fb_free_mib=float(rng.choice([0.0, 16000.0])),
                                     pack_gpus=bool(trial % 3))
        demand = PodDemand(gpus=float(rng.choice([0.0, 0.5, 1.0, 2.0, 3.0, 8.0])), cpu=4000.0)
        origin = rng.random(n) < 0.1 if trial % 2 else None
        full, short = filter_nodes(nodes, demand, settings), filter_nodes(nodes, demand, settings, telemetry=False)
        assert full.reason.tolist() == short.reason.tolist()
        a = score_nodes(nodes, demand, settings, origin)
        b = score_nodes(nodes, demand, settings, origin, telemetry=False)
        for field in ("score", "headroom", "utilisation", "convergence", "penalty"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), field


def test_combined_score_is_bit_identical_to_the_array_of_weights_form() -> None:
    """combined_score's plain-float weights and skipped zero penalty give exactly the bits of
    the form it replaced (a numpy array of weights, its sum, and `- penalty`)."""
    from scoring.placement import MAX_SCORE, combined_score

    rng = np.random.default_rng(11)
    for _ in range(500):
        n = int(rng.integers(1, 50))
        w = rng.choice([0.0, 0.1, 0.3, 0.5, 0.7, 1.0, 1e16], 3)
        s = PlacementSettings(weight_headroom=float(w[0]), weight_utilisation=float(w[1]),
                              weight_convergence=float(w[2]))
        h, u, c = rng.uniform(-1, 2, n), rng.uniform(0, 1, n), rng.uniform(0, 1, n)
        h[rng.random(n) < 0.1], u[rng.random(n) < 0.1] = NAN, -0.0
        p = np.where(rng.random(n) < 0.3, 3.0, 0.0)
        arr = np.array([s.weight_headroom, s.weight_utilisation, s.weight_convergence])
        total = float(arr.sum()) or 1.0
        for util in (u, 0.5):
            ref = (arr[0] * h + arr[1] * util + arr[2] * c) / total * MAX_SCORE
            assert (ref - p).tobytes() == combined_score(h, util, c, p, s).tobytes()
            assert (ref - np.zeros(n)).tobytes() == combined_score(h, util, c, None, s).tobytes()
