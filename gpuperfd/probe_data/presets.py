"""The presets of each probe kind: named workload shapes and timings a spec starts from.

Why a module of their own: the registry (:mod:`gpuperfd.probe_data.kinds`) holds each kind's presets in
its row, and these tables are long. ``tiny`` (per kind) runs in seconds on a CPU and is what the tests use;
the others are sized to keep an H100/H200 busy. Pure Python (the daemon imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuperfd.probe_data.shapes import VIT_MODELS


# Shared timing defaults for the GPU presets: the warmup lasts at least a second (clocks and
# power settle, CUDA graphs and allocator pools are built) and each repeat is a 1.5 s window,
# so five repeats of one point take 7.5 s of measurement.
_GPU_TIMING: dict[str, Any] = {
    "warmup": 3,
    "warmup_seconds": 1.0,
    "repeats": 5,
    "measure_seconds": 1.5,
    # 0.1 s: the LLM's first busy pass took 2.4 s for 0.3 s profiled on an H200 (CUPTI's kernel records
    # of graph replays), time the GPU stays out of service for a diagnostic ratio (issue 60)
    "busy_profile_seconds": 0.1,
    "device": "cuda",
}
_TINY_TIMING: dict[str, Any] = {
    "warmup": 1,
    "warmup_seconds": 0.0,
    "repeats": 2,
    "measure_seconds": 0.2,
    "busy_profile_seconds": 0.05,
    "device": "cpu",
}


def _llm(model: str, batch: int) -> dict[str, Any]:
    return {"model": model, "variant": "graph", "batch_size": batch, "prompt_tokens": 128, "output_tokens": 128,
            "n_groups": 1, "dtype": "float16", **_GPU_TIMING}


def _llama(model: str, batch: int, variant: str = "fused", **more: Any) -> dict[str, Any]:
    """Seed 004's generation arguments: 128 prompt + 128 output tokens, greedy, bf16, static KV cache."""
    return {"model": model, "variant": variant, "batch_size": batch, "prompt_tokens": 128, "output_tokens": 128,
            "n_groups": 1, "dtype": "bfloat16", **_GPU_TIMING, **more}


_LLAMA_TINY: dict[str, Any] = {"model": "llama-tiny", "variant": "graph", "batch_size": 2, "prompt_tokens": 16,
                               "output_tokens": 8, "n_groups": 1, "dtype": "float32", **_TINY_TIMING}


def _train(model: str, batch: int) -> dict[str, Any]:
    return {"model": model, "variant": "eager", "batch_size": batch, "seq_len": 1024, "dtype": "bfloat16",
            **_GPU_TIMING}


def _vit(model: str, batch: int) -> dict[str, Any]:
    return {"model": model, "variant": "compiled", "batch_size": batch,
            "image_size": VIT_MODELS[model]["image_size"], "dtype": "bfloat16", **_GPU_TIMING}


def _per_model(preset: Callable[[str, int], dict[str, Any]], batches: dict[str, int]) -> dict[str, dict[str, Any]]:
    """One preset per model, named after it: ``preset(model, batch)`` for each model and its batch size."""
    return {model: preset(model, batch) for model, batch in batches.items()}


#: The llm probe's presets: GPT-2 sizes and the Llama family (seed 004).
LLM_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"model": "tiny", "variant": "graph", "batch_size": 2, "prompt_tokens": 16, "output_tokens": 8,
             "n_groups": 1, "dtype": "float32", **_TINY_TIMING},
    "tiny-x2": {"model": "tiny-x2", "variant": "graph", "batch_size": 2, "prompt_tokens": 16, "output_tokens": 8,
                "n_groups": 1, "dtype": "float32", **_TINY_TIMING},
    **_per_model(_llm, {"gpt2": 128, "gpt2-medium": 128, "gpt2-large": 64, "gpt2-xl": 32}),
    # The Llama family (seed 004): batch 1, as the seed runs it (--batch-size 32 for the served case).
    "llama-tiny": _LLAMA_TINY,
    "llama-tiny-spec": {**_LLAMA_TINY, "variant": "speculative", "draft_model": "llama-tiny-draft",
                        "speculative_tokens": 4},
    "llama-3.2-1b": _llama("llama-3.2-1b", 1),
    "llama-3.1-8b": _llama("llama-3.1-8b", 1),
    # seed 004's spec_config: amd/PARD-Llama-3.2-1B's shape drafting 12 tokens for the 8B
    "llama-3.1-8b-spec": _llama("llama-3.1-8b", 1, "speculative", draft_model="llama-3.2-1b",
                                speculative_tokens=12),
}

#: The vit probe's presets.
VIT_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"model": "tiny", "variant": "eager", "batch_size": 4, "image_size": 32, "dtype": "float32",
             **_TINY_TIMING},
    **_per_model(_vit, {"vit-s16": 128, "vit-b16": 128, "vit-l16": 64, "vit-h14": 32}),
}

#: The attention probe's presets.
ATTENTION_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"variant": "sdpa", "batch_size": 2, "heads": 4, "head_dim": 16, "seq_len": 64, "n_groups": 1,
             "causal": False, "dtype": "float32", **_TINY_TIMING},
    # One long-context layer's attention: 16 x 16 heads x 4096 tokens x 128, ~2.2 TFLOP a call.
    "default": {"variant": "sdpa", "batch_size": 16, "heads": 16, "head_dim": 128, "seq_len": 4096,
                "n_groups": 1, "causal": False, "dtype": "bfloat16", **_GPU_TIMING},
    # Llama-style grouped-query attention: 32 query heads, 8 key/value heads.
    "gqa": {"variant": "sdpa", "batch_size": 16, "heads": 32, "head_dim": 128, "seq_len": 4096,
            "n_groups": 4, "causal": True, "dtype": "bfloat16", **_GPU_TIMING},
}

#: The train probe's presets.
TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"model": "tiny", "variant": "eager", "batch_size": 2, "seq_len": 32, "dtype": "float32",
             **_TINY_TIMING},
    **_per_model(_train, {"gpt2": 16, "gpt2-medium": 8, "gpt2-large": 4, "gpt2-xl": 2}),
}
