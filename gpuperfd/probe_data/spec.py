"""What to run: :class:`ProbeSpec`, and its validation.

A spec is resolved at construction: every field left ``None`` is filled from the
probe's preset, then the whole spec is validated and a bad value raises
``ValueError`` whose message starts with the field name (``"batch_size: ..."``),
so the CLI can print it as is and exit 2. What differs per probe kind (its fields,
variants, presets in ``presets.py``, its own checks) comes from its registry row
(``kinds.py``).

This module is pure Python: no torch, no transformers (the daemon imports it).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.probe_data.cpu_path import cpu_dtype, cpu_timeout_seconds
from gpuperfd.probe_data.kinds import ProbeKind, probe_kind, spec_kinds
from gpuperfd.probe_data.shape_checks import (GPT2_VARIANTS, LLAMA_VARIANTS,  # noqa: F401 - spec's names
                                              integer as _int, number as _float)
from gpuperfd.probe_data.shapes import (DTYPES, GPT2_MODELS, LLAMA_MODELS, VIT_MODELS,  # noqa: F401 - spec's names
                                        canonical_dtype)
from gpuperfd.probe_data.datasets import dataset_problem
from gpuperfd.probe_data.dict_fields import refuse_unknown_fields

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

#: The per-GPU probe kinds, their variants (the first is the default, the GPU-bound path), presets and
#: default presets: views of the registry's rows (kinds.py).
PROBES: tuple[str, ...] = tuple(kind.name for kind in spec_kinds())
VARIANTS: dict[str, tuple[str, ...]] = {kind.name: kind.variants for kind in spec_kinds()}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {kind.name: kind.presets for kind in spec_kinds()}
DEFAULT_PRESET: dict[str, str] = {kind.name: str(kind.default_preset) for kind in spec_kinds()}

#: Test-only faults the child can inject (see ProbeSpec.inject_fault).
FAULTS: tuple[str, ...] = ("exception", "hang", "oom", "crash", "cuda_error", "wrong_result_element",
                           "wrong_result_bit")
#: Faults that make a probe's answer wrong (one element, or one bit, of its checked output). Stricter
#: than the others: refused unless the test-only switch GPUPERFD_TEST_FAULTS=1 is set, here and again
#: in the child where the output is perturbed. No config or CLI field carries ``inject_fault``.
WRONG_RESULT_FAULTS: tuple[str, ...] = ("wrong_result_element", "wrong_result_bit")
TEST_FAULTS_ENV = "GPUPERFD_TEST_FAULTS"

#: Speculative decoding: the acceptance rates whose tokens/s are reported when none are named (random
#: weights accept nothing meaningful).
DEFAULT_ACCEPTANCE_RATES: tuple[float, ...] = (0.5, 0.7, 0.9)


_WORKLOAD_FIELDS = ("model", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads",
                    "head_dim", "n_groups", "causal")
_SPECULATIVE_FIELDS = ("draft_model", "speculative_tokens", "acceptance_rates")
#: The draft each target gets when the speculative variant names none (seed 004's pairing).
DEFAULT_DRAFT: dict[str, str] = {"llama-3.1-8b": "llama-3.2-1b", "llama-tiny": "llama-tiny-draft"}
DEFAULT_SPECULATIVE_TOKENS = 12
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
        kind = probe_kind(self.probe)
        used = kind.params
        for name in _WORKLOAD_FIELDS:
            if name not in used and getattr(self, name) is not None:
                raise ValueError(f"{name}: not used by probe {self.probe!r} (it uses {', '.join(used)})")
        for name in _SPECULATIVE_FIELDS:
            if getattr(self, name) is not None and kind.llama_module is None:
                raise ValueError(f"{name}: not used by probe {self.probe!r} (the llm probe's speculative variant)")
        object.__setattr__(self, "preset", preset)
        dtype_given = self.dtype is not None
        speculative_given = {name for name in _SPECULATIVE_FIELDS if getattr(self, name) is not None}
        for key, value in presets[preset].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        if kind.llama_module is not None:
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

    # --- validation -------------------------------------------------------------------

    def _validate_variant(self, kind: ProbeKind) -> None:
        """The variant: the kind's own check (the llm probe's per model family), else one of its variants."""
        if kind.check_variant is not None:
            kind.check_variant(self)
        elif self.variant not in kind.variants:
            raise ValueError(f"variant: {self.variant!r} is not a {self.probe} variant; "
                             f"use one of {', '.join(kind.variants)}")

    def _validate(self) -> None:
        probe = self.probe
        kind = probe_kind(probe)
        self._validate_variant(kind)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        _int("batch_size", self.batch_size, 1, 65536)
        if kind.check is not None:
            kind.check(self)
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
        if self.weights_path is not None and not kind.takes_files:
            raise ValueError(f"weights_path: the {probe} probe has no weights")
        if self.dataset_path is not None and not kind.takes_files:
            raise ValueError(f"dataset_path: the {probe} probe uses random tensors only")
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
        out: dict[str, Any] = {name: getattr(self, name) for name in probe_kind(self.probe).params}
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
        refuse_unknown_fields(cls, data)
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
