"""``gpuperfd probe {llm,vit,attention,train}``: run probe points and print a results table.

A run matrix: ``--preset``, ``--variant``, ``--batch-size``, ``--prompt-tokens``,
``--output-tokens``, ``--seq-len``, ``--image-size``, ``--n-groups`` and ``--dtype``
each take several values and the product of them runs, one point per child process
(a read-only session of the daemon's executor, :func:`~gpuperfd.probing.executors.measure_once`;
``--simulate N``: the simulator's), under one progress bar with a time
estimate; a failed point is reported and the matrix goes on. ``--config FILE``
(YAML or JSON) describes the same matrix plus warmup and repeats; flags override it.
``--output`` appends one run record per point (:mod:`gpuperfd.probe_data.record`).

This module is the command: it parses the flags into :class:`~gpuperfd.probing.matrix.ProbeOptions`
(what they mean, the matrix, is :mod:`gpuperfd.probing.matrix`; where the points run,
:mod:`gpuperfd.probing.points`), runs the points under the bar and prints.

Exit codes: 0 every point ok; 1 some point failed or was aborted; 2 bad input
(the message names the field); 3 a CUDA point on a node without an NVIDIA driver (as every command).

Also runnable without the main CLI: ``python -m gpuperfd.commands.probe llm --preset tiny``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpuperfd.console import ProgressBar, format_duration, format_table
from gpuperfd.probe_data.kinds import INTERCONNECT
from gpuperfd.probe_data.result import MAIN_LATENCY, PRIMARY_METRIC, ProbeResult, canonical_latencies, summarize
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PRESETS, PROBES, VARIANTS, ProbeSpec, params_text
from gpuperfd.probe_data.workload_cost import NOT_MODELLED_KEY, SIMULATED_NOTE_KEY
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD
from gpuperfd.commands import interconnect as interconnect_cli
from gpuperfd.probing.matrix import ProbeOptions, UsageError, checked, estimate_seconds, refined_estimate
from gpuperfd.probing.points import Points, write_results

__all__ = ["register", "main", "options_of", "results_table", "correctness_cell"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_DEVICE = 0, 1, 2, 3

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
    parser.add_argument("probe", nargs="?", choices=(*PROBES, INTERCONNECT),
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


# --- printing ---------------------------------------------------------------------------


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


def _describe_point(spec: ProbeSpec) -> str:
    params = spec.params()
    return f"{spec.probe}/{spec.variant} " + (params_text(params) if params.get("model")
                                               else f"{spec.preset} {params_text(params)}").strip()


#: The interconnect probe's flags on the shared parser (``interconnect_cli.add_arguments``).
INTERCONNECT_FLAGS = ("gpus", "size", "copy_size", "ranks")


def options_of(args: argparse.Namespace) -> ProbeOptions:
    """The parsed flags as :class:`~gpuperfd.probing.matrix.ProbeOptions`, with the interconnect flags
    given (the other probes refuse them by name)."""
    values = vars(args)
    given = tuple(name for name in INTERCONNECT_FLAGS if values.get(name) is not None)
    return ProbeOptions(**{f.name: values[f.name] for f in dataclasses.fields(ProbeOptions) if f.name in values},
                        interconnect_flags=given)


def main(args: argparse.Namespace) -> int:
    """Run the points the flags describe; returns the exit code."""
    if args.probe == INTERCONNECT:
        return interconnect_cli.main(args)
    options = options_of(args)
    try:
        options, specs = checked(options)
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


#: The cards the simulator models (config ``simulation.model``).
SIMULATED_MODELS: tuple[str, ...] = ("H100", "H200", "A100")


def simulated_model(text: str) -> str:
    """``--simulate-model``'s value: a simulated card, in any case (argparse's error names the flag)."""
    model = text.strip().upper()
    if model not in SIMULATED_MODELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a simulated card ({', '.join(SIMULATED_MODELS)})")
    return model


def _run_points(options: ProbeOptions, specs: list[ProbeSpec], abort: Any) -> int:
    from gpuperfd.probe_data.record import RecordError, parse_labels
    from gpuperfd.probe_data.recommend import point_words
    from gpuperfd.probe_data.cpu_path import timeout_hint
    from gpuperfd.probe_data.spec import default_timeout

    labels = parse_labels(options.label)
    points = Points(options, specs)
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
