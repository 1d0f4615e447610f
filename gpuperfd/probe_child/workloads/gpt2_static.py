"""GPT-2 inference with a preallocated KV cache, written so a CUDA graph can capture it.

Why our own forward: Hugging Face's ``generate()`` in eager mode spends most of
a batch-1 decode step in Python (107-170 tokens/s on an H200 against a ~19,000
tokens/s memory-bandwidth floor), and its own fast path (static cache +
``torch.compile(mode="reduce-overhead")``) failed on transformers 5.17 / torch 2.11
with a CUDA-graph overwrite error. This module takes the weights of a
``GPT2LMHeadModel`` and runs the same math with:

* a static KV cache ``[layers, batch, heads, max_seq, head_dim]`` allocated once;
* the token buffer ``seq`` and the position ``pos`` as device tensors, so a
  decode step reads its input and writes its output (greedy argmax) on the GPU
  and needs nothing from the host: the step is one ``CUDAGraph.replay()``;
* ``torch.nn.functional.scaled_dot_product_attention`` (flash/efficient kernels;
  causal for prefill, an additive mask over the cache for decode).

Grouped-query attention (``n_groups`` > 1, as seed 002 measured it): every
``n_groups`` query heads share one key/value head. The shared K/V projections are
the mean of the group's original ones (the usual conversion of a multi-head
checkpoint), so the cache and the K/V matmuls shrink by ``n_groups``; SDPA runs
with ``enable_gqa``. With ``n_groups == 1`` the math is GPT-2's own.

Prefill (the whole prompt) and the decode step are separate functions, each
capturable into its own graph; time to first token is the prefill replay, time
per output token the decode replays. The math matches ``GPT2LMHeadModel`` (tests
compare logits and greedy tokens on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from gpuperfd.probe_child.workloads.graphed_steps import REPRODUCIBLE_SDPA, GraphedSteps


__all__ = ["StaticGPT2"]


@dataclass
class _Block:
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    attn_w: torch.Tensor  # [D, 3D] (Conv1D layout: y = x @ W + b)
    attn_b: torch.Tensor
    proj_w: torch.Tensor
    proj_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    fc_w: torch.Tensor
    fc_b: torch.Tensor
    mproj_w: torch.Tensor
    mproj_b: torch.Tensor


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


class StaticGPT2(GraphedSteps):
    """Greedy generation for a fixed (batch, prompt, output) shape.

    Usage: write prompts into ``seq[:, :prompt_tokens]``, call :meth:`prefill`
    once (first token lands in ``seq[:, prompt_tokens]``), then :meth:`decode`
    ``output_tokens - 1`` times. Both return the logits of the position they
    sampled from.
    """

    def __init__(
        self, model: torch.nn.Module, batch_size: int, prompt_tokens: int, output_tokens: int, n_groups: int = 1
    ) -> None:
        cfg = model.config
        if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise ValueError(f"unsupported GPT-2 activation {cfg.activation_function!r}")
        if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(cfg, "reorder_and_upcast_attn", False):
            raise ValueError("StaticGPT2 supports the standard GPT-2 attention only")
        if not getattr(cfg, "scale_attn_weights", True):
            raise ValueError("StaticGPT2 expects scale_attn_weights=True")
        tr = model.transformer
        first = tr.wte.weight
        self.device = first.device
        self.dtype = first.dtype
        self.batch_size = batch_size
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.n_layer = cfg.n_layer
        self.n_head = cfg.n_head
        self.d_model = cfg.n_embd
        self.head_dim = cfg.n_embd // cfg.n_head
        if n_groups < 1 or cfg.n_head % n_groups:
            raise ValueError(f"n_groups: {n_groups} does not divide the model's {cfg.n_head} heads")
        self.n_groups = n_groups
        self.n_kv = cfg.n_head // n_groups
        self.eps = cfg.layer_norm_epsilon
        if prompt_tokens + output_tokens > cfg.n_positions:
            raise ValueError(
                f"output_tokens: prompt + output = {prompt_tokens + output_tokens} exceeds n_positions={cfg.n_positions}"
            )
        # Rounded up so the decode mask's rows stay 16-element aligned for the fused kernels.
        self.max_seq = _round_up(prompt_tokens + output_tokens, 16)
        self.wte = tr.wte.weight
        self.wpe = tr.wpe.weight
        self.lm_head = model.lm_head.weight
        self.lnf_w, self.lnf_b = tr.ln_f.weight, tr.ln_f.bias
        self.blocks = [
            _Block(
                h.ln_1.weight, h.ln_1.bias,
                *self._grouped_qkv(h.attn.c_attn.weight, h.attn.c_attn.bias),
                h.attn.c_proj.weight, h.attn.c_proj.bias,
                h.ln_2.weight, h.ln_2.bias,
                h.mlp.c_fc.weight, h.mlp.c_fc.bias,
                h.mlp.c_proj.weight, h.mlp.c_proj.bias,
            )
            for h in tr.h
        ]
        shape = (self.n_layer, batch_size, self.n_kv, self.max_seq, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.seq = torch.zeros(batch_size, self.max_seq, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.positions = torch.arange(self.max_seq, device=self.device)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        #: Attention through REPRODUCIBLE_SDPA only (set while the answer check's decode runs or is captured).
        self._reproducible = False
        #: Which step ran last ("prefill", "decode" or "decode_check"): whose logits last_logits() gives.
        self._last = "prefill"

    def _grouped_qkv(self, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused QKV projection with K and V averaged over each group of heads ([D, D + 2 * D / g])."""
        if self.n_groups == 1:
            return weight, bias
        D, H, g, Dh = self.d_model, self.n_head, self.n_groups, self.head_dim
        q_w, k_w, v_w = weight.split(D, dim=1)
        q_b, k_b, v_b = bias.split(D)

        def pool_w(w: torch.Tensor) -> torch.Tensor:
            return w.reshape(D, H // g, g, Dh).mean(2).reshape(D, D // g)

        def pool_b(b: torch.Tensor) -> torch.Tensor:
            return b.reshape(H // g, g, Dh).mean(1).reshape(D // g)

        return (torch.cat([q_w, pool_w(k_w), pool_w(v_w)], dim=1).contiguous(),
                torch.cat([q_b, pool_b(k_b), pool_b(v_b)]).contiguous())

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:
        if self.n_groups > 1:
            kwargs["enable_gqa"] = True
        if self._reproducible:
            with sdpa_kernel(REPRODUCIBLE_SDPA):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    @property
    def kv_cache_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def _ln(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.d_model,), w, b, self.eps)

    def _mlp(self, blk: _Block, x2d: torch.Tensor) -> torch.Tensor:
        h = self._ln(x2d, blk.ln2_w, blk.ln2_b)
        m = F.gelu(torch.addmm(blk.fc_b, h, blk.fc_w), approximate="tanh")
        return torch.addmm(blk.mproj_b, m, blk.mproj_w)

    def _logits_and_sample(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(self._ln(last, self.lnf_w, self.lnf_b), self.lm_head)
        return logits, logits.argmax(dim=-1)

    def prefill(self) -> torch.Tensor:
        """Run the prompt ``seq[:, :T]``; fills the cache, writes token T, sets pos = T."""
        B, T, D, H, Dh = self.batch_size, self.prompt_tokens, self.d_model, self.n_head, self.head_dim
        x = F.embedding(self.seq[:, :T], self.wte) + self.wpe[:T]
        x = x.reshape(B * T, D)
        for layer, blk in enumerate(self.blocks):
            h = self._ln(x, blk.ln1_w, blk.ln1_b)
            qkv = torch.addmm(blk.attn_b, h, blk.attn_w)
            Dkv = self.n_kv * Dh
            q = qkv[:, :D].view(B, T, H, Dh).transpose(1, 2)  # [B, H, T, Dh]
            k = qkv[:, D:D + Dkv].view(B, T, self.n_kv, Dh).transpose(1, 2)  # [B, H/g, T, Dh]
            v = qkv[:, D + Dkv:].view(B, T, self.n_kv, Dh).transpose(1, 2)
            self.k_cache[layer, :, :, :T].copy_(k)
            self.v_cache[layer, :, :, :T].copy_(v)
            a = self._attend(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(B * T, D)
            x = x + torch.addmm(blk.proj_b, a, blk.proj_w)
            x = x + self._mlp(blk, x)
        last = x.view(B, T, D)[:, -1]
        logits, nxt = self._logits_and_sample(last)
        self.seq[:, T].copy_(nxt)
        self.pos.fill_(T)
        return logits

    def decode(self) -> torch.Tensor:
        """One token for every sequence: reads ``seq[:, pos]``, writes ``seq[:, pos + 1]``, pos += 1."""
        B, D, H, Dh = self.batch_size, self.d_model, self.n_head, self.head_dim
        tok = self.seq.index_select(1, self.pos).view(B)
        x = F.embedding(tok, self.wte) + self.wpe.index_select(0, self.pos)  # [B, D]
        # Additive mask over the cache: positions after pos do not exist yet.
        mask = torch.zeros(self.max_seq, dtype=self.dtype, device=self.device)
        mask.masked_fill_(self.positions > self.pos, float("-inf"))
        mask = mask.view(1, 1, 1, self.max_seq)
        for layer, blk in enumerate(self.blocks):
            h = self._ln(x, blk.ln1_w, blk.ln1_b)
            qkv = torch.addmm(blk.attn_b, h, blk.attn_w)
            Dkv = self.n_kv * Dh
            q = qkv[:, :D].view(B, H, Dh)
            k = qkv[:, D:D + Dkv].view(B, self.n_kv, Dh)
            v = qkv[:, D + Dkv:].view(B, self.n_kv, Dh)
            k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
            k_cache.index_copy_(2, self.pos, k.unsqueeze(2))
            v_cache.index_copy_(2, self.pos, v.unsqueeze(2))
            a = self._attend(q.unsqueeze(2), k_cache, v_cache, attn_mask=mask)
            x = x + torch.addmm(blk.proj_b, a.reshape(B, D), blk.proj_w)
            x = x + self._mlp(blk, x)
        logits, nxt = self._logits_and_sample(x)
        self.seq.index_copy_(1, self.pos + 1, nxt.view(B, 1))
        self.pos.add_(1)
        return logits

    # --- CUDA graphs ----------------------------------------------------------------

    def capture(self, warmup: int = 2) -> None:
        """Capture prefill and one decode step as CUDA graphs (CUDA only).

        The warm-up runs go on a side stream, as capture requires (cuBLAS handles and
        workspaces are created there, not inside the graph).
        """
        self._warm_up_for_capture([self.prefill, self.decode], warmup)
        prefill_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(prefill_graph):
            prefill_logits = self.prefill()
        decode_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(decode_graph):
            decode_logits = self.decode()
        check_graph = torch.cuda.CUDAGraph()  # the answer check's decode: reproducible attention
        self._reproducible = True
        try:
            with torch.cuda.graph(check_graph):
                check_logits = self.decode()
        finally:
            self._reproducible = False
        self._graph_logits = {"prefill": prefill_logits, "decode": decode_logits, "decode_check": check_logits}
        torch.cuda.synchronize(self.device)
        self.graphs = {"prefill": prefill_graph, "decode": decode_graph, "decode_check": check_graph}

    def run_prefill(self) -> None:
        self._step("prefill", self.prefill)

    def run_decode(self, reproducible: bool = False) -> None:
        """One decode step; ``reproducible``: with attention kernels that give the same bits for
        the same inputs (the answer check's step; see REPRODUCIBLE_SDPA)."""
        self._step("decode_check" if reproducible else "decode", self.decode, reproducible)

    def run_check_decode(self) -> None:
        """The answer check's decode step (attention kernels that repeat their bits)."""
        self.run_decode(reproducible=True)

    def generate(self, prompts: torch.Tensor) -> torch.Tensor:
        """Greedy tokens for ``prompts`` [B, T] -> [B, output_tokens] (tests and checks)."""
        T = self.prompt_tokens
        self.seq[:, :T].copy_(prompts)
        self.run_prefill()
        for _ in range(self.output_tokens - 1):
            self.run_decode()
        return self.seq[:, T:T + self.output_tokens].clone()
