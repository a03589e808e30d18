"""The per-rule interval calibration on the real runs (benchmarks/job_end_calibrate.py)."""

from __future__ import annotations

import math

from benchmarks import job_end_calibrate, job_end_eval
from benchmarks.curves.real_curves import load_runs, on_clock
from scoring.end_interval import EndIntervalSettings


def test_the_defaults_are_what_the_calibration_prints() -> None:
    settings, lines = job_end_calibrate.calibrate()
    assert settings == EndIntervalSettings(), "\n".join(lines)


def test_side_needs_and_tail_scale() -> None:
    a = job_end_eval.Answer(10.0, 5.0, 40.0)
    low, high = job_end_calibrate.side_needs(10.0 * 0.5 ** 2, a)  # twice the low side's log-width
    assert low == 2.0 and high == 0.0
    assert job_end_calibrate.side_needs(20.0, a) == (0.0, 0.5)
    assert job_end_calibrate.side_needs(1.0, job_end_eval.Answer(math.nan, math.nan, math.nan)) == (math.inf,) * 2
    assert job_end_calibrate.side_needs(2.0, job_end_eval.Answer(10.0, 10.0, 12.0))[0] == math.inf
    # 10 needs, 2 may miss: the third largest
    assert job_end_calibrate.tail_scale([0.1 * i for i in range(1, 11)], 2.0) == 0.8
    assert job_end_calibrate.tail_scale([math.inf] * 5, 1.0) == job_end_calibrate.MAX_SCALE
    assert job_end_calibrate.tail_scale([0.0] * 5, 1.0) == job_end_calibrate.MIN_SCALE


def test_every_answer_on_the_real_runs_lies_inside_its_interval() -> None:
    runs = [on_clock(r, "cpu") for r in load_runs(None)]
    _, rows = job_end_eval.evaluate(runs, {"job_end": job_end_eval.job_end})
    answered = [r for r in rows if math.isfinite(float(str(r["remaining_s"])))]
    assert len(answered) > 0.9 * len(rows)
    for r in answered:
        assert float(str(r["low_s"])) <= float(str(r["remaining_s"])) <= float(str(r["high_s"])), r
