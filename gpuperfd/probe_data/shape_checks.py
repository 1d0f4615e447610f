"""Each probe kind's own checks of a resolved spec: its variant, model and shape fields.

Why apart from ``spec.py``: the registry (:mod:`gpuperfd.probe_data.kinds`) names a kind's check in its
row, so :class:`~gpuperfd.probe_data.spec.ProbeSpec` runs the row's check instead of an if-chain over
kind names. A check takes the spec (any object with its fields) and raises ``ValueError`` whose message
starts with the field name. Pure Python (the daemon imports it).
"""

from __future__ import annotations

from typing import Any

from gpuperfd.probe_data.shapes import GPT2_MODELS, LLAMA_MODELS, VIT_MODELS, is_llama

#: Variants of the llm probe on a GPT-2 model.
GPT2_VARIANTS: tuple[str, ...] = ("graph", "eager")

#: Variants of the llm probe on a Llama model (the first is the GPU presets'): ``fused`` the batch-1
#: decode step as six Triton kernels a layer (norm, RoPE, SwiGLU and residuals inside the products:
#: ``llama.fused``; 1.24x ``graph``'s 8B and 1.43x its 1B on an H100), prefill and other batches as
#: ``graph``: our static-cache forward with the decode step in a CUDA graph; ``compiled`` the same
#: forward through torch.compile (element-wise chains fused) and then captured; ``eager``
#: Hugging Face generate(); ``speculative`` a draft proposing ``speculative_tokens`` tokens and the
#: target verifying them (both graphed).
LLAMA_VARIANTS: tuple[str, ...] = ("fused", "graph", "compiled", "eager", "speculative")
#: Speculative decoding: proposed tokens per round (k) between these bounds.
SPECULATIVE_TOKENS_RANGE = (1, 64)
#: The static KV cache's longest context here (a probe, not a server: 131072 positions would be a
#: 16 GiB cache per sequence for the 8B).
LLAMA_MAX_CONTEXT = 8192


def integer(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as a field's integer between ``low`` and ``high``; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def number(name: str, value: Any, low: float, high: float | None = None, low_inclusive: bool = True) -> float:
    """``value`` as a field's float above ``low`` (and at most ``high``); ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    value = float(value)
    if value != value or (value < low if low_inclusive else value <= low) or (high is not None and value > high):
        op = ">=" if low_inclusive else ">"
        bound = f"{op} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def check_decoder_variant(spec: Any) -> None:
    """The llm probe's variant, per model family (GPT2_VARIANTS, LLAMA_VARIANTS)."""
    if is_llama(spec.model):
        if spec.variant not in LLAMA_VARIANTS:
            raise ValueError(f"variant: {spec.variant!r} is not a variant of the llm probe on a Llama model; "
                             f"use one of {', '.join(LLAMA_VARIANTS)}")
    elif spec.variant not in GPT2_VARIANTS:
        raise ValueError(f"variant: {spec.variant!r} is not a variant of the llm probe on a GPT-2 model; "
                         f"use one of {', '.join(GPT2_VARIANTS)} ({', '.join(LLAMA_VARIANTS)} on a Llama model)")


def _check_llama(spec: Any) -> None:
    """A Llama-family llm point: its variant, positions, and the speculative draft."""
    cfg = LLAMA_MODELS[spec.model]
    if spec.n_groups != 1:
        raise ValueError(f"n_groups: a Llama model has its own key/value heads "
                         f"({cfg['num_attention_heads']} query, {cfg['num_key_value_heads']} key/value); use 1")
    extra = 0
    if spec.variant == "speculative":
        if spec.draft_model not in LLAMA_MODELS:
            raise ValueError(f"draft_model: unknown Llama model {spec.draft_model!r}; use one of "
                             f"{', '.join(LLAMA_MODELS)}")
        if LLAMA_MODELS[spec.draft_model]["vocab_size"] != cfg["vocab_size"]:
            raise ValueError(f"draft_model: {spec.draft_model} has a vocabulary of "
                             f"{LLAMA_MODELS[spec.draft_model]['vocab_size']} tokens, {spec.model} of "
                             f"{cfg['vocab_size']}: a draft must share the target's vocabulary")
        low, high = SPECULATIVE_TOKENS_RANGE
        integer("speculative_tokens", spec.speculative_tokens, low, high)
        if spec.output_tokens < 2:
            raise ValueError("output_tokens: speculative decoding needs at least 2 output tokens")
        extra = spec.speculative_tokens + 1
    limit = min(cfg["max_position_embeddings"], LLAMA_MAX_CONTEXT)
    if spec.prompt_tokens + spec.output_tokens + extra > limit:
        raise ValueError(f"output_tokens: prompt_tokens + output_tokens{' + speculative_tokens + 1' if extra else ''}"
                         f" = {spec.prompt_tokens + spec.output_tokens + extra} exceeds {limit} positions")


def check_decoder(spec: Any) -> None:
    """The llm probe's model, lengths and K/V groups (a Llama model: :func:`_check_llama`)."""
    if spec.model not in GPT2_MODELS and not is_llama(spec.model):
        raise ValueError(f"model: unknown llm model {spec.model!r}; use one of "
                         f"{', '.join([*GPT2_MODELS, *LLAMA_MODELS])}")
    integer("prompt_tokens", spec.prompt_tokens, 1)
    integer("output_tokens", spec.output_tokens, 1)
    integer("n_groups", spec.n_groups, 1)
    if is_llama(spec.model):
        _check_llama(spec)
        return
    heads = GPT2_MODELS[spec.model]["n_head"]
    if heads % spec.n_groups:
        raise ValueError(f"n_groups: {spec.n_groups} does not divide the model's {heads} heads; "
                         f"use a divisor of {heads}")
    if spec.n_groups > 1 and spec.variant != "graph":
        raise ValueError("n_groups: grouped key/value heads run in the graph variant only; "
                         "use --variant graph (or n_groups 1)")
    limit = GPT2_MODELS[spec.model]["n_positions"]
    if spec.weights_path is None and spec.prompt_tokens + spec.output_tokens > limit:
        raise ValueError(
            f"output_tokens: prompt_tokens + output_tokens = {spec.prompt_tokens + spec.output_tokens} "
            f"exceeds the model's {limit} positions"
        )


def check_image(spec: Any) -> None:
    """The vit probe's model and image size (a multiple of the model's patch)."""
    if spec.model not in VIT_MODELS:
        raise ValueError(f"model: unknown ViT model {spec.model!r}; use one of {', '.join(VIT_MODELS)}")
    integer("image_size", spec.image_size, 1)
    patch = VIT_MODELS[spec.model]["patch_size"]
    if spec.image_size % patch:
        raise ValueError(f"image_size: {spec.image_size} is not a multiple of the patch size {patch}")


def check_training(spec: Any) -> None:
    """The train probe's GPT-2 model and sequence length (within its positions unless weights are given)."""
    if spec.model not in GPT2_MODELS:
        raise ValueError(f"model: unknown GPT-2 model {spec.model!r}; use one of {', '.join(GPT2_MODELS)}")
    integer("seq_len", spec.seq_len, 2)
    limit = GPT2_MODELS[spec.model]["n_positions"]
    if spec.weights_path is None and spec.seq_len > limit:
        raise ValueError(f"seq_len: {spec.seq_len} exceeds the model's {limit} positions")


def check_sdpa(spec: Any) -> None:
    """The attention probe's heads, head size, sequence, K/V groups and causal flag."""
    integer("heads", spec.heads, 1)
    integer("head_dim", spec.head_dim, 1, 512)
    integer("seq_len", spec.seq_len, 1)
    integer("n_groups", spec.n_groups, 1)
    if spec.heads % spec.n_groups:
        raise ValueError(f"n_groups: {spec.n_groups} does not divide heads={spec.heads}")
    if not isinstance(spec.causal, bool):
        raise ValueError(f"causal: must be true or false, got {spec.causal!r}")
