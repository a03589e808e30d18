from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.convergence_eval import offline_plateau_index
from benchmarks.plateau_errors import main, remaining_gap, tail_level_plateau_index


def test_remaining_gap_is_the_share_of_the_improvement_still_ahead() -> None:
    values = np.array([10.0, 6.0, 4.0, 3.0, 2.0, 2.0, 2.0])  # a loss: 8 to gain in all
    gap = remaining_gap(values, higher_is_better=False)
    assert gap[0] == pytest.approx(1.0) and gap[-1] == 0.0
    assert gap[2] == pytest.approx(2.0 / 8.0)
    assert np.all(np.diff(gap) <= 0)  # of the running best: never grows


def test_tail_level_truth_ignores_a_noisy_tails_luckiest_point() -> None:
    rng = np.random.default_rng(0)
    flat_from = 30
    level = np.concatenate([np.linspace(100.0, 10.0, flat_from), np.full(70, 10.0)])
    values = level + rng.normal(0.0, 2.0, level.size)  # noise 2 on a 90 drop: the min keeps falling in the tail
    k_best = offline_plateau_index(values, False, 0.02)
    k_tail = tail_level_plateau_index(values, False, 0.02)
    assert k_best is not None and k_tail is not None
    assert abs(k_tail - flat_from) <= 3  # the tail's level is reached where the curve flattens
    assert k_best > k_tail  # the final best, a noise dip, is reached later


def test_main_reports_each_model_of_a_pollux_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "pollux" / "traces" / "cifar10"
    folder.mkdir(parents=True)
    steps = np.arange(1, 61) * 100
    acc = 0.9 - 0.5 * np.exp(-steps / 1500.0)
    rows = "\n".join(f"{s},{s},{a:.5f},0,0" for s, a in zip(steps, acc, strict=True))
    (folder / "validation-128.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n" + rows + "\n")
    assert main(["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(r for r in out.splitlines() if r.startswith("cifar10"))
    assert int(line.split()[1]) > 0  # prefixes scored
    assert "against the tail-level truth" in out


def test_main_refuses_a_folder_without_curves(tmp_path: Path) -> None:
    (tmp_path / "pollux" / "traces").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no curves"):
        main(["--data", str(tmp_path)])
