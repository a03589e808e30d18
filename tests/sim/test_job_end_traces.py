"""Early stopping's end on the Pollux validation traces the simulator's jobs report (benchmarks/job_end_traces.py)."""

from __future__ import annotations

import math

from benchmarks import job_end_traces
from scoring.forecast_settings import ForecastSettings


def test_the_recent_window_does_not_cost_the_traces_what_a_short_one_did() -> None:
    """A window of the recent 60 % read best on the project's runs and extrapolated the traces' steps
    where their learning rate decays (pooled 52.4 % against 38.5 % for the whole series): the default
    must stay within 2 points of the whole series here."""
    default = job_end_traces.evaluate(ForecastSettings(), draws=4)
    whole = job_end_traces.evaluate(ForecastSettings(stopping_recent_share=1.0), draws=4)
    short = job_end_traces.evaluate(ForecastSettings(stopping_recent_share=0.6), draws=4)
    assert set(default) == {"cifar10", "deepspeech2", "imagenet", "yolov3"}  # bert and ncf never fire
    assert sum(e.curves for e in default.values()) >= 60
    d, w, s = (job_end_traces.pooled(e) for e in (default, whole, short))
    assert math.isfinite(d) and d <= w + 0.02 < s
    for e in default.values():  # every ask is counted, answered or not
        assert e.asked == sum(len(e.ape[f]) for f in job_end_traces.FRACTIONS)


def test_main_prints_the_table() -> None:
    assert job_end_traces.main(["--draws", "1"]) == 0
