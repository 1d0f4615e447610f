"""The HTML report: one self-contained file (figures embedded as base64 PNG), everything escaped.

Sections (each an element with a fixed id, for readers and tests): ``header``
(date, nodes, GPUs, drivers), ``recommendations``, ``power-cap`` (figure),
``batch-size`` (figure), ``points`` (every cap's numbers), ``outliers`` (the
rule, dropped and failed runs) and ``files``. Table cells holding numbers carry
the unrounded value in ``data-value``.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

import gpuperfd
from gpuperfd.probe_data.record import labels_text
from gpuperfd.probe_data.spec import params_text
from gpuperfd.report.aggregate import Report
from gpuperfd.report.figures import energy_text, percent, utc
from gpuperfd.report.outliers import RULE
from gpuperfd.report.records import LATENCY_TITLES

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1500px;padding:0 1em;color:#222}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.rec td{background:#eaf6ea;font-weight:600}tr.base td{background:#f6f6f6}
img{max-width:100%;height:auto;border:1px solid #eee}.warn{color:#b00;font-weight:bold}.muted{color:#666}.wrong-result{color:#b00;font-weight:bold}
code{font-size:12px}
"""


def _num(value: Any, text: str | None = None, cls: str = "num") -> str:
    if value is None or value == "":
        return f'<td class="{cls}">-</td>'
    shown = text if text is not None else f"{value:.4g}"
    return f'<td class="{cls}" data-value="{escape(repr(float(value)))}">{escape(shown)}</td>'


def _cap(watts: float | None) -> str:
    return "-" if watts is None else f"{watts:g}"


def _cell(text: Any) -> str:
    return f"<td>{escape(str(text))}</td>"


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _header(report: Report) -> str:
    rows = []
    for g in report.gpus:
        memory = f"{g.gpu.memory_total_bytes / 2**30:.0f} GiB" if g.gpu.memory_total_bytes else "-"
        rows.append("<tr>" + "".join(_cell(v) for v in (
            g.gpu.node, g.gpu.index, g.gpu.name, g.label, g.gpu.uuid, ", ".join(g.drivers), g.gpu.compute_capability,
            memory, g.gpu.backend, g.runs)) + "</tr>")
    simulated = any(g.gpu.backend == "simulated" for g in report.gpus)
    notes = "".join(f'<p class="muted">{escape(n)}</p>' for n in report.notes)
    return f"""<header id="header">
<h1>gpuperfd report</h1>
<p>Generated <b id="generated">{escape(utc(report.generated_at))}</b> by gpuperfd {escape(gpuperfd.__version__)} &middot;
data from <b>{escape(utc(report.first_time))}</b> to <b>{escape(utc(report.last_time))}</b></p>
{'<p class="warn">Simulated GPUs: these numbers come from the simulator, not from hardware.</p>' if simulated else ''}
<p>Nodes: <b id="nodes">{escape(', '.join(report.nodes))}</b> &middot; drivers: <b id="drivers">{escape(', '.join(report.drivers))}</b></p>
<table id="gpus"><tr><th>node</th><th>GPU</th><th>model</th><th>label</th><th>UUID</th><th>driver</th><th>compute capability</th>
<th>memory</th><th>backend</th><th>runs</th></tr>
{''.join(rows)}
</table>
<p>Sources: {escape('; '.join(report.sources))}</p>
<p>Runs: <b>{report.runs_total}</b> ({escape(report.runs_text)}).
<span id="rule">{escape(report.rule_text[0].upper() + report.rule_text[1:])}</span>.</p>
{notes}
</header>"""


def _recommendations(report: Report) -> str:
    rows = []
    for s in report.series:
        rec, best, base = s.recommendation, s.recommended, s.baseline
        if len(s.capped) < 2:
            continue
        attrs = (f'data-gpu="{escape(s.gpu.uuid)}" data-node="{escape(s.gpu.node)}" data-probe="{escape(s.probe)}" '
                 f'data-preset="{escape(s.preset)}" data-batch="{s.batch_size if s.batch_size is not None else ""}"')
        cells = [_cell(s.label), _cell(s.probe), _cell(s.kind), _cell(s.preset), _cell(s.batch_size or "-"),
                 _cell(" ".join(f"{p.cap_watts:g}" for p in s.capped))]
        if rec is None or best is None or base is None:
            cells.append('<td colspan="7" class="muted">one cap only: no recommendation</td>')
        else:
            cells += [
                _num(rec.cap_watts, f"{rec.cap_watts:.0f} W"),
                _num(rec.baseline_cap_watts, f"{rec.baseline_cap_watts:.0f} W"),
                _num(rec.energy_saving_ratio, percent(rec.energy_saving_ratio)),
                _num(rec.slowdown_ratio, percent(rec.slowdown_ratio)),
                _num(best.energy_per_unit, f"{energy_text(best.energy_per_unit)}/{s.work_unit}"),
                _num(base.energy_per_unit, f"{energy_text(base.energy_per_unit)}/{s.work_unit}"),
                _num(best.rate, f"{best.rate:,.1f} {s.work_unit}s/s"),
            ]
        rows.append(f"<tr {attrs}>{''.join(cells)}</tr>")
    return f"""<section id="recommendations">
<h2>Recommended power caps</h2>
<table><tr><th>GPU</th><th>probe</th><th>kind</th><th>preset</th><th>batch</th><th>caps tested (W)</th>
<th>recommended cap</th><th>baseline cap</th><th>energy saving</th><th>slowdown</th><th>energy at recommended</th>
<th>energy at baseline</th><th>throughput at recommended</th></tr>
{''.join(rows)}
</table>
</section>"""


def _repeats(report: Report, png: bytes | None) -> str:
    from gpuperfd.report.figures import repeat_table

    head, rows = repeat_table(report)
    if not rows:
        return ""
    cells = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    chart = _img(png, "each metric per repeat, with its mean and one standard deviation") if png else ""
    return f"""<section id="repeats">
<h2>Summary across repeats</h2>
<p class="muted">No power-cap sweep and nothing varied: each metric's mean, spread and coefficient of variation
over the measured windows (or over the runs, where the input keeps no windows). Latency pools every sample.</p>
<table><tr>{"".join(f"<th>{escape(h)}</th>" for h in head)}</tr>
{cells}
</table>
{chart}
</section>"""


def _points(report: Report) -> str:
    rows = []
    for s in report.series:
        rec = s.recommendation
        name = s.latency_name
        for p in s.points:
            cls = ""
            if rec and p is s.recommended:
                cls = ' class="rec"'
            elif rec and p is s.baseline:
                cls = ' class="base"'
            cap = "" if p.cap_watts is None else f"{p.cap_watts:g}"
            attrs = (f'data-gpu="{escape(s.gpu.uuid)}" data-node="{escape(s.gpu.node)}" data-probe="{escape(s.probe)}" '
                     f'data-preset="{escape(s.preset)}" data-batch="{s.batch_size if s.batch_size is not None else ""}" '
                     f'data-variant="{escape(s.variant)}" data-cap="{cap}"')
            latency = [_num(p.latency(name, q), f"{p.latency(name, q) * 1000:.4g}" if p.latency(name, q) is not None else None)
                       for q in (50, 95, 99)]
            cells = [
                _cell(s.label), _cell(s.probe), _cell(s.variant or "-"), _cell(s.preset), _cell(s.batch_size or "-"),
                _cell(" ".join(filter(None, [params_text(s.params, model=False), labels_text(s.labels)]))),
                _num(p.cap_watts, f"{p.cap_watts:.0f}" if p.cap_watts is not None else None), _num(p.runs, str(p.runs)),
                _num(p.dropped, str(p.dropped)),
                _num(p.rate, f"{p.rate:,.1f}"), _cell(f"{s.work_unit}s/s"),
                _num(p.energy_per_unit, energy_text(p.energy_per_unit) if p.energy_per_unit is not None else None),
                _num(p.power, f"{p.power:.1f}" if p.power is not None else None),
                _cell(LATENCY_TITLES.get(name, name)), *latency,
                _num(p.latency(name, "mean"), f"{p.latency(name, 'mean') * 1000:.4g}" if p.latency(name, "mean") is not None else None),
                _num(p.latency("ttft_seconds", "mean"), f"{p.latency('ttft_seconds', 'mean') * 1000:.4g}"
                     if p.latency("ttft_seconds", "mean") is not None else None),
                _num(p.throughput.get("requests_per_second")),
                _num(p.peak_memory_bytes, f"{p.peak_memory_bytes / 2**20:.1f}" if p.peak_memory_bytes else None),
                _num(p.temperature, f"{p.temperature:.0f}" if p.temperature is not None else None),
                _num(p.utilization, f"{100 * p.utilization:.0f}%" if p.utilization is not None else None),
                _num(p.loss),
                *(_num(v, f"{v:.0%}" if v is not None else None) for v in (p.gpm_tensor_active_ratio, p.gpm_dram_active_ratio)),
            ]
            rows.append(f"<tr{cls} {attrs}>{''.join(cells)}</tr>")
    return f"""<section id="points">
<h2>Every point: means of the kept runs</h2>
<p class="muted">Highlighted: the recommended cap (green) and the baseline, the highest cap tested (grey).
Latency percentiles pool every sample of the kept runs.</p>
<table><tr><th>GPU</th><th>probe</th><th>variant</th><th>preset</th><th>batch</th><th>parameters</th><th>cap (W)</th>
<th>runs</th><th>outliers</th><th>throughput</th><th>unit</th><th>energy per unit</th><th>average power (W)</th>
<th>latency</th><th>p50 (ms)</th><th>p95 (ms)</th><th>p99 (ms)</th><th>mean (ms)</th><th>TTFT mean (ms)</th>
<th>requests/s</th><th>peak memory (MiB)</th><th>temperature (&deg;C)</th><th>GPU utilization</th><th>loss</th>
<th title="GPM tensor-pipe active, mean over the measured windows">tensor active</th>
<th title="GPM DRAM bandwidth active, mean over the measured windows">DRAM active</th></tr>
{''.join(rows)}
</table>
</section>"""


WRONG_RESULT = "wrong_result"


def wrong_result_marker(reason: str | None) -> str:
    """The reason cell of a failed run; runs with wrong results stand out (they mean a bad GPU, not a bad run)."""
    if reason == WRONG_RESULT:
        return "WRONG RESULT (wrong_result)"
    return reason or "-"


def _outliers(report: Report) -> str:
    dropped = "".join(
        "<tr>" + "".join(_cell(v) for v in (utc(d.run.time, "%Y-%m-%d %H:%M:%S"), d.run.gpu.node, d.run.gpu.index,
                                          d.run.probe, d.run.preset, d.run.batch_size or "-", _cap(d.run.cap_watts),
                                          d.reason, d.run.source)) + "</tr>"
        for d in report.dropped
    )
    failed = "".join(
        ('<tr class="wrong-result">' if r.failure_reason == WRONG_RESULT else "<tr>")
        + "".join(_cell(v) for v in (utc(r.time, "%Y-%m-%d %H:%M:%S"), r.gpu.node, r.gpu.index, r.probe,
                                     r.preset, r.batch_size or "-", _cap(r.cap_watts), r.status,
                                     wrong_result_marker(r.failure_reason))) + "</tr>"
        for r in report.failed
    )
    skipped = "".join(
        "<tr>" + "".join(_cell(v) for v in (utc(r.time, "%Y-%m-%d %H:%M:%S"), r.gpu.node, r.gpu.index, r.probe,
                                          r.preset, r.batch_size or "-", _cap(r.cap_watts), r.status,
                                          r.failure_reason or "")) + "</tr>"
        for r in report.skipped
    )
    wrong = sum(r.failure_reason == WRONG_RESULT for r in report.failed)
    wrong_note = (f'<p class="wrong-result"><b>{wrong} run(s) computed wrong numbers</b> (answer checks failed: '
                  "silent data corruption; see docs/probes.md, Correctness). Treat those GPUs as unhealthy.</p>"
                  if wrong else "")
    rule = RULE if report.outliers_removed else "outlier removal was switched off (--keep-outliers)"
    return f"""<section id="outliers">
<h2>Outliers and failed runs</h2>
<p>Rule: {escape(rule)}. MAD is the median absolute deviation; 1.4826&middot;MAD estimates the standard deviation
of normal data. A group with a MAD of 0 or fewer than 3 runs drops nothing. See docs/reports.md.</p>
<h3>Dropped ({len(report.dropped)})</h3>
{'<table><tr><th>time (UTC)</th><th>node</th><th>GPU</th><th>probe</th><th>preset</th><th>batch</th><th>cap (W)</th><th>why</th><th>source</th></tr>' + dropped + '</table>' if dropped else '<p class="muted">none</p>'}
<h3>Failed ({len(report.failed)})</h3>
{wrong_note}
{'<table><tr><th>time (UTC)</th><th>node</th><th>GPU</th><th>probe</th><th>preset</th><th>batch</th><th>cap (W)</th><th>status</th><th>reason</th></tr>' + failed + '</table>' if failed else '<p class="muted">none</p>'}
<h3>Skipped on purpose ({len(report.skipped)})</h3>
{'<table><tr><th>time (UTC)</th><th>node</th><th>GPU</th><th>probe</th><th>preset</th><th>batch</th><th>cap (W)</th><th>status</th><th>reason</th></tr>' + skipped + '</table>' if skipped else '<p class="muted">none</p>'}
</section>"""


def _realized(report: Report) -> str:
    """Apply mode's realized savings: the probe at the applied cap against the operator's cap (docs/apply.md)."""
    rows = "".join(
        f"<tr>{_cell(r.gpu)}{_cell(r.model)}{_cell(r.probe)}{_cell(r.preset)}{_num(r.applied_cap_watts, _cap(r.applied_cap_watts))}"
        f"{_num(r.operator_cap_watts, _cap(r.operator_cap_watts))}{_num(r.power_saved_watts, f'{r.power_saved_watts:.0f} W')}"
        f"{_num(r.mwh_per_year, f'{r.mwh_per_year:.2f}')}{_num(r.energy_saving_ratio, percent(r.energy_saving_ratio))}"
        f"{_num(r.throughput_loss_ratio, percent(r.throughput_loss_ratio))}{_num(r.sweeps, str(r.sweeps))}</tr>"
        for r in report.realized)
    total = sum(r.power_saved_watts for r in report.realized)
    return f"""<section id="realized">
<h2>Realized savings of apply mode</h2>
<p class="muted">Measured in the sweeps that ran under an applied cap: the probe at the applied cap against the
same probe at the operator's cap, while busy. All GPUs: {total:.0f} W less.</p>
<table><tr><th>GPU</th><th>model</th><th>probe</th><th>preset</th><th>applied cap</th><th>operator's cap</th>
<th>power saved</th><th>MWh a year if always busy</th><th>energy saving</th><th>throughput given up</th><th>sweeps</th></tr>
{rows}
</table>
</section>"""


def render_html(
    report: Report, cap_png: bytes | None, axes_png: bytes | None, bars_png: bytes | None, files: dict[str, str],
    repeats_png: bytes | None = None, tokens_png: bytes | None = None,
) -> str:
    """The whole page; a section with nothing to say (no cap sweep, nothing varied) is left out, and a
    study of repeats alone gets its summary across repeats instead."""
    links = " &middot; ".join(f'<a href="{escape(name)}">{escape(label)}</a>' for label, name in files.items())
    sections = []
    if any(len(s.capped) > 1 for s in report.series):
        sections.append(_recommendations(report))
    if report.realized:
        sections.append(_realized(report))
    if cap_png:
        sections.append(f"""<section id="power-cap">
<h2>Against power cap</h2>
<p class="muted">Inference probes on the left, training on the right. One line per GPU (colour) and batch size
(line style); the star marks each line's recommended cap. Latency: line at p50, band up to p99.</p>
{_img(cap_png, "throughput, energy per unit, power, latency, temperature, utilization and loss against power cap")}
</section>""")
    if axes_png:
        sections.append(f"""<section id="batch-size">
<h2>Against the parameters that vary</h2>
<p class="muted">Throughput, latency and peak memory against model size, batch size, sequence length and n_groups,
wherever the data varies them; one line per combination of the other factors.</p>
{_img(axes_png, "throughput, latency and peak memory against the parameters that vary")}
</section>""")
    if bars_png:
        sections.append(f"""<section id="compare">
<h2>Variants, GPUs, hosts and labels compared</h2>
{_img(bars_png, "grouped bars comparing variants, GPUs, hosts or labels")}
</section>""")
    from gpuperfd.report.figures import png_bytes
    from gpuperfd.report.seed004 import seed004_html, speculative_figure

    curve = speculative_figure(report)
    seed004 = seed004_html(report, _img(png_bytes(curve), "speculative tokens/s against the acceptance rate")
                           if curve is not None else "")
    if seed004:
        sections.append(seed004)
    if tokens_png:
        sections.append(f"""<section id="tokens">
<h2>Per-token latency over the output position</h2>
<p class="muted">Mean time to each output token (after the first) over the requests that traced every token
(a fixed share of each window's requests); one line per llm series. Token 1's time is the TTFT, charted above.</p>
{_img(tokens_png, "time to each output token against its position")}
</section>""")
    if not (cap_png or axes_png or bars_png):
        sections.append(_repeats(report, repeats_png))
    body = "\n".join(sections)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuperfd report {escape(utc(report.generated_at))}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{CSS}</style></head><body>
{_header(report)}
{body}
{_points(report)}
{_outliers(report)}
<section id="files"><h2>Files</h2><p>{links}</p></section>
</body></html>
"""
