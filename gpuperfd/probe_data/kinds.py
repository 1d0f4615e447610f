"""The probe kinds, one row each: everything the package knows about a kind is written here once.

Why: a kind used to be spread over fifteen modules (metrics, config, report, dashboards, simulator,
fleet, spec, costs, results), each with its own table or if-chain over kind names. Now they read the
row. Adding a probe is one child workload module (named here by its dotted path, imported lazily in the
child) plus one row. ``tests/probe_data/test_kinds.py`` holds the count of modules a kind's name may
stand in.

Pure Python: the daemon imports this, so it never imports torch or the child's workload modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.probe_data import kind_work, shape_checks
from gpuperfd.probe_data.presets import ATTENTION_PRESETS, LLM_PRESETS, TRAIN_PRESETS, VIT_PRESETS
from gpuperfd.probe_data.shapes import canonical_dtype, is_llama
from gpuperfd.probe_data.workload_cost import WorkCost

#: A check of a resolved spec: ValueError whose message starts with the field name.
SpecCheck = Callable[[Any], None]


@dataclass(frozen=True)
class ProbeKind:
    """One probe kind. A per-GPU kind runs as a :class:`~gpuperfd.probe_data.spec.ProbeSpec` in a probe
    child; a node-wide kind (``node_wide``) runs its own workers over a set of GPUs and has no spec."""

    name: str
    #: The child module that runs it (``build(spec, ctx)`` for a per-GPU kind), imported by name.
    workload_module: str
    #: What one unit of work is (the ``unit`` label of the rate and energy series).
    work_unit: str | None = None
    #: The workload fields it uses (the others must stay None) and its variants (the first the default).
    params: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    #: What ``--variant both`` names (empty: every variant).
    both_variants: tuple[str, ...] = ()
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_preset: str | None = None
    #: The latency tables and charts show, the headline rate, and older latency names still read.
    main_latency: str | None = None
    primary_metric: str | None = None
    legacy_latencies: Mapping[str, str] = field(default_factory=dict)
    #: The latencies the report's parameter and bar charts show (empty: the main latency).
    chart_latencies: tuple[str, ...] = ()
    #: Result latency -> the histogram (by latency name, ``probing/metrics.py``) it feeds.
    latency_series: Mapping[str, str] = field(default_factory=dict)
    #: The dashboard's latency panels: (title, histogram base name).
    panels: tuple[tuple[str, str], ...] = ()
    #: What a child told to wait imports beforehand (model code that touches no GPU).
    preload_modules: tuple[str, ...] = ()
    #: The Llama family's child module, where the kind runs Llama models too (and speculative decoding).
    llama_module: str | None = None
    #: The simulator's measured child costs at the default preset, seconds: (imports, build, overhead).
    child_costs: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: What the simulated process holds at batch 1 beyond its modelled bytes (torch's allocator segments,
    #: cuBLAS/cuDNN workspaces, a compiled graph's pools), bytes: it does not grow with the batch. Measured
    #: on an H100 (tests/data/h100_shape_points.json): vit-b16 at batch 1 peaks 124 MiB above its weights,
    #: gpt2 and gpt2-xl 77-131 MiB above weights and KV cache. The attention probe holds only its tensors;
    #: the train probe's modelled bytes exceed its real peak (the simulator scales them down instead).
    framework_floor_bytes: int = 0
    #: Whether healthy peers share its answer check's fingerprint (the simulator's too).
    peer_comparable: bool = True
    training: bool = False
    #: Its dataset is images (else token ids); whether it takes weights and a dataset at all.
    images: bool = False
    takes_files: bool = True
    node_wide: bool = False
    #: The kind ``gpuperfd check`` runs, at its default preset (one kind has it).
    runs_in_check: bool = False
    #: Its own checks of a resolved spec: the variant (None: one of ``variants``) and the shape fields.
    check_variant: SpecCheck | None = None
    check: SpecCheck | None = None
    #: Its work: one step's cost from options and dtype; a spec's parameters and FLOPs an iteration.
    cost: Callable[[Mapping[str, Any], str], WorkCost] | None = None
    parameters: Callable[[Any], float] = kind_work.no_work
    flops: Callable[[Any], float] = kind_work.no_work


_GPT2_MODEL_CODE = "transformers.models.gpt2.modeling_gpt2"
#: The node-wide interconnect probe: the check summary's key, its rows in a GPU's run history.
INTERCONNECT = "interconnect"

KINDS: dict[str, ProbeKind] = {kind.name: kind for kind in (
    ProbeKind(
        "llm", "gpuperfd.probe_child.workloads.llm", "token",
        params=("model", "batch_size", "prompt_tokens", "output_tokens", "n_groups", "dtype"),
        # graph: own static-KV-cache GPT-2 forward, decode step captured in a CUDA graph.
        # eager: Hugging Face generate() in eager mode (the seeds' method), for comparison.
        # compiled, fused, speculative: the Llama family only (shape_checks.LLAMA_VARIANTS).
        variants=("graph", "eager", "compiled", "fused", "speculative"), both_variants=("graph", "eager"),
        presets=LLM_PRESETS, default_preset="gpt2",
        main_latency="tpot_seconds", primary_metric="output_tokens_per_second",
        chart_latencies=("ttft_seconds", "tpot_seconds"),
        latency_series={"ttft_seconds": "ttft_seconds", "tpot_seconds": "tpot_seconds",
                        "request_seconds": "request_seconds"},
        panels=(("LLM time to first token", "gpuperf_probe_ttft_seconds"),
                ("LLM time per output token", "gpuperf_probe_tpot_seconds"),
                ("LLM request latency", "gpuperf_probe_request_latency_seconds")),
        preload_modules=(_GPT2_MODEL_CODE, "transformers.models.llama.modeling_llama"),
        llama_module="gpuperfd.probe_child.workloads.llama.probe",
        child_costs=(13.4, 0.5, 1.5), framework_floor_bytes=90 * 2**20, runs_in_check=True,
        check_variant=shape_checks.check_decoder_variant, check=shape_checks.check_decoder,
        cost=kind_work.decoder_cost, parameters=kind_work.decoder_parameters, flops=kind_work.decoder_flops),
    ProbeKind(
        "vit", "gpuperfd.probe_child.workloads.vit", "image",
        params=("model", "batch_size", "image_size", "dtype"),
        # compiled: our fused forward (vit_fused) + torch.compile + one CUDA graph per batch;
        # fused: the fused forward in a CUDA graph, no compiler; eager: the Hugging Face module.
        variants=("compiled", "fused", "eager"),
        presets=VIT_PRESETS, default_preset="vit-b16",
        main_latency="batch_seconds", primary_metric="images_per_second",
        latency_series={"batch_seconds": "batch_seconds"},
        panels=(("ViT batch latency", "gpuperf_probe_batch_latency_seconds"),),
        preload_modules=("transformers.models.vit.modeling_vit",),
        child_costs=(19.1, 2.0, 0.64), framework_floor_bytes=120 * 2**20, images=True,
        check=shape_checks.check_image,
        cost=kind_work.image_cost, parameters=kind_work.image_parameters, flops=kind_work.image_flops),
    ProbeKind(
        "attention", "gpuperfd.probe_child.workloads.attention", "iteration",
        params=("batch_size", "heads", "head_dim", "seq_len", "n_groups", "causal", "dtype"),
        variants=("sdpa",), presets=ATTENTION_PRESETS, default_preset="default",
        main_latency="iteration_seconds", primary_metric="flops_per_second",
        # it wrote batch_seconds until issue 34
        legacy_latencies={"batch_seconds": "iteration_seconds"},
        latency_series={"batch_seconds": "iteration_seconds", "iteration_seconds": "iteration_seconds"},
        panels=(("Attention iteration time", "gpuperf_probe_iteration_seconds"),),
        child_costs=(3.7, 0.15, 2.1), takes_files=False,
        check=shape_checks.check_sdpa, cost=kind_work.sdpa_cost, flops=kind_work.sdpa_flops),
    ProbeKind(
        "train", "gpuperfd.probe_child.workloads.train", "token",
        params=("model", "batch_size", "seq_len", "dtype"),
        variants=("eager",), presets=TRAIN_PRESETS, default_preset="gpt2",
        main_latency="step_seconds", primary_metric="tokens_per_second",
        latency_series={"step_seconds": "step_seconds"},
        panels=(("Training step time", "gpuperf_probe_step_seconds"),),
        preload_modules=(_GPT2_MODEL_CODE,),
        child_costs=(12.3, 0.2, 1.5), peer_comparable=False, training=True,
        check=shape_checks.check_training,
        cost=kind_work.training_cost, parameters=kind_work.gpt2_parameters, flops=kind_work.training_flops),
    # The node's copies and all-reduces across its GPUs (issue 44); its verdicts: health/interconnect.py.
    ProbeKind(INTERCONNECT, "gpuperfd.probe_child.interconnect.worker", node_wide=True),
)}


def probe_kind(name: str) -> ProbeKind:
    """The row of ``name``; KeyError for a name no row has."""
    return KINDS[name]


def spec_kinds() -> tuple[ProbeKind, ...]:
    """The per-GPU kinds (a :class:`~gpuperfd.probe_data.spec.ProbeSpec` each), in the registry's order."""
    return tuple(kind for kind in KINDS.values() if not kind.node_wide)


def node_kind_names() -> tuple[str, ...]:
    """The names of the node-wide kinds (run over a set of GPUs, no spec)."""
    return tuple(kind.name for kind in KINDS.values() if kind.node_wide)


def check_kind() -> ProbeKind:
    """The kind ``gpuperfd check`` runs (llm at gpt2: the model, batch and variant of the shipped figures)."""
    return next(kind for kind in KINDS.values() if kind.runs_in_check)


def is_llama_point(probe: str, model: Any) -> bool:
    """Whether ``probe`` at ``model`` runs the Llama family (its own child module, room check, tables)."""
    kind = KINDS.get(probe)
    return kind is not None and kind.llama_module is not None and is_llama(model)


def workload_cost(probe: str, options: Mapping[str, Any]) -> WorkCost:
    """The cost of one step of ``probe`` at ``options`` (a preset's values with the request's on top).

    KeyError names a missing option; ValueError an unknown dtype or a kind with no cost model.
    """
    dtype = canonical_dtype(options["dtype"])
    kind = KINDS.get(probe)
    if kind is None or kind.cost is None:
        raise ValueError(f"probe: no cost model for {probe!r}")
    return kind.cost(options, dtype)


def work_unit(probe: str, fallback: str | None = None) -> str | None:
    """The unit of work of ``probe`` (the series' ``unit`` label), or ``fallback`` for a kind without one."""
    kind = KINDS.get(probe)
    return kind.work_unit if kind is not None and kind.work_unit else fallback
