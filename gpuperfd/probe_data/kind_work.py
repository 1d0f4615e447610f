"""Each probe kind's work, as its registry row names it: the cost of one step from the options, and
the parameters and FLOPs of one iteration from a spec.

Why: the simulator (:func:`gpuperfd.probe_data.kinds.workload_cost`) and a CPU point's time bound
(``cpu_path.py``) read a kind's work through its row, never through an if-chain over kind names; the
arithmetic itself stays in ``workload_cost.py``. Pure Python (the daemon imports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuperfd.probe_data.shapes import GPT2_MODELS, VIT_MODELS, is_llama
from gpuperfd.probe_data.workload_cost import (WorkCost, attention_cost, llama_cost, llama_shape, llm_cost,
                                               train_cost, vit_cost)


def decoder_cost(options: Mapping[str, Any], dtype: str) -> WorkCost:
    """The llm probe's step: a GPT-2 or a Llama model's requests."""
    if is_llama(options["model"]):
        return llama_cost(str(options["model"]), int(options["batch_size"]), int(options["prompt_tokens"]),
                          int(options["output_tokens"]), dtype)
    return llm_cost(str(options["model"]), int(options["batch_size"]), int(options["prompt_tokens"]),
                    int(options["output_tokens"]), int(options.get("n_groups") or 1), dtype)


def image_cost(options: Mapping[str, Any], dtype: str) -> WorkCost:
    """The vit probe's step: one batch of images."""
    return vit_cost(str(options["model"]), int(options["batch_size"]), int(options["image_size"]), dtype)


def sdpa_cost(options: Mapping[str, Any], dtype: str) -> WorkCost:
    """The attention probe's step: one attention call."""
    return attention_cost(int(options["batch_size"]), int(options["heads"]), int(options["head_dim"]),
                          int(options["seq_len"]), int(options.get("n_groups") or 1),
                          bool(options.get("causal")), dtype)


def training_cost(options: Mapping[str, Any], dtype: str) -> WorkCost:
    """The train probe's step: forward, backward and optimizer."""
    return train_cost(str(options["model"]), int(options["batch_size"]), int(options["seq_len"]), dtype)


def gpt2_parameters(spec: Any) -> float:
    """About how many parameters the spec's GPT-2 model has."""
    m = GPT2_MODELS[spec.model]
    d = m["n_embd"]
    return 12 * m["n_layer"] * d * d + (m["vocab_size"] + m["n_positions"]) * d


def decoder_parameters(spec: Any) -> float:
    """The llm probe's parameters: a GPT-2 model's, or a Llama target's and its speculative draft's."""
    if is_llama(spec.model):
        drafts = [spec.draft_model] if getattr(spec, "draft_model", None) else []
        return sum(llama_shape(model).total_params for model in [spec.model, *drafts])
    return gpt2_parameters(spec)


def image_parameters(spec: Any) -> float:
    """About how many parameters the spec's ViT model has."""
    m = VIT_MODELS[spec.model]
    d = m["hidden_size"]
    return m["num_hidden_layers"] * (4 * d * d + 2 * d * m["intermediate_size"]) + 3 * m["patch_size"] ** 2 * d


def no_work(spec: Any) -> float:
    """Nothing to count: a kind without a model has no parameters to build (attention)."""
    return 0.0


def decoder_flops(spec: Any) -> float:
    """One request batch: two FLOPs a parameter for every prompt and output token."""
    return 2.0 * decoder_parameters(spec) * spec.batch_size * (spec.prompt_tokens + spec.output_tokens)


def image_flops(spec: Any) -> float:
    """One batch of images: two FLOPs a parameter for every patch token and the class token."""
    tokens = (spec.image_size // VIT_MODELS[spec.model]["patch_size"]) ** 2 + 1
    return 2.0 * image_parameters(spec) * spec.batch_size * tokens


def sdpa_flops(spec: Any) -> float:
    """One attention call: the two products of every head (half under a causal mask)."""
    causal = 0.5 if spec.causal else 1.0
    return 4.0 * spec.batch_size * spec.heads * spec.seq_len ** 2 * spec.head_dim * causal


def training_flops(spec: Any) -> float:
    """One training step: six FLOPs a parameter for every token (forward and backward)."""
    return 6.0 * gpt2_parameters(spec) * spec.batch_size * spec.seq_len
