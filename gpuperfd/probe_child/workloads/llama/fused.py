"""The ``fused`` variant's batch-1 decode step: :class:`StaticLlama`'s weights, caches and buffers, six
Triton kernels a layer (``llama.kernels``) instead of ~16 PyTorch kernels, captured in a CUDA graph.

Why a variant of its own: it is the decode a hand-tuned serving stack runs (norms, RoPE, SwiGLU and the
residual adds inside the products), beside ``graph`` (PyTorch's kernels, cuBLAS's GEMV) and
``compiled`` (inductor's), so seed 004's "frameworks compared as variants" can show what each costs.
Prefill and a speculative verify (many tokens at once, compute-bound) stay ``StaticLlama``'s.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

__all__ = ["DecodeState", "FusedDecode", "fused_unavailable", "product_tiles"]


class DecodeState(Protocol):
    """What the fused step reads and writes of a ``StaticLlama`` (its weights, caches, token buffer and
    position); a protocol, so ``static`` can build a :class:`FusedDecode` without an import circle."""

    batch_size: int
    device: torch.device
    dtype: torch.dtype
    d_model: int
    n_head: int
    n_kv: int
    head_dim: int
    eps: float
    max_seq: int
    layers: list[Any]  # each with ln1, qkv, o, ln2, gate_up, down
    embed: torch.Tensor
    norm: torch.Tensor
    lm_head: torch.Tensor
    cos: torch.Tensor
    signed_sin: torch.Tensor
    k_cache: list[torch.Tensor]
    v_cache: list[torch.Tensor]
    seq: torch.Tensor
    pos: torch.Tensor


def fused_unavailable(device: torch.device, batch_size: int) -> str | None:
    """Why the fused decode cannot run here (None: it can): it needs a CUDA card, Triton, and batch 1."""
    if batch_size != 1:
        return f"the fused decode runs batch 1 only (batch {batch_size})"
    if device.type != "cuda":
        return "the fused decode's Triton kernels need a CUDA device"
    try:
        import triton  # noqa: F401 - shipped with torch's CUDA builds
    except ImportError as exc:
        return f"Triton is not installed: {exc}"
    return None


class FusedDecode:
    """A batch-1 decode step over ``static``'s state: reads ``seq[0, pos]``, writes ``seq[0, pos + 1]``,
    pos += 1 (as ``StaticLlama.decode``), with its activations in buffers allocated once (a graph replays
    them). Its bits repeat for the same inputs (no split-K, no atomics), so the answer check uses it too."""

    def __init__(self, static: DecodeState) -> None:
        if static.batch_size != 1:
            raise ValueError(f"batch_size: the fused decode runs batch 1 only, got {static.batch_size}")
        self.static = static
        s = static
        heads = s.n_head + 2 * s.n_kv

        def buffer(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=s.dtype, device=s.device)

        self.x = buffer(1, s.d_model)  # the residual stream
        self.qkv = buffer(heads * s.head_dim)
        self.attn = buffer(s.n_head * s.head_dim)
        self.act = buffer(s.layers[0].down.shape[1])
        self.logits = buffer(1, s.lm_head.shape[0])
        from gpuperfd.probe_child.workloads.llama.kernels import attention_splits

        splits = attention_splits(s.max_seq)
        self.tiles = product_tiles(s)
        self.partials = torch.zeros(s.n_head, splits, s.head_dim, dtype=torch.float32, device=s.device)
        self.stats = torch.zeros(s.n_head, splits, 2, dtype=torch.float32, device=s.device)

    def decode(self) -> torch.Tensor:
        from gpuperfd.probe_child.workloads.llama.kernels import gemv, rope_attend

        s, tiles = self.static, self.tiles
        x = self.x.view(-1)
        torch.index_select(s.embed, 0, s.seq[0].index_select(0, s.pos), out=self.x)
        for index, layer in enumerate(s.layers):
            gemv(layer.qkv, x, self.qkv, norm=layer.ln1, eps=s.eps, config=tiles["qkv"])
            rope_attend(self.qkv, s.cos, s.signed_sin, s.pos, s.k_cache[index], s.v_cache[index], self.attn,
                        s.n_head, s.n_kv, self.partials, self.stats)
            gemv(layer.o, self.attn, x, residual=x, config=tiles["o"])
            gemv(layer.gate_up, x, self.act, norm=layer.ln2, eps=s.eps, swiglu=True, config=tiles["gate_up"])
            gemv(layer.down, self.act, x, residual=x, config=tiles["down"])
        gemv(s.lm_head, x, self.logits.view(-1), norm=s.norm, eps=s.eps, config=tiles["lm_head"])
        s.seq.index_copy_(1, s.pos + 1, self.logits.argmax(dim=-1).view(1, 1))
        s.pos.add_(1)
        return self.logits


def product_tiles(static: DecodeState) -> dict[str, Any]:
    """Each product's tile for this card (``kernels.gemv_config``: deeper tiles where the HBM is faster)."""
    from gpuperfd.device.roofline import hbm_bandwidth
    from gpuperfd.probe_child.workloads.llama.kernels import gemv_config

    bandwidth = hbm_bandwidth(torch.cuda.get_device_name(static.device)) if static.device.type == "cuda" else None
    layer = static.layers[0]
    shapes = {"qkv": layer.qkv.shape, "o": layer.o.shape, "gate_up": (layer.gate_up.shape[0] // 2, layer.gate_up.shape[1]),
              "down": layer.down.shape, "lm_head": static.lm_head.shape}
    return {name: gemv_config(rows, cols, bandwidth) for name, (rows, cols) in shapes.items()}
