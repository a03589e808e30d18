"""The step-time prior's defaults are what benchmarks.fit_step_prior fits to the shipped profiles."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fit_step_prior import shares
from scoring.settings import ElasticLoopSettings


def test_prior_defaults_are_the_profiles_medians() -> None:
    rows = shares()
    assert len(rows) == 6
    compute, sync, per_gpu = np.median(np.array(list(rows.values())), axis=0)
    s = ElasticLoopSettings()
    assert s.compute_fraction == pytest.approx(compute, abs=0.005)
    assert s.sync_fraction == pytest.approx(sync, abs=0.005)
    assert s.sync_per_gpu_fraction == pytest.approx(per_gpu, abs=0.0005)
