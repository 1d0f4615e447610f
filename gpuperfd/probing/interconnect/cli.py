"""``gpuperfd probe interconnect``: one read-only interconnect probe across a set of GPUs.

Peer copy bandwidth per ordered pair and all-reduce latency and bus bandwidth per size, with checked
sums (:mod:`gpuperfd.probing.interconnect.runner`: one worker per GPU, NCCL); ``--device cpu`` runs
gloo ranks on this host (``--ranks N``: the tests and the CI), ``--simulate N`` the simulated node's
figures (its executor; the output says SIMULATED). Nothing falls back: GPUs asked for and not there
is an error. Prints a table (or ``--json``) and appends to ``--output FILE.csv|.jsonl``.

Exit codes as ``gpuperfd probe``'s: 0 ok, 1 failed, skipped (a user's job came) or aborted, 2 bad input,
3 no NVIDIA driver (as every command).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuperfd.console import format_table
from gpuperfd.device.errors import DeviceError, DriverNotFound
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.probing.check.cli import gpu_list

__all__ = ["add_arguments", "byte_size", "build_request", "result_tables", "write_output", "main", "CSV_COLUMNS"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_DEVICE = 0, 1, 2, 3
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
#: A CPU's gloo ranks share a few cores: sizes that finish in seconds unless asked for more.
CPU_DEFAULTS = {"copy_bytes": 1 << 20, "allreduce_bytes": (1 << 12, 1 << 20), "repeats": 5, "warmup": 1}
#: The columns of ``--output FILE.csv``: one row per ordered pair and one per all-reduce size.
CSV_COLUMNS = ("schema", "host", "started_at", "backend", "gpus", "status", "failure_reason", "kind", "src", "dst",
               "bytes", "ranks", "bandwidth_bytes_per_second", "cv", "latency_p50_seconds", "latency_p99_seconds",
               "algorithm_bandwidth_bytes_per_second", "bus_bandwidth_bytes_per_second", "check_ok",
               "energy_joules", "wall_seconds")
SCHEMA = "gpuperfd.interconnect/1"


class UsageError(ValueError):
    """Bad input for the interconnect probe; the message names the field."""


def byte_size(text: str) -> int:
    """``256MiB``, ``1G``, ``4096`` -> bytes (binary units); argparse makes a ValueError exit 2."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 64KiB, 256MiB, 1GiB)")
    return int(match.group(1)) * _UNITS[unit]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The interconnect probe's own flags on the ``probe`` parser (the rest are shared)."""
    group = parser.add_argument_group("interconnect (gpuperfd probe interconnect)")
    group.add_argument("--gpus", type=gpu_list, metavar="LIST", help="interconnect: the set, e.g. 0,1 or 0-3 "
                       "(default: every GPU of the node; at least two)")
    group.add_argument("--size", type=byte_size, nargs="+", metavar="BYTES",
                       help="interconnect: all-reduce size(s) per rank (default 1MiB 256MiB)")
    group.add_argument("--copy-size", type=byte_size, metavar="BYTES", help="interconnect: bytes per peer copy "
                       "(default 1GiB)")
    group.add_argument("--ranks", type=int, metavar="N", help="interconnect with --device cpu: gloo ranks (default 2)")


def build_request(args: argparse.Namespace) -> InterconnectRequest:
    """The request the flags describe (UsageError naming the flag)."""
    cpu = args.device == "cpu"
    base = InterconnectRequest(**(CPU_DEFAULTS if cpu else {}))
    dtypes = args.dtype or [base.dtype]
    if len(dtypes) != 1 or dtypes[0] not in ("bfloat16", "float16", "float32"):
        raise UsageError(f"dtype: interconnect takes one of bfloat16, float16, float32, got {' '.join(dtypes)}")
    for name in ("repeats", "warmup"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "repeats" else 0):
            raise UsageError(f"{name}: must be at least {1 if name == 'repeats' else 0}, got {value}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"timeout: must be > 0, got {args.timeout}")
    return InterconnectRequest(
        gpus=tuple(args.gpus) if args.gpus else None,
        copy_bytes=args.copy_size or base.copy_bytes,
        allreduce_bytes=tuple(args.size) if args.size else base.allreduce_bytes,
        repeats=args.repeats if args.repeats is not None else base.repeats,
        warmup=args.warmup if args.warmup is not None else base.warmup,
        dtype=dtypes[0], timeout_seconds=args.timeout or base.timeout_seconds)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def result_tables(result: InterconnectResult) -> str:
    """One row per ordered pair (GB/s) and one per all-reduce size (p50, algbw, busbw, sum ok)."""
    who = "rank" if result.backend == "gloo" else "GPU"
    copies = format_table(
        ["copy", "size", "GB/s", "CV%", "bytes ok"],
        [[f"{who} {c.src} -> {who} {c.dst}", _size(c.bytes), c.bandwidth_bytes_per_second / 1e9,
          c.cv * 100 if c.cv is not None else None, "ok" if c.ok else "WRONG"] for c in result.copies],
        align=["l", "r", "r", "r", "l"])
    reduces = format_table(
        ["all-reduce", "ranks", "p50 ms", "p99 ms", "algbw GB/s", "busbw GB/s", "sum"],
        [[_size(a.bytes), a.ranks, a.latency_p50_seconds * 1e3, a.latency_p99_seconds * 1e3,
          a.algorithm_bandwidth_bytes_per_second / 1e9, a.bus_bandwidth_bytes_per_second / 1e9,
          "ok" if a.sum_ok else "WRONG"] for a in result.allreduce],
        align=["r", "r", "r", "r", "r", "r", "l"])
    status = result.status if result.ok else f"{result.status}:{result.failure_reason}"
    energy = f", {result.energy_joules:.1f} J" if result.energy_joules is not None else ""
    wall = f"{result.wall_seconds:.1f} s" if result.wall_seconds is not None else "-"
    head = f"interconnect {result.backend} {who}s {','.join(map(str, result.gpus))}: {status}, {wall}{energy}"
    parts = [head] + ([copies] if result.copies else []) + ([reduces] if result.allreduce else [])
    if result.error_message:
        parts.append(result.error_message)
    return "\n".join(parts)


def csv_rows(result: InterconnectResult, host: str) -> list[dict[str, Any]]:
    """The flat rows of ``--output FILE.csv`` (CSV_COLUMNS): a run that measured nothing is one row."""
    common = {"schema": SCHEMA, "host": host, "started_at": result.started_at, "backend": result.backend,
              "gpus": ",".join(map(str, result.gpus)), "status": result.status,
              "failure_reason": result.failure_reason, "energy_joules": result.energy_joules,
              "wall_seconds": result.wall_seconds}
    rows = [{**common, "kind": "copy", "src": c.src, "dst": c.dst, "bytes": c.bytes, "ranks": 2,
             "bandwidth_bytes_per_second": c.bandwidth_bytes_per_second, "cv": c.cv, "check_ok": c.ok}
            for c in result.copies]
    rows += [{**common, "kind": "allreduce", "bytes": a.bytes, "ranks": a.ranks,
              "latency_p50_seconds": a.latency_p50_seconds, "latency_p99_seconds": a.latency_p99_seconds,
              "algorithm_bandwidth_bytes_per_second": a.algorithm_bandwidth_bytes_per_second,
              "bus_bandwidth_bytes_per_second": a.bus_bandwidth_bytes_per_second, "check_ok": a.sum_ok}
             for a in result.allreduce]
    return rows or [{**common, "kind": "run"}]


def check_output(path: str) -> None:
    """Refuse, before anything runs, a file this writer would not append to (nothing overwritten)."""
    target = Path(path)
    if target.suffix not in (".csv", ".jsonl"):
        raise UsageError(f"output: give a file name ending in .csv or .jsonl, got {path!r}")
    if target.is_dir() or not target.parent.exists():
        raise UsageError(f"output: {path} is a directory or its folder does not exist")
    if not target.exists() or target.stat().st_size == 0:
        return
    with open(target, encoding="utf-8", errors="replace") as fh:
        first = fh.readline()
    good = (next(csv.reader([first]), []) == list(CSV_COLUMNS) if target.suffix == ".csv"
            else first.startswith("{") and json.loads(first).get("schema") == SCHEMA)
    if not good:
        raise UsageError(f"output: {path} exists and is not a gpuperfd interconnect file of this format; "
                         "give a new file name (nothing was overwritten)")


def write_output(path: str, result: InterconnectResult, host: str | None = None) -> None:
    """Append the run to ``path``: CSV rows (CSV_COLUMNS) or one JSON line, the daemon's history record
    (``gpuperfd.interconnect/1``: time, host, source, the set, the result)."""
    host = host or socket.gethostname()
    target = Path(path)
    new = not target.exists() or target.stat().st_size == 0
    with open(target, "a", encoding="utf-8", newline="") as fh:
        if target.suffix == ".csv":
            writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
            if new:
                writer.writeheader()
            writer.writerows(csv_rows(result, host))
        else:
            record = {"schema": SCHEMA, "time": float(result.started_at or time.time()), "host": host,
                      "source": "probe", "gpus": [{"index": gpu} for gpu in result.gpus], "result": result.to_dict()}
            fh.write(json.dumps(record) + "\n")


def _check_flags(args: argparse.Namespace) -> None:
    """Flags of the other probes mean nothing here: refused by name, not ignored."""
    if getattr(args, "config", None):
        raise UsageError("config: interconnect takes its settings as flags, not --config")
    for name in ("preset", "variant", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size",
                 "n_groups", "weights", "dataset", "iterations", "measure_seconds", "warmup_seconds", "heads",
                 "head_dim", "causal", "seed", "gpu_busy_threshold", "label"):
        if getattr(args, name, None) is not None:
            raise UsageError(f"{name}: not an interconnect setting (see gpuperfd probe --help, interconnect)")
    if getattr(args, "no_idle_check", False):
        raise UsageError("no_idle_check: the interconnect probe always checks and watches every GPU of its set")
    if args.device not in (None, "cuda", "cpu"):
        raise UsageError(f"device: interconnect runs on cuda (one rank per GPU of --gpus) or cpu, not {args.device!r}")
    if args.ranks is not None and (args.device != "cpu" or args.ranks < 2):
        raise UsageError(f"ranks: --ranks N (at least 2) goes with --device cpu, got {args.ranks}")
    if args.simulate is not None and (args.simulate < 1 or args.device == "cpu"):
        raise UsageError("simulate: --simulate N (N >= 1) runs on simulated GPUs, not with --device cpu")
    if getattr(args, "simulate_model", None) is not None and args.simulate is None:
        raise UsageError("simulate_model: goes with --simulate N (the simulated GPUs' card)")


def _run(args: argparse.Namespace, request: InterconnectRequest, abort: threading.Event) -> InterconnectResult:
    """Open the devices (simulated, NVML or none for gloo), run the probe on them, close them."""
    from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor

    backend: Any = None
    try:
        if args.simulate is not None:
            from gpuperfd.config import config_with_flags
            from gpuperfd.device.factory import open_backend
            from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor

            config = config_with_flags(None, {"simulation.model": getattr(args, "simulate_model", None)},
                                       simulate=args.simulate)
            backend = open_backend(config)
            executor: Any = SimulatedInterconnectExecutor(backend.interconnect, seed=config.simulation.seed)
            devices = backend.devices()
        elif args.device == "cpu":
            ranks = args.ranks or (max(request.gpus) + 1 if request.gpus else 2)
            executor, devices = ProcessInterconnectExecutor("cpu", ranks=ranks), []
        else:
            from gpuperfd.device.nvml import NvmlBackend

            backend = NvmlBackend(indices=None)  # a missing driver raises: never a silent CPU run
            devices = backend.devices()
            executor = ProcessInterconnectExecutor("cuda", idle_utilization_threshold=args.idle_threshold)
        return executor.run(devices, request, abort)
    finally:
        if backend is not None:
            backend.close()


def main(args: argparse.Namespace) -> int:
    """Run one interconnect probe as ``args`` say; the exit code."""
    from gpuperfd.system.stopsignals import StopSignals, say

    try:
        _check_flags(args)
        request = build_request(args)
        if args.output is not None:
            check_output(args.output)
    except UsageError as exc:
        print(f"gpuperfd probe interconnect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    abort = threading.Event()
    with StopSignals(abort) as stop:
        try:
            result = _run(args, request, abort)
        except ValueError as exc:  # a bad set: named, nothing started
            print(f"gpuperfd probe interconnect: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except DeviceError as exc:  # no driver, a GPU that does not answer: never a silent CPU run
            print(f"gpuperfd probe interconnect: {exc}", file=sys.stderr)
            return EXIT_DEVICE if isinstance(exc, DriverNotFound) else EXIT_FAILURE
    if stop.received is not None:
        say(f"gpuperfd probe interconnect: stopped by {stop.name}; every worker was ended")
    if args.output:
        write_output(args.output, result)
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(("SIMULATED (the simulated node's figures, not a measurement)\n" if args.simulate else "")
              + result_tables(result))
    return stop.exit_code if stop.received is not None else (EXIT_OK if result.ok else EXIT_FAILURE)


