"""Seed 004's section of the report: the llm probe's Llama series as the seed tabulates them (one row per
configuration: model, variant as the seed's "framework", batch; TTFT, time per output token, tokens/s),
the HBM roofline and the share reached beside the decode figure, and speculative decoding's tokens/s
over the acceptance rate (computed from the measured draft round and verify step: random weights make
a measured acceptance rate meaningless, and the section says so).

TTFT, time per token and throughput per configuration are also in the report's parameter and bar
charts (every llm series is there); this section is the seed's own table and the curve."""

from __future__ import annotations

from html import escape
from typing import Any

from matplotlib.figure import Figure

from gpuperfd.probe_data.kinds import is_llama_point
from gpuperfd.probe_data.spec import PRESETS
from gpuperfd.report.aggregate import CapPoint, Report, Series

__all__ = ["llama_series", "seed004_rows", "speculative_figure", "seed004_html"]


def model_of(series: Series) -> str:
    """The series' model: its preset's (the report tells models apart by preset, as its charts do)."""
    return str(PRESETS.get(series.probe, {}).get(series.preset, {}).get("model") or series.preset)


def llama_series(report: Report) -> list[Series]:
    """The llm probe's series on a Llama model."""
    return [s for s in report.series if is_llama_point(s.probe, model_of(s))]


def _point(series: Series) -> CapPoint:
    """The figure a configuration is shown at: its baseline (highest cap, or the uncapped run)."""
    return series.baseline or series.points[-1]


def seed004_rows(report: Report) -> list[dict[str, Any]]:
    """One dict per Llama configuration: what the seed's table shows, and the roofline beside it."""
    rows = []
    for s in llama_series(report):
        point = _point(s)
        roof = point.llm_figures.get("roofline") or {}
        decode = point.throughput.get("decode_tokens_per_second")
        bound = roof.get("tokens_per_second")
        rows.append({
            "gpu": s.label, "model": model_of(s), "variant": s.variant, "batch_size": s.batch_size,
            "tokens": f"{s.params.get('prompt_tokens')}+{s.params.get('output_tokens')}",
            "ttft_ms": _ms(point.latency("ttft_seconds", "mean")),
            "tpot_ms": _ms(point.latency("tpot_seconds", "mean")),
            "output_tokens_per_second": point.throughput.get("output_tokens_per_second", point.rate),
            "decode_tokens_per_second": decode,
            "roofline_tokens_per_second": bound,
            "roofline_share": decode / bound if decode and bound else None,
            "energy_per_token": point.energy_per_unit,
        })
    return rows


def _ms(seconds: float | None) -> float | None:
    return seconds * 1e3 if seconds is not None else None


def speculative_series(report: Report) -> list[Series]:
    return [s for s in llama_series(report) if _point(s).llm_figures.get("speculative")]


def speculative_figure(report: Report) -> Figure | None:
    """Tokens/s against the acceptance rate, one line per speculative configuration, the plain decode
    rate dashed beside it and the named rates marked (None without a speculative series)."""
    series = speculative_series(report)
    if not series:
        return None
    fig = Figure(figsize=(7.5, 3.4), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    for index, s in enumerate(series):
        spec = _point(s).llm_figures["speculative"]
        color = f"C{index % 10}"
        name = f"{s.label} {model_of(s)} + {spec.get('draft_model')} k={spec['speculative_tokens']}"
        curve = spec.get("curve") or []
        ax.plot([p["acceptance_rate"] for p in curve], [p["tokens_per_second"] for p in curve], color=color,
                label=name)
        named = spec.get("at_rates") or []
        ax.scatter([p["acceptance_rate"] for p in named], [p["tokens_per_second"] for p in named], color=color,
                   zorder=3, s=18)
        if spec.get("baseline_tokens_per_second"):
            ax.axhline(spec["baseline_tokens_per_second"], color=color, linestyle="--", linewidth=0.8,
                       label=f"{name}: plain target decode")
    ax.set_xlabel("acceptance rate (computed, not measured: random weights)", fontsize=8)
    ax.set_ylabel("tokens/s", fontsize=8)
    ax.set_title("Speculative decoding: tokens/s from the measured draft round and verify step", fontsize=9,
                 loc="left", fontweight="bold")
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6.5)
    return fig


def _num(value: Any, digits: str = ".4g") -> str:
    return '<td class="num">-</td>' if value is None else f'<td class="num">{format(value, digits)}</td>'


def seed004_html(report: Report, curve_img: str = "") -> str:
    """The section (empty without a Llama series): the table, the speculative lines and the curve."""
    rows = seed004_rows(report)
    if not rows:
        return ""
    head = ["GPU", "model", "variant", "batch", "in+out", "TTFT ms", "TPOT ms", "output tok/s", "decode tok/s",
            "HBM roofline tok/s", "of roofline", "J/token"]
    body = []
    for r in rows:
        share = f"{r['roofline_share']:.0%}" if r["roofline_share"] is not None else None
        body.append("<tr>" + "".join([
            f"<td>{escape(str(r['gpu']))}</td>", f"<td>{escape(str(r['model']))}</td>",
            f"<td>{escape(str(r['variant']))}</td>", _num(r["batch_size"], "d") if r["batch_size"] else _num(None),
            f"<td>{escape(r['tokens'])}</td>", _num(r["ttft_ms"]), _num(r["tpot_ms"]),
            _num(r["output_tokens_per_second"]), _num(r["decode_tokens_per_second"]),
            _num(r["roofline_tokens_per_second"]),
            f'<td class="num">{share}</td>' if share else _num(None), _num(r["energy_per_token"])]) + "</tr>")
    notes = []
    for s in speculative_series(report):
        spec = _point(s).llm_figures["speculative"]
        rates = ", ".join(f"{p['acceptance_rate']:g}: {p['tokens_per_second']:.4g} tok/s"
                          + (f" ({p['speedup']:.2f}x)" if p.get("speedup") else "") for p in spec.get("at_rates", []))
        notes.append(f"<li>{escape(str(s.label))} {escape(model_of(s))} with draft "
                     f"{escape(str(spec.get('draft_model')))}, k = {spec['speculative_tokens']}: draft step "
                     f"{spec['draft_step_seconds'] * 1e3:.3g} ms, verify of {spec['speculative_tokens'] + 1} tokens "
                     f"{spec['verify_seconds'] * 1e3:.3g} ms; at acceptance {escape(rates)}. "
                     f"{escape(spec['note'])}.</li>")
    return f"""<section id="seed004">
<h2>LLM: seed 004's table (Llama family)</h2>
<p class="muted">One row per configuration, variants as the seed's frameworks (fused: the batch-1 decode step as
Triton kernels in a CUDA graph; graph: static cache and CUDA graphs; compiled: the same under torch.compile; eager: Hugging
Face generate(); speculative: a draft and the target's verify).
The HBM roofline is the card's datasheet bandwidth over the bytes one decode step reads (every weight once, and
the live KV cache); "of roofline" is the decode rate's share of it.</p>
<table><thead><tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr></thead>
<tbody>{''.join(body)}</tbody></table>
{f'<ul>{"".join(notes)}</ul>' if notes else ''}
{curve_img}
</section>"""
