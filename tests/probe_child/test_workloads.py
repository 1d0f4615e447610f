"""Workload internals, in process: the fast paths compute the same function as Hugging Face,
the FLOP/byte counts and the busy-fraction arithmetic are right, local weights and data load."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_child.busy import busy_ratio_from_trace  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec  # noqa: E402
from gpuperfd.probe_child.workloads.attention import attention_bytes, attention_flops  # noqa: E402
from gpuperfd.probe_child.workloads.gpt2_static import StaticGPT2  # noqa: E402
from gpuperfd.probe_child.workloads.models import build_gpt2, build_vit  # noqa: E402
from gpuperfd.probe_child.workloads.vit import vit_flops_per_image  # noqa: E402
from gpuperfd.probe_child.workloads.vit_fused import FusedViT  # noqa: E402

CPU = torch.device("cpu")
QUICK = {"repeats": 1, "measure_seconds": 0.05, "busy_profile_seconds": 0.0}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(1)
    model = build_gpt2(ProbeSpec("llm", preset="tiny"), CPU, torch.float32)
    with torch.no_grad():  # larger weights than the init, so greedy tokens differ step to step
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_static_gpt2_logits_match_hugging_face(gpt2: torch.nn.Module) -> None:
    B, T, O = 3, 12, 6
    prompts = torch.randint(0, gpt2.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    static = StaticGPT2(gpt2, B, T, O)
    with torch.inference_mode():
        static.seq[:, :T].copy_(prompts)
        logits = [static.prefill()]
        for _ in range(O - 1):
            logits.append(static.decode())
        tokens = static.seq[:, T:T + O]
        assert int(static.pos) == T + O - 1
        full = torch.cat([prompts, tokens], dim=1)
        ref = gpt2(full).logits  # position i predicts token i + 1
        for step, got in enumerate(logits):
            assert _rel(got, ref[:, T - 1 + step]) < 1e-5, step
        hf = gpt2.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=O, min_new_tokens=O,
                           do_sample=False, pad_token_id=0)[:, T:]
    assert torch.equal(tokens, hf)
    assert len(set(tokens[0].tolist())) > 1  # a real sequence, not one repeated token


def test_static_gpt2_grouped_kv_heads(gpt2: torch.nn.Module) -> None:
    """GQA: a model whose K/V heads already agree within each group gives the same tokens with
    n_groups=2 as with full MHA, from a cache half the size; other models differ (the groups are used)."""
    import copy

    shared = copy.deepcopy(gpt2)
    D, H = shared.config.n_embd, shared.config.n_head
    Dh = D // H
    with torch.no_grad():
        for block in shared.transformer.h:
            w, b = block.attn.c_attn.weight, block.attn.c_attn.bias
            for part in (1, 2):  # K and V: copy head 2i onto head 2i + 1
                cols = w[:, part * D:(part + 1) * D].view(D, H, Dh)
                cols[:, 1::2] = cols[:, 0::2]
                bias = b[part * D:(part + 1) * D].view(H, Dh)
                bias[1::2] = bias[0::2]
    B, T, O = 2, 10, 5
    prompts = torch.randint(0, gpt2.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        mha = StaticGPT2(shared, B, T, O)
        gqa = StaticGPT2(shared, B, T, O, n_groups=2)
        assert torch.equal(mha.generate(prompts), gqa.generate(prompts))
        assert gqa.kv_cache_bytes * 2 == mha.kv_cache_bytes and gqa.n_kv == H // 2
        other = StaticGPT2(gpt2, B, T, O, n_groups=2)
        other.seq[:, :T].copy_(prompts)
        base = StaticGPT2(gpt2, B, T, O)
        base.seq[:, :T].copy_(prompts)
        assert _rel(other.prefill(), base.prefill()) > 1e-3
    with pytest.raises(ValueError, match="n_groups"):
        StaticGPT2(gpt2, B, T, O, n_groups=3)


def test_static_gpt2_rejects_too_long_requests(gpt2: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="output_tokens"):
        StaticGPT2(gpt2, 1, 100, 100)


def test_fused_vit_matches_hugging_face() -> None:
    spec = ProbeSpec("vit", preset="tiny")
    torch.manual_seed(2)
    model = build_vit(spec, CPU, torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    pixels = torch.randn(3, 3, spec.image_size, spec.image_size)
    with torch.inference_mode():
        assert _rel(FusedViT(model)(pixels), model(pixel_values=pixels).logits) < 1e-5


def test_compiled_vit_compiles_one_layer_for_every_layer_and_matches_hugging_face() -> None:
    """Regional compilation (issue 60): the layers share one compiled graph (one frame compiled, one
    graph, however many layers), and the answer is still Hugging Face's; the eager fused forward
    calls the same layer function uncompiled."""
    from torch._dynamo.utils import counters

    spec = ProbeSpec("vit", preset="tiny")
    torch.manual_seed(3)
    model = build_vit(spec, CPU, torch.float32)
    assert model.config.num_hidden_layers > 1
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    pixels = torch.randn(2, 3, spec.image_size, spec.image_size)
    torch._dynamo.reset()
    counters.clear()
    with torch.inference_mode():
        fused = FusedViT(model)
        fused.compile_layers()
        first = fused(pixels)
        again = fused(pixels * 0.5)  # other values, same shapes: no recompile
        expected = model(pixel_values=pixels * 0.5).logits
    assert counters["frames"]["ok"] == 1
    assert counters["stats"]["unique_graphs"] == 1
    assert _rel(first, model(pixel_values=pixels).logits) < 1e-5
    assert _rel(again, expected) < 1e-5


def test_vit_b16_flop_count() -> None:
    from transformers import ViTConfig

    # ViT-B/16 at 224: ~17.6 G multiply-adds -> ~35.1 GFLOP per image.
    flops = vit_flops_per_image(ViTConfig(num_labels=1000))
    assert 35.0e9 < flops < 35.3e9


def test_attention_counts() -> None:
    assert attention_flops(1, 1, 4, 2, causal=False) == 4 * 1 * 1 * 2 * 16
    assert attention_flops(1, 1, 4, 2, causal=True) == 4 * 2 * 10
    # 8 query heads, 2 KV heads, fp16: Q and out for 8 heads, K and V for 2.
    assert attention_bytes(1, 8, 16, 4, 4, 2) == 2 * 16 * 4 * (16 + 4)


def test_busy_ratio_is_the_union_over_the_window() -> None:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "gpuperfd_busy_window", "ts": 100.0, "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 90.0, "dur": 20.0},  # clipped to 100..110
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 120.0, "dur": 20.0},  # 120..140
        {"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": 130.0, "dur": 20.0},  # overlaps b: 140..150 new
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 100.0, "dur": 100.0},  # not device work
        {"ph": "X", "cat": "kernel", "name": "d", "ts": 250.0, "dur": 10.0},  # outside
    ]
    ratio, info = busy_ratio_from_trace(events, "cuda")
    assert ratio == pytest.approx(0.4)
    assert info["busy_activities"] == 3
    cpu_ratio, _ = busy_ratio_from_trace(events, "cpu")
    assert cpu_ratio == pytest.approx(1.0)
    none, info = busy_ratio_from_trace(events[1:], "cuda")
    assert none is None and "busy_error" in info


def test_local_weights_and_token_dataset(tmp_path: Path, gpt2: torch.nn.Module) -> None:
    import numpy as np

    weights = tmp_path / "gpt2-tiny"
    gpt2.save_pretrained(weights)
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.arange(5000) % gpt2.config.vocab_size)
    spec = ProbeSpec("llm", preset="tiny", weights_path=str(weights), dataset_path=str(tokens), **QUICK)
    result = harness.execute(spec)
    assert result.status == "ok" and result.units_of_work > 0
    assert result.extra["model_parameters"] == sum(p.numel() for p in gpt2.parameters())
    train = harness.execute(ProbeSpec("train", preset="tiny", dataset_path=str(tokens), **QUICK))
    assert train.extra["loss"] > 0


def test_image_dataset_from_array_and_folder(tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    images = tmp_path / "images.npy"
    np.save(images, (np.random.default_rng(0).random((5, 40, 40, 3)) * 255).astype("uint8"))
    result = harness.execute(ProbeSpec("vit", preset="tiny", dataset_path=str(images), **QUICK))
    assert result.status == "ok" and result.throughput["images_per_second"] > 0
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (50, 60), (i * 40, 10, 200)).save(folder / f"{i}.png")
    result = harness.execute(ProbeSpec("vit", preset="tiny", dataset_path=str(folder), **QUICK))
    assert result.status == "ok"


def test_bad_dataset_fails_with_the_field_name(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.txt"
    bad.write_text("1 2 3")
    with pytest.raises(ValueError, match="^dataset_path:"):
        harness.execute(ProbeSpec("llm", preset="tiny", dataset_path=str(bad), **QUICK))


@pytest.mark.parametrize("variant", ["fused", "eager"])
def test_vit_variants_and_fixed_iterations(variant: str) -> None:
    spec = ProbeSpec("vit", preset="tiny", variant=variant, iterations=7, repeats=2, busy_profile_seconds=0.0)
    result = harness.execute(spec)
    assert [r.iterations for r in result.repeats] == [7, 7]
    assert result.units_of_work == 2 * 7 * spec.batch_size
    assert result.extra["implementation"] == ("gpuperfd.vit_fused" if variant == "fused" else "transformers")
    assert result.gpu_busy_ratio is None and result.low_gpu_busy is False  # busy profiling disabled


def test_eager_llm_variant_in_process() -> None:
    result = harness.execute(ProbeSpec("llm", preset="tiny", variant="eager", **QUICK))
    assert result.extra["kv_cache"] == "dynamic" and result.extra["generate_short_outputs"] == 0
    lat = result.latencies
    assert all(0 < t < r for t, r in zip(lat["ttft_seconds"], lat["request_seconds"]))


def test_a_compiled_variants_preload_imports_the_compiler_without_touching_a_gpu() -> None:
    """A standby child imports torch.compile's Dynamo and Inductor before its GPU is taken (issue 60: they
    were most of a ready ViT child's build on an H200), and only for a compiled variant; no CUDA call."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from gpuperfd.probe_child import workloads\n"
            "workloads.preload('vit', sys.argv[1])\n"
            "print(all(m in sys.modules for m in workloads.COMPILER_MODULES), torch.cuda.is_initialized())\n")
    for variant, expected in (("compiled", "True False"), ("eager", "False False")):
        out = subprocess.run([sys.executable, "-c", code, variant], capture_output=True, text=True, timeout=300,
                             check=True)
        assert out.stdout.split() == expected.split(), (variant, out.stdout, out.stderr)


def test_preload_imports_what_the_build_imports_list_names() -> None:
    from gpuperfd.probe_child import workloads

    assert workloads.build_imports("vit", "compiled")[-len(workloads.COMPILER_MODULES):] == workloads.COMPILER_MODULES
    assert not set(workloads.COMPILER_MODULES) & set(workloads.build_imports("vit", "eager"))
    assert workloads.build_imports("llm")[0] == "gpuperfd.probe_child.workloads.llm"
