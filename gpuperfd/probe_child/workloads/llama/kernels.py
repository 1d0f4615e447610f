"""Triton kernels for a batch-1 Llama decode step: six kernels a layer, each reading its weights once.

Why (issue 53): at batch 1 a decode step is bound by the HBM, and on an H200 the ``graph`` variant's
step reached 64 % of its bound: cuBLAS's GEMV streamed the small products (Q/K/V, O) at 56-66 % of the
bandwidth, and ~210 small kernels (RMSNorm, RoPE, cache writes, SiLU, residual adds, split-K
reductions) took 1.3 of its 5.3 ms. Here a layer is:

1. :func:`gemv` with ``norm``: Q, K and V of RMSNorm(x) (the norm in the product's prologue: every
   program reads the whole 8-16 KB input from L2 anyway, sums its squares on the way and scales its
   dot products by the reciprocal root at the end, so the norm costs no kernel and no pass);
2. :func:`rope_attend`: RoPE of the new query and key, the new key and value into the cache, and
   attention of each query head over the cache, split over the sequence, then the splits combined
   (two kernels);
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

__all__ = ["ATTENTION_CHUNK", "DEEP_TILES_FROM", "GemvConfig", "attention_splits", "gemv", "gemv_config", "rope_attend"]

#: Cache positions one attention program takes (see :func:`rope_attend`).
ATTENTION_CHUNK = 64


@dataclass(frozen=True)
class GemvConfig:
    """A product's tile: rows a program owns, the columns a loop step reads, warps and pipeline stages."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


#: HBM bandwidth (bytes/s) from which a card gets the deep tiles (the H200's 4.8 TB/s; the H100's 3.35 keeps
#: the first sweep's).
DEEP_TILES_FROM = 4.0e12


def gemv_config(rows: int, cols: int, hbm_bytes_per_second: float | None = None) -> GemvConfig:
    """The tile for a ``rows x cols`` product, from the sweeps (docs/benchmarks.md, issue 53's third pass;
    ``benchmarks/llama_kernels_gpu.py``).

    On an H100 (and any card below :data:`DEEP_TILES_FROM`): 4 rows a program (thousands of programs,
    several streaming on every SM), 512 columns a step, 3 stages; 8 warps where a product has no more rows
    than columns (O, down), else 4: the best or within 1 % of it on every shape of the 8B and the 1B but
    the 8B's O (2.33 against 2.34 TB/s). On an H200 a program must keep more bytes in flight: 2048
    columns a step with 8 warps, 2 rows a program where rows outnumber columns (Q/K/V 3.56 against 3.27
    TB/s, gate/up 4.25 against 4.00, LM head 4.47 against 4.27), 4 for a square one (O 3.19 against
    2.82); the down product (rows < columns) keeps the H100's tile, still its best (3.90)."""
    if hbm_bytes_per_second is not None and hbm_bytes_per_second >= DEEP_TILES_FROM and rows >= cols:
        return GemvConfig(block_n=2 if rows > cols else 4, block_k=2048, num_warps=8, num_stages=3)
    return GemvConfig(block_n=4, block_k=512, num_warps=8 if rows <= cols else 4, num_stages=3)


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
    cfg = config or gemv_config(rows, cols)
    grid = (triton.cdiv(rows, cfg.block_n),)
    _gemv_kernel[grid](weight, x, out, norm if norm is not None else x, residual if residual is not None else out,
                       rows, weight.stride(0), rows, eps, K=cols,
                       NORM=norm is not None, RESIDUAL=residual is not None, SWIGLU=swiglu,
                       EVEN_K=cols % cfg.block_k == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                       num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


@triton.jit
def _rope_attend_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, part_ptr, stat_ptr,
                        k_head_stride, k_seq_stride, v_head_stride, v_seq_stride, scale,
                        N_HEAD: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
                        SPLITS: tl.constexpr):
    head = tl.program_id(0)
    split = tl.program_id(1)
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
    start = split * CHUNK
    owner = (pos >= start) & (pos < start + CHUNK)  # this split holds the new token
    writer = owner & (head % (N_HEAD // N_KV) == 0)  # one query head of the group writes the cache
    writes = tl.where(writer, d < HEAD_DIM, d < 0)  # a mask of the head's shape (Triton 3.9's interpreter
    # refuses a scalar and-ed into a store's mask)
    tl.store(k_head + pos * k_seq_stride + d, k_new, mask=writes)
    tl.store(v_head + pos * v_seq_stride + d, v_new.to(v_ptr.dtype.element_ty), mask=writes)
    # The cached positions of this split before pos, and the new token from registers (its cache row
    # may not be written yet when another program reads).
    s = start + tl.arange(0, CHUNK)
    live = s < pos
    keys = tl.load(k_head + s[:, None] * k_seq_stride + d[None, :], mask=live[:, None], other=0.0)
    scores = tl.where(live, tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale, float("-inf"))
    new_score = tl.where(owner, tl.sum(q * k_new.to(tl.float32), axis=0) * scale, float("-inf"))
    top = tl.maximum(tl.max(scores, axis=0), new_score)  # -inf for a split past pos: the combine weighs it 0
    shift = tl.where(top == float("-inf"), 0.0, top)  # ... and its own weights are 0, not NaN
    weights = tl.exp(scores - shift)
    new_weight = tl.exp(new_score - shift)
    values = tl.load(v_head + s[:, None] * v_seq_stride + d[None, :], mask=live[:, None], other=0.0)
    acc = tl.sum(weights[:, None] * values.to(tl.float32), axis=0) + new_weight * v_new.to(tl.float32)
    slot = head * SPLITS + split
    tl.store(part_ptr + slot * HEAD_DIM + d, acc)
    tl.store(stat_ptr + slot * 2, top)
    tl.store(stat_ptr + slot * 2 + 1, tl.sum(weights, axis=0) + new_weight)


@triton.jit
def _combine_kernel(part_ptr, stat_ptr, out_ptr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
    head = tl.program_id(0)
    slots = head * SPLITS + tl.arange(0, SPLITS)
    tops = tl.load(stat_ptr + slots * 2)
    totals = tl.load(stat_ptr + slots * 2 + 1)
    scale = tl.exp(tops - tl.max(tops, axis=0))  # the split holding pos is never empty: the max is finite
    d = tl.arange(0, HEAD_DIM)
    parts = tl.load(part_ptr + slots[:, None] * HEAD_DIM + d[None, :])
    out = tl.sum(scale[:, None] * parts, axis=0) / tl.sum(scale * totals, axis=0)
    tl.store(out_ptr + head * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty))


def attention_splits(max_seq: int, chunk: int = ATTENTION_CHUNK) -> int:
    """Programs a query head's attention is split into (a power of two covering ``max_seq``)."""
    return triton.next_power_of_2(triton.cdiv(max_seq, chunk))


def rope_attend(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, pos: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, n_head: int, n_kv: int,
                partials: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """One decode token's attention: ``qkv`` ``[(H + 2 Hkv) * Dh]`` (a Q/K/V product's output), RoPE
    from ``cos``/``signed_sin`` ``[S, Dh]`` (sin with its first half negated: rotate_half's sign) at
    position ``pos`` (a one-element device tensor: the graph reads it), its key and value written into
    ``k_cache``/``v_cache`` ``[1, Hkv, S, Dh]`` at ``pos``, and each query head's attention over positions
    ``0..pos`` into ``out`` ``[H * Dh]``.

    Split over the sequence (flash-decoding): ``H x splits`` programs each take ``ATTENTION_CHUNK``
    positions (a program a head, walking the cache alone, took 12.8 us a layer of the 8B on an H100),
    leaving a partial sum in ``partials`` ``[H, splits, Dh]`` and its max and total in ``stats``
    ``[H, splits, 2]`` (float32, :func:`attention_splits`); a second kernel combines them."""
    head_dim = cos.shape[-1]
    splits = attention_splits(k_cache.shape[2])
    if k_cache.shape[0] != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_attend: caches must be [1, Hkv, S, Dh] with contiguous heads")
    if partials.numel() < n_head * splits * head_dim or stats.numel() < n_head * splits * 2:
        raise ValueError(f"rope_attend: partials/stats hold fewer than {n_head} x {splits} splits")
    _rope_attend_kernel[(n_head, splits)](
        qkv, cos, signed_sin, pos, k_cache, v_cache, partials, stats,
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2), head_dim ** -0.5,
        N_HEAD=n_head, N_KV=n_kv, HEAD_DIM=head_dim, CHUNK=ATTENTION_CHUNK, SPLITS=splits, num_warps=4)
    _combine_kernel[(n_head,)](partials, stats, out, HEAD_DIM=head_dim, SPLITS=splits, num_warps=4)
    return out
