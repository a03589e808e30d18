"""The step-time prior's defaults are what benchmarks.fit_step_prior fits to the shipped profiles."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fit_step_prior import shares
from scoring.settings import ElasticLoopSettings


def test_prior_defaults_are_the_profiles_medians() -> None:
    rows = shares()
    assert len(rows) == 6
    compute, sync, per_gpu, node, node_per_gpu = np.median(np.array(list(rows.values())), axis=0)
    assert node == node_per_gpu == 0.0  # one sync line: nothing across nodes apart
    s = ElasticLoopSettings()
    assert s.compute_fraction == pytest.approx(compute, abs=0.005)
    assert s.sync_fraction == pytest.approx(sync, abs=0.005)
    assert s.sync_per_gpu_fraction == pytest.approx(per_gpu, abs=0.0005)


def test_the_node_sync_shares_are_the_profiles_medians_with_a_line_across_nodes() -> None:
    """elastic.node_sync_* (used when node_sync is on) are fit_step_prior --node-gpus 4's medians."""
    rows = shares(node_gpus=4)
    _, sync, _, node, node_per_gpu = np.median(np.array(list(rows.values())), axis=0)
    s = ElasticLoopSettings()
    assert sync == pytest.approx(0.0, abs=0.005)  # within a node the profiles' sync is per GPU only
    assert s.node_sync_fraction == pytest.approx(node, abs=0.005)
    assert s.node_sync_per_gpu_fraction == pytest.approx(node_per_gpu, abs=0.0005)
