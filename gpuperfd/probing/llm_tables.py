"""Seed 004's tables for the llm probe's Llama points: one row per configuration (model, variant as
the seed's "framework", batch), the HBM roofline beside the decode figure, and speculative decoding's
tokens/s at the named acceptance rates and on a curve (pure Python: the CLI and the report use it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuperfd.console import format_table
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.kinds import is_llama_point

__all__ = ["llama_results", "seed004_table", "speculative_table", "speculative_lines"]


def llama_results(results: Sequence[ProbeResult]) -> list[ProbeResult]:
    """The llm probe's Llama points."""
    return [r for r in results if is_llama_point(r.probe, (r.params or {}).get("model"))]


def _mean_ms(result: ProbeResult, name: str) -> float | None:
    values = (result.latencies or {}).get(name) or []
    return sum(values) / len(values) * 1e3 if values else None


def seed004_rows(results: Sequence[ProbeResult]) -> list[list[Any]]:
    """Rows of seed 004's table (one per configuration; failed points say why)."""
    rows = []
    for r in llama_results(results):
        p = r.params or {}
        roof = (r.extra or {}).get("roofline") or {}
        thr = r.throughput or {}
        status = r.status if r.ok else f"{r.status}:{r.failure_reason}"
        share = roof.get("share")
        rows.append([p.get("model"), r.variant, p.get("batch_size"), f"{p.get('prompt_tokens')}+{p.get('output_tokens')}",
                     status, _mean_ms(r, "ttft_seconds"), _mean_ms(r, "tpot_seconds"),
                     thr.get("output_tokens_per_second"), thr.get("decode_tokens_per_second"),
                     roof.get("tokens_per_second"), share * 100 if share is not None else None,
                     r.energy_per_unit_joules])
    return rows


SEED004_HEADERS = ["model", "variant", "batch", "in+out", "status", "TTFT ms", "TPOT ms", "output tok/s",
                   "decode tok/s", "HBM roofline tok/s", "of roofline %", "J/token"]


def seed004_table(results: Sequence[ProbeResult]) -> str | None:
    """Seed 004's table of the Llama points, or None without any."""
    rows = seed004_rows(results)
    if not rows:
        return None
    return format_table(SEED004_HEADERS, rows, align=["l", "l", "r", "l", "l", *["r"] * 7], drop_empty=True)


def speculative_rows(result: ProbeResult, curve: bool = False) -> list[list[Any]]:
    """(acceptance rate, expected tokens a round, tokens/s, speedup over plain decode) at the named
    rates, or on the curve."""
    spec = (result.extra or {}).get("speculative") or {}
    points = spec.get("curve" if curve else "at_rates") or []
    return [[p["acceptance_rate"], p["expected_tokens_per_round"], p["tokens_per_second"], p["speedup"]]
            for p in points]


def speculative_lines(result: ProbeResult) -> list[str]:
    """What one speculative point measured, in words, with the note that acceptance is not measured."""
    spec = (result.extra or {}).get("speculative") or {}
    if not spec:
        return []
    p = result.params or {}
    draft_ms = spec["draft_step_seconds"] * 1e3
    lines = [f"speculative {p.get('model')} with draft {p.get('draft_model')}, k = {spec['speculative_tokens']}: "
             f"draft step {draft_ms:.3g} ms, verify of {spec['speculative_tokens'] + 1} tokens "
             f"{spec['verify_seconds'] * 1e3:.3g} ms, plain target decode step "
             + (f"{spec['target_decode_step_seconds'] * 1e3:.3g} ms" if spec.get("target_decode_step_seconds") else "-")]
    if spec.get("break_even_acceptance_rate") is not None:
        lines.append(f"break-even acceptance rate (speculation beats plain decode above it): "
                     f"{spec['break_even_acceptance_rate']:.3f}")
    lines.append(f"note: {spec['note']}")
    return lines


def speculative_table(results: Sequence[ProbeResult]) -> str | None:
    """Every speculative point's tokens/s at its named acceptance rates and on the curve, in words."""
    blocks = []
    for r in llama_results(results):
        if not (r.extra or {}).get("speculative"):
            continue
        named = format_table(["acceptance", "tokens/round", "tokens/s", "speedup"], speculative_rows(r))
        curve = format_table(["acceptance", "tokens/round", "tokens/s", "speedup"], speculative_rows(r, curve=True))
        blocks.append("\n".join([*speculative_lines(r), "at the named rates:", named, "curve:", curve]))
    return "\n\n".join(blocks) if blocks else None
