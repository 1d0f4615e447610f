"""The model shapes the probes build, and the dtypes they take: plain tables, no logic beyond a lookup.

Kept apart from :mod:`.spec` (which re-exports them) so that the spec, the CPU path's cost estimate
(:mod:`.cpu_path`) and the simulator's workload cost (:mod:`.workload_cost`) read one table without
importing each other in a circle.
"""

from __future__ import annotations

from typing import Any

#: Accepted dtype spellings -> the canonical name.
DTYPES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}

#: GPT-2 family architectures (built from GPT2Config; random weights unless weights_path).
GPT2_MODELS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 128},
    # A second CPU-sized model, so a model-size axis can be tried without a GPU (docs, tests).
    "tiny-x2": {"n_layer": 4, "n_embd": 128, "n_head": 8, "vocab_size": 512, "n_positions": 128},
    "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
    "gpt2-medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "vocab_size": 50257, "n_positions": 1024},
    "gpt2-large": {"n_layer": 36, "n_embd": 1280, "n_head": 20, "vocab_size": 50257, "n_positions": 1024},
    "gpt2-xl": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257, "n_positions": 1024},
}

#: Llama-family architectures (built from LlamaConfig, random weights; the llm probe's second model
#: family, docs/probes.md "Llama family"): grouped-query attention (``num_key_value_heads``), RoPE,
#: SwiGLU, RMSNorm. ``llama-3.1-8b`` and ``llama-3.2-1b`` are seed 004's model and speculative draft,
#: by shape (8.03 B and 1.24 B parameters); the tiny ones run on a CPU in seconds.
LLAMA_MODELS: dict[str, dict[str, Any]] = {
    "llama-tiny": {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
                   "rope_theta": 500000.0, "tie_word_embeddings": False},
    # the tiny model's speculative draft: one layer, the same vocabulary (a draft must share the tokenizer)
    "llama-tiny-draft": {"hidden_size": 32, "intermediate_size": 88, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 512,
                         "max_position_embeddings": 256, "rope_theta": 500000.0, "tie_word_embeddings": True},
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": True},
    "llama-3.1-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False},
}
def is_llama(model: Any) -> bool:
    """Whether ``model`` names a Llama-family architecture (the llm probe's second family)."""
    return model in LLAMA_MODELS


#: ViT architectures (built from ViTConfig, 1000 classes).
VIT_MODELS: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
             "patch_size": 8, "image_size": 32},
    "vit-s16": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
                "patch_size": 16, "image_size": 224},
    "vit-b16": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                "patch_size": 16, "image_size": 224},
    "vit-l16": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
                "patch_size": 16, "image_size": 224},
    "vit-h14": {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16, "intermediate_size": 5120,
                "patch_size": 14, "image_size": 224},
}

def canonical_dtype(name: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``; ValueError naming the field for anything else."""
    key = str(name).strip().lower()
    if key not in DTYPES:
        raise ValueError(f"dtype: unknown dtype {name!r}; use one of float32, float16, bfloat16 (or fp32/fp16/bf16)")
    return DTYPES[key]
