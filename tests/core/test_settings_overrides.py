"""`--set` overrides (scoring.settings.with_overrides): each value parsed as its field's type."""

from __future__ import annotations

import pytest

from scoring.admission import queue_of
from scoring.settings import CoreSettings, with_overrides


def test_a_tuple_of_numbers_stays_numbers_and_a_literal_is_checked() -> None:
    s = with_overrides(CoreSettings(), {"admission.queue_thresholds_gpu_s": "3600, 14400",
                                        "admission.queue_by": "remaining"})
    assert s.admission.queue_thresholds_gpu_s == (3600.0, 14400.0) and s.admission.queue_by == "remaining"
    assert queue_of(5000.0, s.admission.queue_thresholds_gpu_s) == 1  # compared as numbers, not strings
    with pytest.raises(ValueError, match="queue_by"):
        with_overrides(CoreSettings(), {"admission.queue_by": "size"})
    with pytest.raises(ValueError):
        with_overrides(CoreSettings(), {"admission.queue_thresholds_gpu_s": "an hour"})
