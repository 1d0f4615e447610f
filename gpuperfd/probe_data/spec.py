"""What to run: :class:`ProbeSpec`, the presets, and validation.

A spec is resolved at construction: every field left ``None`` is filled from the
probe's preset, then the whole spec is validated and a bad value raises
``ValueError`` whose message starts with the field name (``"batch_size: ..."``),
so the CLI can print it as is and exit 2.

Presets: ``tiny`` (per probe) runs in seconds on a CPU and is what the tests use;
the other presets are sized to keep an H100/H200 busy (large batches, bf16/fp16,
a warmup long enough for clocks and power to settle, short fixed-time windows so
one measured point stays under ten seconds).

This module is pure Python: no torch, no transformers (the daemon imports it).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.probe_data.cpu_path import cpu_dtype, cpu_timeout_seconds
from gpuperfd.probe_data.shapes import (DTYPES, GPT2_MODELS, LLAMA_MODELS, VIT_MODELS,  # noqa: F401 - spec's names
                                        canonical_dtype, is_llama)
from gpuperfd.probe_data.datasets import dataset_problem

__all__ = [
    "PROBES",
    "FAULTS",
    "WRONG_RESULT_FAULTS",
    "DTYPES",
    "VARIANTS",
    "PRESETS",
    "DEFAULT_PRESET",
    "GPT2_MODELS",
    "LLAMA_MODELS",
    "LLAMA_VARIANTS",
    "GPT2_VARIANTS",
    "VIT_MODELS",
    "ProbeSpec",
    "canonical_dtype",
    "default_timeout",
]

PROBES: tuple[str, ...] = ("llm", "vit", "attention", "train")

#: Test-only faults the child can inject (see ProbeSpec.inject_fault).
FAULTS: tuple[str, ...] = ("exception", "hang", "oom", "crash", "cuda_error", "wrong_result_element",
                           "wrong_result_bit")
#: Faults that make a probe's answer wrong (one element, or one bit, of its checked output). Stricter
#: than the others: refused unless the test-only switch GPUPERFD_TEST_FAULTS=1 is set, here and again
#: in the child where the output is perturbed. No config or CLI field carries ``inject_fault``.
WRONG_RESULT_FAULTS: tuple[str, ...] = ("wrong_result_element", "wrong_result_bit")
TEST_FAULTS_ENV = "GPUPERFD_TEST_FAULTS"

#: Variants per probe; the first is the default (the GPU-bound path).
VARIANTS: dict[str, tuple[str, ...]] = {
    # graph: own static-KV-cache GPT-2 forward, decode step captured in a CUDA graph.
    # eager: Hugging Face generate() in eager mode (the seeds' method), for comparison.
    # compiled, speculative: the Llama family only (LLAMA_VARIANTS); GPT-2 runs GPT2_VARIANTS.
    "llm": ("graph", "eager", "compiled", "fused", "speculative"),
    # compiled: our fused forward (vit_fused) + torch.compile + one CUDA graph per batch;
    # fused: the fused forward in a CUDA graph, no compiler; eager: the Hugging Face module.
    "vit": ("compiled", "fused", "eager"),
    "attention": ("sdpa",),
    "train": ("eager",),
}

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
#: Speculative decoding: proposed tokens per round (k) between these bounds, and the acceptance rates
#: whose tokens/s are reported when none are named (random weights accept nothing meaningful).
SPECULATIVE_TOKENS_RANGE = (1, 64)
DEFAULT_ACCEPTANCE_RATES: tuple[float, ...] = (0.5, 0.7, 0.9)


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


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "llm": {
        "tiny": {"model": "tiny", "variant": "graph", "batch_size": 2, "prompt_tokens": 16, "output_tokens": 8,
                 "n_groups": 1, "dtype": "float32", **_TINY_TIMING},
        "tiny-x2": {"model": "tiny-x2", "variant": "graph", "batch_size": 2, "prompt_tokens": 16, "output_tokens": 8,
                    "n_groups": 1, "dtype": "float32", **_TINY_TIMING},
        "gpt2": _llm("gpt2", 128),
        "gpt2-medium": _llm("gpt2-medium", 128),
        "gpt2-large": _llm("gpt2-large", 64),
        "gpt2-xl": _llm("gpt2-xl", 32),
        # The Llama family (seed 004): batch 1, as the seed runs it (--batch-size 32 for the served case).
        "llama-tiny": _LLAMA_TINY,
        "llama-tiny-spec": {**_LLAMA_TINY, "variant": "speculative", "draft_model": "llama-tiny-draft",
                            "speculative_tokens": 4},
        "llama-3.2-1b": _llama("llama-3.2-1b", 1),
        "llama-3.1-8b": _llama("llama-3.1-8b", 1),
        # seed 004's spec_config: amd/PARD-Llama-3.2-1B's shape drafting 12 tokens for the 8B
        "llama-3.1-8b-spec": _llama("llama-3.1-8b", 1, "speculative", draft_model="llama-3.2-1b",
                                    speculative_tokens=12),
    },
    "vit": {
        "tiny": {"model": "tiny", "variant": "eager", "batch_size": 4, "image_size": 32, "dtype": "float32",
                 **_TINY_TIMING},
        "vit-s16": _vit("vit-s16", 128),
        "vit-b16": _vit("vit-b16", 128),
        "vit-l16": _vit("vit-l16", 64),
        "vit-h14": _vit("vit-h14", 32),
    },
    "attention": {
        "tiny": {"variant": "sdpa", "batch_size": 2, "heads": 4, "head_dim": 16, "seq_len": 64, "n_groups": 1,
                 "causal": False, "dtype": "float32", **_TINY_TIMING},
        # One long-context layer's attention: 16 x 16 heads x 4096 tokens x 128, ~2.2 TFLOP a call.
        "default": {"variant": "sdpa", "batch_size": 16, "heads": 16, "head_dim": 128, "seq_len": 4096,
                    "n_groups": 1, "causal": False, "dtype": "bfloat16", **_GPU_TIMING},
        # Llama-style grouped-query attention: 32 query heads, 8 key/value heads.
        "gqa": {"variant": "sdpa", "batch_size": 16, "heads": 32, "head_dim": 128, "seq_len": 4096,
                "n_groups": 4, "causal": True, "dtype": "bfloat16", **_GPU_TIMING},
    },
    "train": {
        "tiny": {"model": "tiny", "variant": "eager", "batch_size": 2, "seq_len": 32, "dtype": "float32",
                 **_TINY_TIMING},
        "gpt2": _train("gpt2", 16),
        "gpt2-medium": _train("gpt2-medium", 8),
        "gpt2-large": _train("gpt2-large", 4),
        "gpt2-xl": _train("gpt2-xl", 2),
    },
}

DEFAULT_PRESET: dict[str, str] = {"llm": "gpt2", "vit": "vit-b16", "attention": "default", "train": "gpt2"}

#: Which workload parameters each probe uses (the rest must stay None).
_PROBE_PARAMS: dict[str, tuple[str, ...]] = {
    "llm": ("model", "batch_size", "prompt_tokens", "output_tokens", "n_groups", "dtype"),
    "vit": ("model", "batch_size", "image_size", "dtype"),
    "attention": ("batch_size", "heads", "head_dim", "seq_len", "n_groups", "causal", "dtype"),
    "train": ("model", "batch_size", "seq_len", "dtype"),
}
_WORKLOAD_FIELDS = ("model", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads",
                    "head_dim", "n_groups", "causal")
_SPECULATIVE_FIELDS = ("draft_model", "speculative_tokens", "acceptance_rates")
#: The draft each target gets when the speculative variant names none (seed 004's pairing).
DEFAULT_DRAFT: dict[str, str] = {"llama-3.1-8b": "llama-3.2-1b", "llama-tiny": "llama-tiny-draft"}
DEFAULT_SPECULATIVE_TOKENS = 12
#: The static KV cache's longest context here (a probe, not a server: 131072 positions would be a
#: 16 GiB cache per sequence for the 8B).
LLAMA_MAX_CONTEXT = 8192
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


#: Short names of the parameters that tell two points of a probe apart, in the order shown.
PARAM_SHORT = {"batch_size": "b", "prompt_tokens": "in", "output_tokens": "out", "seq_len": "s", "image_size": "px",
               "heads": "h", "head_dim": "d", "n_groups": "g", "speculative_tokens": "k"}


def params_text(params: dict[str, Any], model: bool = True) -> str:
    """``gpt2 b=8 in=128 out=128 causal fp16``: a point's parameters in a table cell, a progress
    line or a report's series name (the model first unless ``model`` is False)."""
    parts = [str(params["model"])] if model and params.get("model") else []
    parts += [f"{short}={params[key]}" for key, short in PARAM_SHORT.items() if key in params]
    if params.get("causal"):
        parts.append("causal")
    if params.get("dtype"):
        parts.append(str(params["dtype"]).replace("bfloat16", "bf16").replace("float16", "fp16")
                     .replace("float32", "fp32"))
    return " ".join(parts)



def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def _float(name: str, value: Any, low: float, high: float | None = None, low_inclusive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    value = float(value)
    if value != value or (value < low if low_inclusive else value <= low) or (high is not None and value > high):
        op = ">=" if low_inclusive else ">"
        bound = f"{op} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


@dataclass(frozen=True)
class ProbeSpec:
    """One probe point: which workload, its shape, and how to measure it.

    Leave a field ``None`` to take it from the preset (``preset=None`` means the
    probe's default preset, see :data:`DEFAULT_PRESET`). Sweeps (several batch
    sizes, several ``n_groups``) are several specs: each runs in its own child.
    """

    probe: str
    preset: str | None = None
    variant: str | None = None
    model: str | None = None
    batch_size: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    seq_len: int | None = None
    image_size: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    #: Grouped-query attention: how many query heads share one key/value head (1 = MHA).
    n_groups: int | None = None
    causal: bool | None = None
    dtype: str | None = None
    #: llm, speculative variant only: the draft model (a Llama model sharing the target's vocabulary),
    #: the tokens it proposes per round (k), and the acceptance rates to report tokens/s at.
    draft_model: str | None = None
    speculative_tokens: int | None = None
    acceptance_rates: tuple[float, ...] | None = None
    #: Warmup iterations (requests, batches, calls, steps) before any window; at least this many,
    warmup: int | None = None
    #: ...and at least this long, so clocks and power reach steady state.
    warmup_seconds: float | None = None
    #: Measured windows (each gives one sample for mean/median/stdev/CV).
    repeats: int | None = None
    #: Fixed iterations per window; None means a fixed-time window of measure_seconds.
    iterations: int | None = None
    measure_seconds: float | None = None
    #: Length of the separate profiled pass that measures the GPU-busy fraction (0 disables it).
    busy_profile_seconds: float | None = None
    device: str | None = None
    #: Local Hugging Face model directory (config + weights); never downloaded.
    weights_path: str | None = None
    #: Local data: token ids (.npy/.pt/.bin uint16) for llm/train, images (.npy/.pt or a folder) for vit.
    dataset_path: str | None = None
    seed: int = 0
    #: A result whose GPU-busy fraction is below this is flagged low_gpu_busy.
    gpu_busy_threshold: float = 0.9
    #: Telemetry sampling period inside the measured window (seconds).
    sample_interval: float = 0.05
    #: Cap on the child's memory: RLIMIT_AS growth on CPU, the caching allocator's share on CUDA.
    memory_limit_bytes: int | None = None
    #: FOR TESTS ONLY: make the child fail on purpose at the start of the first measured window:
    #: "exception" raises, "hang" sleeps forever, "oom" allocates until the allocator fails
    #: (under memory_limit_bytes, default 512 MiB), "crash" sends itself SIGSEGV, "cuda_error"
    #: triggers a device-side assert on CUDA (raises a CUDA-error RuntimeError on CPU).
    inject_fault: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.probe not in PROBES:
            raise ValueError(f"probe: unknown probe {self.probe!r}; use one of {', '.join(PROBES)}")
        preset = self.preset if self.preset is not None else DEFAULT_PRESET[self.probe]
        presets = PRESETS[self.probe]
        if preset not in presets:
            raise ValueError(
                f"preset: unknown preset {preset!r} for probe {self.probe!r}; use one of {', '.join(presets)}"
            )
        # Fields a probe does not use must not be set: "--prompt-tokens 64" with vit is a mistake.
        used = _PROBE_PARAMS[self.probe]
        for name in _WORKLOAD_FIELDS:
            if name not in used and getattr(self, name) is not None:
                raise ValueError(f"{name}: not used by probe {self.probe!r} (it uses {', '.join(used)})")
        for name in _SPECULATIVE_FIELDS:
            if getattr(self, name) is not None and self.probe != "llm":
                raise ValueError(f"{name}: not used by probe {self.probe!r} (the llm probe's speculative variant)")
        object.__setattr__(self, "preset", preset)
        dtype_given = self.dtype is not None
        speculative_given = {name for name in _SPECULATIVE_FIELDS if getattr(self, name) is not None}
        for key, value in presets[preset].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        if self.probe == "llm":
            self._resolve_speculative(speculative_given)
        # The presets' half precision is for GPUs; a CPU point without a dtype runs float32 (cpu_path.py).
        object.__setattr__(self, "dtype", cpu_dtype(self.dtype, dtype_given, self.is_cuda))
        if self.iterations is not None and self.measure_seconds is None:
            object.__setattr__(self, "measure_seconds", 0.0)
        object.__setattr__(self, "extra", dict(self.extra))
        self._validate()

    def _resolve_speculative(self, given: set[str]) -> None:
        """The speculative fields: the preset's dropped for another variant (``--preset llama-3.1-8b-spec
        --variant graph`` measures the target alone), defaults filled for the speculative variant, the
        acceptance rates as a tuple of floats (a JSON record gives a list)."""
        if self.variant != "speculative":
            for name in _SPECULATIVE_FIELDS:
                if name in given:
                    raise ValueError(f"{name}: used by the speculative variant only (use --variant speculative)")
                object.__setattr__(self, name, None)
            return
        if self.draft_model is None and self.model in DEFAULT_DRAFT:
            object.__setattr__(self, "draft_model", DEFAULT_DRAFT[self.model])
        if self.speculative_tokens is None:
            object.__setattr__(self, "speculative_tokens", DEFAULT_SPECULATIVE_TOKENS)
        rates = self.acceptance_rates if self.acceptance_rates is not None else DEFAULT_ACCEPTANCE_RATES
        if isinstance(rates, (int, float)) and not isinstance(rates, bool):
            rates = (rates,)
        if isinstance(rates, str) or not isinstance(rates, (list, tuple)) or not rates:
            raise ValueError(f"acceptance_rates: must be a list of rates in [0, 1], got {rates!r}")
        for rate in rates:
            _float("acceptance_rates", rate, 0.0, 1.0)
        object.__setattr__(self, "acceptance_rates", tuple(float(rate) for rate in rates))

    def _validate_llama(self) -> None:
        """A Llama-family llm point: its variant, positions, and the speculative draft."""
        cfg = LLAMA_MODELS[self.model]
        if self.n_groups != 1:
            raise ValueError(f"n_groups: a Llama model has its own key/value heads "
                             f"({cfg['num_attention_heads']} query, {cfg['num_key_value_heads']} key/value); use 1")
        extra = 0
        if self.variant == "speculative":
            if self.draft_model not in LLAMA_MODELS:
                raise ValueError(f"draft_model: unknown Llama model {self.draft_model!r}; use one of "
                                 f"{', '.join(LLAMA_MODELS)}")
            if LLAMA_MODELS[self.draft_model]["vocab_size"] != cfg["vocab_size"]:
                raise ValueError(f"draft_model: {self.draft_model} has a vocabulary of "
                                 f"{LLAMA_MODELS[self.draft_model]['vocab_size']} tokens, {self.model} of "
                                 f"{cfg['vocab_size']}: a draft must share the target's vocabulary")
            low, high = SPECULATIVE_TOKENS_RANGE
            _int("speculative_tokens", self.speculative_tokens, low, high)
            if self.output_tokens < 2:
                raise ValueError("output_tokens: speculative decoding needs at least 2 output tokens")
            extra = self.speculative_tokens + 1
        limit = min(cfg["max_position_embeddings"], LLAMA_MAX_CONTEXT)
        if self.prompt_tokens + self.output_tokens + extra > limit:
            raise ValueError(f"output_tokens: prompt_tokens + output_tokens{' + speculative_tokens + 1' if extra else ''}"
                             f" = {self.prompt_tokens + self.output_tokens + extra} exceeds {limit} positions")

    # --- validation -------------------------------------------------------------------

    def _validate_variant(self) -> None:
        """The variant: the llm probe's per model family (GPT2_VARIANTS, LLAMA_VARIANTS)."""
        probe = self.probe
        if probe == "llm" and is_llama(self.model):
            if self.variant not in LLAMA_VARIANTS:
                raise ValueError(f"variant: {self.variant!r} is not a variant of the llm probe on a Llama model; "
                                 f"use one of {', '.join(LLAMA_VARIANTS)}")
        elif probe == "llm" and self.variant not in GPT2_VARIANTS:
            raise ValueError(f"variant: {self.variant!r} is not a variant of the llm probe on a GPT-2 model; "
                             f"use one of {', '.join(GPT2_VARIANTS)} ({', '.join(LLAMA_VARIANTS)} on a Llama model)")
        elif self.variant not in VARIANTS[probe]:
            raise ValueError(f"variant: {self.variant!r} is not a {probe} variant; use one of {', '.join(VARIANTS[probe])}")

    def _validate_llm(self) -> None:
        """The llm probe's model, lengths and K/V groups (a Llama model: :meth:`_validate_llama`)."""
        if self.model not in GPT2_MODELS and not is_llama(self.model):
            raise ValueError(f"model: unknown llm model {self.model!r}; use one of "
                             f"{', '.join([*GPT2_MODELS, *LLAMA_MODELS])}")
        _int("prompt_tokens", self.prompt_tokens, 1)
        _int("output_tokens", self.output_tokens, 1)
        _int("n_groups", self.n_groups, 1)
        if is_llama(self.model):
            self._validate_llama()
            return
        heads = GPT2_MODELS[self.model]["n_head"]
        if heads % self.n_groups:
            raise ValueError(f"n_groups: {self.n_groups} does not divide the model's {heads} heads; "
                             f"use a divisor of {heads}")
        if self.n_groups > 1 and self.variant != "graph":
            raise ValueError("n_groups: grouped key/value heads run in the graph variant only; "
                             "use --variant graph (or n_groups 1)")
        limit = GPT2_MODELS[self.model]["n_positions"]
        if self.weights_path is None and self.prompt_tokens + self.output_tokens > limit:
            raise ValueError(
                f"output_tokens: prompt_tokens + output_tokens = {self.prompt_tokens + self.output_tokens} "
                f"exceeds the model's {limit} positions"
            )

    def _validate(self) -> None:
        probe = self.probe
        self._validate_variant()
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        _int("batch_size", self.batch_size, 1, 65536)
        if probe == "llm":
            self._validate_llm()
        if probe == "train" and self.model not in GPT2_MODELS:
            raise ValueError(f"model: unknown GPT-2 model {self.model!r}; use one of {', '.join(GPT2_MODELS)}")
        if probe == "vit" and self.model not in VIT_MODELS:
            raise ValueError(f"model: unknown ViT model {self.model!r}; use one of {', '.join(VIT_MODELS)}")
        if probe == "train":
            _int("seq_len", self.seq_len, 2)
            limit = GPT2_MODELS[self.model]["n_positions"]
            if self.weights_path is None and self.seq_len > limit:
                raise ValueError(f"seq_len: {self.seq_len} exceeds the model's {limit} positions")
        if probe == "vit":
            _int("image_size", self.image_size, 1)
            patch = VIT_MODELS[self.model]["patch_size"]
            if self.image_size % patch:
                raise ValueError(f"image_size: {self.image_size} is not a multiple of the patch size {patch}")
        if probe == "attention":
            _int("heads", self.heads, 1)
            _int("head_dim", self.head_dim, 1, 512)
            _int("seq_len", self.seq_len, 1)
            _int("n_groups", self.n_groups, 1)
            if self.heads % self.n_groups:
                raise ValueError(f"n_groups: {self.n_groups} does not divide heads={self.heads}")
            if not isinstance(self.causal, bool):
                raise ValueError(f"causal: must be true or false, got {self.causal!r}")
        _int("warmup", self.warmup, 0, 100000)
        _float("warmup_seconds", self.warmup_seconds, 0.0, 600.0)
        _int("repeats", self.repeats, 1, 1000)
        if self.iterations is not None:
            _int("iterations", self.iterations, 1)
        else:
            _float("measure_seconds", self.measure_seconds, 0.0, 600.0, low_inclusive=False)
        _float("busy_profile_seconds", self.busy_profile_seconds, 0.0, 60.0)
        if not isinstance(self.device, str) or not _DEVICE_RE.match(self.device):
            raise ValueError(f"device: must be cpu, cuda or cuda:N, got {self.device!r}")
        _int("seed", self.seed, 0, 2**63 - 1)
        _float("gpu_busy_threshold", self.gpu_busy_threshold, 0.0, 1.0)
        _float("sample_interval", self.sample_interval, 0.005, 10.0)
        if self.memory_limit_bytes is not None:
            _int("memory_limit_bytes", self.memory_limit_bytes, 1 << 20)
        if self.inject_fault is not None and self.inject_fault not in FAULTS:
            raise ValueError(f"inject_fault: unknown fault {self.inject_fault!r}; use one of {', '.join(FAULTS)}")
        if self.inject_fault in WRONG_RESULT_FAULTS and os.environ.get(TEST_FAULTS_ENV) != "1":
            raise ValueError(f"inject_fault: {self.inject_fault} is for tests only (needs {TEST_FAULTS_ENV}=1)")
        for name in ("weights_path", "dataset_path"):
            path = getattr(self, name)
            if path is not None and not os.path.exists(path):
                raise ValueError(f"{name}: {path} does not exist (probes never download; give a local path)")
        if self.weights_path is not None and probe == "attention":
            raise ValueError("weights_path: the attention probe has no weights")
        if self.dataset_path is not None and probe == "attention":
            raise ValueError("dataset_path: the attention probe uses random tensors only")
        if self.dataset_path is not None and (problem := dataset_problem(self.dataset_path, probe)) is not None:
            raise ValueError(f"dataset_path: {problem}")

    # --- views ------------------------------------------------------------------------

    @property
    def is_cuda(self) -> bool:
        return str(self.device).startswith("cuda")

    @property
    def cuda_index(self) -> int | None:
        """The CUDA ordinal (``cuda`` -> 0), or None on CPU."""
        if not self.is_cuda:
            return None
        return int(self.device.split(":", 1)[1]) if ":" in self.device else 0

    def params(self) -> dict[str, Any]:
        """The workload parameters that identify this point (for results and tables)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in _PROBE_PARAMS[self.probe]}
        out["repeats"] = self.repeats
        out["warmup"] = self.warmup
        if self.iterations is not None:
            out["iterations"] = self.iterations
        else:
            out["measure_seconds"] = self.measure_seconds
        for name in _SPECULATIVE_FIELDS:  # only the speculative variant has them (GPT-2 rows keep their params)
            if getattr(self, name) is not None:
                out[name] = list(self.acceptance_rates) if name == "acceptance_rates" else getattr(self, name)
        if self.weights_path:
            out["weights_path"] = self.weights_path
        if self.dataset_path:
            out["dataset_path"] = self.dataset_path
        out["seed"] = self.seed
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown ProbeSpec field")
        return cls(**data)

    def replace(self, **changes: Any) -> ProbeSpec:
        """A copy with ``changes`` applied and validated again."""
        return dataclasses.replace(self, **changes)


#: The seeds' configuration keys (and other benchmarks' usual spellings) -> what this project calls them.
#: One table for every error that meets an unknown key: a run-matrix file, ``--option``, a schedule's
#: ``options``. A value of None means "no equivalent here", with the reason in :data:`NO_EQUIVALENT`.
SEED_KEYS: dict[str, str | None] = {
    # seed 004 (benchmark_llm_offline.py config)
    "frameworks": "variant", "framework": "variant", "model_name": "model", "model_args": None,
    "num_speculated_tokens": "speculative_tokens", "spec_config": None,
    "input_tokens": "prompt_tokens", "input_len": "prompt_tokens", "prompt_len": "prompt_tokens",
    "output_len": "output_tokens", "max_new_tokens": "output_tokens", "new_tokens": "output_tokens",
    "warmup_runs": "warmup", "num_warmup": "warmup", "num_runs": "repeats", "runs": "repeats",
    "iterations_per_run": "iterations", "generation_args": None, "output_dir": "output", "num_beams": None,
    "do_sample": None, "manual_seed": "seed", "random_seed": "seed", "use_real_data": "dataset",
    "token_metrics": None, "system_metrics": None, "visualize": None, "verbose": None,
    # seeds 000-003
    "num_iterations": "iterations", "num_tests": "repeats", "num_repeats": "repeats", "batchsize": "batch_size",
    "batch": "batch_size", "bs": "batch_size", "seq_length": "seq_len", "sequence_length": "seq_len",
    "n_group": "n_groups", "groups": "n_groups", "num_groups": "n_groups", "n_head": "heads", "num_heads": "heads",
    "max_watt": "caps", "max_power": "caps", "power_limit": "caps", "img_size": "image_size",
    "resolution": "image_size", "precision": "dtype", "datasets": "dataset",
}
NO_EQUIVALENT: dict[str, str] = {
    "model_args": "give model (a preset name) and dtype at the top level",
    "generation_args": "give prompt_tokens, output_tokens and batch_size at the top level",
    "num_beams": "the llm probe decodes greedily, one beam",
    "spec_config": "give variant speculative, draft_model and speculative_tokens at the top level",
    "do_sample": "the llm probe decodes greedily (no sampling), so runs compare",
    "token_metrics": "TTFT and time per output token are always measured",
    "system_metrics": "GPU telemetry is always recorded on a GPU",
    "visualize": "run gpuperfd report on the output file",
    "verbose": "the table is always printed; --json for machine output",
}


def unknown_key_message(key: str, known: list[str] | set[str] | tuple[str, ...], where: str = "") -> str:
    """The error for an unknown configuration key: the seed's translation if it has one, else the
    nearest valid spelling, and always the valid keys.

    ``"frameworks: 'frameworks' is 'variant' here"``; ``"batchsize: unknown key; did you mean batch_size?"``.
    """
    import difflib

    name = str(key).replace("-", "_")
    known_sorted = sorted(known)
    prefix = f"{where}: " if where else ""
    valid = f"valid keys: {', '.join(known_sorted)}"
    if name in SEED_KEYS:
        ours = SEED_KEYS[name]
        if ours is None:
            return f"{prefix}{key!r} has no equivalent here: {NO_EQUIVALENT.get(name, 'not supported')} ({valid})"
        return f"{prefix}{key!r} is {ours!r} here ({valid})"
    close = difflib.get_close_matches(name, known_sorted, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{prefix}unknown key {key!r}{hint} ({valid})"


#: ProbeSpec fields a schedule's ``options`` or ``sweep --option`` may set (the rest are the runner's).
OPTION_KEYS: tuple[str, ...] = (
    "variant", "model", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads",
    "head_dim", "n_groups", "causal", "dtype", "warmup", "warmup_seconds", "repeats", "iterations",
    "measure_seconds", "busy_profile_seconds", "weights_path", "dataset_path", "seed", "gpu_busy_threshold",
    "sample_interval", "memory_limit_bytes", "draft_model", "speculative_tokens", "acceptance_rates",
)


def schedule_fault(options: dict[str, Any]) -> str | None:
    """The ``inject_fault`` a schedule's options may carry: only with the test-only switch
    (``GPUPERFD_TEST_FAULTS=1``, never set by a shipped config, unit or image) and never a
    wrong-result fault, which only code can ask for. ValueError names what was refused."""
    fault = options.get("inject_fault")
    if fault is None:
        return None
    if os.environ.get(TEST_FAULTS_ENV) != "1":
        raise ValueError(f"options: inject_fault is for tests only (needs {TEST_FAULTS_ENV}=1)")
    if fault in WRONG_RESULT_FAULTS or fault not in FAULTS:
        raise ValueError(f"options: inject_fault {fault!r} cannot come from a configuration")
    return str(fault)


def check_options(probe: str, options: dict[str, Any], preset: str | None = None) -> None:
    """ValueError, naming the key and the valid ones, for probe options ProbeSpec would not take.

    What ``sweep --option`` and a schedule's ``options`` should call before anything runs, instead
    of Python's ``unexpected keyword argument`` TypeError.
    """
    for key in options:
        if key not in OPTION_KEYS and not (key == "inject_fault" and schedule_fault(options)):
            raise ValueError(unknown_key_message(key, OPTION_KEYS, where=f"option {key}"))
    ProbeSpec(probe=probe, preset=preset, device="cpu", **options)


def default_timeout(spec: ProbeSpec) -> float:
    """A hard timeout generous enough for setup (model build, torch.compile) plus the windows; on a CPU
    also every iteration's work (:func:`gpuperfd.probe_data.cpu_path.cpu_timeout_seconds`)."""
    windows = spec.repeats * (spec.measure_seconds or 0.0) + spec.warmup_seconds + spec.busy_profile_seconds
    compile_seconds = 480.0 if spec.variant == "compiled" else 0.0
    if spec.iterations is not None:
        windows += 60.0  # fixed iteration counts have no time bound of their own
    if not spec.is_cuda:  # grows with the point's work: a CPU runs gpt2-xl's iterations in minutes, not ms
        return cpu_timeout_seconds(spec, windows) + compile_seconds
    return 120.0 + compile_seconds + 3.0 * windows
