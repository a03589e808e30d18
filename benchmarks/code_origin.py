"""Which code printed a table: the checkout the benchmarks' modules were loaded from, and its commit.

The installed `flowsched` entry point loads the checkout it was installed from (an editable
install: the main one), not the working directory's: run from another worktree, `flowsched demo`
measured the main checkout's code while `python -m benchmarks.run_pollux` measured the worktree's,
and a table once claimed a commit whose code it had not run (README, 2026-11-29). Every table's
header now says which tree and commit it ran.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the tree holding benchmarks/, scoring/ and extender/


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_line(root: Path = ROOT) -> str:
    """"code: <tree> at <commit>" (", with uncommitted changes" when tracked files differ from it),
    or "code: <tree> (not a git checkout)" where git cannot say."""
    top = _git(root, "rev-parse", "--show-toplevel")
    commit = _git(root, "rev-parse", "--short", "HEAD") if top is not None and Path(top).resolve() == root else None
    if commit is None:
        return f"code: {root} (not a git checkout)"
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"code: {root} at {commit}" + (", with uncommitted changes" if changed else "")
