"""run_pollux's saved runs read back, and the tuned / unseen split it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.run_pollux import format_seeds, format_split, main, read_loops, write_loops
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
    assert main(["--report", str(tmp_path / "nothing")]) == 2


def test_report_prints_the_loops_counts_it_saved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "mix-all" / "load-1.0"
    write_csv(folder / "runs.csv", [run("tiresias", 1, 100.0), run("flowsched", 1, 50.0)])
    assert main(["--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    before = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("flowsched")}
    assert "saved before the end mix" in out  # a run without its mode file is labelled as the old oracle runs
    assert before["flowsched"][7] == "0.02"  # restarts per job: 3 restarts over 160 jobs
    assert before["flowsched"][8:10] == ["-", "-"]  # saved before loops.csv existed: unknown, not zero
    loops = {"tiresias": {"resizes": 0.0, "evictions": 0.0}, "flowsched": {"resizes": 612.0, "evictions": 3.0}}
    write_loops(folder / "loops.csv", loops)
    assert read_loops(folder / "loops.csv") == loops
    assert main(["--report", str(tmp_path)]) == 0
    after = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("flowsched")}
    assert after["flowsched"][8:10] == ["612", "3"]


def test_per_seed_figures_on_tuned_unseen_and_all_with_their_mean() -> None:
    def seeded(policy: str, w: int, seed: int, avg: float) -> RunMetrics:
        r = run(policy, w, avg)
        return RunMetrics(r.policy, r.workload, seed, *[getattr(r, f) for f in list(r.__dataclass_fields__)[3:]])

    runs = [seeded("flowsched", w, s, 100.0 * (s + 1) + w) for s in (0, 1, 2) for w in (1, 5)]
    runs += [seeded("tiresias", 1, 0, 40.0), seeded("tiresias", 5, 0, 60.0)]
    text = format_seeds(runs, [1])
    rows = {(ln.split()[0], ln.split()[1]): ln.split()[2:] for ln in text.splitlines()[2:]}
    assert rows[("flowsched", "tuned")] == ["101", "201", "301", "201"]
    assert rows[("flowsched", "all")] == ["103", "203", "303", "203"]  # seed means; their mean = the headline's
    assert rows[("tiresias", "all")] == ["50", "-", "-", "50"]
    assert format_seeds([r for r in runs if r.seed == 0], [1]) == ""


def test_a_saved_run_reprints_the_settings_and_the_code_that_ran_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workloads", "1", "--loads", "1.0", "--policies", "fifo", "--procs", "1", "--mix", "none",
                 "--set", "admission.min_evidence=0.2", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    code = next(ln for ln in printed.splitlines() if ln.startswith("code: "))
    assert main(["--report", str(tmp_path)]) == 0
    again = capsys.readouterr().out
    assert code in again.splitlines() and "cluster: 16x4 GPUs" in again
    assert "admission.min_evidence=0.2" in again  # the override the run printed, not the defaults
    (tmp_path / "mix-none" / "load-1.0" / "header.txt").unlink()
    assert main(["--report", str(tmp_path)]) == 0
    assert "the settings and the code that ran are not recorded" in capsys.readouterr().out
