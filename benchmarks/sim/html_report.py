"""One self-contained HTML file per `flowsched demo` / `flowsched simulate` run: the title, the
comparison table and every plot, the plots embedded as base64 PNG data URIs, so the file can
be mailed or attached to an issue and opened offline (no links to anything outside it)."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.sim.report import METRIC_FIELDS

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}
.wide{overflow-x:auto}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;font-size:13px}
th:first-child,td:first-child{text-align:left}thead{background:#f2f2f2}
td.better{color:#06651b}td.worse{color:#9b1c1c}pre{background:#f7f7f7;padding:8px;overflow-x:auto}
figure{display:inline-block;margin:0 1em 1em 0}figcaption{font-size:90%;color:#555}
"""

_PERCENT = {"gpu_allocated", "gpu_busy"}
LABELS = {"avg_jct": "avg JCT (s)", "p50_jct": "p50 JCT (s)", "p99_jct": "p99 JCT (s)", "makespan": "makespan (s)",
          "avg_queueing": "queueing (s)", "gpu_allocated": "GPU alloc", "gpu_busy": "GPU busy", "restarts": "restarts"}


def _cell(field: str, value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    if field in _PERCENT:
        return f"{value:.1%}"
    return f"{value:.1f}" if field == "restarts" else f"{value:.0f}"


def summary_table(summary: Mapping[str, Mapping[str, float]], reference: str = "flowsched") -> str:
    """The comparison as an HTML table; the ratio columns are each policy's figure over the
    reference's (above 1: the reference is better on that figure), as in the printed table."""
    ref = summary.get(reference)
    ratio_fields = ("avg_jct", "p99_jct", "makespan")
    head = ["policy", *(LABELS.get(f, f) for f in METRIC_FIELDS), "runs"] \
        + ([f"{LABELS[f].split(' (')[0]} ÷ {reference}" for f in ratio_fields] if ref else [])
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for policy, s in summary.items():
        cells = [f"<td>{html.escape(policy)}</td>"]
        cells += [f"<td>{_cell(f, s[f])}</td>" for f in METRIC_FIELDS]
        cells.append(f"<td>{s.get('runs', float('nan')):.0f}</td>")
        if ref:
            for f in ratio_fields:
                r = s[f] / ref[f] if ref[f] else float("nan")
                cls = "better" if r > 1.0005 else "worse" if r < 0.9995 else ""
                cells.append(f'<td class="{cls}">{r:.3f}</td>' if math.isfinite(r) else "<td>n/a</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    legend = (f"<p>÷ {html.escape(reference)}: the policy's figure over {html.escape(reference)}'s; above 1 "
              f"(green) {html.escape(reference)} is better, below 1 (red) worse.</p>") if ref else ""
    body = "".join(rows[1:])
    return f'<div class="wide"><table><thead>{rows[0]}</thead><tbody>{body}</tbody></table></div>{legend}'


def embedded_png(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(caption)
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
            f"<figcaption>{alt}</figcaption></figure>")


def render(title: str, notes: Sequence[str], summary: Mapping[str, Mapping[str, float]], table_text: str,
           plots: Sequence[Path]) -> str:
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>flowsched simulation report</h1><p>{html.escape(title)}</p>",
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        "<h2>Results (mean over runs)</h2>",
        summary_table(summary),
        "<details><summary>As printed</summary><pre>" + html.escape(table_text) + "</pre></details>",
    ]
    if plots:
        parts.append("<h2>Plots</h2>")
        parts += [embedded_png(p, p.stem.replace("_", " ")) for p in plots]
    else:
        parts.append("<p>No plots (run without --no-plots, with matplotlib installed).</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html_report(path: Path, title: str, notes: Sequence[str], summary: Mapping[str, Mapping[str, float]],
                      table_text: str, plots: Sequence[Path]) -> Path:
    """Write the report; plots are the PNG files already written next to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(title, notes, summary, table_text, [p for p in plots if p.suffix == ".png"]),
                    encoding="utf-8")
    return path
