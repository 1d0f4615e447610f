"""One ``gpuperfd top`` frame as lines of text, each at most the terminal's width.

Layout: a header, then one block per GPU: its title (index, name, up or lost, verdict, a sweep
marker), its telemetry, the verdict's reasons, one line per probe result and its recommendation,
and the sweep in progress. Each block is groups of short fields that flow onto as few lines as the
width allows (two on one line at 120 columns, one per line at 40); a field wider than the line is
word-wrapped, never cut mid-way or left to overflow, so a narrow terminal over SSH shows whole lines.
Colour (ANSI) only when asked, after the layout, so escape codes never count towards the width.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from gpuperfd.web.status import age_words

#: (text, style) of one field; style names a colour below or "".
Field = tuple[str, str]
STYLES = {"bold": "1", "green": "32", "yellow": "33", "red": "31;1", "magenta": "35;1", "dim": "2"}
STATE_STYLE = {"healthy": "green", "unknown": "yellow", "degraded": "yellow", "unhealthy": "red"}
#: Reasons shown per GPU (worst first, as the daemon sorts them); the rest are counted.
MAX_REASONS = 3
#: Narrowest width laid out; below it lines are still cut to the width.
MIN_WIDTH = 20
GIB = 1024 ** 3
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def visible_width(line: str) -> int:
    """The columns a line takes on a terminal (escape codes take none)."""
    return len(_ANSI.sub("", line))


def fmt_rate(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _chunks(text: str, room: int) -> list[str]:
    """``text`` word-wrapped to ``room`` columns (a word longer than that is split)."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        while len(word) > room:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:room])
            word = word[room:]
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= room:
            line += " " + word
        else:
            lines.append(line)
            line = word
    if line or not lines:
        lines.append(line)
    return lines


#: A laid-out line: its indent and its fields (joined by two spaces).
Line = tuple[int, list[Field]]


def flow(fields: Sequence[Field], width: int, indent: int = 0, more: int = 2) -> list[Line]:
    """Fields onto lines of at most ``width`` columns, two spaces apart: the first line indented by
    ``indent``, the lines after by ``indent + more`` (no indent at all below :data:`MIN_WIDTH`)."""
    if width < MIN_WIDTH:
        indent, more = 0, 0
    lines: list[Line] = []
    pad, line, used = indent, [], indent
    for text, style in fields:
        if line and used + 2 + len(text) <= width:
            line.append((text, style))
            used += 2 + len(text)
            continue
        if line:
            lines.append((pad, line))
            pad = indent + more
        pieces = _chunks(text, max(1, width - indent - more))
        for piece in pieces[:-1]:
            lines.append((pad, [(piece, style)]))
            pad = indent + more
        line, used = [(pieces[-1], style)], pad + len(pieces[-1])
    if line:
        lines.append((pad, line))
    return lines


def _telemetry(gpu: dict[str, Any]) -> list[Field]:
    out: list[Field] = []
    util = gpu.get("utilization_ratio")
    out.append((f"util {100 * util:.0f}%" if util is not None else "util -", ""))
    used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
    out.append((f"mem {used / GIB:.1f}/{total / GIB:.1f} GiB" if used is not None and total else "mem -", ""))
    draw, cap = gpu.get("power_draw_watts"), gpu.get("power_limit_watts")
    power = f"{draw:.0f}" if draw is not None else "-"
    out.append((f"power {power}/{cap:.0f} W cap" if cap is not None else f"power {power} W", ""))
    held = gpu.get("apply")
    if held:  # the cap is apply mode's, not the operator's: say so beside it
        operator = held.get("operator_watts")
        out.append((f"cap {held['applied_watts']:.0f} W set by apply mode"
                    + (f" (operator's {operator:.0f} W)" if operator is not None else ""), "magenta"))
    temp = gpu.get("temperature_celsius")
    out.append((f"temp {temp:.0f} C" if temp is not None else "temp -", ""))
    sm, sm_max = gpu.get("sm_clock_hertz"), gpu.get("sm_clock_max_hertz")
    clock = f"SM {sm / 1e6:.0f}" if sm is not None else "SM -"
    out.append((clock + (f"/{sm_max / 1e6:.0f} MHz" if sm_max else " MHz"), ""))
    events = gpu.get("clock_events")
    if events is not None:
        active = [e for e in events if e != "gpu_idle"]
        out.append((f"throttle: {', '.join(active)}" if active else ("clocks: idle" if events else "no throttle"),
                    "yellow" if active else ""))
    return out


def _probe_fields(probe: dict[str, Any]) -> list[Field]:
    unit = probe.get("unit") or "unit"
    rate = probe.get("units_per_second")
    text = f"{probe['probe']}/{probe['preset']} at {probe['cap_watts']:.0f} W: {fmt_rate(rate or 0)} {unit}s/s"
    expected = probe.get("expected_units_per_second")
    against = (f"{100 * (rate / expected - 1):+.1f}% vs expected {fmt_rate(expected)}" if expected and rate
               else "no expected figure (peers only)")
    fields: list[Field] = [(text, ""), (against, "red" if expected and rate and rate < 0.9 * expected else "dim")]
    age = probe.get("age_seconds")
    if age is not None:  # issue 50: how fresh, and whether a new result is due
        fields.append((f"result {age_words(age)} old" + (", due" if probe.get("due") else ""),
                       "yellow" if probe.get("due") else "dim"))
    rec = probe.get("recommendation")
    if rec is not None:
        if round(rec["cap_watts"]) == round(rec["baseline_cap_watts"]):
            fields.append((f"recommended {rec['cap_watts']:.0f} W (the highest cap tested)", "green"))
        else:
            saved = rec.get("watts_saved_while_busy")
            words = (f"recommended {rec['cap_watts']:.0f} W: {100 * rec['energy_saving_ratio']:.1f}% less energy, "
                     f"{100 * rec['slowdown_ratio']:.1f}% slower" + (f", {saved:.0f} W less busy" if saved else ""))
            fields.append((words, "green"))
    return fields


def gpu_block(gpu: dict[str, Any], width: int) -> list[Line]:
    """One GPU's lines: title, telemetry, verdict reasons, probe results, the sweep in progress."""
    health = gpu.get("health")
    title: list[Field] = [(f"GPU {gpu['gpu']}", "bold"), (gpu.get("name") or "?", "bold"),
                          ("up", "green") if gpu.get("up") else ("LOST", "red")]
    if health is not None:
        action = "" if health["action"] == "none" else f" ({health['action'].replace('_', ' ')})"
        title.append((health["state"] + action, STATE_STYLE.get(health["state"], "")))
    sweep = gpu.get("sweep")
    if sweep is not None:
        title.append(("SWEEPING", "magenta"))
    lines = flow(title, width)
    if gpu.get("up"):
        lines += flow(_telemetry(gpu), width, 2)
    reasons = (health or {}).get("reasons", [])
    for reason in reasons[:MAX_REASONS]:
        lines += flow([(f"! {reason['message']}", STATE_STYLE.get(reason["severity"], "yellow"))], width, 2)
    if len(reasons) > MAX_REASONS:
        lines += flow([(f"! and {len(reasons) - MAX_REASONS} more (GET /api/v1/health)", "dim")], width, 2)
    for probe in gpu.get("probes") or ():
        lines += flow(_probe_fields(probe), width, 2)
    for cover in gpu.get("coverage") or ():
        if cover.get("age_seconds") is None:  # scheduled, no result yet
            lines += flow([(f"{cover['probe']}/{cover['preset']}: no result yet"
                            + (", due (waiting for a gap)" if cover.get("due") else ""), "yellow")], width, 2)
    gaps = gpu.get("gaps")
    if gaps and gaps.get("words"):
        lines += flow([(gaps["words"], "yellow" if gaps.get("state") in ("no_gap", "gaps_too_short") else "dim")],
                      width, 2)
    if sweep is not None:
        lines += flow([(f"sweep in progress: {sweep['probe']}/{sweep['preset']} at {sweep['cap_watts']:.0f} W, "
                        f"point {sweep['point']} of {sweep['points']}", "magenta")], width, 2)
    return lines


def header(data: dict[str, Any], source: str, width: int, error: str | None = None) -> list[Line]:
    """The frame's first lines: what it shows, where it comes from, when; the last fetch's error if any."""
    when = time.strftime("%H:%M:%S UTC", time.gmtime(data.get("time") or time.time()))
    fields: list[Field] = [("gpuperfd top", "bold"), (f"from {source}", ""),
                           (f"backend {data.get('backend', '?')}", ""), (f"{len(data.get('gpus', []))} GPU(s)", ""),
                           (when, "dim")]
    lines = flow(fields, width)
    if error is not None:
        lines += flow([(f"stale: {error}", "red")], width)
    return lines


def render(data: dict[str, Any], source: str, width: int, color: bool = False, error: str | None = None) -> list[str]:
    """The whole frame as lines of at most ``width`` visible columns, a blank line between GPUs."""
    width = max(1, width)
    out = [_text(line, color) for line in header(data, source, width, error)]
    for gpu in data.get("gpus", []):
        out.append("")
        out += [_text(line, color) for line in gpu_block(gpu, width)]
    return [line if visible_width(line) <= width else line[:width] for line in out]


def _text(line: Line, color: bool) -> str:
    pad, fields = line
    parts = [f"\x1b[{STYLES[style]}m{text}\x1b[0m" if color and style else text for text, style in fields]
    return " " * pad + "  ".join(parts)
