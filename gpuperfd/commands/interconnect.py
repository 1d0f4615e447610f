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
import dataclasses
import json
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuperfd.console import format_table
from gpuperfd.device.errors import DeviceError, DriverNotFound
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.commands.check import gpu_list
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD

__all__ = ["InterconnectOptions", "add_arguments", "byte_size", "build_request", "result_tables", "write_output",
           "main", "CSV_COLUMNS"]

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


#: The other probes' flags on the shared ``probe`` parser: refused by name here, never ignored.
OTHER_PROBES_FLAGS = ("preset", "variant", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size",
                      "n_groups", "weights", "dataset", "iterations", "measure_seconds", "warmup_seconds", "heads",
                      "head_dim", "causal", "seed", "gpu_busy_threshold", "label")


@dataclass(frozen=True)
class InterconnectOptions:
    """``gpuperfd probe interconnect``'s flags, typed once from the ``probe`` parser's namespace."""

    gpus: list[int] | None = None
    size: list[int] | None = None
    copy_size: int | None = None
    ranks: int | None = None
    device: str | None = None
    dtype: list[str] | None = None
    repeats: int | None = None
    warmup: int | None = None
    timeout: float | None = None
    idle_threshold: float = DEFAULT_IDLE_THRESHOLD
    simulate: int | None = None
    simulate_model: str | None = None
    output: str | None = None
    json: bool = False
    #: Given flags that are not this probe's (``--config``, ``--no-idle-check`` and :data:`OTHER_PROBES_FLAGS`).
    foreign: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> InterconnectOptions:
        values = vars(args)
        foreign = (("config",) if values.get("config") else ()) + tuple(
            name for name in OTHER_PROBES_FLAGS if values.get(name) is not None)
        foreign += ("no_idle_check",) if values.get("no_idle_check") else ()
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}, foreign=foreign)


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


def build_request(options: InterconnectOptions) -> InterconnectRequest:
    """The request the flags describe (UsageError naming the flag)."""
    cpu = options.device == "cpu"
    base = InterconnectRequest(**(CPU_DEFAULTS if cpu else {}))
    dtypes = options.dtype or [base.dtype]
    if len(dtypes) != 1 or dtypes[0] not in ("bfloat16", "float16", "float32"):
        raise UsageError(f"dtype: interconnect takes one of bfloat16, float16, float32, got {' '.join(dtypes)}")
    for name, value, least in (("repeats", options.repeats, 1), ("warmup", options.warmup, 0)):
        if value is not None and value < least:
            raise UsageError(f"{name}: must be at least {least}, got {value}")
    if options.timeout is not None and options.timeout <= 0:
        raise UsageError(f"timeout: must be > 0, got {options.timeout}")
    return InterconnectRequest(
        gpus=tuple(options.gpus) if options.gpus else None,
        copy_bytes=options.copy_size or base.copy_bytes,
        allreduce_bytes=tuple(options.size) if options.size else base.allreduce_bytes,
        repeats=options.repeats if options.repeats is not None else base.repeats,
        warmup=options.warmup if options.warmup is not None else base.warmup,
        dtype=dtypes[0], timeout_seconds=options.timeout or base.timeout_seconds)


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


def _check_flags(options: InterconnectOptions) -> None:
    """Flags of the other probes mean nothing here: refused by name, not ignored."""
    if "config" in options.foreign:
        raise UsageError("config: interconnect takes its settings as flags, not --config")
    if other := [name for name in options.foreign if name != "no_idle_check"]:
        raise UsageError(f"{other[0]}: not an interconnect setting (see gpuperfd probe --help, interconnect)")
    if "no_idle_check" in options.foreign:
        raise UsageError("no_idle_check: the interconnect probe always checks and watches every GPU of its set")
    if options.device not in (None, "cuda", "cpu"):
        raise UsageError(f"device: interconnect runs on cuda (one rank per GPU of --gpus) or cpu, not {options.device!r}")
    if options.ranks is not None and (options.device != "cpu" or options.ranks < 2):
        raise UsageError(f"ranks: --ranks N (at least 2) goes with --device cpu, got {options.ranks}")
    if options.simulate is not None and (options.simulate < 1 or options.device == "cpu"):
        raise UsageError("simulate: --simulate N (N >= 1) runs on simulated GPUs, not with --device cpu")
    if options.simulate_model is not None and options.simulate is None:
        raise UsageError("simulate_model: goes with --simulate N (the simulated GPUs' card)")


def _open_backend(options: InterconnectOptions) -> Any:
    """The devices' backend: the simulated node (``--simulate``), NVML (a missing driver raises: never a
    silent CPU run), or None for gloo ranks on this host's CPU."""
    if options.simulate is not None:
        from gpuperfd.config import config_with_flags
        from gpuperfd.device.factory import open_backend

        return open_backend(config_with_flags(None, {"simulation.model": options.simulate_model},
                                              simulate=options.simulate))
    if options.device == "cpu":
        return None
    from gpuperfd.device.nvml import NvmlBackend

    return NvmlBackend(indices=None)


def _run(options: InterconnectOptions, request: InterconnectRequest, abort: threading.Event) -> InterconnectResult:
    """Open the devices, run the probe on them through the one executor choice, close them."""
    from gpuperfd.probing.executors import interconnect_executor

    backend = _open_backend(options)
    try:
        ranks = None
        if backend is None:
            ranks = options.ranks or (max(request.gpus) + 1 if request.gpus else 2)
        executor, _ = interconnect_executor(backend, options.device or "cuda",
                                            idle_utilization_threshold=options.idle_threshold, ranks=ranks)
        return executor.run(backend.devices() if backend is not None else [], request, abort)
    finally:
        if backend is not None:
            backend.close()


def main(args: argparse.Namespace) -> int:
    """Run one interconnect probe as the flags say; the exit code."""
    from gpuperfd.system.stopsignals import StopSignals, say

    options = InterconnectOptions.from_args(args)
    try:
        _check_flags(options)
        request = build_request(options)
        if options.output is not None:
            check_output(options.output)
    except UsageError as exc:
        print(f"gpuperfd probe interconnect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    abort = threading.Event()
    with StopSignals(abort) as stop:
        try:
            result = _run(options, request, abort)
        except ValueError as exc:  # a bad set: named, nothing started
            print(f"gpuperfd probe interconnect: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except DeviceError as exc:  # no driver, a GPU that does not answer: never a silent CPU run
            print(f"gpuperfd probe interconnect: {exc}", file=sys.stderr)
            return EXIT_DEVICE if isinstance(exc, DriverNotFound) else EXIT_FAILURE
    if stop.received is not None:
        say(f"gpuperfd probe interconnect: stopped by {stop.name}; every worker was ended")
    if options.output:
        write_output(options.output, result)
    if options.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(("SIMULATED (the simulated node's figures, not a measurement)\n" if options.simulate else "")
              + result_tables(result))
    return stop.exit_code if stop.received is not None else (EXIT_OK if result.ok else EXIT_FAILURE)
