"""Model construction for the probes: from configs (random weights) or a local directory.

Random weights are enough to measure speed and energy (the arithmetic is the same)
and need no download. Parameters are created directly on the target device, so
building GPT-2 XL on a GPU takes seconds rather than a CPU-side initialization.
"""

from __future__ import annotations

from typing import Any

import torch

from gpuperfd.probe_data.spec import GPT2_MODELS, LLAMA_MODELS, VIT_MODELS, ProbeSpec

__all__ = ["attention_entry", "build_gpt2", "build_llama", "build_vit", "count_parameters", "llama_config",
           "random_llama"]


def attention_entry(model: Any | None = None) -> dict[str, str | None]:
    """A workload description's ``attention`` entry, spelled once for every workload: the Hugging Face
    model's attention implementation, or ``sdpa`` for our own forward (``model`` None)."""
    return {"attention": "sdpa" if model is None else getattr(model.config, "_attn_implementation", None)}


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

    Random weights (:func:`random_llama`) are made on the device, in ``dtype``, one tensor at a time:
    the 8B shape never has a host copy nor a float32 stage, and Q/K/V and gate/up are born fused.
    """
    from transformers import LlamaForCausalLM

    if weights_path:
        built = LlamaForCausalLM.from_pretrained(weights_path, local_files_only=True, dtype=dtype,
                                                 attn_implementation="sdpa")
        built.to(device)
    else:
        built = random_llama(llama_config(model), device, dtype)
    built.eval()
    return built


def random_llama(config: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """A LlamaForCausalLM with random weights, its skeleton made on the meta device (no memory, no
    init pass: transformers' init of the 8B took seconds of the probe's setup) and each weight then
    allocated on ``device`` and drawn as transformers draws it (normal, std ``initializer_range``;
    norms 1). Q/K/V of a layer are one ``[(H + 2 Hkv) Dh, D]`` matrix and gate/up one ``[2 I, D]``,
    the modules' weights consecutive row views into them, so the static forward multiplies by the
    fused matrices (:func:`~gpuperfd.probe_child.workloads.llama.static.fuse_rows` finds them) and
    nothing is held twice; ``generate()`` (the answer check's reference) reads the same memory."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        built = LlamaForCausalLM(config)
    std = float(getattr(config, "initializer_range", 0.02))

    def normal(rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=dtype, device=device).normal_(0.0, std)

    def bind(module: torch.nn.Module, weight: torch.Tensor) -> None:
        module.weight = torch.nn.Parameter(weight, requires_grad=False)

    def bind_rows(linears: list[torch.nn.Module]) -> None:
        fused = normal(sum(lin.weight.shape[0] for lin in linears), linears[0].weight.shape[1])
        start = 0
        for lin in linears:
            rows = lin.weight.shape[0]
            bind(lin, fused[start:start + rows])
            start += rows

    def ones(module: torch.nn.Module) -> None:
        bind(module, torch.ones(module.weight.shape, dtype=dtype, device=device))

    inner = built.model
    bind(inner.embed_tokens, normal(*inner.embed_tokens.weight.shape))
    for block in inner.layers:
        att, mlp = block.self_attn, block.mlp
        bind_rows([att.q_proj, att.k_proj, att.v_proj])
        bind(att.o_proj, normal(*att.o_proj.weight.shape))
        bind_rows([mlp.gate_proj, mlp.up_proj])
        bind(mlp.down_proj, normal(*mlp.down_proj.weight.shape))
        ones(block.input_layernorm)
        ones(block.post_attention_layernorm)
    ones(inner.norm)
    if getattr(config, "tie_word_embeddings", False):
        built.lm_head.weight = inner.embed_tokens.weight
    else:
        bind(built.lm_head, normal(*built.lm_head.weight.shape))
    # the rotary module's inverse frequencies are buffers computed at construction: made again, on the device
    # (made under the device, not passed it: transformers 5.x's constructor takes no device)
    with torch.device(device):
        inner.rotary_emb = type(inner.rotary_emb)(config=config)
    left = [name for name, t in [*built.named_parameters(), *built.named_buffers()] if t.is_meta]
    if left and torch.device(device).type != "meta":
        raise RuntimeError(f"random_llama: tensors left on the meta device (this transformers adds state "
                           f"the builder does not know): {', '.join(left[:5])}")
    return built
