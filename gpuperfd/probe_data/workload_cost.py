"""The work one step of a probe does: FLOPs, bytes moved, kernels, and the memory it holds.

Why: the simulated GPU (``probing/simulated/workload.py`` over ``device/roofline.py``) turns this
into time, power and peak memory, so its figures follow the workload's shape (model size, batch,
prompt and output length, sequence length, head groups, image size, dtype) instead of one flat line
per probe. The arithmetic reads the model shapes from ``spec.py`` (the same tables the child builds
its models from) and stays pure Python: it runs in the daemon, which never imports torch.

Counts are the usual transformer estimates (2 FLOPs per multiply-add, weights read once per step,
activations written and read once per fused kernel); they set the *shape* of the simulated figures,
and the simulator calibrates the absolute level on the default presets' real figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuperfd.probe_data.shapes import GPT2_MODELS, LLAMA_MODELS, VIT_MODELS, canonical_dtype

#: Where a simulated result lists the options its figures do not follow (``ProbeResult.extra``); the
#: CLI's table and the report name them, so a flat simulated line is never read as a trend.
NOT_MODELLED_KEY = "simulated_not_modelled"
#: Where a simulated result says in words what it is not (``ProbeResult.extra``): the CLI prints it under
#: its table, the daemon logs it once per preset.
SIMULATED_NOTE_KEY = "simulated_note"
#: A simulated speculative point's note (issue 61: it printed plain decode figures and no curve, silently).
SPECULATIVE_NOT_SIMULATED = ("simulated: speculative decoding is not simulated: the figures are the target's "
                             "plain decode (no draft round, no verify step, no acceptance-rate curve); run the "
                             "speculative variant on a GPU for those")

#: Bytes per element of each canonical dtype.
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Kernels per transformer layer of a step: a CUDA-graph decode or compiled forward (fused), and an
#: eager training step (forward and backward, many element-wise kernels).
FUSED_KERNELS_PER_LAYER = 12
#: torch.compile fuses a ViT layer's norms, bias, GELU and residuals into the matmuls' neighbours: about
#: 4 matmuls, attention and 2 fused element-wise kernels (fitted: ViT-B/16 at batch 1 on an H100).
COMPILED_VIT_KERNELS_PER_LAYER = 7
TRAIN_KERNELS_PER_LAYER = 40
#: ViT classes (ViTConfig, 1000 classes).
VIT_CLASSES = 1000


@dataclass(frozen=True)
class Phase:
    """One step: FLOPs, bytes moved to and from device memory, kernels launched."""

    flops: float
    bytes_moved: float
    kernels: int


@dataclass(frozen=True)
class MemoryBytes:
    """What a probe holds at its peak, bytes: weights, activations, KV cache, optimizer state (with grads)."""

    weights: float
    activations: float
    kv_cache: float = 0.0
    optimizer: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.activations + self.kv_cache + self.optimizer


@dataclass(frozen=True)
class WorkCost:
    """A probe point's work: its measured step (``step``, ``units_per_step`` units of work each), the
    llm probe's prefill (time to first token), its dtype and the memory it holds."""

    dtype: str
    step: Phase
    units_per_step: float
    memory: MemoryBytes
    prefill: Phase | None = None


def _gpt2_params(model: str, n_groups: int = 1) -> tuple[dict[str, int], float, float]:
    """(config, matmul parameters incl. the tied LM head, all parameters) of a GPT-2 model whose
    K/V projections are shared by ``n_groups`` query heads."""
    cfg = GPT2_MODELS[model]
    h, layers, vocab = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
    per_layer = h * (h + 2 * h / n_groups) + h * h + 8 * h * h  # qkv, attention out, MLP
    matmul = layers * per_layer + vocab * h
    total = matmul + cfg["n_positions"] * h + layers * 13 * h
    return cfg, matmul, total


def llm_cost(model: str, batch: int, prompt: int, output: int, n_groups: int, dtype: str) -> WorkCost:
    """Prefill of the batch's prompts and one decode step (static KV cache of ``prompt + output``
    positions, read whole every step under a mask, as ``gpt2_static`` does)."""
    cfg, matmul, total = _gpt2_params(model, n_groups)
    size = ELEMENT_BYTES[dtype]
    h, layers, vocab = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
    context = prompt + output
    kv = batch * layers * 2 * context * (h / n_groups) * size
    weights = total * size
    kernels = layers * FUSED_KERNELS_PER_LAYER + 5
    decode = Phase(flops=2 * batch * matmul + 4 * batch * layers * context * h,
                   bytes_moved=weights + kv + batch * (layers * 10 * h + vocab) * size, kernels=kernels)
    prefill = Phase(flops=2 * batch * prompt * (matmul - vocab * h) + 2 * batch * vocab * h
                    + 2 * batch * layers * prompt * prompt * h,
                    bytes_moved=weights + kv + batch * prompt * layers * 12 * h * size, kernels=kernels)
    # the prefill's transient peak: the residual stream and one layer's intermediate (the graph reuses
    # its buffers), and the last position's logits
    activations = batch * prompt * 2 * h * size + batch * vocab * size
    return WorkCost(dtype, decode, float(batch), MemoryBytes(weights, activations, kv_cache=kv), prefill)


#: Kernels per Llama layer of our static decode step (``llama.static``): norm, fused QKV, RoPE on Q and K,
#: two cache writes, attention, output projection, residual, norm, fused gate/up, SiLU, product, down, residual.
LLAMA_KERNELS_PER_LAYER = 20
#: Kernels per layer of the presets' batch-1 decode step (the ``fused`` variant, ``llama.fused``): Q/K/V
#: with the norm, attention and its combine, O with the residual, gate/up with the norm and SwiGLU, down.
LLAMA_FUSED_KERNELS_PER_LAYER = 6


@dataclass(frozen=True)
class LlamaShape:
    """A Llama model's sizes: parameters read by a decode step (matmuls incl. the LM head), all of them."""

    hidden: int
    layers: int
    vocab: int
    kv_width: int
    matmul_params: float
    total_params: float


def llama_shape(model: str) -> LlamaShape:
    """The sizes of a :data:`LLAMA_MODELS` shape (8,030,261,248 parameters for ``llama-3.1-8b``)."""
    cfg = LLAMA_MODELS[model]
    d, inner, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    head_dim = d // cfg["num_attention_heads"]
    kv_width = cfg["num_key_value_heads"] * head_dim
    per_layer = d * (d + 2 * kv_width) + d * d + 3 * d * inner
    matmul = layers * per_layer + vocab * d
    total = matmul + layers * 2 * d + d + (0 if cfg["tie_word_embeddings"] else vocab * d)
    return LlamaShape(d, layers, vocab, kv_width, float(matmul), float(total))


def llama_cost(model: str, batch: int, prompt: int, output: int, dtype: str, verify_tokens: int = 0) -> WorkCost:
    """Prefill and one decode step of a Llama model (static KV cache of the whole context, read whole by
    each step under a mask, as ``llama.static`` does); ``verify_tokens`` widens the cache for a
    speculative round. Batch-1 decode reads every weight once per token: memory-bound."""
    shape = llama_shape(model)
    size = ELEMENT_BYTES[dtype]
    d, layers, vocab = shape.hidden, shape.layers, shape.vocab
    context = prompt + output + verify_tokens
    kv = batch * layers * 2 * context * shape.kv_width * size
    weights = shape.total_params * size
    read = shape.matmul_params * size  # the embedding is a gather of B rows
    kernels = layers * LLAMA_KERNELS_PER_LAYER + 6
    decode_kernels = layers * LLAMA_FUSED_KERNELS_PER_LAYER + 6 if batch == 1 else kernels
    decode = Phase(flops=2 * batch * shape.matmul_params + 4 * batch * layers * context * d,
                   bytes_moved=read + kv + batch * (layers * 12 * d + vocab) * size, kernels=decode_kernels)
    prefill = Phase(flops=2 * batch * prompt * (shape.matmul_params - vocab * d) + 2 * batch * vocab * d
                    + 4 * batch * layers * prompt * context * d,
                    bytes_moved=read + kv + batch * prompt * layers * 16 * d * size, kernels=kernels)
    inner = LLAMA_MODELS[model]["intermediate_size"]
    # the prefill's transient peak: residual stream, one layer's gate/up product, the last logits (fp32 argmax)
    activations = batch * prompt * (4 * d + 3 * inner) * size + batch * max(verify_tokens, 1) * vocab * 4
    return WorkCost(dtype, decode, float(batch), MemoryBytes(weights, activations, kv_cache=kv), prefill)


#: Device memory a Llama point needs beyond its modelled bytes: CUDA context, cuBLAS workspaces,
#: the graphs' pools and allocator slack (seed 004's 8B at batch 32 peaked at 30.9 GiB, H100).
LLAMA_ROOM_MARGIN_BYTES = 2 * 2**30
LLAMA_ROOM_FACTOR = 1.10


def llama_room_bytes(options: Mapping[str, Any], margin: bool = True) -> int:
    """Device memory a Llama llm point (a preset's values with the request's on top) needs: the
    target's and, for the speculative variant, the draft's weights, caches and activations, with a
    margin (``margin`` False: without the CUDA context's and workspaces' 2 GiB, for a CPU child). What a
    card without this much free memory refuses before building anything."""
    dtype = canonical_dtype(options["dtype"])
    batch, prompt, output = int(options["batch_size"]), int(options["prompt_tokens"]), int(options["output_tokens"])
    verify = int(options.get("speculative_tokens") or 0) + 1 if options.get("variant") == "speculative" else 0
    total = llama_cost(str(options["model"]), batch, prompt, output, dtype, verify).memory.total
    if verify and options.get("draft_model"):
        total += llama_cost(str(options["draft_model"]), batch, prompt, output, dtype, verify).memory.total
    return int(total * LLAMA_ROOM_FACTOR + (LLAMA_ROOM_MARGIN_BYTES if margin else 0))


def llama_no_room(options: Mapping[str, Any], preset: str | None, needed: str, have: str) -> str:
    """The one refusal of a Llama point without room (the child's and the simulator's alike): the
    preset, model and batch, what it needs and what the place it would run has; the docs quote it."""
    return (f"preset: {preset} ({options['model']}, batch {options['batch_size']}) needs about {needed}; "
            f"{have}: not run (use a smaller preset or --batch-size)")


def vit_cost(model: str, batch: int, image_size: int, dtype: str) -> WorkCost:
    """One batch of images through the ViT (fp32 input images, ``dtype`` compute)."""
    cfg = VIT_MODELS[model]
    h, layers, inner, patch = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"],
                               cfg["patch_size"])
    size = ELEMENT_BYTES[dtype]
    tokens = (image_size // patch) ** 2 + 1
    per_layer = 4 * h * h + 2 * h * inner
    params = layers * (per_layer + 9 * h + inner) + 3 * patch * patch * h + tokens * h + VIT_CLASSES * h
    per_image = 2 * tokens * layers * per_layer + 4 * tokens * tokens * h * layers + 2 * tokens * 3 * patch * patch * h
    images = batch * 3 * image_size * image_size * 4
    step = Phase(flops=batch * per_image,
                 bytes_moved=params * size + images + batch * tokens * layers * (8 * h + 2 * inner) * size,
                 kernels=layers * COMPILED_VIT_KERNELS_PER_LAYER + 4)
    activations = images + batch * tokens * (inner + h) * size
    return WorkCost(dtype, step, float(batch), MemoryBytes(params * size, activations))


def attention_cost(batch: int, heads: int, head_dim: int, seq_len: int, n_groups: int, causal: bool,
                   dtype: str) -> WorkCost:
    """One fused attention call: Q and O with ``heads`` heads, K and V with ``heads / n_groups``."""
    size = ELEMENT_BYTES[dtype]
    flops = 4 * batch * heads * seq_len * seq_len * head_dim * (0.5 if causal else 1.0)
    tensors = (2 * heads + 2 * heads / n_groups) * batch * seq_len * head_dim * size
    return WorkCost(dtype, Phase(flops, tensors, 1), 1.0, MemoryBytes(0.0, tensors))


def train_cost(model: str, batch: int, seq_len: int, dtype: str) -> WorkCost:
    """One eager training step (forward, backward, fused AdamW): fp32 master weights, their gradients
    and two Adam moments (16 bytes a parameter), activations in ``dtype`` (autocast)."""
    cfg, matmul, total = _gpt2_params(model)
    size = ELEMENT_BYTES[dtype]
    h, layers, heads, vocab = cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["vocab_size"]
    tokens = batch * seq_len
    flops = 6 * matmul * tokens + 6 * batch * layers * seq_len * seq_len * h
    # per layer, Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes at 2 bytes an element
    per_layer = tokens * (34 * h + 5 * heads * seq_len) * size / 2
    logits = tokens * vocab * (size + 4 + 4)  # logits, fp32 upcast for the loss, its gradient
    step = Phase(flops=flops, bytes_moved=total * 34 + 2 * (layers * per_layer + logits),
                 kernels=layers * TRAIN_KERNELS_PER_LAYER + 20)
    return WorkCost(dtype, step, float(tokens),
                    MemoryBytes(total * 4, layers * per_layer + logits, optimizer=total * 12))
