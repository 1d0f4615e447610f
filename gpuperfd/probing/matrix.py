"""``gpuperfd probe``'s run matrix: its typed options (the flags, under them a ``--config`` file's
values), every point's spec, each input checked before anything runs, and the time the matrix takes.

The command (:mod:`gpuperfd.commands.probe`) parses the flags into :class:`ProbeOptions` and prints; what
the options mean is decided here, once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuperfd.probe_data.kinds import probe_kind
from gpuperfd.probe_data.spec import PROBES, VARIANTS, ProbeSpec
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD

__all__ = ["ProbeOptions", "UsageError", "load_config_file", "with_config_file", "build_specs", "checked",
           "simulate_index", "estimate_seconds", "refined_estimate", "POINT_OVERHEAD_SECONDS", "MATRIX"]

#: A point's time besides its timed phases (a child's start, torch's import, the model's build,
#: the first calls): on a GPU the CUDA context and kernels' first launch dominate; a tiny CPU model
#: starts in a few seconds (the seed 002 CPU matrix: about 3 s a point on a quiet 2-core machine, 12 s
#: for its 4 points where 8 s a point estimated 33 s; a loaded machine is slower: after the first
#: point the estimate is redone from its measured time, :func:`refined_estimate`).
POINT_OVERHEAD_SECONDS = {"cuda": 20.0, "cpu": 3.0, "simulated": 0.0}

#: Matrix axes: option name -> spec field. Each takes several values; the product runs.
MATRIX = ("preset", "variant", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "n_groups",
          "dtype")
#: Scalar settings a --config file may hold (besides the matrix axes and "probe", "output").
CONFIG_SCALARS = ("heads", "head_dim", "causal", "warmup", "warmup_seconds", "repeats", "iterations",
                  "measure_seconds", "device", "timeout", "weights", "dataset", "seed", "gpu_busy_threshold",
                  "draft_model", "speculative_tokens", "acceptance_rates")
#: Config scalars that are one value made of a list (the speculative variant's acceptance rates).
CONFIG_LISTS = ("acceptance_rates",)


class UsageError(ValueError):
    """Bad command-line input; the message names the field."""


def load_config_file(path: str) -> dict[str, Any]:
    """A run-matrix file (YAML or JSON) as a mapping; UsageError naming the file and the key."""
    import yaml

    from gpuperfd.config.strict_yaml import AliasBomb, DuplicateKeyError, read_bounded, safe_load_strict

    try:
        data = safe_load_strict(read_bounded(path))  # JSON is YAML
    except ValueError as exc:  # past the size bound
        raise UsageError(f"config: {path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"config: cannot read {path}: {exc.strerror or exc}") from None
    except DuplicateKeyError as exc:
        raise UsageError(f"config: {path}: {exc.problem}") from None
    except AliasBomb as exc:  # valid YAML, but not a file of options: say what is wrong with it
        raise UsageError(f"config: {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"config: {path}{where} is not valid YAML or JSON") from None
    if not isinstance(data, dict):
        raise UsageError(f"config: {path} must hold a mapping of options (probe, batch_size, ...)")
    known = {"probe", "output", *MATRIX, *CONFIG_SCALARS}
    for key in data:
        name = str(key).replace("-", "_")
        if name not in known:
            raise UsageError(f"config: {path}: unknown key {key!r}; use {', '.join(sorted(known))}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


@dataclass(frozen=True)
class ProbeOptions:
    """``gpuperfd probe``'s flags, typed once (:func:`gpuperfd.commands.probe.options_of`; see its parser for
    what each means); the interconnect probe's own are
    :class:`~gpuperfd.commands.interconnect.InterconnectOptions`."""

    probe: str | None = None
    config: str | None = None
    preset: list[str] | None = None
    variant: list[str] | None = None
    batch_size: list[int] | None = None
    prompt_tokens: list[int] | None = None
    output_tokens: list[int] | None = None
    seq_len: list[int] | None = None
    image_size: list[int] | None = None
    heads: int | None = None
    head_dim: int | None = None
    n_groups: list[int] | None = None
    causal: bool | None = None
    dtype: list[str] | None = None
    draft_model: str | None = None
    speculative_tokens: int | None = None
    acceptance_rates: list[float] | None = None
    warmup: int | None = None
    warmup_seconds: float | None = None
    repeats: int | None = None
    iterations: int | None = None
    measure_seconds: float | None = None
    device: str | None = None
    timeout: float | None = None
    weights: str | None = None
    dataset: str | None = None
    seed: int | None = None
    gpu_busy_threshold: float | None = None
    idle_threshold: float = DEFAULT_IDLE_THRESHOLD
    no_idle_check: bool = False
    output: str | None = None
    label: list[str] | None = None
    simulate: int | None = None
    simulate_model: str | None = None
    no_progress: bool = False
    json: bool = False
    #: The interconnect probe's flags given (refused by name for the other probes).
    interconnect_flags: tuple[str, ...] = ()


def with_config_file(options: ProbeOptions) -> ProbeOptions:
    """Flags over the --config file's values; the file's single values become one-element lists."""
    if not options.config:
        return options
    data = load_config_file(options.config)
    merged: dict[str, Any] = {}
    for key, value in data.items():
        if getattr(options, key) not in (None, False):
            continue  # a flag given on the command line wins
        if key in MATRIX:
            value = value if isinstance(value, list) else [value]
            if not value:
                raise UsageError(f"config: {key}: give at least one value")
        elif isinstance(value, list) and key not in CONFIG_LISTS:
            raise UsageError(f"config: {key}: takes one value, got a list")
        merged[key] = value
    # merged: merging it again (build_specs after main) reads no file
    return dataclasses.replace(options, **merged, config=None)


def _values(options: ProbeOptions, name: str) -> list[Any]:
    values = getattr(options, name)
    return list(values) if values else [None]


def build_specs(options: ProbeOptions) -> list[ProbeSpec]:
    """Every point of the matrix the options ask for, validated (UsageError names the bad field)."""
    options = with_config_file(options)
    probe = options.probe
    if probe is None:
        raise UsageError("probe: name a probe (llm, vit, attention, train) or give 'probe' in --config")
    if probe not in PROBES:
        raise UsageError(f"probe: unknown probe {probe!r}; use one of {', '.join(PROBES)}")
    variants: list[Any] = []
    #: Variants that came from 'both'/'all': a point whose model lacks one is left out, not refused
    #: ('both' is graph and eager on an llm; 'all' also compiled and speculative, Llama models only).
    expanded: set[str] = set()
    for variant in _values(options, "variant"):
        if variant in ("both", "all"):
            every = (variant == "both" and probe_kind(probe).both_variants) or VARIANTS[probe]
            expanded.update(v for v in every if v not in variants)
            variants.extend(v for v in every if v not in variants)
        elif variant not in variants:
            variants.append(variant)
    common: dict[str, Any] = {
        "heads": options.heads,
        "head_dim": options.head_dim,
        "causal": options.causal,
        "warmup": options.warmup,
        "warmup_seconds": options.warmup_seconds,
        "repeats": options.repeats,
        "iterations": options.iterations,
        "measure_seconds": options.measure_seconds,
        "device": options.device,
        "weights_path": options.weights,
        "dataset_path": options.dataset,
        "draft_model": options.draft_model,
        "speculative_tokens": options.speculative_tokens,
        "acceptance_rates": options.acceptance_rates,
    }
    if options.seed is not None:
        common["seed"] = options.seed
    if options.gpu_busy_threshold is not None:
        common["gpu_busy_threshold"] = options.gpu_busy_threshold
    axes = {name: _values(options, name) for name in MATRIX if name != "variant"}
    specs = []
    for combo in itertools.product(variants, *axes.values()):
        fields = dict(common, variant=combo[0], **dict(zip(axes, combo[1:])))
        if combo[0] in expanded and combo[0] != "speculative":  # 'all': the other variants take none
            for name in ("draft_model", "speculative_tokens", "acceptance_rates"):
                fields[name] = None
        try:
            specs.append(_spec_of_point(probe, fields))
        except (TypeError, ValueError) as exc:
            if combo[0] in expanded and str(exc).startswith("variant:"):
                continue
            raise UsageError(str(exc)) from exc
    if not specs:
        raise UsageError("variant: no variant of this run applies to its model")
    given = [name for name in _SPECULATIVE_OPTIONS if common.get(name) is not None]
    if given and not any(s.variant == "speculative" for s in specs):
        raise UsageError(f"{given[0]}: used by the speculative variant only (use --variant speculative or "
                         f"--preset llama-3.1-8b-spec)")
    return specs


_SPECULATIVE_OPTIONS = ("draft_model", "speculative_tokens", "acceptance_rates")


def _spec_of_point(probe: str, fields: dict[str, Any]) -> ProbeSpec:
    """One point's spec; the speculative options reach only the run's speculative points (a matrix of
    ``--preset llama-3.1-8b llama-3.1-8b-spec --acceptance-rates 0.8`` measures the plain one too)."""
    spec = ProbeSpec(probe=probe, **{k: v for k, v in fields.items() if k not in _SPECULATIVE_OPTIONS})
    if "speculative" in (spec.variant, fields.get("variant")):
        return ProbeSpec(probe=probe, **fields)
    return spec


def checked(options: ProbeOptions) -> tuple[ProbeOptions, list[ProbeSpec]]:
    """The options merged with their --config file and the matrix's specs, every input checked before
    anything runs (UsageError naming the field)."""
    from gpuperfd.probe_data.record import RecordError, check_output, parse_labels

    if options.interconnect_flags:
        raise UsageError(f"{options.interconnect_flags[0]}: an interconnect setting; the {options.probe or 'config'} "
                         "probe does not take it")
    options = with_config_file(options)
    specs = build_specs(options)
    try:
        parse_labels(options.label)  # a bad label is a usage error before anything runs
        if options.output is not None:
            check_output(options.output)
    except RecordError as exc:
        raise UsageError(str(exc)) from exc
    if options.timeout is not None and not 0 < options.timeout < math.inf:  # nan passed "<= 0": no bound at all
        raise UsageError(f"timeout: must be a finite number of seconds > 0, got {options.timeout}")
    if not 0 <= options.idle_threshold <= 1:
        raise UsageError(f"idle_threshold: must be between 0 and 1, got {options.idle_threshold}")
    if options.simulate_model is not None and options.simulate is None:
        raise UsageError("simulate_model: goes with --simulate N (the simulated GPUs' card)")
    if options.simulate is not None:
        if options.simulate < 1:
            raise UsageError(f"simulate: give at least 1 simulated GPU, got {options.simulate}")
        if options.device is not None and not str(options.device).startswith("cuda"):
            raise UsageError(f"device: --simulate runs on simulated GPUs; use cuda or cuda:N, not {options.device!r}")
        for spec in specs:
            simulate_index(spec, options.simulate)
    return options, specs


def estimate_seconds(specs: Sequence[ProbeSpec], simulated: bool = False,
                     overhead_seconds: float | None = None) -> float:
    """The matrix's starting estimate: each point's timed phases plus its device's fixed cost
    (:data:`POINT_OVERHEAD_SECONDS`), or ``overhead_seconds`` measured on an earlier point."""
    total = 0.0
    for spec in specs:
        timed = spec.warmup_seconds + spec.repeats * (spec.measure_seconds or 0.0) + spec.busy_profile_seconds
        if overhead_seconds is not None:
            fixed = overhead_seconds
        else:
            fixed = POINT_OVERHEAD_SECONDS["simulated" if simulated else "cuda" if spec.is_cuda else "cpu"]
        total += (spec.repeats * (spec.measure_seconds or 0.0) if simulated else timed) + fixed
    return total


def refined_estimate(first: ProbeSpec, first_seconds: float, rest: Sequence[ProbeSpec],
                     simulated: bool = False) -> float:
    """The time left after the first point took ``first_seconds``: its fixed cost, so measured,
    stands for every remaining point's (on this machine, under its load now)."""
    timed = estimate_seconds([first], simulated=simulated, overhead_seconds=0.0)
    return estimate_seconds(rest, simulated=simulated, overhead_seconds=max(first_seconds - timed, 0.0))


def simulate_index(spec: ProbeSpec, gpus: int) -> int:
    """The simulated GPU a point runs on: cuda:I's I, else 0 (UsageError for an index past ``gpus``)."""
    index = (spec.cuda_index or 0) if spec.is_cuda else 0
    if index >= gpus:
        raise UsageError(f"device: cuda:{index} but --simulate {gpus} makes GPUs 0..{gpus - 1}")
    return index
