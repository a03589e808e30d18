"""`flowsched demo` writes one self-contained HTML report beside its CSVs and PNGs."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from benchmarks.sim.entry import demo_main
from benchmarks.sim.html_report import summary_table

POLICIES = ("fifo", "kube-default", "binpack", "tiresias", "flowsched-placement", "flowsched")


class _Refs(HTMLParser):
    """Every URL-carrying attribute and every table cell of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "data", "action", "srcset") and value is not None:
                self.refs.append((tag, name, value))
        self._in_cell = tag in ("td", "th")

    def handle_endtag(self, tag: str) -> None:
        self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells.append(data.strip())


def test_demo_writes_a_self_contained_html_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = demo_main(["--out", str(tmp_path), "--jobs", "40", "--hours", "2", "--workloads", "1", "--seeds", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    report = tmp_path / "report.html"
    assert str(report) in printed  # named in the "wrote ..." line
    page = report.read_text(encoding="utf-8")
    parser = _Refs()
    parser.feed(page)

    # Self-contained: every reference is an inline data URI, no stylesheet or script links.
    assert parser.refs, "the report has no images"
    assert all(v.startswith("data:image/png;base64,") for _, _, v in parser.refs), parser.refs
    assert not re.search(r"<link\b|<script\b|@import|url\(", page, re.I)
    # The three PNGs written beside it, byte for byte.
    embedded = [base64.b64decode(v.split(",", 1)[1]) for _, _, v in parser.refs]
    for name in ("jct_cdf.png", "utilisation.png", "queue_length.png"):
        assert (tmp_path / name).read_bytes() in embedded, f"{name} is not embedded"
    # The table: one row per policy, with the same avg JCT the printed table shows.
    summary_rows = (tmp_path / "summary.csv").read_text().splitlines()[1:]
    for row in summary_rows:
        policy, avg_jct = row.split(",")[:2]
        assert policy in parser.cells
        assert f"{float(avg_jct):.0f}" in parser.cells
    assert {p for p in POLICIES} <= set(parser.cells)


def test_report_without_plots_still_has_the_table(tmp_path: Path) -> None:
    rc = demo_main(["--out", str(tmp_path), "--jobs", "20", "--hours", "1", "--workloads", "1", "--seeds", "1",
                    "--policies", "fifo,flowsched", "--no-plots"])
    assert rc == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "No plots" in page and "<img" not in page
    assert "<td>fifo</td>" in page and "<td>flowsched</td>" in page


def test_ratio_columns_and_unknown_values() -> None:
    nan = float("nan")
    base = {"avg_jct": 100.0, "p50_jct": 90.0, "p99_jct": 300.0, "makespan": 1000.0, "avg_queueing": 5.0,
            "gpu_allocated": 0.5, "gpu_busy": 0.4, "restarts": 1.0, "runs": 2.0}
    worse = {**base, "avg_jct": 150.0, "avg_queueing": nan}
    table = summary_table({"flowsched": base, "fifo": worse})
    assert '<td class="better">1.500</td>' in table  # fifo's avg JCT is 1.5x flowsched's
    assert "<td>n/a</td>" in table  # NaN shows as unknown, not as 0 or "nan"
    assert "<td>50.0%</td>" in table
    assert "flowsched</th>" in table
