"""Model construction for the probes: from configs (random weights) or a local directory.

Random weights are enough to measure speed and energy (the arithmetic is the same)
and need no download. Parameters are created directly on the target device, so
building GPT-2 XL on a GPU takes seconds rather than a CPU-side initialization.
"""

from __future__ import annotations

from typing import Any

import torch

from gpuperfd.probe_data.spec import GPT2_MODELS, LLAMA_MODELS, VIT_MODELS, ProbeSpec

__all__ = ["build_gpt2", "build_llama", "build_vit", "count_parameters", "llama_config"]


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _build(pretrained: Any, make: Any, spec: ProbeSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """``pretrained.from_pretrained(spec.weights_path)`` if given, else ``make()`` built on ``device``;
    in ``dtype``, eval mode, SDPA attention."""
    if spec.weights_path:
        model = pretrained.from_pretrained(
            spec.weights_path, local_files_only=True, dtype=dtype, attn_implementation="sdpa"
        )
        model.to(device)
    else:
        with torch.device(device):
            model = make()
        model.to(dtype=dtype)
    model.eval()
    return model


def build_gpt2(spec: ProbeSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """A GPT2LMHeadModel on ``device`` in ``dtype`` (eval mode, SDPA attention)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def make() -> Any:
        # No BOS/EOS: a random model must not stop early, and tiny vocabularies lack id 50256.
        config = GPT2Config(**GPT2_MODELS[spec.model], bos_token_id=None, eos_token_id=None,
                            attn_implementation="sdpa")
        return GPT2LMHeadModel(config)

    return _build(GPT2LMHeadModel, make, spec, device, dtype)


def build_vit(spec: ProbeSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """A ViTForImageClassification (1000 classes) on ``device`` in ``dtype``, eval mode."""
    from transformers import ViTConfig, ViTForImageClassification

    def make() -> Any:
        arch = dict(VIT_MODELS[spec.model])
        arch["image_size"] = spec.image_size
        return ViTForImageClassification(ViTConfig(**arch, num_labels=1000, attn_implementation="sdpa"))

    return _build(ViTForImageClassification, make, spec, device, dtype)


def llama_config(model: str) -> Any:
    """The ``LlamaConfig`` of a :data:`LLAMA_MODELS` shape (no BOS/EOS: a random model must not stop
    early; SDPA attention). Only keys every transformers from 4.45 to 5.x takes (``rope_theta`` is
    folded into ``rope_parameters`` by 5.x itself)."""
    from transformers import LlamaConfig

    return LlamaConfig(**LLAMA_MODELS[model], bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       attn_implementation="sdpa")


def build_llama(model: str, device: torch.device, dtype: torch.dtype, weights_path: str | None = None) -> Any:
    """A LlamaForCausalLM of shape ``model`` on ``device`` in ``dtype`` (eval mode, SDPA attention).

    Random weights are created on the device and in ``dtype`` from the start (the default dtype is
    set while the modules are made): the 8B shape never has a host copy nor a 32 GB float32 stage
    (seed 004's reference built it in 0.55 s on an H100).
    """
    from transformers import LlamaForCausalLM

    if weights_path:
        built = LlamaForCausalLM.from_pretrained(weights_path, local_files_only=True, dtype=dtype,
                                                 attn_implementation="sdpa")
        built.to(device)
    else:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                built = LlamaForCausalLM(llama_config(model))
        finally:
            torch.set_default_dtype(previous)
        built.to(dtype=dtype)
    built.eval()
    return built
