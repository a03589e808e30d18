"""run_pollux's saved runs read back, and the tuned / unseen split it prints."""

from __future__ import annotations

from pathlib import Path

from benchmarks.run_pollux import format_split, main
from benchmarks.sim.report import RunMetrics, read_csv, write_csv


def run(policy: str, w: int, avg: float) -> RunMetrics:
    return RunMetrics(policy, f"workload-{w}", 0, 160, 160, avg, avg / 2, avg * 10, avg * 20, 5.0, 0.9, 0.8, 3, 1.5)


def test_runs_round_trip_and_the_split_separates_tuned_from_unseen(tmp_path: Path) -> None:
    runs = [run("tiresias", 1, 100.0), run("tiresias", 2, 300.0), run("tiresias", 5, 1000.0),
            run("flowsched", 1, 50.0), run("flowsched", 2, 150.0), run("flowsched", 5, 2000.0)]
    path = tmp_path / "mix-none" / "load-1.0" / "runs.csv"
    write_csv(path, runs)
    assert read_csv(path) == runs
    text = format_split(runs, [1, 2])
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:]}
    assert "tuned 1,2" in text and "unseen 5" in text
    assert lines["tiresias"].split()[1] == "200" and lines["flowsched"].split()[6] == "2000"
    assert format_split([r for r in runs if r.workload != "workload-5"], [1, 2]) == ""  # nothing unseen
    assert main(["--report", str(tmp_path)]) == 0
    assert main(["--report", str(tmp_path / "nothing")]) == 2
