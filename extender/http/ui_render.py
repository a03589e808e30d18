"""The status page's HTML, from a StatusPage: pure functions, no I/O, no clock.

One self-contained document: inline CSS, loss curves as inline SVG, no script and nothing
fetched from elsewhere (it must work in an air-gapped cluster). It refreshes itself every
REFRESH_S seconds with a meta refresh. Elements carry ids, classes and data-* attributes
naming what they show, so tests (and curl | grep) can read the page without parsing prose.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence

from extender.http.status_view import ActionRow, JobRow, NodeRow, QueuedPod, StatusPage

REFRESH_S = 10

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;background:#fff}th,td{border:1px solid #ddd;padding:3px 7px;font-size:13px}
th{background:#f0f0f0;text-align:left}.muted{color:#777}.bad{color:#a11}
.gpus{display:flex;gap:3px}.gpu{width:26px;height:26px;border:1px solid #bbb;position:relative;background:#eee}
.gpu .fill{position:absolute;bottom:0;left:0;right:0;background:#3b82f6}
.gpu.unknown{background:repeating-linear-gradient(45deg,#eee,#eee 4px,#ddd 4px,#ddd 8px)}
.gpu span{position:absolute;width:100%;text-align:center;top:6px;font-size:10px;color:#111}
.jobs{display:flex;flex-wrap:wrap;gap:12px}.job{background:#fff;border:1px solid #ddd;padding:8px;width:360px}
.job h3{font-size:14px;margin:0 0 4px;word-break:break-all}.phase{padding:1px 6px;border-radius:8px;font-size:12px}
.phase-growing{background:#d1fae5}.phase-watching{background:#fef3c7}.phase-completing{background:#fde2e2}
.phase-unknown{background:#e5e7eb}svg.loss-curve{background:#fcfcfc;border:1px solid #eee}
"""


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def duration(seconds: float | None) -> str:
    """'3h 05m', '12m 30s', '45s'; '?' when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def _num(x: float) -> str:
    return f"{x:.4g}"


def loss_curve_svg(points: Sequence[tuple[float, float]], width: int = 340, height: int = 120,
                   label: str = "loss") -> str:
    """An inline SVG line chart of (step, value), with the value range and step range written
    on it. Fewer than two points: a box that says so."""
    pad_l, pad_r, pad_t, pad_b = 44, 6, 6, 18
    head = (f'<svg class="loss-curve" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(label)} curve">')
    if len(points) < 2:
        return (head + f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="11" fill="#777">'
                f"{'one point' if points else 'no progress reported'}</text></svg>")
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    # In halves: the span of finite values (1e308 down to -1e308) overflows to inf, and
    # (y1 - y) / inf drew "nan" coordinates; half of any difference of finite floats is finite.
    xspan = (x1 / 2 - x0 / 2) or 1.0
    yspan = (y1 / 2 - y0 / 2) or 1.0

    def at(x: float, y: float) -> str:
        return f"{pad_l + (x / 2 - x0 / 2) / xspan * w:.1f},{pad_t + (y1 / 2 - y / 2) / yspan * h:.1f}"

    line = " ".join(at(x, y) for x, y in points)
    axis = "#999"
    return (head
            + f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="{axis}"/>'
            + f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="{axis}"/>'
            + f'<text x="{pad_l - 3}" y="{pad_t + 9}" text-anchor="end" font-size="10">{_num(y1)}</text>'
            + f'<text x="{pad_l - 3}" y="{pad_t + h}" text-anchor="end" font-size="10">{_num(y0)}</text>'
            + f'<text x="{pad_l}" y="{height - 4}" font-size="10">step {_num(x0)}</text>'
            + f'<text x="{pad_l + w}" y="{height - 4}" text-anchor="end" font-size="10">{_num(x1)}</text>'
            + f'<polyline class="curve" fill="none" stroke="#2563eb" stroke-width="1.5" points="{line}"/>'
            + "</svg>")


def gpu_cells(util: Sequence[float | None]) -> str:
    cells = []
    for i, u in enumerate(util):
        if u is None:
            cells.append(f'<div class="gpu unknown" data-gpu="{i}" title="GPU {i}: no fresh sample">'
                         "<span>?</span></div>")
        else:
            pct = max(0.0, min(100.0, u))
            cells.append(f'<div class="gpu" data-gpu="{i}" data-util="{u:g}" title="GPU {i}: {u:g}%">'
                         f'<div class="fill" style="height:{pct:.0f}%"></div><span>{u:.0f}</span></div>')
    return f'<div class="gpus">{"".join(cells)}</div>' if cells else '<span class="muted">no GPUs</span>'


def node_row(n: NodeRow) -> str:
    state = "Ready" if n.ready else '<span class="bad">NotReady</span>'
    if n.unschedulable:
        state += ", cordoned"
    age = "" if n.telemetry_age_s is None else f" ({n.telemetry_age_s:.0f}s ago)"
    tel = f'<span class="{"" if n.telemetry == "fresh" else "bad"}">{esc(n.telemetry)}</span>{age}'
    return (f'<tr class="node" data-node="{esc(n.name)}" data-telemetry="{esc(n.telemetry)}">'
            f"<td>{esc(n.name)}</td><td>{state}</td><td>{n.gpu_used:g} / {n.gpu_alloc:g}</td>"
            f"<td>{gpu_cells(n.gpu_util)}</td><td>{tel}</td><td>{n.pods}</td></tr>")


def job_card(j: JobRow) -> str:
    pace = "?" if j.progress is None else f"{j.progress:.2f}"  # FlowCon's P: 1 = steady pace, 0 = plateau
    last = "" if j.last_value is None else f", last {'value' if j.higher_is_better else 'loss'} {_num(j.last_value)}"
    pods = ", ".join(j.pods) if j.pods else "no pods in the cluster"
    return (f'<section class="job" data-job="{esc(j.key)}" data-phase="{esc(j.phase)}">'
            f"<h3>{esc(j.key)}</h3>"
            f'<div><span class="phase phase-{esc(j.phase)}">{esc(j.phase)}</span> '
            f'remaining <b class="remaining">{duration(j.remaining_s)}</b>, '
            f'<span title="relative learning pace: 1 = steady, 0 = plateau">pace {pace}</span></div>'
            f'<div class="muted">{j.points} points{last}</div>'
            + loss_curve_svg(j.curve, label="metric" if j.higher_is_better else "loss")
            + f'<div class="muted pods">{esc(pods)}</div></section>')


def queue_row(q: QueuedPod) -> str:
    return (f'<tr class="queued" data-pod="{esc(q.key)}"><td>{esc(q.key)}</td><td>{q.gpus:g}</td>'
            f"<td>{esc(q.job)}</td></tr>")


def action_row(a: ActionRow, now: float) -> str:
    outcome = esc(a.outcome) + (" (dry run)" if a.dry_run and a.outcome != "dry_run" else "")
    times = f" (in {a.repeats} ticks)" if a.repeats > 1 else ""
    return (f'<tr class="action" data-loop="{esc(a.loop)}" data-outcome="{esc(a.outcome)}" '
            f'data-repeats="{a.repeats}"><td>{duration(now - a.at)} ago{times}</td>'
            f"<td>{esc(a.loop)}</td><td>{esc(a.kind)}</td>"
            f"<td>{esc(a.target)}</td><td>{outcome}</td><td>{esc(a.reason)}</td></tr>")


def _table(id_: str, head: Sequence[str], rows: Sequence[str], empty: str) -> str:
    if not rows:
        return f'<p id="{id_}" class="muted empty">{esc(empty)}</p>'
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f'<table id="{id_}"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render_status_page(page: StatusPage) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(page.now))
    loops = "; ".join(f"{esc(name)}: {'dry run' if v.get('dry_run') else 'acting'}, budget left "
                      + ", ".join(f"{esc(k)} {esc(x)}" for k, x in dict(v.get("budget_left") or {}).items())
                      for name, v in page.loops.items()) or "no control loop enabled"
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_S}"><title>flowsched status</title>',
        f"<style>{_STYLE}</style></head><body>",
        f'<h1>flowsched</h1><div class="muted" id="stamp">{stamp} · '
        f'{"synced" if page.ready else "<span class=bad>not synced</span>"} · '
        f"{len(page.nodes)} nodes · {len(page.jobs)} jobs · {len(page.queue)} pending pods · "
        f"refreshes every {REFRESH_S}s</div>",
        *(f'<p class="bad note">{esc(n)}</p>' for n in page.notes),
        "<h2>Nodes</h2>",
        _table("nodes", ["node", "state", "GPUs used", "GPU utilisation (%)", "telemetry", "pods"],
               [node_row(n) for n in page.nodes], "No nodes in the snapshot."),
        "<h2>Jobs</h2>",
        (f'<div class="jobs" id="jobs">{"".join(job_card(j) for j in page.jobs)}</div>' if page.jobs
         else '<p id="jobs" class="muted empty">No jobs.</p>'),
        "<h2>Queue</h2>",
        _table("queue", ["pending pod", "GPUs", "job"], [queue_row(q) for q in page.queue], "No pending pods."),
        "<h2>Control loops</h2>",
        f'<p id="loops">{loops}</p>',
        _table("actions", ["when", "loop", "action", "target", "outcome", "reason"],
               [action_row(a, page.now) for a in page.actions], "No recent actions."),
        "</body></html>",
    ]
    return "\n".join(parts)
