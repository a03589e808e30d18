"""Every simulator table names the tree and commit whose code printed it (benchmarks/code_origin.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.code_origin import ROOT, code_line
from benchmarks.sim_speed import main as sim_speed_main


def test_the_line_names_the_tree_the_modules_came_from_and_its_commit() -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    line = code_line()
    assert line.startswith(f"code: {ROOT}")
    if head.returncode == 0:  # a clone, as CI runs: the commit, and whether tracked files differ from it
        assert f" at {head.stdout.strip()}" in line
    else:
        assert line.endswith("(not a git checkout)")


def test_a_tree_git_does_not_know_says_so(tmp_path: Path) -> None:
    assert code_line(tmp_path) == f"code: {tmp_path} (not a git checkout)"
    # a folder inside a checkout is not that checkout's root: its commit would not be this tree's
    inner = ROOT / "benchmarks"
    assert code_line(inner) == f"code: {inner} (not a git checkout)"


def test_sim_speed_prints_it_in_its_header(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_speed_main(["--jobs", "8", "--hours", "0.5"]) == 0
    out = capsys.readouterr().out
    assert code_line() in out.splitlines()
