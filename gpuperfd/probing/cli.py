"""``gpuperfd probe {llm,vit,attention,train}``: run probe points and print a results table.

A run matrix: ``--preset``, ``--variant``, ``--batch-size``, ``--prompt-tokens``,
``--output-tokens``, ``--seq-len``, ``--image-size``, ``--n-groups`` and ``--dtype``
each take several values and the product of them runs, one point per child process
(a read-only session of the daemon's executor, :func:`~gpuperfd.probing.executors.measure_once`;
``--simulate N``: the simulator's), under one progress bar with a time
estimate; a failed point is reported and the matrix goes on. ``--config FILE``
(YAML or JSON) describes the same matrix plus warmup and repeats; flags override it.
``--output`` appends one run record per point (:mod:`gpuperfd.probe_data.record`).

Exit codes: 0 every point ok; 1 some point failed or was aborted; 2 bad input
(the message names the field); 3 a CUDA point on a node without an NVIDIA driver (as every command).

Also runnable without the main CLI: ``python -m gpuperfd.probing.cli llm --preset tiny``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuperfd.console import ProgressBar, format_duration, format_table
from gpuperfd.probe_data.result import MAIN_LATENCY, PRIMARY_METRIC, ProbeResult, canonical_latencies, summarize
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PRESETS, PROBES, VARIANTS, ProbeSpec, params_text
from gpuperfd.probe_data.workload_cost import NOT_MODELLED_KEY, SIMULATED_NOTE_KEY
from gpuperfd.probing.interconnect import cli as interconnect_cli
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD

__all__ = ["register", "main", "build_specs", "load_config_file", "write_results", "results_table",
           "estimate_seconds", "POINT_OVERHEAD_SECONDS"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_DEVICE = 0, 1, 2, 3

#: A point's time besides its timed phases (a child's start, torch's import, the model's build,
#: the first calls): on a GPU the CUDA context and kernels' first launch dominate; a tiny CPU model
#: starts in a few seconds (the seed 002 CPU matrix: about 3 s a point on a quiet 2-core machine, 12 s
#: for its 4 points where 8 s a point estimated 33 s; a loaded machine is slower: after the first
#: point the estimate is redone from its measured time, :func:`refined_estimate`).
POINT_OVERHEAD_SECONDS = {"cuda": 20.0, "cpu": 3.0, "simulated": 0.0}
_UNIT_SHORT = {"token": "tok", "image": "img", "step": "step", "iteration": "call"}


def _int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from exc


#: Matrix axes: option name -> spec field. Each takes several values; the product runs.
MATRIX = ("preset", "variant", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "n_groups",
          "dtype")
#: Scalar settings a --config file may hold (besides the matrix axes and "probe", "output").
CONFIG_SCALARS = ("heads", "head_dim", "causal", "warmup", "warmup_seconds", "repeats", "iterations",
                  "measure_seconds", "device", "timeout", "weights", "dataset", "seed", "gpu_busy_threshold",
                  "draft_model", "speculative_tokens", "acceptance_rates")
#: Config scalars that are one value made of a list (the speculative variant's acceptance rates).
CONFIG_LISTS = ("acceptance_rates",)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    presets = "; ".join(f"{p}: {', '.join(PRESETS[p])} (default {DEFAULT_PRESET[p]})" for p in PROBES)
    parser.add_argument("probe", nargs="?", choices=(*PROBES, "interconnect"),
                        help="which workload to run (or 'probe' in --config); interconnect: peer copies and "
                             "all-reduce across a set of GPUs (its own flags below)")
    parser.add_argument("--config", metavar="FILE",
                        help="YAML or JSON run matrix: probe, the list options below, warmup, repeats, ... "
                             "(docs/probes.md); flags given too override it")
    parser.add_argument("--preset", nargs="+", help=f"named defaults ({presets}); 'tiny' runs on a CPU in seconds; "
                                                    "several make a model-size axis")
    variants = "; ".join(f"{p}: {'|'.join(v)}" for p, v in VARIANTS.items())
    parser.add_argument("--variant", nargs="+", help=f"workload variant(s) ({variants}); 'both' runs every variant")
    parser.add_argument("--batch-size", type=_int_arg, nargs="+", metavar="N", help="batch size(s)")
    parser.add_argument("--prompt-tokens", type=_int_arg, nargs="+", metavar="N", help="llm: prompt length(s)")
    parser.add_argument("--output-tokens", type=_int_arg, nargs="+", metavar="N",
                        help="llm: generated tokens per request")
    parser.add_argument("--seq-len", type=_int_arg, nargs="+", metavar="N", help="attention/train: sequence length(s)")
    parser.add_argument("--image-size", type=_int_arg, nargs="+", metavar="N", help="vit: image resolution(s)")
    parser.add_argument("--heads", type=_int_arg, metavar="N", help="attention: query heads")
    parser.add_argument("--head-dim", type=_int_arg, metavar="N", help="attention: head dimension")
    parser.add_argument("--n-groups", type=_int_arg, nargs="+", metavar="N",
                        help="attention, llm (graph variant): query heads per key/value head (1 = MHA)")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None, help="attention: causal mask")
    parser.add_argument("--dtype", nargs="+", help="float32|float16|bfloat16 (fp32/fp16/bf16)")
    parser.add_argument("--draft-model", metavar="MODEL",
                        help="llm speculative: the draft (a Llama model; default: llama-3.2-1b for the 8B)")
    parser.add_argument("--speculative-tokens", type=_int_arg, metavar="K",
                        help="llm speculative: tokens the draft proposes per round (1-64; seed 004: 12)")
    parser.add_argument("--acceptance-rates", type=_number, nargs="+", metavar="R",
                        help="llm speculative: acceptance rates (0-1) to report tokens/s at (random weights "
                             "accept nothing meaningful; default 0.5 0.7 0.9)")
    parser.add_argument("--warmup", type=_int_arg, metavar="N", help="warmup iterations (at least)")
    parser.add_argument("--warmup-seconds", type=_number, metavar="S", help="warmup duration (at least)")
    parser.add_argument("--repeats", type=_int_arg, metavar="N", help="measured windows (for mean/stdev/CV)")
    parser.add_argument("--iterations", type=_int_arg, metavar="N", help="fixed iterations per window")
    parser.add_argument("--measure-seconds", type=_number, metavar="S", help="fixed-time window length")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the preset's)")
    parser.add_argument("--timeout", type=_number, metavar="S", help="hard timeout per point (default: from the spec)")
    parser.add_argument("--weights", metavar="PATH", help="local Hugging Face model directory (no downloads)")
    parser.add_argument("--dataset", metavar="PATH", help="local token ids (.npy/.pt/.bin) or images (.npy/.pt/folder)")
    parser.add_argument("--seed", type=_int_arg, metavar="N", help="random seed (default 0)")
    parser.add_argument("--gpu-busy-threshold", type=_number, metavar="R", help="flag results less busy than this")
    parser.add_argument("--idle-threshold", type=_number, default=DEFAULT_IDLE_THRESHOLD, metavar="R",
                        help="GPU utilization above which the GPU counts as busy before a start "
                             f"(default {DEFAULT_IDLE_THRESHOLD:g}, probes.idle_utilization_threshold's)")
    parser.add_argument("--no-idle-check", action="store_true", help="skip the idle-GPU check and process watch")
    parser.add_argument("--output", metavar="FILE",
                        help="append one run record per point to FILE.csv or FILE.jsonl (gpuperfd report reads it); "
                             "an existing file of another format is refused, never overwritten")
    parser.add_argument("--label", action="append", default=None, metavar="KEY=VALUE",
                        help="repeatable: a label kept in each record and the CSV (dataset=cifar10); the report "
                             "never merges runs whose labels differ and can plot, group or facet by a label")
    parser.add_argument("--simulate", type=_int_arg, metavar="N",
                        help="run on N simulated GPUs (the simulator's physics, no torch; the output says "
                             "simulated): the point runs on simulated GPU I of --device cuda:I (default 0)")
    parser.add_argument("--simulate-model", metavar="MODEL", type=simulated_model,
                        help="with --simulate: the simulated card, one of " + ", ".join(SIMULATED_MODELS)
                             + " (default H100, as the config's simulation.model)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print results as JSON instead of a table")
    interconnect_cli.add_arguments(parser)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``probe`` subcommand to an argparse subparsers object."""
    parser = subparsers.add_parser(
        "probe",
        help="run a probe workload (llm, vit, attention, train, interconnect) and print its figures",
        description="Run a probe workload in an isolated child process: throughput, latency percentiles, "
        "energy per unit of work, GPU-busy fraction, repeatability over repeats.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=main)
    return parser


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
    """``gpuperfd probe``'s flags, typed once (see :func:`_add_arguments` for what each means); the
    interconnect probe's own flags are :class:`~gpuperfd.probing.interconnect.cli.InterconnectOptions`."""

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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProbeOptions:
        values = vars(args)
        given = tuple(name for name in INTERCONNECT_FLAGS if values.get(name) is not None)
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values},
                   interconnect_flags=given)


#: The interconnect probe's flags on the shared parser (``interconnect_cli.add_arguments``).
INTERCONNECT_FLAGS = ("gpus", "size", "copy_size", "ranks")


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
            every = ("graph", "eager") if probe == "llm" and variant == "both" else VARIANTS[probe]
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
    if spec.variant == "speculative" or (probe == "llm" and fields.get("variant") == "speculative"):
        return ProbeSpec(probe=probe, **fields)
    return spec


# --- flattening and output --------------------------------------------------------------


def write_results(path: str, results: list[ProbeResult], host: str | None = None,
                  labels: dict[str, str] | None = None, gpu: dict[str, Any] | None = None) -> None:
    """Append ``results`` to ``path`` as run records (:func:`gpuperfd.probe_data.record.append_records`)."""
    from gpuperfd.probe_data.record import append_records, build_record

    append_records(path, [build_record(r, "probe", host=host, labels=labels, gpu=gpu) for r in results])


def correctness_cell(correctness: dict[str, Any]) -> str:
    """The correctness column: ok, MISMATCH (wrong numbers: docs/probes.md, "Correctness") or - (not checked)."""
    return {"ok": "ok", "mismatch": "MISMATCH"}.get(str((correctness or {}).get("status")), "-")


def results_table(results: list[ProbeResult]) -> str:
    """The summary table: headline rate over repeats, energy, busy fraction, latency percentiles."""
    headers = ["probe", "params", "status", "check", "metric", "mean", "median", "stdev", "CV%", "J/unit", "busy",
               "latency", "mean ms", "p50 ms", "p95 ms", "p99 ms", "TTFT ms", "req/s", "peak MiB", "alloc MiB",
               "wall s"]
    rows = []
    for r in results:
        metric = PRIMARY_METRIC.get(r.probe, "")
        summary = summarize(r) if r.ok else {"throughput": {}, "latencies": {}}
        if metric not in summary["throughput"] and summary["throughput"]:  # a simulated point's own rate
            metric = next(iter(summary["throughput"]))
        stats = summary["throughput"].get(metric)
        lat_name = MAIN_LATENCY.get(r.probe, "")
        lat = canonical_latencies(r.probe, summary["latencies"]).get(lat_name)
        ttft = summary["latencies"].get("ttft_seconds")
        status = r.status if r.ok else f"{r.status}:{r.failure_reason}"
        if r.ok and r.low_gpu_busy:
            status = "ok LOW-BUSY"
        unit = _UNIT_SHORT.get(r.work_unit or "", r.work_unit or "")
        rows.append([
            f"{r.probe}/{r.variant}",
            params_text(r.params),
            status,
            correctness_cell(r.correctness),
            metric.replace("_per_second", "/s") if stats else None,
            stats["mean"] if stats else None,
            stats["median"] if stats else None,
            stats["stdev"] if stats else None,
            stats["cv"] * 100 if stats and stats["cv"] is not None else None,
            f"{r.energy_per_unit_joules:.4g}/{unit}" if r.energy_per_unit_joules is not None else None,
            r.gpu_busy_ratio,
            lat_name.replace("_seconds", "") if lat else None,
            lat["mean"] * 1e3 if lat else None,
            lat["p50"] * 1e3 if lat else None,
            lat["p95"] * 1e3 if lat else None,
            lat["p99"] * 1e3 if lat else None,
            ttft["mean"] * 1e3 if ttft else None,
            r.throughput.get("requests_per_second") if r.ok else None,
            r.peak_memory_bytes / 2**20 if r.peak_memory_bytes else None,
            r.allocated_memory_bytes / 2**20 if r.allocated_memory_bytes else None,
            r.wall_seconds,
        ])
    align = ["l", "l", "l", "l", "l", "r", "r", "r", "r", "r", "r", "l", "r", "r", "r", "r", "r", "r", "r", "r", "r"]
    return format_table(headers, rows, align=align, drop_empty=True)


# --- running ----------------------------------------------------------------------------


def _nvml_device(spec: ProbeSpec) -> Any:
    """The NVML device behind ``spec.device`` for the idle check (CUDA_VISIBLE_DEVICES aware)."""
    from gpuperfd.device.nvml import NvmlBackend

    devices = NvmlBackend(indices=None).devices()
    index = spec.cuda_index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index >= len(entries):
            raise RuntimeError(f"device {spec.device}: CUDA_VISIBLE_DEVICES lists only {len(entries)} GPU(s)")
        entry = entries[index]
        if entry.isdigit():
            index = int(entry)
        else:
            for dev in devices:
                if dev.info().uuid.startswith(entry):
                    return dev
            raise RuntimeError(f"device {spec.device}: no GPU matches CUDA_VISIBLE_DEVICES entry {entry!r}")
    if index >= len(devices):
        raise RuntimeError(f"device {spec.device}: NVML sees only {len(devices)} GPU(s)")
    return devices[index]


def _describe_point(spec: ProbeSpec) -> str:
    params = spec.params()
    return f"{spec.probe}/{spec.variant} " + (params_text(params) if params.get("model")
                                               else f"{spec.preset} {params_text(params)}").strip()


def main(args: argparse.Namespace) -> int:
    """Run the points the flags describe; returns the exit code."""
    if args.probe == "interconnect":
        return interconnect_cli.main(args)
    options = ProbeOptions.from_args(args)
    try:
        options, specs = _checked(options)
    except UsageError as exc:
        print(f"gpuperfd probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from gpuperfd.probe_data.cpu_path import half_on_cpu_warning

    if options.simulate is None and (warning := half_on_cpu_warning(specs)) is not None:
        print(f"gpuperfd probe: {warning}", file=sys.stderr)  # once for the whole matrix
    import threading

    from gpuperfd.system.stopsignals import StopSignals, say

    abort = threading.Event()
    # SIGTERM/SIGHUP/SIGINT/SIGQUIT only set `abort`: the session then kills the child's process group.
    from gpuperfd.device.errors import DriverNotFound

    with StopSignals(abort) as stop:
        try:
            code = _run_points(options, specs, abort)
        except DriverNotFound as exc:
            print(f"gpuperfd probe: {exc}", file=sys.stderr)
            return EXIT_DEVICE
        except OSError:  # a closed terminal while printing: the child is already ended
            code = EXIT_FAILURE
    if stop.received is not None:
        say(f"gpuperfd probe: stopped by {stop.name}; the probe child was ended")
        return stop.exit_code
    return code


def _checked(options: ProbeOptions) -> tuple[ProbeOptions, list[ProbeSpec]]:
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
            _simulate_index(spec, options.simulate)
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


#: The cards the simulator models (config ``simulation.model``).
SIMULATED_MODELS: tuple[str, ...] = ("H100", "H200", "A100")


def simulated_model(text: str) -> str:
    """``--simulate-model``'s value: a simulated card, in any case (argparse's error names the flag)."""
    model = text.strip().upper()
    if model not in SIMULATED_MODELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a simulated card ({', '.join(SIMULATED_MODELS)})")
    return model


def _simulate_index(spec: ProbeSpec, gpus: int) -> int:
    """The simulated GPU a point runs on: cuda:I's I, else 0 (UsageError for an index past ``gpus``)."""
    index = (spec.cuda_index or 0) if spec.is_cuda else 0
    if index >= gpus:
        raise UsageError(f"device: cuda:{index} but --simulate {gpus} makes GPUs 0..{gpus - 1}")
    return index


class _Points:
    """Where the points run, through the daemon's sessions (:func:`~gpuperfd.probing.executors.measure_once`):
    ``--simulate N`` on the simulator's GPUs through its executor (its physics: power, clocks,
    temperature, energy; no torch, no workload), else in a probe child on this host's torch device,
    the GPU under it watched unless ``--no-idle-check``. Read-only: no cap is ever set."""

    def __init__(self, options: ProbeOptions, specs: Sequence[ProbeSpec]) -> None:
        from gpuperfd.probe_data.spec import default_timeout
        from gpuperfd.probing.executors import command_executor

        self.options = options
        self.backend: Any = None
        #: The simulated GPUs by index, or the NVML device of each torch device (None: not watched).
        self.devices: dict[Any, Any] = {}
        self.window = options.measure_seconds or 1.0
        seed = None
        if options.simulate is not None:
            from gpuperfd.config import config_with_flags
            from gpuperfd.device.factory import open_backend

            config = config_with_flags(None, {"simulation.model": options.simulate_model}, simulate=options.simulate)
            self.backend, seed = open_backend(config), config.simulation.seed
            self.devices = {d.index: d for d in self.backend.devices()}
        else:
            os.environ.setdefault("GPUPERFD_PROBE_NICE", "0")  # no exporter to yield to: the child keeps its priority
        self.executor = command_executor(
            self.backend.name if self.backend is not None else "nvml",
            options.timeout or max(default_timeout(s) for s in specs), options.idle_threshold, self.window, seed)

    @property
    def simulated(self) -> bool:
        return self.backend is not None

    def gpu(self, spec: ProbeSpec) -> dict[str, Any] | None:
        """The simulated GPU's identity for the run record (None: a real point's child reports its own)."""
        import dataclasses

        if not self.simulated:
            return None
        info = self.devices[_simulate_index(spec, len(self.devices))].info()
        return {k: v for k, v in dataclasses.asdict(info).items() if k != "serial"}

    def run(self, spec: ProbeSpec, bar: ProgressBar, on_progress: Any, abort: Any) -> ProbeResult:
        """One point, read-only at the cap the GPU holds now: no settle (the table's windows are the spec's)."""
        from gpuperfd.probe_data.request import ProbeRequest
        from gpuperfd.probe_data.spec import default_timeout
        from gpuperfd.probing.executors import measure_once

        if self.simulated:  # the spec's parameters (repeats among them): one window per repeat, pooled;
            # the options the simulator does not model ride along, so its result names them
            named = {"variant": spec.variant, "weights_path": spec.weights_path, "dataset_path": spec.dataset_path}
            options = {**spec.params(), **{k: v for k, v in named.items() if v is not None}}
            request = ProbeRequest(spec.probe, spec.preset, options, settle_seconds=0.0)
            device = self.devices[_simulate_index(spec, len(self.devices))]
        else:  # every field of the spec, its torch device included
            request = ProbeRequest.from_spec(spec, self.options.timeout or default_timeout(spec))
            device = self._watched(spec, bar)
        return measure_once(self.executor, device, request, abort, on_progress)

    def _watched(self, spec: ProbeSpec, bar: ProgressBar) -> Any:
        """The NVML device under a CUDA point, for the idle check and the watch (None: a CPU point,
        ``--no-idle-check``, or NVML cannot say: run without the check, but say so)."""
        if not spec.is_cuda or self.options.no_idle_check:
            return None
        if spec.device not in self.devices:
            from gpuperfd.device.errors import DriverNotFound

            try:
                self.devices[spec.device] = _nvml_device(spec)
            except DriverNotFound:  # no driver: no CUDA point can run here (exit 3, as every command)
                raise
            except Exception as exc:  # noqa: BLE001 - run without the check, but say so
                bar.write(f"gpuperfd probe: warning: no idle check for {spec.device}: {exc}")
                self.devices[spec.device] = None
        return self.devices[spec.device]

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def _run_points(options: ProbeOptions, specs: list[ProbeSpec], abort: Any) -> int:
    from gpuperfd.probe_data.record import RecordError, parse_labels
    from gpuperfd.probe_data.recommend import point_words
    from gpuperfd.probe_data.cpu_path import timeout_hint
    from gpuperfd.probe_data.spec import default_timeout

    labels = parse_labels(options.label)
    points = _Points(options, specs)
    simulated = points.simulated
    if simulated:
        print(f"gpuperfd probe: SIMULATED: {options.simulate} simulated GPU(s), the simulator's physics "
              f"({points.window:g} s windows); no workload runs and no real GPU is measured", file=sys.stderr)
    results: list[ProbeResult] = []
    total = sum(spec.repeats for spec in specs)
    estimate = estimate_seconds(specs, simulated=simulated)
    if len(specs) > 1 and estimate >= 2:
        print(f"gpuperfd probe: {len(specs)} points, about {format_duration(estimate)} (the bar refines it)",
              file=sys.stderr)
    try:
        with ProgressBar(total, desc=f"probe {len(specs)} points",
                         enabled=None if not options.no_progress else False) as bar:
            for number, spec in enumerate(specs, 1):
                if abort.is_set():
                    break
                what = _describe_point(spec)
                if simulated:  # never silently: every line names the simulated variant
                    what = what.replace(f"{spec.probe}/{spec.variant}", f"{spec.probe}/simulated", 1)
                label = f"[{number}/{len(specs)}] {what}"
                bar.set_message(label)
                done = 0

                def on_progress(body: dict[str, Any], label: str = label) -> None:
                    nonlocal done
                    if body.get("phase") == "measure":
                        done += 1
                        bar.update(1, f"{label} {body.get('repeat')}/{body.get('repeats')}")
                    else:
                        bar.set_message(f"{label} {body.get('phase', '')}")

                point_started = time.monotonic()
                result, gpu = points.run(spec, bar, on_progress, abort), points.gpu(spec)
                if done < spec.repeats:
                    bar.update(spec.repeats - done)
                if not result.ok:
                    first_line = (result.error_message or "").splitlines()[0] if result.error_message else ""
                    bar.write(f"gpuperfd probe: {label}: {result.status} ({result.failure_reason}): {first_line}")
                    if result.failure_reason == "timeout" and not simulated:
                        bound = options.timeout if options.timeout is not None else default_timeout(spec)
                        bar.write(f"gpuperfd probe: {timeout_hint(spec, bound)}")
                bar.point_done(what, point_words(result))
                if number == 1 and len(specs) > 1 and bar.mode != "off":
                    took = time.monotonic() - point_started
                    left = refined_estimate(spec, took, specs[1:], simulated)
                    if not estimate / 1.5 <= left + took <= estimate * 1.5:
                        bar.write(f"gpuperfd probe: the first point took {format_duration(took)}: "
                                  f"about {format_duration(left)} left for {len(specs) - 1} more")
                results.append(result)
                if options.output:  # one record per point as it lands: an interrupted matrix keeps what it measured
                    try:
                        write_results(options.output, [result], labels=labels, gpu=gpu)
                    except (RecordError, OSError) as exc:
                        bar.write(f"gpuperfd probe: output: {exc}")
    finally:
        points.close()

    _print_results(options, results, simulated=simulated)
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILURE


def _print_results(options: ProbeOptions, results: list[ProbeResult], simulated: bool) -> None:
    """The points' JSON (``--json``), or their table with the GPU line and the LOW-BUSY note."""
    if options.json:
        json.dump([r.to_dict() for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(results_table(results))
    from gpuperfd.probing.llm_tables import seed004_table, speculative_table

    for block in (seed004_table(results), speculative_table(results)):
        if block:
            print()
            print(block)
    gpu_name = next((r.gpu_name for r in results if r.gpu_name), None)
    if gpu_name:
        capability = next(r.compute_capability for r in results if r.gpu_name)
        where = " SIMULATED (the simulator's physics, not a measurement)" if simulated else ""
        print(f"GPU: {gpu_name} (compute capability {capability}){where}")
    if unmodelled := sorted({k for r in results for k in r.extra.get(NOT_MODELLED_KEY, [])}):
        print(f"simulated: {', '.join(unmodelled)} not modelled (the simulated figures do not follow it)")
    for note in sorted({r.extra[SIMULATED_NOTE_KEY] for r in results if r.extra.get(SIMULATED_NOTE_KEY)}):
        print(note)
    if any(r.ok and r.low_gpu_busy for r in results):
        print("LOW-BUSY: the device was idle for part of the window; the figure measures the host as much as the GPU.")


def _standalone(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuperfd probe", description="Run a probe workload.")
    _add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_standalone())
