"""Attention microbenchmark: ``scaled_dot_product_attention`` over (batch, heads, seq, head_dim).

Grouped-query variants: ``n_groups`` query heads share one key/value head
(``heads / n_groups`` KV heads; 1 is plain multi-head attention), run with
``enable_gqa=True`` so the kernel reads the smaller K/V directly.

Per call: FLOPs = 4 x batch x heads x head_dim x (query, key) pairs attended
(seq^2, or seq(seq+1)/2 when causal): two matmuls, 2 FLOPs per multiply-add.
Bytes = the minimum traffic: Q and the output (heads) plus K and V (KV heads),
each read or written once. Work unit: one call ("iteration").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpuperfd.probe_child import correctness
from gpuperfd.probe_child.context import Clock, ProbeContext, WindowStats
from gpuperfd.probe_data.spec import ProbeSpec

__all__ = ["build", "AttentionWorkload", "attention_flops", "attention_bytes"]


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    pairs = seq * (seq + 1) / 2 if causal else seq * seq
    return 4.0 * batch * heads * head_dim * pairs


def attention_bytes(batch: int, heads: int, seq: int, head_dim: int, n_groups: int, element_size: int) -> float:
    kv_heads = heads // n_groups
    return float(element_size * batch * seq * head_dim * (2 * heads + 2 * kv_heads))


class AttentionWorkload:
    work_unit = "iteration"
    host_clock = False

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext) -> None:
        self.spec = spec
        self.ctx = ctx
        B, H, S, Dh, g = spec.batch_size, spec.heads, spec.seq_len, spec.head_dim, spec.n_groups
        gen = ctx.generator()
        self.q = torch.randn((B, H, S, Dh), generator=gen, device=ctx.device, dtype=ctx.dtype)
        self.k = torch.randn((B, H // g, S, Dh), generator=gen, device=ctx.device, dtype=ctx.dtype)
        self.v = torch.randn((B, H // g, S, Dh), generator=gen, device=ctx.device, dtype=ctx.dtype)
        self.gqa = g > 1
        self.flops = attention_flops(B, H, S, Dh, spec.causal)
        self.bytes = attention_bytes(B, H, S, Dh, g, self.q.element_size())
        self.backend = self._backend()
        self.marks: list[int] = []

    def _backend(self) -> str | None:
        """Which fused kernel SDPA picks for these inputs (private API; None if unknown)."""
        try:
            from torch.nn.attention import SDPBackend

            choice = torch._fused_sdp_choice(self.q, self.k, self.v, None, 0.0, self.spec.causal,
                                             enable_gqa=self.gqa)
            return SDPBackend(choice).name
        except Exception:  # noqa: BLE001 - informational only
            return None

    def _call(self) -> torch.Tensor:
        return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.spec.causal,
                                              enable_gqa=self.gqa)

    def begin(self, clock: Clock) -> None:
        self.marks = [clock.mark()]

    def step(self, clock: Clock) -> None:
        with torch.inference_mode():
            self._call()
        self.marks.append(clock.mark())

    def end(self, clock: Clock, iterations: int, seconds: float) -> WindowStats:
        clock.finalize()
        counts = {
            "iterations_per_second": (iterations, seconds),
            "flops_per_second": (iterations * self.flops, seconds),
            "bytes_per_second": (iterations * self.bytes, seconds),
        }
        return WindowStats(iterations=iterations, units=iterations, counts=counts,
                           latencies={"iteration_seconds": clock.diffs(self.marks)})

    def check_plan(self) -> correctness.CheckPlan:
        """The window's own call on its own inputs; the slice is rows of it (batch 0, first and last
        head; first, middle and last query) recomputed in float64 on the CPU."""

        def output() -> list[torch.Tensor]:
            with torch.inference_mode():
                return [self._call().clone()]

        return correctness.CheckPlan(output, lambda outs: self.attention_slice(outs[0]), path="eager")

    def attention_slice(self, out: torch.Tensor) -> correctness.SliceCheck:
        """softmax(q k^T / sqrt(d)) v for a few (head, query) rows of batch 0, in float64."""
        H, S, Dh, g = self.spec.heads, self.spec.seq_len, self.spec.head_dim, self.spec.n_groups
        heads = sorted({0, H - 1})
        rows = sorted({0, S // 2, S - 1})
        got, want = [], []
        for h in heads:
            q = self.q[0, h, rows].to("cpu", torch.float64)
            k = self.k[0, h // g].to("cpu", torch.float64)
            v = self.v[0, h // g].to("cpu", torch.float64)
            scores = q @ k.T / Dh ** 0.5
            if self.spec.causal:
                allowed = torch.arange(S).view(1, S) <= torch.tensor(rows).view(-1, 1)
                scores = scores.masked_fill(~allowed, float("-inf"))
            want.append(torch.softmax(scores, dim=-1) @ v)
            got.append(out[0, h, rows])
        return correctness.SliceCheck("attention_rows", torch.stack(got), torch.stack(want),
                                      correctness.precision_of(self.q.dtype, self.q.device))

    def describe(self) -> dict[str, Any]:
        return {
            "flops_per_call": self.flops,
            "bytes_per_call": self.bytes,
            "kv_heads": self.spec.heads // self.spec.n_groups,
            "sdpa_backend": self.backend,
        }


def build(spec: ProbeSpec, ctx: ProbeContext) -> AttentionWorkload:
    return AttentionWorkload(spec, ctx)
