"""The demo's entry point end to end (small), without ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sim.entry import demo_main


def test_demo_writes_table_csv_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = demo_main(["--out", str(tmp_path), "--jobs", "40", "--hours", "2", "--workloads", "1", "--seeds", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    for policy in ("fifo", "kube-default", "binpack", "tiresias", "flowsched-placement", "flowsched"):
        assert policy in out
    assert "avg/fs" in out
    for name in ("runs.csv", "summary.csv", "jct_cdf.png", "utilisation.png", "queue_length.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = (tmp_path / "runs.csv").read_text().splitlines()
    assert len(rows) == 1 + 6
