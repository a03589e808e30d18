"""Where the real data is: the copy shipped in benchmarks/data/ (see its README.md), or another
folder with the same layout named by FLOWSCHED_DATA (e.g. the full ../shared/data, which also
holds the Pollux philly.csv that is too large to ship)."""

from __future__ import annotations

import os
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "data"
ENV = "FLOWSCHED_DATA"


def data_root() -> Path:
    """$FLOWSCHED_DATA when set (non-empty), else the shipped copy."""
    override = os.environ.get(ENV, "").strip()
    return Path(override).expanduser() if override else SHIPPED


def pollux_dir() -> Path:
    """The Pollux artifact's folder: workloads*/ and traces/<model>/."""
    return data_root() / "pollux"


def pollux_traces() -> Path:
    return pollux_dir() / "traces"


def lcbench_curves() -> Path:
    return data_root() / "lcbench" / "curves.csv"


def openb_dir() -> Path:
    """The Alibaba openb node and pod lists."""
    return data_root() / "alibaba-openb"
