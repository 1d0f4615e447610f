"""``gpuperfd sweep`` (one power-cap sweep from the command line) and ``gpuperfd restore-caps``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from typing import Any

from gpuperfd.config import Config, ScheduleConfig, config_with_flags

log = logging.getLogger(__name__)


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"option {text!r} must be KEY=VALUE (e.g. batch_size=8)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def register(subparsers: Any) -> None:
    sweep = subparsers.add_parser(
        "sweep",
        help="run one probe at a list of power caps and recommend a cap",
        description=(
            "Run one probe on one GPU at each power cap of a list (highest first), restore the original cap, "
            "print a table and the recommended cap (lowest energy per unit of work within --max-slowdown of "
            "the highest cap). The original cap is journaled before the first change."
        ),
    )
    sweep.add_argument("--probe", required=True, choices=["llm", "vit", "attention", "train"])
    sweep.add_argument("--caps", required=True, metavar="LIST",
                       help="comma-separated caps: watts (450), fractions of the maximum (0.8), min, max, default, current")
    sweep.add_argument("--gpu", type=int, default=0, metavar="I", help="GPU index (default 0)")
    sweep.add_argument("--preset", help="probe preset (default: the probe's default)")
    sweep.add_argument("--option", action="append", type=_parse_option, default=[], metavar="KEY=VALUE",
                       help="probe option, repeatable (e.g. batch_size=8)")
    sweep.add_argument("--settle", type=float, default=5.0, metavar="SECONDS", help="wait after each cap change")
    sweep.add_argument("--max-slowdown", type=float, default=0.10, help="slowdown allowed for the recommendation")
    sweep.add_argument("--read-only", action="store_true", help="never change the cap: probe at the current cap only")
    sweep.add_argument("--simulate", type=int, metavar="N", help="run on N simulated GPUs")
    sweep.add_argument("--config", metavar="FILE", help="config file (device, simulation, state_dir)")
    sweep.add_argument("--state-dir", metavar="DIR", help="power-cap journal directory (default from config)")
    sweep.add_argument("--clamp", action="store_true",
                       help="clamp caps outside the board's range to it (default: such a cap is an error)")
    sweep.add_argument("--output", metavar="FILE",
                       help="append each point as a run record to FILE.csv or FILE.jsonl (docs/reports.md); "
                            "an existing file of another format is refused, never overwritten")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.set_defaults(func=cmd_sweep)

    restore = subparsers.add_parser(
        "restore-caps",
        help="restore power caps a crashed run left changed (systemd ExecStartPre/ExecStopPost)",
        description="Restore every original power cap recorded in the journal; exit 0 when none is left changed.",
    )
    restore.add_argument("--config", metavar="FILE")
    restore.add_argument("--state-dir", metavar="DIR")
    restore.add_argument("--simulate", type=int, metavar="N")
    restore.set_defaults(func=cmd_restore_caps)


def _load(args: argparse.Namespace) -> Config:
    return config_with_flags(args.config, {"probes.state_dir": args.state_dir}, simulate=args.simulate)


def _one_line(exc: Exception) -> str:
    """A validation error as one line naming the field (no pydantic class names or URLs)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {message}" if where and not message.startswith(("options", "caps")) else message
    return str(exc)


def cmd_sweep(args: argparse.Namespace) -> int:
    from gpuperfd.console import ProgressBar, format_table
    from gpuperfd.device.errors import DeviceError
    from gpuperfd.device.factory import open_backend
    from gpuperfd.probes.record import (
        RecordError,
        append_records,
        build_record,
        check_output,
    )
    from gpuperfd.probing.executors import child_process_executor, simulated_executor
    from gpuperfd.probing.idle import busy_reason
    from gpuperfd.probing.sweep.caps import CapSpecError, parse_cap_list, resolve_caps
    from gpuperfd.probing.sweep.journal import CapJournal, restore_pending
    from gpuperfd.probing.sweep.sweeper import (
        SweepAborted,
        SweepPoint,
        recommend,
        run_sweep,
        work_rate,
    )
    from gpuperfd.system.logs import setup_logging

    if args.output:
        try:
            check_output(args.output)
        except RecordError as exc:
            print(f"gpuperfd: --{exc}", file=sys.stderr)
            return 2
    if not 0 <= args.max_slowdown < 1:
        print("gpuperfd: --max-slowdown must be in [0, 1)", file=sys.stderr)
        return 2
    try:
        caps_spec = parse_cap_list(args.caps)
        schedule = ScheduleConfig(
            probe=args.probe, preset=args.preset, interval_seconds=3600, caps=caps_spec,
            settle_seconds=args.settle, options=dict(args.option),
        )
    except (CapSpecError, ValueError) as exc:
        print(f"gpuperfd: --caps/--option: {_one_line(exc)}", file=sys.stderr)
        return 2
    config = _load(args)
    setup_logging(config.log_level)
    try:
        backend = open_backend(config)
        devices = {d.index: d for d in backend.devices()}
    except DeviceError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 3
    if args.gpu not in devices:
        print(f"gpuperfd: --gpu {args.gpu}: no such GPU (have {sorted(devices)})", file=sys.stderr)
        return 2
    device = devices[args.gpu]
    journal = CapJournal(config.probes.state_dir)
    restore_pending(journal, devices.values())
    reason = busy_reason(device, config.probes.idle_utilization_threshold, own_pids=(os.getpid(),))
    if reason is not None:
        print(f"gpuperfd: gpu {args.gpu} is busy ({reason}); not sweeping", file=sys.stderr)
        return 1
    try:
        caps = resolve_caps(caps_spec, device.power_limits(), strict=not args.clamp)
    except CapSpecError as exc:
        backend.close()
        print(f"gpuperfd: --caps: {exc}", file=sys.stderr)
        return 2
    read_only = args.read_only or config.probes.read_only
    if backend.name == "simulated":
        executor = simulated_executor(config.probes.simulated_measure_seconds, seed=config.simulation.seed)
    else:
        executor = child_process_executor(config.probes.timeout_seconds, config.probes.torch_device)
    abort = threading.Event()
    points: list[SweepPoint] = []
    info = device.info()
    gpu = {k: v for k, v in dataclasses.asdict(info).items() if k != "serial"}
    sweep_id = f"cli-{os.getpid()}-{int(time.time())}"

    def on_point(point: SweepPoint) -> None:
        points.append(point)
        bar.update(1)
        if args.output:  # one record per point as it lands: an interrupted sweep keeps what it measured
            try:
                append_records(args.output, [build_record(point.result, "sweep", gpu=gpu,
                                                          power_cap_watts=point.cap_watts, sweep_id=sweep_id)])
            except (RecordError, OSError) as exc:
                bar.write(f"gpuperfd: --output: {exc}")

    bar = ProgressBar(1 if read_only else len(caps), desc=f"sweep {args.probe} gpu{args.gpu}",
                      enabled=False if args.no_progress else None)
    try:
        with bar:
            run_sweep(
                device, journal, caps, lambda cap: executor(device, schedule, abort),
                settle_seconds=args.settle, read_only=read_only, abort=abort,
                on_cap=lambda watts: bar.set_message(f"{watts:.0f} W" if watts else "restored"),
                on_point=on_point,
            )
    except (KeyboardInterrupt, SweepAborted):
        print("gpuperfd: sweep interrupted; original cap restored", file=sys.stderr)
        return 1
    finally:
        backend.close()
    rows = []
    for point in points:
        r = point.result
        rows.append({
            "cap_watts": point.cap_watts, "status": r.status, "reason": r.failure_reason or "",
            "units_per_second": work_rate(r), "unit": r.work_unit,
            "energy_per_unit_joules": r.energy_per_unit_joules, "average_power_watts": r.average_power_watts,
            "sm_clock_hertz": r.sm_clock_hertz_mean, "gpu_busy_ratio": r.gpu_busy_ratio,
            "clock_events": " ".join(r.clock_events_seen),
        })
    print(format_table(
        ["cap W", "status", "units/s", "J/unit", "avg W", "SM MHz", "busy"],
        [[row["cap_watts"], row["status"], row["units_per_second"], row["energy_per_unit_joules"],
          row["average_power_watts"], (row["sm_clock_hertz"] or 0) / 1e6 or None, row["gpu_busy_ratio"]]
         for row in rows],
    ))
    best = recommend(points, args.max_slowdown)
    if best is not None and len(points) > 1:
        print(
            f"\nrecommended cap: {best.cap_watts:.0f} W: {100 * best.energy_saving_ratio:.1f}% less energy per "
            f"{points[0].result.work_unit}, {100 * best.slowdown_ratio:.1f}% slower than {best.baseline_cap_watts:.0f} W "
            f"(rule: lowest energy among caps at most {100 * args.max_slowdown:.0f}% slower than the highest)"
        )
    return 0 if all(p.result.status == "ok" for p in points) else 1


def cmd_restore_caps(args: argparse.Namespace) -> int:
    from gpuperfd.device.errors import DeviceError
    from gpuperfd.device.factory import open_backend
    from gpuperfd.probing.sweep.journal import CapJournal, restore_pending
    from gpuperfd.system.logs import setup_logging

    config = _load(args)
    setup_logging(config.log_level)
    journal = CapJournal(config.probes.state_dir)
    if not journal.entries():
        return 0
    try:
        backend = open_backend(config)
    except DeviceError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 3
    try:
        restore_pending(journal, backend.devices())
    finally:
        backend.close()
    left = journal.entries()
    for path, _ in left:
        print(f"gpuperfd: still changed: {path}", file=sys.stderr)
    return 1 if left else 0

