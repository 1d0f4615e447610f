"""The landing page at /: the GPUs this daemon sees and each GPU's latest probe results.

Per GPU: a row in the GPU table (index, name, UUID, up/lost, power draw and
cap, the health verdict: state, action and its reasons, worst first, each reason's
evidence in its title, the sweep holding it now: probe, cap, point k of n, also
in a banner above the table), a row per GPU that was here at the first start and is missing
now, then one row per (probe, preset) with the latest ok result at each cap
tested, a small hand-written SVG chart (throughput and energy per unit against
the cap, each series' min and max labelled with its unit, the caps in watts, recommended cap marked) and the recommended cap with its energy saving
and slowdown (the rule of :func:`gpuperfd.probe_data.recommend.recommend`).

Cheap by construction: one snapshot of the sampler's store, the probe service's
latest points (a copy of a small dict), string formatting; no device call, no
plotting library, no JavaScript. Every value that comes from outside (names,
UUIDs, probe and preset names, units) is HTML-escaped.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gpuperfd
from gpuperfd.health.verdict import Verdict
from gpuperfd.probe_data.progress import SweepProgress
from gpuperfd.probe_data.recommend import (Recommendation, SweepPoint, comparison_words, recommend_latest,
                                          watts_saved_while_busy, work_rate)
from gpuperfd.telemetry.sampler import Sampler, lost_gpus
from gpuperfd.web.status import age_words, gap_words

#: (gpu index, probe, preset) -> latest ok point per cap (ProbeService.latest()).
Latest = Mapping[tuple[int, str, str], Sequence[SweepPoint]]

CHART_WIDTH, CHART_HEIGHT, PAD = 400, 96, 8
#: Room left and right of the plot for the series' value labels ("1.23k tokens/s", "410 mJ/token").
AXIS_MARGIN = 86
RATE_COLOR, ENERGY_COLOR, REC_COLOR = "#1f77b4", "#e8710a", "#2e7d32"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em 2em;color:#222}
table{border-collapse:collapse;margin:.4em 0 1.2em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:middle}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
h2{margin:1.2em 0 .2em;font-size:1.15em}.lost{color:#b00;font-weight:bold}.up{color:#2e7d32}
.rec b{color:#2e7d32}.muted{color:#666}.key{font-size:12px}.key i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin:0 3px 0 8px}
svg{display:block}.health ul{margin:.2em 0 0;padding-left:1.2em;font-size:12px}
.due{color:#a15c00}
.sweeping{background:#fff4e0;border-left:4px solid #e8710a;padding:.3em .6em}td.sweep{color:#c25e00;font-weight:bold}
.h-healthy{color:#2e7d32}.h-unknown{color:#8a6d00}.h-degraded{color:#c25e00}.h-unhealthy{color:#b00;font-weight:bold}
"""

#: Reasons listed in a GPU's health cell (worst first); the rest are counted.
MAX_REASONS_SHOWN = 3


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt_rate(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _fmt_energy(joules: float) -> str:
    return f"{joules * 1000:.3g} mJ" if abs(joules) < 1 else f"{joules:.3g} J"


def _scale(values: list[float], low_px: float, high_px: float):  # type: ignore[no-untyped-def]
    lo, hi = min(values), max(values)
    span = hi - lo
    if span <= 0:
        return lambda v: (low_px + high_px) / 2
    return lambda v: high_px - (v - lo) / span * (high_px - low_px)


def _axis_labels(values: list[float], top: float, bottom: float, at_x: float, anchor: str, color: str,
                 fmt) -> list[str]:  # type: ignore[no-untyped-def]
    """The series' max at the top and min at the bottom of its axis (one label at mid-height when flat)."""
    lo, hi = min(values), max(values)
    spots = [(hi, top + 3), (lo, bottom + 3)] if hi > lo else [(hi, (top + bottom) / 2 + 3)]
    return [f'<text x="{at_x:.1f}" y="{y:.1f}" font-size="9" fill="{color}" text-anchor="{anchor}" '
            f'class="axis">{_e(fmt(v))}</text>' for v, y in spots]


def chart_svg(points: Sequence[tuple[float, float, float | None]], recommended_cap: float | None, unit: str) -> str:
    """Throughput (blue, values on the left axis) and energy per unit (orange, right axis) against the cap
    (bottom axis, watts), each series on its own scale with its min and max labelled; rec. cap in green."""
    points = sorted(points)
    caps = [p[0] for p in points]
    left, right = AXIS_MARGIN, CHART_WIDTH - AXIS_MARGIN
    top, bottom = PAD + 6, CHART_HEIGHT - PAD - 10
    if caps[-1] > caps[0]:
        x = lambda c: left + (c - caps[0]) / (caps[-1] - caps[0]) * (right - left)  # noqa: E731
    else:
        x = lambda c: (left + right) / 2  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" '
        f'viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" role="img" class="chart">',
        f"<title>{_e(unit)}s/s (blue, left axis) and J/{_e(unit)} (orange, right axis) against power cap</title>",
        f'<rect x="0.5" y="0.5" width="{CHART_WIDTH - 1}" height="{CHART_HEIGHT - 1}" fill="#fff" stroke="#ddd"/>',
        f'<path d="M{left - 2},{top} V{bottom + 2} H{right + 2} V{top}" fill="none" stroke="#ccc"/>',
    ]
    if recommended_cap is not None:
        rx = x(recommended_cap)
        parts.append(f'<line x1="{rx:.1f}" y1="{top}" x2="{rx:.1f}" y2="{bottom + 2}" stroke="{REC_COLOR}" '
                     f'stroke-width="1.5" stroke-dasharray="3,2"/>')
    series = [(RATE_COLOR, [p[1] for p in points], left - 4, "end", lambda v: f"{_fmt_rate(v)} {unit}s/s"),
              (ENERGY_COLOR, [p[2] for p in points], right + 4, "start", lambda v: f"{_fmt_energy(v)}/{unit}")]
    for color, values, label_x, anchor, fmt in series:
        pairs = [(c, v) for c, v in zip(caps, values) if v is not None]
        if not pairs:
            continue
        y = _scale([v for _, v in pairs], top, bottom)
        coords = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v in pairs)
        if len(pairs) > 1:
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        parts += [f'<circle cx="{x(c):.1f}" cy="{y(v):.1f}" r="2.3" fill="{color}"/>' for c, v in pairs]
        parts += _axis_labels([v for _, v in pairs], top, bottom, label_x, anchor, color, fmt)
    parts.append(f'<text x="{left}" y="{CHART_HEIGHT - 4}" font-size="9" fill="#666" class="axis">{caps[0]:.0f} W</text>')
    if caps[-1] > caps[0]:
        parts.append(f'<text x="{right}" y="{CHART_HEIGHT - 4}" font-size="9" fill="#666" text-anchor="end" '
                     f'class="axis">{caps[-1]:.0f} W</text>')
    if recommended_cap is not None:
        label_x = min(max(x(recommended_cap), left + 12), right - 12)
        parts.append(f'<text x="{label_x:.1f}" y="{top - 2}" font-size="9" fill="{REC_COLOR}" '
                     f'text-anchor="middle">{recommended_cap:.0f} W</text>')
    parts.append("</svg>")
    return "".join(parts)


def _probe_row(probe: str, preset: str, points: Sequence[SweepPoint], max_slowdown: float, due: bool | None = None) -> str:
    ok = [p for p in points if p.result.status == "ok" and work_rate(p.result)]
    if not ok:
        return ""
    unit = ok[0].result.work_unit or "unit"
    top = max(ok, key=lambda p: p.cap_watts)
    rate = work_rate(top.result) or 0.0
    energy = top.result.energy_per_unit_joules
    best: Recommendation | None = recommend_latest(points, max_slowdown)  # the one rule (probe_data/recommend.py)
    if best is not None:
        rec = f"<b>{best.cap_watts:.0f} W</b>: {_e(comparison_words(best, unit))}"
        saved = watts_saved_while_busy(points, best)  # W saved while busy (issue 35)
        if best.cap_watts != best.baseline_cap_watts and saved is not None:
            rec += f"; {saved:.0f} W less while busy"
    elif any(p.sweep_cut_short for p in points):
        rec = '<span class="muted">sweep cut short: no recommendation until a complete sweep</span>'
    elif len(ok) > 1:
        rec = '<span class="muted">no energy figures: no recommendation</span>'
    else:
        rec = '<span class="muted">one cap only: no recommendation</span>'
    ended = max(p.result.started_at + (p.result.wall_seconds or 0.0) for p in ok)
    chart = chart_svg([(p.cap_watts, work_rate(p.result) or 0.0, p.result.energy_per_unit_joules) for p in ok],
                      best.cap_watts if best else None, unit)
    caps = " ".join(f"{c:.0f}" for c in sorted({round(p.cap_watts) for p in ok}, reverse=True))
    return (
        f'<tr class="probe-row" data-probe="{_e(probe)}" data-preset="{_e(preset)}">'
        f"<td>{_e(probe)}</td><td>{_e(preset)}</td><td class=\"num\">{_e(caps)}</td>"
        f'<td class="num">{_fmt_rate(rate)} {_e(unit)}s/s</td>'
        f'<td class="num">{_fmt_energy(energy) if energy is not None else "-"}/{_e(unit)}</td>'
        f'<td class="rec">{rec}</td><td>{chart}</td>'
        f'<td class="muted">{_e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ended)))}'
        f'<br><span class="age" data-due="{1 if due else 0}">{_e(age_words(max(0.0, time.time() - ended)))} old'
        f'{", due" if due else ""}</span></td></tr>'
    )


def _health_cell(verdict: Verdict | None) -> str:
    """State and action, then the worst reasons (message shown, check and evidence in the title)."""
    if verdict is None:
        return '<td class="health muted">-</td>'
    data = verdict.to_dict()
    action = "" if data["action"] == "none" else f" &middot; {_e(data['action'].replace('_', ' '))}"
    items = []
    for reason in data["reasons"][:MAX_REASONS_SHOWN]:
        evidence = ", ".join(f"{k}={v}" for k, v in sorted(reason["evidence"].items()))
        title = f"{reason['check']} ({reason['severity']}, {reason['action']}): {evidence}"
        items.append(f'<li title="{_e(title)}" data-check="{_e(reason["check"])}">{_e(reason["message"])}</li>')
    more = len(data["reasons"]) - MAX_REASONS_SHOWN
    if more > 0:
        items.append(f'<li class="muted">and {more} more (<a href="/api/v1/health">all</a>)</li>')
    listing = f"<ul>{''.join(items)}</ul>" if items else ""
    return (f'<td class="health" data-state="{_e(data["state"])}" data-action="{_e(data["action"])}">'
            f'<span class="h-{_e(data["state"])}">{_e(data["state"])}</span>{action}{listing}</td>')


def _sweep_cell(progress: SweepProgress | None) -> str:
    if progress is None:
        return '<td class="muted">-</td>'
    return f'<td class="sweep" data-sweeping="1">{_e(progress.words())}</td>'


def _sweep_banner(sweeps: Mapping[int, SweepProgress]) -> str:
    """One line per GPU whose cap a sweep holds now (nothing when none does)."""
    if not sweeps:
        return ""
    items = "; ".join(f"GPU {gpu}: {_e(p.words())} (since {_e(time.strftime('%H:%M:%S UTC', time.gmtime(p.since)))})"
                      for gpu, p in sorted(sweeps.items()))
    return f'<p class="sweeping" id="sweeps">Sweep in progress (the sweep sets the power cap): {items}</p>\n'


def _gpu_section(gpu: int, name: str, latest: Latest, max_slowdown: float,
                 coverage: Mapping[tuple[int, str, str], bool] | None = None,
                 gaps: Mapping[str, Any] | None = None) -> str:
    coverage = coverage or {}
    rows = [
        _probe_row(probe, preset, points, max_slowdown, coverage.get((gpu, probe, preset)))
        for (index, probe, preset), points in sorted(latest.items())
        if index == gpu
    ]
    rows = [r for r in rows if r]
    head = f'<h2 id="gpu-{gpu}-results">GPU {gpu} &middot; {_e(name)}</h2>'
    measured = {(probe, preset) for (index, probe, preset), points in latest.items() if index == gpu
                if any(p.result.status == "ok" and work_rate(p.result) for p in points)}
    waiting = sorted(f"{probe}/{preset}" for (index, probe, preset), due in coverage.items()
                     if index == gpu and due and (probe, preset) not in measured)
    pending = (f'<p class="due" id="due-{gpu}">No result yet, due (waiting for the GPU to be free): '
               f"{_e(', '.join(waiting))}</p>") if waiting else ""
    if gaps:
        pending += f'<p class="due" id="gaps-{gpu}">{_e(gap_words(gaps))}</p>'

    if not rows:
        return (f'<section class="gpu" id="gpu-{gpu}">{head}{pending}'
                '<p class="muted">No probe results yet.</p></section>')
    return (
        f'<section class="gpu" id="gpu-{gpu}">{head}{pending}'
        f'<table class="probes" id="probes-{gpu}"><tr><th>probe</th><th>preset</th><th>caps (W)</th>'
        "<th>throughput at the highest cap</th><th>energy there</th><th>recommended cap</th>"
        "<th>against power cap</th><th>last run</th></tr>"
        f"{''.join(rows)}</table></section>"
    )


def landing_page(
    sampler: Sampler,
    backend_name: str,
    telemetry_path: str,
    latest: Latest | None = None,
    max_slowdown: float = 0.10,
    verdicts: Sequence[Verdict] | None = None,
    sweeps: Mapping[int, SweepProgress] | None = None,
    coverage: Mapping[tuple[int, str, str], bool] | None = None,
    gaps: Mapping[int, Mapping[str, Any]] | None = None,
) -> bytes:
    """The page's HTML. ``latest`` is ``ProbeService.latest()``; None or empty: telemetry only.

    ``verdicts`` is ``HealthMonitor.verdicts()``; None (health off): the health column shows "-".
    ``sweeps`` is ``ProbeService.sweeps()``: a GPU whose cap a sweep holds now is marked in its row
    (cap, point k of n) and above the table. ``coverage`` is ``ProbeScheduler.coverage()``: each result's
    age says whether it is due, and a due probe with no result yet is named. ``gaps`` is
    ``ProbeScheduler.gap_states()``: a GPU with a result due says why it waits (no gap, gaps too short).
    """
    sweeps = sweeps or {}
    by_gpu = {v.gpu: v for v in verdicts or () if v.gpu is not None}
    snap = sampler.store.snapshot()
    readings, last_info, identities = snap.readings, snap.last_good_info, snap.identities
    latest = latest or {}
    rows = []
    names: dict[int, str] = {}
    for gpu, identity in sorted(identities.items()):
        info_points = last_info.get(gpu, ())
        name = info_points[0].labels[0] if info_points else "?"
        names[gpu] = name
        lost = gpu in lost_gpus(readings, sampler.interval_seconds)
        power = readings.get((gpu, "power"))
        values = {p.metric: p.value for p in power.points} if power is not None and power.ok else {}
        draw = values.get("gpuperf_power_draw_watts")
        cap = values.get("gpuperf_power_limit_watts")
        rows.append(
            f'<tr class="gpu-row" data-gpu="{gpu}"><td>{gpu}</td><td>{_e(name)}</td><td><code>{_e(identity.uuid)}</code></td>'
            f'<td class="{"lost" if lost else "up"}">{"lost" if lost else "up"}</td>'
            f'<td class="num">{f"{draw:.0f} W" if draw is not None else "-"}</td>'
            f'<td class="num">{f"{cap:.0f} W" if cap is not None else "-"}</td>{_health_cell(by_gpu.get(gpu))}'
            f"{_sweep_cell(sweeps.get(gpu))}</tr>"
        )
    for verdict in verdicts or ():
        if verdict.gpu is None:
            rows.append(
                f'<tr class="gpu-row missing"><td>-</td><td>?</td><td><code>{_e(verdict.uuid)}</code></td>'
                f'<td class="lost">missing</td><td class="num">-</td><td class="num">-</td>{_health_cell(verdict)}<td>-</td></tr>'
            )
    sections = "".join(_gpu_section(gpu, names[gpu], latest, max_slowdown, coverage, (gaps or {}).get(gpu))
                       for gpu in sorted(identities))
    key = (f'<p class="key">Charts: <i style="background:{RATE_COLOR}"></i>throughput '
           f'<i style="background:{ENERGY_COLOR}"></i>energy per unit (each on its own scale) '
           f'<i style="background:{REC_COLOR}"></i>recommended cap: the lowest energy per unit within '
           f"{100 * max_slowdown:.0f}% of the highest cap's throughput. "
           "Full reports: <code>gpuperfd report</code>.</p>")
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuperfd</title>
<style>{CSS}</style>
</head><body>
<h1>gpuperfd {_e(gpuperfd.__version__)}</h1>
<p>Backend: <b>{_e(backend_name)}</b> &middot; <a href="{_e(telemetry_path)}">Metrics</a> &middot; <a href="/healthz">Liveness</a> &middot; <a href="/api/v1/health">Health verdicts (JSON)</a></p>
{_sweep_banner(sweeps)}<table id="gpus"><tr><th>GPU</th><th>Name</th><th>UUID</th><th>State</th><th>Power</th><th>Power cap</th><th>Health</th><th>Sweep</th></tr>
{''.join(rows)}
</table>
{key}
{sections}
</body></html>
"""
    return body.encode()
