"""``gpuperfd probe {llm,vit,attention,train}``: run probe points and print a results table.

Each point (one batch size, one n_groups value, one variant) runs in its own
child process through :func:`~gpuperfd.probes.runner.run_probe`; a failed point
is reported and the sweep goes on. Lists after ``--batch-size`` and
``--n-groups`` sweep; ``--variant both`` runs the GPU-bound path and the eager
comparison in the same invocation.

Exit codes: 0 every point ok; 1 some point failed or was aborted; 2 bad input
(the message names the field).

Also runnable without the main CLI: ``python -m gpuperfd.probes.cli llm --preset tiny``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from gpuperfd.console import ProgressBar, format_table
from gpuperfd.probes.result import PRIMARY_METRIC, ProbeResult, summarize
from gpuperfd.probes.spec import DEFAULT_PRESET, PRESETS, PROBES, VARIANTS, ProbeSpec

__all__ = ["register", "main", "build_specs", "result_row", "write_results", "results_table"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

#: The latency each probe's table shows percentiles of.
_MAIN_LATENCY = {"llm": "tpot_seconds", "vit": "batch_seconds", "attention": "batch_seconds", "train": "step_seconds"}
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


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    presets = "; ".join(f"{p}: {', '.join(PRESETS[p])} (default {DEFAULT_PRESET[p]})" for p in PROBES)
    parser.add_argument("probe", choices=PROBES, help="which workload to run")
    parser.add_argument("--preset", help=f"named defaults ({presets}); 'tiny' runs on a CPU in seconds")
    variants = "; ".join(f"{p}: {'|'.join(v)}" for p, v in VARIANTS.items())
    parser.add_argument("--variant", help=f"workload variant ({variants}); 'both' runs every variant")
    parser.add_argument("--batch-size", type=_int_arg, nargs="+", metavar="N", help="batch size(s); several sweep")
    parser.add_argument("--prompt-tokens", type=_int_arg, metavar="N", help="llm: prompt length")
    parser.add_argument("--output-tokens", type=_int_arg, metavar="N", help="llm: generated tokens per request")
    parser.add_argument("--seq-len", type=_int_arg, metavar="N", help="attention/train: sequence length")
    parser.add_argument("--image-size", type=_int_arg, metavar="N", help="vit: image resolution")
    parser.add_argument("--heads", type=_int_arg, metavar="N", help="attention: query heads")
    parser.add_argument("--head-dim", type=_int_arg, metavar="N", help="attention: head dimension")
    parser.add_argument("--n-groups", type=_int_arg, nargs="+", metavar="N",
                        help="attention: query heads per key/value head (1 = MHA); several sweep")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None, help="attention: causal mask")
    parser.add_argument("--dtype", help="float32|float16|bfloat16 (fp32/fp16/bf16)")
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
    parser.add_argument("--idle-threshold", type=_number, default=0.1, metavar="R",
                        help="GPU utilization above which the GPU counts as busy before a start (default 0.1)")
    parser.add_argument("--no-idle-check", action="store_true", help="skip the idle-GPU check and process watch")
    parser.add_argument("--output", metavar="FILE", help="write results to FILE.csv or FILE.jsonl")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print results as JSON instead of a table")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``probe`` subcommand to an argparse subparsers object."""
    parser = subparsers.add_parser(
        "probe",
        help="run a probe workload (llm, vit, attention, train) and print its figures",
        description="Run a probe workload in an isolated child process: throughput, latency percentiles, "
        "energy per unit of work, GPU-busy fraction, repeatability over repeats.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=main)
    return parser


class UsageError(ValueError):
    """Bad command-line input; the message names the field."""


def build_specs(args: argparse.Namespace) -> list[ProbeSpec]:
    """Every point the arguments ask for, validated (UsageError names the bad field)."""
    probe = args.probe
    if args.variant in (None, ""):
        variants: list[str | None] = [None]
    elif args.variant == "both" or args.variant == "all":
        variants = list(VARIANTS[probe])
    else:
        variants = [args.variant]
    batch_sizes: list[int | None] = list(args.batch_size) if args.batch_size else [None]
    groups: list[int | None] = list(args.n_groups) if args.n_groups else [None]
    if args.n_groups and probe != "attention":
        raise UsageError(f"n_groups: not used by probe {probe!r}")
    common: dict[str, Any] = {
        "preset": args.preset,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "seq_len": args.seq_len,
        "image_size": args.image_size,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "causal": args.causal,
        "dtype": args.dtype,
        "warmup": args.warmup,
        "warmup_seconds": args.warmup_seconds,
        "repeats": args.repeats,
        "iterations": args.iterations,
        "measure_seconds": args.measure_seconds,
        "device": args.device,
        "weights_path": args.weights,
        "dataset_path": args.dataset,
    }
    if args.seed is not None:
        common["seed"] = args.seed
    if args.gpu_busy_threshold is not None:
        common["gpu_busy_threshold"] = args.gpu_busy_threshold
    specs = []
    for variant, batch, group in itertools.product(variants, batch_sizes, groups):
        fields = dict(common, variant=variant, batch_size=batch, n_groups=group)
        try:
            specs.append(ProbeSpec(probe=probe, **fields))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    return specs


def _output_format(path: str | None) -> str | None:
    if path is None:
        return None
    lower = path.lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith(".jsonl"):
        return "jsonl"
    raise UsageError(f"output: {path!r} must end in .csv or .jsonl")


# --- flattening and output --------------------------------------------------------------


def result_row(result: ProbeResult) -> dict[str, Any]:
    """One flat row (CSV): identity, params, pooled figures, per-repeat statistics, latency percentiles."""
    row: dict[str, Any] = {}
    for key in ("probe", "variant", "preset", "status", "failure_reason", "device", "gpu_name",
                "compute_capability", "gpu_uuid", "started_at", "wall_seconds", "measured_seconds", "work_unit",
                "units_of_work", "energy_joules", "average_power_watts", "energy_per_unit_joules",
                "peak_memory_bytes", "allocated_memory_bytes", "sm_clock_hertz_mean", "memory_clock_hertz_mean",
                "temperature_celsius_max", "gpu_utilization_mean_ratio", "memory_utilization_mean_ratio",
                "gpu_busy_ratio", "low_gpu_busy", "power_limit_watts"):
        row[key] = getattr(result, key)
    row["clock_events_seen"] = "|".join(result.clock_events_seen)
    row["error_message"] = (result.error_message or "").splitlines()[0] if result.error_message else None
    for key, value in result.params.items():
        row[f"param.{key}"] = value
    for key, value in result.throughput.items():
        row[f"throughput.{key}"] = value
    summary = summarize(result)
    for key, stats in summary["throughput"].items():
        for stat in ("mean", "median", "stdev", "cv"):
            row[f"throughput.{key}.{stat}"] = stats[stat]
    for key in ("energy_per_unit_joules", "average_power_watts"):
        stats = summary.get(key)
        if stats:
            for stat in ("mean", "median", "stdev", "cv"):
                row[f"{key}.{stat}"] = stats[stat]
    for key, lat in summary["latencies"].items():
        for stat in ("mean", "p50", "p95", "p99"):
            row[f"latency.{key}.{stat}"] = lat[stat]
    for key, value in result.extra.items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            if key not in ("traceback", "log_tail"):
                row[f"extra.{key}"] = value
    return row


def write_results(path: str, results: list[ProbeResult]) -> None:
    """Write every result so far to ``path`` (.csv: one row each; .jsonl: one full result per line)."""
    fmt = _output_format(path)
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as fh:
        if fmt == "jsonl":
            for result in results:
                fh.write(json.dumps(result.to_dict(), sort_keys=False) + "\n")
        else:
            rows = [result_row(r) for r in results]
            header: list[str] = []
            for row in rows:
                header.extend(k for k in row if k not in header)
            writer = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow(row)
    os.replace(tmp, path)


def _params_text(result: ProbeResult) -> str:
    shown = []
    for key in ("batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads", "head_dim",
                "n_groups", "causal", "dtype"):
        if key in result.params:
            short = {"batch_size": "b", "prompt_tokens": "in", "output_tokens": "out", "seq_len": "s",
                     "image_size": "px", "heads": "h", "head_dim": "d", "n_groups": "g", "causal": "causal",
                     "dtype": ""}[key]
            value = result.params[key]
            if key == "dtype":
                shown.append(str(value).replace("bfloat16", "bf16").replace("float16", "fp16").replace("float32", "fp32"))
            elif key == "causal":
                if value:
                    shown.append("causal")
            else:
                shown.append(f"{short}={value}")
    model = result.params.get("model")
    return " ".join(([str(model)] if model else []) + shown)


def results_table(results: list[ProbeResult]) -> str:
    """The summary table: headline rate over repeats, energy, busy fraction, latency percentiles."""
    headers = ["probe", "params", "status", "metric", "mean", "median", "stdev", "CV%", "J/unit", "busy",
               "latency", "p50 ms", "p95 ms", "p99 ms", "wall s"]
    rows = []
    for r in results:
        metric = PRIMARY_METRIC.get(r.probe, "")
        summary = summarize(r) if r.ok else {"throughput": {}, "latencies": {}}
        stats = summary["throughput"].get(metric)
        lat_name = _MAIN_LATENCY.get(r.probe, "")
        lat = summary["latencies"].get(lat_name)
        status = r.status if r.ok else f"{r.status}:{r.failure_reason}"
        if r.ok and r.low_gpu_busy:
            status = "ok LOW-BUSY"
        unit = _UNIT_SHORT.get(r.work_unit or "", r.work_unit or "")
        rows.append([
            f"{r.probe}/{r.variant}",
            _params_text(r),
            status,
            metric.replace("_per_second", "/s") if stats else None,
            stats["mean"] if stats else None,
            stats["median"] if stats else None,
            stats["stdev"] if stats else None,
            stats["cv"] * 100 if stats and stats["cv"] is not None else None,
            f"{r.energy_per_unit_joules:.4g}/{unit}" if r.energy_per_unit_joules is not None else None,
            r.gpu_busy_ratio,
            lat_name.replace("_seconds", "") if lat else None,
            lat["p50"] * 1e3 if lat else None,
            lat["p95"] * 1e3 if lat else None,
            lat["p99"] * 1e3 if lat else None,
            r.wall_seconds,
        ])
    align = ["l", "l", "l", "l", "r", "r", "r", "r", "r", "r", "l", "r", "r", "r", "r"]
    return format_table(headers, rows, align=align)


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
    parts = [f"{spec.probe}/{spec.variant}", str(params.get("model", spec.preset))]
    if "batch_size" in params:
        parts.append(f"b={params['batch_size']}")
    if spec.probe == "attention":
        parts.append(f"g={spec.n_groups}")
    return " ".join(parts)


def main(args: argparse.Namespace) -> int:
    """Run the points ``args`` describe; returns the exit code."""

    try:
        fmt = _output_format(args.output)
        specs = build_specs(args)
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError(f"timeout: must be > 0, got {args.timeout}")
        if not 0 <= args.idle_threshold <= 1:
            raise UsageError(f"idle_threshold: must be between 0 and 1, got {args.idle_threshold}")
    except UsageError as exc:
        print(f"gpuperfd probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    del fmt

    import threading

    from gpuperfd.system.stopsignals import StopSignals, say

    abort = threading.Event()
    # SIGTERM/SIGHUP/SIGINT/SIGQUIT only set `abort`: run_probe then kills the child's process group.
    with StopSignals(abort) as stop:
        try:
            code = _run_points(args, specs, abort)
        except OSError:  # a closed terminal while printing: the child is already ended
            code = EXIT_FAILURE
    if stop.received is not None:
        say(f"gpuperfd probe: stopped by {stop.name}; the probe child was ended")
        return stop.exit_code
    return code


def _run_points(args: argparse.Namespace, specs: list[ProbeSpec], abort: Any) -> int:
    from gpuperfd.probes.runner import run_probe
    from gpuperfd.probes.spec import default_timeout

    results: list[ProbeResult] = []
    total = sum(spec.repeats for spec in specs)
    devices: dict[str, Any] = {}
    with ProgressBar(total, desc="probe", enabled=None if not args.no_progress else False) as bar:
        for spec in specs:
            if abort.is_set():
                break
            device = None
            if spec.is_cuda and not args.no_idle_check:
                if spec.device not in devices:
                    try:
                        devices[spec.device] = _nvml_device(spec)
                    except Exception as exc:  # noqa: BLE001 - run without the check, but say so
                        bar.write(f"gpuperfd probe: warning: no idle check for {spec.device}: {exc}")
                        devices[spec.device] = None
                device = devices[spec.device]
            label = _describe_point(spec)
            bar.set_message(label)
            done = 0

            def on_progress(body: dict[str, Any], label: str = label) -> None:
                nonlocal done
                if body.get("phase") == "measure":
                    done += 1
                    bar.update(1, f"{label} {body.get('repeat')}/{body.get('repeats')}")
                else:
                    bar.set_message(f"{label} {body.get('phase', '')}")

            timeout = args.timeout if args.timeout is not None else default_timeout(spec)
            result = run_probe(spec, timeout_seconds=timeout, device=device,
                               idle_utilization_threshold=args.idle_threshold, on_progress=on_progress,
                               should_abort=abort.is_set)
            if done < spec.repeats:
                bar.update(spec.repeats - done)
            if not result.ok:
                first_line = (result.error_message or "").splitlines()[0] if result.error_message else ""
                bar.write(f"gpuperfd probe: {label}: {result.status} ({result.failure_reason}): {first_line}")
            results.append(result)
            if args.output:
                write_results(args.output, results)

    if args.json:
        json.dump([r.to_dict() for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(results_table(results))
        gpu = next((r.gpu_name for r in results if r.gpu_name), None)
        if gpu:
            print(f"GPU: {gpu} (compute capability {next(r.compute_capability for r in results if r.gpu_name)})")
        if any(r.ok and r.low_gpu_busy for r in results):
            print("LOW-BUSY: the device was idle for part of the window; the figure measures the host as much as the GPU.")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILURE


def _standalone(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuperfd probe", description="Run a probe workload.")
    _add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_standalone())
