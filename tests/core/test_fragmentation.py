"""scoring/fragmentation.py: the expected-fragment measure and placement deltas, on small
hand-checkable clusters, and a brute-force cross-check of the grouped (vectorised) form."""

from __future__ import annotations

from collections import Counter

import numpy as np

from scoring.fragmentation import (
    DemandMixLearner,
    PodKind,
    access_matrix,
    candidate_scores,
    combined_gpu_score,
    group_weights,
    mix_from_counts,
    node_fragment,
    packed_gpu_free,
    placement_deltas,
    placement_scores,
)

SHARE_500 = PodKind(cpu_milli=1000, gpus=1, gpu_milli=500)
WHOLE_1 = PodKind(cpu_milli=1000, gpus=1, gpu_milli=1000)
WHOLE_2 = PodKind(cpu_milli=1000, gpus=2, gpu_milli=1000)


def brute_fragment(free: np.ndarray, cpu: float, model: str, kinds: list[PodKind], freq: list[float]) -> float:
    """The definition, kind by kind, one node."""
    total = float(free.sum())
    out = 0.0
    for kind, p in zip(kinds, freq, strict=True):
        if kind.gpus == 0:
            continue
        fits_gpu = int((free >= kind.gpu_milli).sum()) >= kind.gpus
        ok = fits_gpu and cpu >= kind.cpu_milli and (not kind.models or model in kind.models)
        out += p * (float(free[free < kind.gpu_milli].sum()) if ok else total)
    return out


def test_whole_gpu_demand_sees_partial_gpus_as_fragment() -> None:
    mix = mix_from_counts(Counter({WHOLE_1: 1}), popularity=1.0)
    free = np.array([[1000.0, 300.0], [1000.0, 1000.0]])
    frag = node_fragment(free, np.array([8000.0, 8000.0]), access_matrix(["A", "A"], mix), mix)
    assert frag.tolist() == [300.0, 0.0]


def test_node_without_cpu_is_all_fragment() -> None:
    mix = mix_from_counts(Counter({SHARE_500: 1}), popularity=1.0)
    free = np.array([[1000.0, 1000.0]])
    frag = node_fragment(free, np.array([500.0]), access_matrix(["A"], mix), mix)
    assert frag.tolist() == [2000.0]


def test_model_constraint_makes_node_all_fragment_for_that_kind() -> None:
    t4_only = PodKind(1000, 1, 1000, frozenset({"T4"}))
    mix = mix_from_counts(Counter({t4_only: 1}), popularity=1.0)
    free = np.array([[1000.0], [1000.0]])
    frag = node_fragment(free, np.array([4000.0, 4000.0]), access_matrix(["T4", "V100"], mix), mix)
    assert frag.tolist() == [0.0, 1000.0]


def test_fractional_pod_prefers_the_gpu_that_keeps_whole_gpus_whole() -> None:
    # Mix: half 500-milli shares, half whole GPUs. Putting a 500 share on the half-used GPU
    # closes it (fragment falls); on the free GPU it breaks a whole GPU (fragment rises).
    mix = mix_from_counts(Counter({SHARE_500: 1, WHOLE_1: 1}), popularity=1.0)
    free = np.array([[1000.0, 500.0]])
    cpu = np.array([8000.0])
    acc = access_matrix(["A"], mix)
    now = node_fragment(free, cpu, acc, mix)
    c = placement_deltas(free, cpu, acc, np.array([0]), now, SHARE_500, mix)
    assert c.valid.tolist() == [[True, True]]
    assert c.delta[0, 1] < 0 < c.delta[0, 0]


def test_grouped_form_matches_the_definition_on_random_nodes() -> None:
    rng = np.random.default_rng(7)
    kinds = [SHARE_500, WHOLE_1, WHOLE_2, PodKind(6000, 1, 250), PodKind(2000, 1, 1000, frozenset({"B"})),
             PodKind(500, 0, 0)]
    counts = Counter({k: int(rng.integers(1, 20)) for k in kinds})
    mix = mix_from_counts(counts, popularity=1.0)
    n = 40
    free = rng.choice([0.0, 100.0, 250.0, 500.0, 750.0, 1000.0], size=(n, 4))
    cpu = rng.choice([0.0, 1000.0, 4000.0, 16000.0], size=n)
    models = [str(rng.choice(["A", "B"])) for _ in range(n)]
    acc = access_matrix(models, mix)
    got = node_fragment(free, cpu, acc, mix)
    freq = list(mix.freq)
    want = [brute_fragment(free[i], cpu[i], models[i], list(mix.kinds), freq) for i in range(n)]
    np.testing.assert_allclose(got, want)

    # deltas: placing a 250-milli pod on GPU g of node i equals the definition after the change
    pod = PodKind(1000, 1, 250)
    c = placement_deltas(free, cpu, acc, np.arange(n), got, pod, mix)
    for i in range(n):
        for g in range(4):
            if not c.valid[i, g]:
                continue
            after = free[i].copy()
            after[g] -= 250
            expect = brute_fragment(after, cpu[i] - 1000, models[i], list(mix.kinds), freq) - want[i]
            assert abs(c.delta[i, g] - expect) < 1e-6

    # whole-GPU pods: the definition after taking the first two fully free GPUs
    c2 = placement_deltas(free, cpu, acc, np.arange(n), got, WHOLE_2, mix)
    for i in range(n):
        full = np.flatnonzero(free[i] >= 1000)
        assert c2.valid[i] == (full.size >= 2)
        if full.size >= 2:
            after = free[i].copy()
            after[full[:2]] = 0
            expect = brute_fragment(after, cpu[i] - 1000, models[i], list(mix.kinds), freq) - want[i]
            assert abs(c2.delta[i] - expect) < 1e-6


def test_learner_weighs_kinds_by_the_square_root_of_the_gpus_they_ask() -> None:
    learner = DemandMixLearner(popularity=0.8, refresh_every=1, weight_exponent=0.5, cpu_only=False)
    share_25 = PodKind(1000, 1, 250)
    whole_8 = PodKind(8000, 8, 1000)
    for _ in range(12):
        learner.observe(share_25)  # 12 pods x sqrt(0.25) = 6
    for _ in range(3):
        learner.observe(whole_8)  # 3 pods x sqrt(8) = 8.49
    learner.observe(PodKind(4000, 0, 0))  # CPU-only: no GPU demand, not counted
    mix = learner.mix()
    assert set(mix.kinds) == {share_25, whole_8}  # the top kind covers 8.49 / 14.49 < 80 %: both kept
    w8 = 3 * np.sqrt(8.0)
    np.testing.assert_allclose(sorted(mix.freq), sorted([6.0 / (6.0 + w8), w8 / (6.0 + w8)]))
    for _ in range(40):
        learner.observe(whole_8)
    assert learner.mix().kinds == (whole_8,)  # now 121.6 of 127.6: the top kind alone covers 80 %


def test_unknown_utilisation_is_neutral_and_known_utilisation_breaks_fragment_ties() -> None:
    delta = np.array([0.0, 0.0, 0.0])
    util = np.array([90.0, np.nan, 10.0])
    s = combined_gpu_score(delta, util)
    assert s[2] > s[1] > s[0]
    np.testing.assert_allclose(combined_gpu_score(delta, None), [0.5, 0.5, 0.5])


def test_packed_gpu_free_fills_the_first_gpus() -> None:
    free = packed_gpu_free(np.array([4.0, 2.0, 0.0]), np.array([1500.0, 2000.0, 0.0]), 5)
    assert free.tolist() == [[0.0, 500.0, 1000.0, 1000.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 5]


def test_placement_scores_order_by_fragment_level_then_best_fit() -> None:
    delta = np.array([0.0, 0.0, -2000.0, 3000.0, 0.0])
    valid = np.array([True, True, True, True, False])
    gpu_after = np.array([600.0, 100.0, 900.0, 0.0, 0.0])
    node_after = np.array([600.0, 4100.0, 900.0, 0.0, 0.0])
    s = placement_scores(delta, valid, gpu_after, node_after, np.zeros(5), levels=100)
    assert s[4] == -1.0  # impossible
    assert s[2] > s[1] > s[0] > s[3]  # less fragment first; in one level the fuller GPU
    assert np.all((s[:4] >= 0.0) & (s[:4] <= 1.0))
    # within one level the fit never crosses into the next level
    lv = placement_scores(np.array([0.0, -300.0]), np.array([True, True]), np.array([0.0, 1000.0]),
                          np.array([0.0, 8000.0]), np.zeros(2), levels=100)
    assert lv[1] > lv[0]  # -300 milli: a higher level; the fit cannot undo that


def test_candidate_scores_for_whole_and_fractional_pods() -> None:
    mix = mix_from_counts(Counter({WHOLE_2: 1, SHARE_500: 1}), popularity=1.0)
    free = np.array([[1000.0, 1000.0], [500.0, 1000.0]])
    cpu = np.array([8000.0, 8000.0])
    acc = access_matrix(["T4", "T4"], mix)
    now = node_fragment(free, cpu, acc, mix)
    c = placement_deltas(free, cpu, acc, np.arange(2), now, SHARE_500, mix)
    s = candidate_scores(free, cpu, SHARE_500, c.delta, c.valid, 100)
    assert s.shape == (2, 2)
    # the half-used GPU of node 1 takes the share (keeps node 0 whole for 2-GPU pods)
    assert np.unravel_index(int(np.argmax(s)), s.shape) == (1, 0)


def test_default_learner_counts_one_per_pod_and_cpu_only_pods_as_fragment() -> None:
    learner = DemandMixLearner(refresh_every=1)
    share_25, whole_8, cpu = PodKind(1000, 1, 250), PodKind(8000, 8, 1000), PodKind(4000, 0, 0)
    for k in (share_25, share_25, whole_8, cpu):
        learner.observe(k)
    mix = learner.mix()
    assert set(mix.kinds) == {share_25, whole_8, cpu}
    assert dict(zip(mix.kinds, mix.freq.tolist(), strict=True)) == {share_25: 0.5, whole_8: 0.25, cpu: 0.25}
    assert mix.cpu_only_weight == 0.25
    # a CPU-only kind's share counts all free GPU as fragment: the same shift on every node
    free = np.array([[1000.0, 1000.0]])
    only_gpu = mix_from_counts(Counter({share_25: 2, whole_8: 1}), popularity=1.0)
    a = node_fragment(free, np.array([64000.0]), access_matrix(["T4"], mix), mix)
    b = node_fragment(free, np.array([64000.0]), access_matrix(["T4"], only_gpu), only_gpu)
    assert abs(a[0] - (0.75 * b[0] + 0.25 * 2000.0)) < 1e-9


def test_group_weights_fast_path_equals_the_definition_when_every_model_is_allowed() -> None:
    rng = np.random.default_rng(7)
    kinds = Counter({PodKind(int(rng.integers(0, 16)) * 1000, int(g), int(m)): int(rng.integers(1, 9))
                     for g, m in [(1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (8, 1000)] * 5})
    mix = mix_from_counts(kinds, popularity=1.0)
    cpu = rng.integers(0, 20, 200).astype(np.float64) * 1000.0
    access = np.ones((200, len(mix.kinds)), dtype=bool)
    slow = (cpu[:, None] >= mix.kind_cpu[None, :]).astype(np.float64) @ mix.kind_group_freq
    np.testing.assert_allclose(group_weights(cpu, access, mix), slow, atol=1e-12)
