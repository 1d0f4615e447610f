"""Llama-family inference with a preallocated KV cache, written so a CUDA graph can capture it.

Why our own forward (as ``gpt2_static`` for GPT-2): on an H100 the 8B shape decodes 25.6 tokens/s
through plain ``generate()`` and 108.8 with transformers' static cache, against ~209 that the HBM
allows (../shared/reference/h100-llama-seed004.json): Python and kernel launches, not the memory
system. This module takes the weights of a ``LlamaForCausalLM`` and runs the same math with:

* a static KV cache, ``[batch, kv_heads, max_seq, head_dim]`` a layer, allocated once;
* the token buffer ``seq`` and the position ``pos`` as device tensors, so a step reads its input and
  writes its greedy output on the device: a step is one ``CUDAGraph.replay()``;
* fewer, larger kernels: Q, K and V in one matrix product, gate and up in one (random weights are
  born fused, ``models.random_llama``; loaded ones are fused once and the module's own parameters
  become views into the fused matrices, so no weight is held twice), the residual adds
  inside the output and down products (``addmm_`` into the stream), RoPE's cos/sin
  looked up once per step for every layer, ``F.rms_norm``, SDPA over the cache with each key/value
  head's query heads folded into its query axis (plain multi-head attention, no GQA flag); at batch 1
  a decode step's RoPE is one batched product a layer (its rotation built once a step) and its K and
  V go into a joint cache with one write (issue 53: the 8B's step was ~16 kernels a layer);
* one step function for ``n`` new tokens: the prompt (prefill, ``n = T``), one decode token
  (``n = 1``), or a speculative verify of ``k + 1`` proposed tokens, each capturable in its graph.

The math matches ``LlamaForCausalLM`` (tests compare logits and greedy tokens on a CPU). RoPE's
cos/sin come from the model's own rotary module, so any rope type the installed transformers
supports gives the same angles (transformers 4.45 to 5.x spell its configuration differently).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpuperfd.probe_child.workloads.gpt2_static import _round_up
from gpuperfd.probe_child.workloads.graphed_steps import REPRODUCIBLE_SDPA, GraphedSteps
from gpuperfd.probe_child.workloads.llama.fused import FusedDecode

__all__ = ["COMPILE_OPTIONS", "StaticLlama", "fuse_rows"]

#: Inductor's options for the ``compiled`` steps (gpt-fast's): with coordinate-descent tuning on,
#: inductor decomposes a matrix product with one row (a batch-1 decode's every projection and the LM
#: head) into a Triton reduction it tunes and fuses with its neighbours (the norm before it, the
#: residual add after it), where cuBLAS's GEMV stops short of the HBM's bandwidth; larger batches keep
#: cuBLAS. The graphs are our own (``capture``), so inductor's cudagraph trees stay off.
COMPILE_OPTIONS: dict[str, Any] = {"coordinate_descent_tuning": True, "triton.cudagraphs": False}


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: torch.Tensor  # [(H + 2 Hkv) * Dh, D]
    o: torch.Tensor  # [D, H * Dh]
    ln2: torch.Tensor
    gate_up: torch.Tensor  # [2 I, D]
    down: torch.Tensor  # [D, I]


def fuse_rows(linears: list[torch.nn.Linear]) -> torch.Tensor:
    """One matrix holding the rows of ``linears`` (bias-free).

    Weights already consecutive rows of one matrix (as :func:`~gpuperfd.probe_child.workloads.models.random_llama`
    makes them) are returned as that matrix, a view: nothing is copied. Otherwise (weights loaded
    from a directory) they are concatenated and rebound as views into the result; the originals are
    freed as each is rebound, so the peak grows by one layer's matrices only, and the module (its
    ``generate()``, the answer check's largest weight) reads the same memory.
    """
    adjacent = _adjacent_rows([lin.weight.detach() for lin in linears])
    if adjacent is not None:
        return adjacent
    fused = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight.data = fused[start:start + rows]
        start += rows
    return fused


def _adjacent_rows(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The matrix ``weights`` are consecutive row blocks of (a view from the first one's offset), or None."""
    first = weights[0]
    cols = first.shape[1]
    offset = first.storage_offset()
    for w in weights:
        if (w.dim() != 2 or w.shape[1] != cols or not w.is_contiguous() or w.storage_offset() != offset
                or w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
        offset += w.numel()
    return first.as_strided((sum(w.shape[0] for w in weights), cols), (cols, 1))


class StaticLlama(GraphedSteps):
    """Greedy generation for a fixed (batch, context) shape.

    Usage: write prompts into ``seq[:, :T]``; :meth:`run_prefill` (the first token lands in
    ``seq[:, T]``, pos = T); :meth:`run_decode` per further token. :meth:`run_verify` runs the
    ``verify_tokens`` tokens ``seq[:, pos:pos + n]`` at once (a speculative round's target step),
    writes its greedy choices for each of them into ``verified`` and leaves ``pos`` where it was.
    """

    def __init__(self, model: torch.nn.Module, batch_size: int, prompt_tokens: int, max_context: int,
                 verify_tokens: int = 0, compile_steps: bool = False, fused_decode: bool = False) -> None:
        cfg = model.config
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise ValueError("StaticLlama supports bias-free Llama projections only")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported Llama activation {cfg.hidden_act!r}")
        inner = model.model
        first = inner.embed_tokens.weight
        self.device, self.dtype = first.device, first.dtype
        self.batch_size, self.prompt_tokens = batch_size, prompt_tokens
        self.n_layer = cfg.num_hidden_layers
        self.n_head = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.d_model = cfg.hidden_size
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.verify_tokens = verify_tokens
        # Rounded up so the mask's rows stay 16-element aligned for the fused attention kernels.
        self.max_seq = _round_up(max_context, 16)
        self.embed = first
        self.lm_head = model.lm_head.weight
        self.norm = inner.norm.weight
        self.layers = []
        for block in inner.layers:
            att, mlp = block.self_attn, block.mlp
            self.layers.append(_Layer(
                block.input_layernorm.weight, fuse_rows([att.q_proj, att.k_proj, att.v_proj]), att.o_proj.weight,
                block.post_attention_layernorm.weight, fuse_rows([mlp.gate_proj, mlp.up_proj]),
                mlp.down_proj.weight))
        self.cos, sin = _rope_tables(model, self.max_seq, self.device, self.dtype)
        half = self.head_dim // 2
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).contiguous()
        # RoPE of a batch-1 decode token as one batched product a layer (see _rope_product): the roll as a
        # permutation matrix; every Q and K head's rotation, rebuilt once per step for all layers; V's
        # heads the identity (exact), so the product's output holds K and V side by side for the cache.
        columns = torch.arange(self.head_dim, device=self.device)
        self._roll = torch.zeros(self.head_dim, self.head_dim, dtype=self.dtype, device=self.device)
        self._roll[(columns - half) % self.head_dim, columns] = 1
        heads = self.n_head + 2 * self.n_kv
        self._rotations = torch.eye(self.head_dim, dtype=self.dtype, device=self.device).repeat(heads, 1, 1)
        #: A batch-1 decode step's RoPE as one product a layer (as written), or element-wise (3 kernels,
        #: which torch.compile fuses into one anyway, without reading a rotation matrix).
        self.rope_by_product = not compile_steps
        self._make_caches(batch_size)
        self.seq = torch.zeros(batch_size, self.max_seq, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.positions = torch.arange(self.max_seq, device=self.device)
        self.verified = torch.zeros(batch_size, max(verify_tokens, 1), dtype=torch.long, device=self.device)
        self._reproducible = False
        #: The step functions the graphs capture: through torch.compile (inductor fuses the element-wise
        #: chains of norm, RoPE, SwiGLU and residuals) or as written.
        self.compiled = compile_steps
        self.compile_error: str | None = None
        self._decode_fn: Callable[[], torch.Tensor] = self.decode
        self._verify_fn: Callable[[], torch.Tensor] = self.verify
        #: Residual adds inside the output and down products (``addmm_``: no add kernel) as written; out
        #: of place under torch.compile, whose batch-1 products become fused reductions (see COMPILE_OPTIONS).
        self.inplace_residual = not compile_steps
        if compile_steps:
            self._decode_fn = torch.compile(self.decode, dynamic=False, fullgraph=True, options=COMPILE_OPTIONS)
            self._verify_fn = torch.compile(self.verify, dynamic=False, fullgraph=True, options=COMPILE_OPTIONS)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self._graph_logits: dict[str, torch.Tensor] = {}
        self._eager_logits: torch.Tensor | None = None
        self._last = "prefill"
        #: The batch-1 decode step as Triton kernels (``llama.fused``; the ``fused`` variant), or None.
        self.fused: FusedDecode | None = None
        if fused_decode:
            if compile_steps:
                raise ValueError("variant: fused and compiled decode steps are exclusive")
            self.fused = FusedDecode(self)

    def _make_caches(self, batch_size: int) -> None:
        """The KV caches. One tensor a layer, not one for all: a step writes into whole tensors, which
        torch.compile updates in place (a slice of one big cache was copied back whole every step: 2 GB
        at batch 32)."""
        shape = (batch_size, self.n_kv, self.max_seq, self.head_dim)
        #: At batch 1 as written, a layer's keys and values in one tensor ``[1, 2 Hkv, S, Dh]`` (K's heads,
        #: then V's), so a decode step writes both with one kernel; ``k_cache``/``v_cache`` are its halves
        #: (contiguous at batch 1). Otherwise (and under torch.compile, which updates whole tensors in
        #: place but copies a written view back whole) one tensor each.
        self.kv_cache: list[torch.Tensor] | None = None
        if self.rope_by_product and batch_size == 1:
            joint = (1, 2 * self.n_kv, self.max_seq, self.head_dim)
            self.kv_cache = [torch.zeros(joint, dtype=self.dtype, device=self.device) for _ in range(self.n_layer)]
            self.k_cache = [t[:, :self.n_kv] for t in self.kv_cache]
            self.v_cache = [t[:, self.n_kv:] for t in self.kv_cache]
        else:
            self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layer)]
            self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layer)]

    # --- sizes ----------------------------------------------------------------------

    @property
    def kv_cache_bytes(self) -> int:
        return 2 * sum(t.numel() * t.element_size() for t in self.k_cache)

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every layer, the final norm and the LM head (the
        embedding is a gather of B rows; a tied head reads the same matrix once)."""
        per_layer = sum(t.numel() for layer in self.layers for t in vars(layer).values())
        return (per_layer + self.norm.numel() + self.lm_head.numel()) * self.embed.element_size()

    # --- the step ---------------------------------------------------------------------

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                gqa: bool = True) -> torch.Tensor:
        """SDPA over ``k``/``v`` under ``mask`` (None: causal over the new tokens, the prefill)."""
        kwargs: dict[str, Any] = {"attn_mask": mask} if mask is not None else {"is_causal": True}
        if gqa and self.n_kv != self.n_head:
            kwargs["enable_gqa"] = True
        if self._reproducible:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(REPRODUCIBLE_SDPA):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    def _attend_cache(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
        """Attention of ``n`` new queries [B, H, n, Dh] over the cache under ``mask`` [1, 1, n, S].

        The query heads that share a key/value head are folded into the query axis ([B, Hkv, g * n, Dh],
        the mask's rows repeated per head), so this is plain multi-head attention over the cache as it
        is: no ``enable_gqa`` (which a masked kernel may not take, falling back to one that copies K and
        V ``g`` times), and one fused kernel reads each cached key once for its ``g`` query heads."""
        B, H, n, Dh = q.shape
        g = H // self.n_kv
        if g == 1:
            return self._attend(q, k_cache, v_cache, mask)
        folded = q.reshape(B, self.n_kv, g * n, Dh)
        rows = mask if n == 1 else mask.repeat(1, 1, g, 1)
        out = self._attend(folded, k_cache, v_cache, rows, gqa=False)
        return out.view(B, self.n_kv, g, n, Dh).reshape(B, H, n, Dh)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """RoPE as transformers applies it (``x * cos + rotate_half(x) * sin``) in three kernels:
        rotate_half(x) is ``x`` rolled by half a head with the first half's sign flipped, and the
        flip lives in ``signed_sin`` (looked up once per step for every layer)."""
        return torch.addcmul(x * cos, x.roll(self.head_dim // 2, dims=-1), signed_sin)

    def _set_rotations(self, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        """The rotation of one position as a matrix, ``x @ R = x * cos + roll(x) * signed_sin``
        (``R = diag(cos) + roll * signed_sin``), copied for every Q and K head: once a step."""
        rotation = torch.addcmul(torch.diag_embed(cos.reshape(-1)), self._roll, signed_sin.reshape(1, -1))
        rotated = self._rotations[:self.n_head + self.n_kv]
        rotated.copy_(rotation.expand_as(rotated))

    def _rope_product(self, qkv: torch.Tensor) -> torch.Tensor:
        """RoPE of a batch-1 decode token's heads ``[(H + 2 Hkv) * Dh]`` in one batched product
        (``[heads, 1, Dh] @ [heads, Dh, Dh]``; V's rotation is the identity) instead of three element-wise
        kernels: a step of the 8B is ~500 kernels, most of them this small, and each costs its launch in
        the graph as well. The products accumulate in float32 and round once (the element-wise form
        rounds twice); V comes out exact. Returns ``[1, heads, 1, Dh]``."""
        heads = self.n_head + 2 * self.n_kv
        return torch.bmm(qkv.view(heads, 1, self.head_dim), self._rotations).view(1, heads, 1, self.head_dim)

    def _forward(self, n: int, logits_all: bool, prefill: bool = False) -> torch.Tensor:
        """``n`` tokens ``seq[:, pos:pos + n]`` at positions ``pos..pos + n - 1`` through every layer
        (their K/V written into the cache, attention over the cache under a causal mask); the
        logits of every position (``logits_all``) or of the last one."""
        B, D, H, Hkv, Dh = self.batch_size, self.d_model, self.n_head, self.n_kv, self.head_dim
        here = self.pos + self.positions[:n]  # [n]
        tokens = self.seq.index_select(1, here)  # [B, n]
        x = F.embedding(tokens, self.embed).reshape(B * n, D)  # a fresh tensor: the residual stream, updated in place
        cos = self.cos.index_select(0, here).view(1, 1, n, Dh)
        sin = self.signed_sin.index_select(0, here).view(1, 1, n, Dh)
        mask = None if prefill else torch.zeros(n, self.max_seq, dtype=self.dtype, device=self.device)
        if mask is not None:
            mask.masked_fill_(self.positions.view(1, -1) > here.view(-1, 1), float("-inf"))
            mask = mask.view(1, 1, n, self.max_seq)
        q_width = H * Dh
        by_product = self.rope_by_product and B == 1 and n == 1
        if by_product:
            self._set_rotations(cos, sin)
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, (D,), layer.ln1, self.eps)
            fused = F.linear(h, layer.qkv)
            qkv = fused.view(B, n, H + 2 * Hkv, Dh).transpose(1, 2)  # [B, heads, n, Dh]
            if by_product:
                rotated = self._rope_product(fused)
                q, k, v = rotated[:, :H], rotated[:, H:H + Hkv], rotated[:, H + Hkv:]
            else:
                qk = self._rope(qkv[:, :H + Hkv], cos, sin)  # Q's and K's heads in one pass
                q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + Hkv:]
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            if by_product and self.kv_cache is not None:
                self.kv_cache[index].index_copy_(2, here, rotated[:, H:])  # K and V side by side: one write
            else:
                k_cache.index_copy_(2, here, k)
                v_cache.index_copy_(2, here, v)
            if prefill:  # from position 0: the new keys alone, causal (flash; the same bits every time)
                a = self._attend(q, k, v, None)
            else:
                a = self._attend_cache(q, k_cache, v_cache, mask)  # [B, H, n, Dh]
            a = a.transpose(1, 2).reshape(B * n, q_width)
            if self.inplace_residual:  # residual adds inside the products (beta = 1 into x): no add kernel
                x = x.addmm_(a, layer.o.t())
            else:  # a plain product: inductor turns a batch-1 one into a reduction fused with the add
                x = x + F.linear(a, layer.o)
            h = F.rms_norm(x, (D,), layer.ln2, self.eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            if self.inplace_residual:
                x = x.addmm_(F.silu(gate) * up, layer.down.t())
            else:
                x = x + F.linear(F.silu(gate) * up, layer.down)
        x = x.view(B, n, D)
        if not logits_all:
            x = x[:, -1:]
        return F.linear(F.rms_norm(x, (D,), self.norm, self.eps), self.lm_head)  # [B, n or 1, V]

    def prefill(self) -> torch.Tensor:
        """The prompt ``seq[:, :T]`` from position 0: fills the cache, writes token T, sets pos = T."""
        T = self.prompt_tokens
        self.pos.zero_()
        logits = self._forward(T, logits_all=False, prefill=True)[:, 0]
        self.seq[:, T].copy_(logits.argmax(dim=-1))
        self.pos.fill_(T)
        return logits

    def decode(self) -> torch.Tensor:
        """One token for every sequence: reads ``seq[:, pos]``, writes ``seq[:, pos + 1]``, pos += 1
        (the fused variant's kernels where set: its bits repeat, so the answer check's step is it too)."""
        if self.fused is not None:
            return self.fused.decode()
        logits = self._forward(1, logits_all=False)[:, 0]
        self.seq.index_copy_(1, self.pos + 1, logits.argmax(dim=-1).view(-1, 1))
        self.pos.add_(1)
        return logits

    def verify(self) -> torch.Tensor:
        """A speculative round's target step: the ``verify_tokens`` tokens from ``pos`` at once; the
        greedy choice after each lands in ``verified`` (what the target would have said); pos stays."""
        logits = self._forward(self.verify_tokens, logits_all=True)
        self.verified.copy_(logits.argmax(dim=-1))
        return logits

    # --- CUDA graphs --------------------------------------------------------------------

    def capture(self, warmup: int = 2, decode_steps: int = 1) -> None:
        """Capture prefill, ``decode_steps`` decode steps (a draft's round: ``k`` steps in one graph),
        the answer check's decode step and, with ``verify_tokens``, the verify step (CUDA only).

        Warm-up runs (and torch.compile's compilation) go on a side stream, as capture requires.
        """
        self._warm_up_for_capture([self.prefill, self._decode_fn, *([self._verify_fn] if self.verify_tokens else [])],
                                  warmup)
        graphs: dict[str, torch.cuda.CUDAGraph] = {}
        logits: dict[str, torch.Tensor] = {}

        def grab(name: str, fn: Callable[[], torch.Tensor], times: int = 1) -> None:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(times):
                    out = fn()
            graphs[name], logits[name] = graph, out

        grab("prefill", self.prefill)
        grab("decode", self._decode_fn, decode_steps)
        if self.verify_tokens:
            grab("verify", self._verify_fn)
        self._reproducible = True  # the answer check's decode: attention kernels that repeat their bits
        try:
            grab("decode_check", self.decode)
        finally:
            self._reproducible = False
        torch.cuda.synchronize(self.device)
        self.graphs, self._graph_logits = graphs, logits

    def run_prefill(self) -> None:
        self._step("prefill", self.prefill)

    def run_decode(self) -> None:
        """One decode step (the captured graph's ``decode_steps`` steps when graphed)."""
        self._step("decode", self._decode_fn)

    def run_verify(self) -> None:
        self._step("verify", self._verify_fn)

    def run_check_decode(self) -> None:
        """The answer check's decode step: attention kernels that give the same bits for the same inputs."""
        self._step("decode_check", self.decode, reproducible=True)

    def generate(self, prompts: torch.Tensor, output_tokens: int) -> torch.Tensor:
        """Greedy tokens for ``prompts`` [B, T] -> [B, output_tokens] (eager steps; tests and checks)."""
        T = self.prompt_tokens
        self.seq[:, :T].copy_(prompts)
        self.prefill()
        for _ in range(output_tokens - 1):
            self.decode()
        return self.seq[:, T:T + output_tokens].clone()


def _rope_tables(model: torch.nn.Module, max_seq: int, device: torch.device,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_seq, head_dim] from the model's own rotary module (its rope type and
    scaling, whatever the installed transformers calls them), in the model's dtype as it applies them."""
    rotary = model.model.rotary_emb
    probe = torch.zeros(1, dtype=dtype, device=device)
    positions = torch.arange(max_seq, device=device).view(1, -1)
    with torch.no_grad():
        cos, sin = rotary(probe, positions)
    return cos[0].to(dtype).contiguous(), sin[0].to(dtype).contiguous()
