"""The ``fused`` variant's Triton kernels, run in Triton's interpreter on a CPU: each kernel against
PyTorch's math, and the whole fused decode step against ``StaticLlama``'s and ``LlamaForCausalLM``'s
greedy tokens, across the attention's splits; its bits repeat; bad shapes are refused by name.

Not collected by itself: ``test_llama_kernels.py`` runs it in a process started with
``TRITON_INTERPRET=1`` (Triton reads it when it is imported, before any kernel is decorated)."""

from __future__ import annotations

from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from gpuperfd.probe_child.workloads.llama import kernels as llama_kernels  # noqa: E402
from gpuperfd.probe_child.workloads.llama.fused import FusedDecode  # noqa: E402
from gpuperfd.probe_child.workloads.llama.static import StaticLlama  # noqa: E402
from gpuperfd.probe_child.workloads.models import build_llama  # noqa: E402


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1", "run through test_llama_kernels.py (Triton's interpreter)"
    return llama_kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean() + eps) * weight


@pytest.mark.parametrize("deep", [False, True], ids=["h100_tiles", "h200_tiles"])
@pytest.mark.parametrize("rows,cols", [(24, 64), (13, 700), (130, 1024), (131, 100), (64, 64)])  # ragged; cols not a tile multiple
def test_gemv_modes_match_pytorch(kernels: ModuleType, rows: int, cols: int, deep: bool) -> None:
    torch.manual_seed(0)
    w = torch.randn(2 * rows, cols)
    x, gamma = torch.randn(cols), torch.rand(cols) + 0.5
    w64, x64, g64 = w.double(), x.double(), gamma.double()  # references in float64: the kernel's float32 error alone

    def tile(n: int) -> object:
        return kernels.gemv_config(n, cols, 4.8e12 if deep else None)

    def close(got: torch.Tensor, expected: torch.Tensor, atol: float = 2e-4) -> None:
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=atol)

    close(kernels.gemv(w[:rows], x, torch.empty(rows), config=tile(rows)), w64[:rows] @ x64)
    h64 = rms_norm(x64, g64, 1e-6)
    close(kernels.gemv(w[:rows], x, torch.empty(rows), norm=gamma, eps=1e-6, config=tile(rows)), w64[:rows] @ h64)
    stream = torch.randn(rows)
    expected = stream.double() + w64[:rows] @ x64
    kernels.gemv(w[:rows], x, stream, residual=stream, config=tile(rows))  # in place, as the decode step adds into its stream
    close(stream, expected)
    swiglu = kernels.gemv(w, x, torch.empty(rows), norm=gamma, eps=1e-6, swiglu=True, config=tile(rows))
    close(swiglu, F.silu(w64[:rows] @ h64) * (w64[rows:] @ h64), atol=2e-3)  # a product of two sums of ~30


def test_gemv_refuses_shapes_that_do_not_fit(kernels: ModuleType) -> None:
    w = torch.randn(8, 32)
    with pytest.raises(ValueError, match=r"gemv: weight \(8, 32\).*x of 31"):
        kernels.gemv(w, torch.randn(31), torch.empty(8))
    with pytest.raises(ValueError, match="out of 7"):
        kernels.gemv(w, torch.randn(32), torch.empty(7))
    with pytest.raises(ValueError, match="row-major"):
        kernels.gemv(w.t(), torch.randn(8), torch.empty(32))


def test_tiles_follow_the_sweeps(kernels: ModuleType) -> None:
    """The H100's (and an unknown card's): 8 warps where a product has no more rows than columns (O, down),
    4 elsewhere; the H200's deeper steps but for down (docs/benchmarks.md)."""
    h100, h200 = 3.35e12, 4.8e12
    for bandwidth in (None, h100):
        assert kernels.gemv_config(4096, 4096, bandwidth).num_warps == kernels.gemv_config(4096, 14336, bandwidth).num_warps == 8
        assert kernels.gemv_config(6144, 4096, bandwidth) == kernels.GemvConfig(4, 512, 4, 3)
    assert kernels.gemv_config(6144, 4096, h200) == kernels.gemv_config(128256, 4096, h200) == kernels.GemvConfig(2, 2048, 8, 3)
    assert kernels.gemv_config(4096, 4096, h200) == kernels.GemvConfig(4, 2048, 8, 3)
    assert kernels.gemv_config(4096, 14336, h200) == kernels.gemv_config(4096, 14336, h100)


@pytest.mark.parametrize("pos,far", [(70, False), (63, False), (64, False), (70, True)])
def test_rope_attend_is_sdpa_over_the_cache(kernels: ModuleType, pos: int, far: bool) -> None:
    """Split attention against SDPA over positions 0..pos: splits past pos (2 of 4 here) weigh nothing, a
    boundary at 64 loses no position, and scores far below 0 (``far``: every score -1600, which underflows
    exp() against an empty split's 0) still give the softmax's average, not NaN."""
    torch.manual_seed(1)
    H, Hkv, Dh, S = 4, 2, 16, 256
    qkv = torch.randn((H + 2 * Hkv) * Dh)
    k_cache, v_cache = torch.randn(1, Hkv, S, Dh), torch.randn(1, Hkv, S, Dh)
    angles = torch.rand(S, Dh // 2) * 3
    if far:  # every key, the new one too, against every query: -20 x 20 x 16 / 4 = -1600
        qkv[:H * Dh], qkv[H * Dh:(H + Hkv) * Dh] = 20.0, -20.0
        k_cache.fill_(-20.0)
        angles.zero_()  # no rotation: the scores stay what they were made to be
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    signed_sin = torch.cat([-sin[:, :Dh // 2], sin[:, Dh // 2:]], dim=-1)
    splits = kernels.attention_splits(S)
    out = torch.empty(H * Dh)
    kernels.rope_attend(qkv, cos, signed_sin, torch.tensor([pos]), k_cache, v_cache, out, H, Hkv,
                        torch.empty(H, splits, Dh), torch.empty(H, splits, 2))

    def rope(x: torch.Tensor) -> torch.Tensor:  # transformers' x * cos + rotate_half(x) * sin
        return x * cos[pos] + torch.cat([-x[..., Dh // 2:], x[..., :Dh // 2]], dim=-1) * sin[pos]

    heads = qkv.view(H + 2 * Hkv, Dh)
    q, k_new, v_new = rope(heads[:H]), rope(heads[H:H + Hkv]), heads[H + Hkv:]
    torch.testing.assert_close(k_cache[0, :, pos], k_new)  # the new key and value are in the cache
    torch.testing.assert_close(v_cache[0, :, pos], v_new)
    keys = k_cache[0, :, :pos + 1].repeat_interleave(H // Hkv, dim=0)
    values = v_cache[0, :, :pos + 1].repeat_interleave(H // Hkv, dim=0)
    expected = F.scaled_dot_product_attention(q[:, None], keys, values)[:, 0]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.view(H, Dh), expected, rtol=1e-4, atol=1e-5)


@pytest.fixture()
def model() -> torch.nn.Module:
    torch.manual_seed(3)
    built = build_llama("llama-tiny", torch.device("cpu"), torch.float32)
    with torch.no_grad():  # larger weights than the init, so greedy tokens change step to step
        for p in built.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return built


def _decode_pair(static: StaticLlama, fused: FusedDecode) -> tuple[torch.Tensor, torch.Tensor]:
    """StaticLlama's decode step and the fused one from the same state; the state left is the fused one's,
    and it must equal the other's (cache rows, next token, position)."""
    saved = (static.pos.clone(), static.seq.clone(), [c.clone() for c in static.k_cache + static.v_cache])
    reference = static._forward(1, logits_all=False)[:, 0].clone()
    static.seq.index_copy_(1, static.pos + 1, reference.argmax(dim=-1).view(-1, 1))
    after = (static.seq.clone(), [c.clone() for c in static.k_cache + static.v_cache])
    static.pos.copy_(saved[0])
    static.seq.copy_(saved[1])
    for cache, old in zip(static.k_cache + static.v_cache, saved[2]):
        cache.copy_(old)
    logits = fused.decode().clone()
    assert int(static.pos) == int(saved[0]) + 1
    assert torch.equal(static.seq, after[0])
    for cache, expected in zip(static.k_cache + static.v_cache, after[1]):
        torch.testing.assert_close(cache, expected, rtol=1e-5, atol=1e-5)
    return reference, logits


@pytest.mark.parametrize("prompt", [5, 62])  # one split; then a decode that crosses into the second of four
def test_fused_decode_is_the_static_forwards_step(kernels: ModuleType, model: torch.nn.Module, prompt: int) -> None:
    with torch.inference_mode():
        static = StaticLlama(model, 1, prompt, prompt + (20 if prompt < 10 else 140), fused_decode=True)
        assert static.fused is not None and kernels.attention_splits(static.max_seq) == (1 if prompt < 10 else 4)
        prompts = torch.randint(0, model.config.vocab_size, (1, prompt))
        static.seq[:, :prompt].copy_(prompts)
        static.prefill()
        static.fused = None  # StaticLlama's own step for the reference
        tokens = set()
        for _ in range(4):
            reference, logits = _decode_pair(static, FusedDecode(static))
            torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)
            tokens.add(int(static.seq[0, int(static.pos)]))
        assert len(tokens) > 1


def test_fused_greedy_tokens_are_llama_for_causal_lms(kernels: ModuleType, model: torch.nn.Module) -> None:
    T, O = 9, 6
    prompts = torch.randint(0, model.config.vocab_size, (1, T))
    with torch.inference_mode():
        expected = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=O,
                                  min_new_tokens=O, do_sample=False, pad_token_id=0)[:, T:]
        static = StaticLlama(model, 1, T, T + O, fused_decode=True)
        assert torch.equal(static.generate(prompts, O), expected)


def test_fused_decode_repeats_its_bits_in_bfloat16(kernels: ModuleType) -> None:
    """The answer check compares bits: the same state gives the same logits (no split-K, no atomics)."""
    torch.manual_seed(4)
    model = build_llama("llama-tiny", torch.device("cpu"), torch.bfloat16)
    with torch.inference_mode():
        static = StaticLlama(model, 1, 70, 90, fused_decode=True)
        static.seq[:, :70].random_(0, model.config.vocab_size)
        static.prefill()
        runs = []
        for _ in range(2):
            static.pos.fill_(70)
            runs.append(static.decode().clone())
        assert torch.equal(runs[0], runs[1])
        static.fused = None
        static.pos.fill_(70)
        reference = static.decode()
        assert float((runs[0].float() - reference.float()).abs().max()) <= 4 * 2.0 ** -8 * float(reference.abs().max())  # bf16 ulps
