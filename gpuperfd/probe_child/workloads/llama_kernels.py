"""Triton kernels for a batch-1 Llama decode step: five kernels a layer, each reading its weights once.

Why (issue 53): at batch 1 a decode step is bound by the HBM, and on an H200 the ``graph`` variant's
step reached 64 % of its bound: cuBLAS's GEMV streamed the small products (Q/K/V, O) at 56-66 % of the
bandwidth, and ~210 small kernels (RMSNorm, RoPE, cache writes, SiLU, residual adds, split-K
reductions) took 1.3 of its 5.3 ms. Here a layer is:

1. :func:`gemv` with ``norm``: Q, K and V of RMSNorm(x) (the norm in the product's prologue: every
   program reads the whole 8-16 KB input from L2 anyway, sums its squares on the way and scales its
   dot products by the reciprocal root at the end, so the norm costs no kernel and no pass);
2. :func:`rope_attend`: RoPE of the new query and key, the new key and value into the cache, and
   attention of each query head over the cache (online softmax), one program a query head;
3. :func:`gemv` with ``residual``: the output product added into the residual stream in place;
4. :func:`gemv` with ``norm`` and ``swiglu``: gate and up of RMSNorm(x), ``silu(gate) * up`` in the
   epilogue (each program reads a block of gate rows and the same block of up rows);
5. :func:`gemv` with ``residual``: the down product added into the stream.

Every program of a product reads whole rows (no split-K, no atomics), so a step's bits repeat: the
answer check compares them. The products accumulate in float32 and round once. Import needs Triton
(shipped with torch's CUDA builds); tests run the kernels in Triton's interpreter on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["GemvConfig", "gemv", "gemv_config", "rope_attend"]


@dataclass(frozen=True)
class GemvConfig:
    """A product's tile: rows a program owns, the columns a loop step reads, warps and pipeline stages."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def gemv_config(rows: int, cols: int, swiglu: bool = False) -> GemvConfig:
    """The tile for a ``rows x cols`` product (see docs/benchmarks.md, issue 53's third pass, for the
    measured sweep this follows): enough programs to keep every SM streaming (several per SM), small
    row blocks for narrow products, and a long column step so each load is a wide vector."""
    block_n = 8 if rows * (2 if swiglu else 1) <= 16384 else 16
    return GemvConfig(block_n=block_n, block_k=512, num_warps=4, num_stages=4)


@triton.jit
def _gemv_kernel(w_ptr, x_ptr, out_ptr, gamma_ptr, res_ptr, N, stride_w, up_rows, eps, K: tl.constexpr,
                 NORM: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.where(row_ok, rows, 0)  # clamped: every load stays in bounds, the store is masked
    offsets = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    for start in range(0, K, BLOCK_K):
        cols = start + offsets
        if EVEN_K:
            x = tl.load(x_ptr + cols).to(tl.float32)
            w = tl.load(w_rows + cols[None, :], eviction_policy="evict_first")
        else:
            col_ok = cols < K
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(w_rows + cols[None, :], mask=col_ok[None, :], other=0.0, eviction_policy="evict_first")
        if NORM:
            squares += x * x
            if EVEN_K:
                x = x * tl.load(gamma_ptr + cols).to(tl.float32)
            else:
                x = x * tl.load(gamma_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        if SWIGLU:
            up_ptrs = w_rows + up_rows.to(tl.int64) * stride_w + cols[None, :]
            if EVEN_K:
                u = tl.load(up_ptrs, eviction_policy="evict_first")
            else:
                u = tl.load(up_ptrs, mask=col_ok[None, :], other=0.0, eviction_policy="evict_first")
            acc_up += u.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
        y = y * rstd
    if SWIGLU:
        up = tl.sum(acc_up, axis=1)
        if NORM:
            up = up * rstd
        y = y / (1.0 + tl.exp(-y)) * up
    if RESIDUAL:
        y += tl.load(res_ptr + rows).to(tl.float32)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


def gemv(weight: torch.Tensor, x: torch.Tensor, out: torch.Tensor, *, norm: torch.Tensor | None = None,
         eps: float = 1e-5, residual: torch.Tensor | None = None, swiglu: bool = False,
         config: GemvConfig | None = None) -> torch.Tensor:
    """``out = weight @ x`` for one input vector, with the options a decode step fuses:

    * ``norm``: ``weight @ RMSNorm(x)`` with that weight (and ``eps``);
    * ``residual``: ``out = residual + weight @ x`` (``out`` may be ``residual``: in place);
    * ``swiglu``: ``weight`` is gate's rows then up's (``[2 I, K]``): ``out = silu(gate @ x) * (up @ x)``.
    """
    rows = weight.shape[0] // 2 if swiglu else weight.shape[0]
    cols = weight.shape[1]
    if weight.stride(1) != 1 or x.numel() != cols or out.numel() != rows:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} (row-major), x of {x.numel()} and out of "
                         f"{out.numel()} elements do not fit")
    cfg = config or gemv_config(rows, cols, swiglu)
    grid = (triton.cdiv(rows, cfg.block_n),)
    _gemv_kernel[grid](weight, x, out, norm if norm is not None else x, residual if residual is not None else out,
                       rows, weight.stride(0), rows, eps, K=cols,
                       NORM=norm is not None, RESIDUAL=residual is not None, SWIGLU=swiglu,
                       EVEN_K=cols % cfg.block_k == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                       num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


@triton.jit
def _rope_attend_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, out_ptr,
                        k_head_stride, k_seq_stride, v_head_stride, v_seq_stride, scale, MAX_SEQ: tl.constexpr,
                        N_HEAD: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    head = tl.program_id(0)
    kv = head // (N_HEAD // N_KV)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = HEAD_DIM // 2
    partner = (d + half) % HEAD_DIM  # rotate_half: x[d + half] (negated) for the first half, x[d - half] after
    cos = tl.load(cos_ptr + pos * HEAD_DIM + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HEAD_DIM + d).to(tl.float32)  # signed: rotate_half's sign is in it
    q_at = qkv_ptr + head * HEAD_DIM
    q = tl.load(q_at + d).to(tl.float32) * cos + tl.load(q_at + partner).to(tl.float32) * sin
    q = q.to(qkv_ptr.dtype.element_ty).to(tl.float32)  # rounded as the model rounds it
    k_at = qkv_ptr + (N_HEAD + kv) * HEAD_DIM
    k_new = tl.load(k_at + d).to(tl.float32) * cos + tl.load(k_at + partner).to(tl.float32) * sin
    k_new = k_new.to(k_ptr.dtype.element_ty)
    v_new = tl.load(qkv_ptr + (N_HEAD + N_KV + kv) * HEAD_DIM + d)
    k_head = k_ptr + kv * k_head_stride
    v_head = v_ptr + kv * v_head_stride
    writer = head % (N_HEAD // N_KV) == 0  # one query head of the group writes the cache
    tl.store(k_head + pos * k_seq_stride + d, k_new, mask=(d < HEAD_DIM) & writer)
    tl.store(v_head + pos * v_seq_stride + d, v_new.to(v_ptr.dtype.element_ty), mask=(d < HEAD_DIM) & writer)
    # The new token from registers (another program may not have written it yet), then the cache
    # before it, block by block (online softmax).
    best = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
    total = tl.full((), 1.0, tl.float32)
    acc = v_new.to(tl.float32)
    for start in range(0, MAX_SEQ, BLOCK_S):  # a fixed trip count (the graph's), blocks past pos skipped
        if start < pos:
            s = start + tl.arange(0, BLOCK_S)
            live = s < pos
            keys = tl.load(k_head + s[:, None] * k_seq_stride + d[None, :], mask=live[:, None], other=0.0)
            scores = tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale
            scores = tl.where(live, scores, float("-inf"))
            top = tl.maximum(best, tl.max(scores, axis=0))
            shrink = tl.exp(best - top)
            weights = tl.exp(scores - top)
            values = tl.load(v_head + s[:, None] * v_seq_stride + d[None, :], mask=live[:, None], other=0.0)
            acc = acc * shrink + tl.sum(weights[:, None] * values.to(tl.float32), axis=0)
            total = total * shrink + tl.sum(weights, axis=0)
            best = top
    tl.store(out_ptr + head * HEAD_DIM + d, (acc / total).to(out_ptr.dtype.element_ty))


def rope_attend(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, pos: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, n_head: int, n_kv: int,
                block_s: int = 64) -> torch.Tensor:
    """One decode token's attention: ``qkv`` ``[(H + 2 Hkv) * Dh]`` (a Q/K/V product's output), RoPE
    from ``cos``/``signed_sin`` ``[S, Dh]`` (sin with its first half negated: rotate_half's sign) at
    position ``pos`` (a one-element device tensor: the graph reads it), its key and value written into
    ``k_cache``/``v_cache`` ``[1, Hkv, S, Dh]`` at ``pos``, and each query head's attention over positions
    ``0..pos`` into ``out`` ``[H * Dh]``."""
    head_dim = cos.shape[-1]
    if k_cache.shape[0] != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_attend: caches must be [1, Hkv, S, Dh] with contiguous heads")
    _rope_attend_kernel[(n_head,)](qkv, cos, signed_sin, pos, k_cache, v_cache, out,
                                   k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
                                   head_dim ** -0.5, MAX_SEQ=k_cache.shape[2], N_HEAD=n_head, N_KV=n_kv, HEAD_DIM=head_dim, BLOCK_S=block_s,
                                   num_warps=4)
    return out
