"""``gpuperfd sweep`` (one power-cap sweep from the command line) and ``gpuperfd restore-caps``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
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


def _probe_list(text: str) -> list[str]:
    from gpuperfd.probe_data.spec import PROBES

    probes = [p.strip() for p in text.split(",")]
    for probe in probes:
        if probe not in PROBES:
            raise argparse.ArgumentTypeError(f"unknown probe {probe!r}; use one or more of {', '.join(PROBES)}")
    if len(set(probes)) != len(probes):
        raise argparse.ArgumentTypeError(f"{text!r} names a probe twice")
    return probes


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
    sweep.add_argument("--probe", required=True, type=_probe_list, metavar="PROBE[,PROBE...]",
                       help="llm, vit, attention, train; several (llm,train) sweep one after another, "
                            "inference and training side by side in --report")
    sweep.add_argument("--caps", required=True, metavar="LIST",
                       help="comma-separated caps: watts (450), fractions of the maximum (0.8), min, max, default, current")
    sweep.add_argument("--gpu", type=int, default=0, metavar="I", help="GPU index (default 0)")
    sweep.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="when another process owns the GPU's cap, wait this long for it (default: refuse at once)")
    sweep.add_argument("--preset", help="probe preset (default: the probe's default)")
    sweep.add_argument("--option", action="append", type=_parse_option, default=[], metavar="KEY=VALUE",
                       help="probe option, repeatable (e.g. batch_size=8)")
    sweep.add_argument("--settle", type=float, default=5.0, metavar="SECONDS",
                       help="after each cap change, wait at most this long for the limit to read back and for "
                            "power and SM clock to be steady under load (default 5)")
    sweep.add_argument("--no-stop-early", dest="stop_early", action="store_false",
                       help="run every cap, even below one already clearly slower than --max-slowdown allows")
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
    sweep.add_argument("--report", metavar="DIR", help="also write the report (HTML, PNG, CSV) into DIR")
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


def _read_only(args: argparse.Namespace, config: Config) -> bool:
    """--read-only, or ``probes.read_only`` when the config file sets it. Its default (true) guards the
    daemon against a half-written file; ``gpuperfd sweep --caps ...`` typed by hand is explicit consent."""
    return bool(args.read_only or ("read_only" in config.probes.model_fields_set and config.probes.read_only))


def _cap_report(device: Any, original: float | None, journal: Any) -> str:
    """What the cap really is now (read back from the GPU), for the last line of a stopped sweep."""
    from gpuperfd.device.errors import DeviceError

    try:
        back = device.power_limits().enforced_watts
    except DeviceError as exc:
        return f"gpu {device.index}: cannot read the power cap back ({exc}); run `gpuperfd restore-caps`"
    pending = os.path.lexists(journal.path_for(device.info().uuid))
    if original is not None and round(back) == round(original) and not pending:
        return f"gpu {device.index}: power cap restored, reads back {back:.0f} W (the original)"
    kept = f"; the journal keeps the original {original:.0f} W" if pending and original is not None else ""
    return f"gpu {device.index}: power cap NOT restored, reads back {back:.0f} W{kept}; run `gpuperfd restore-caps`"


def cmd_sweep(args: argparse.Namespace) -> int:
    from gpuperfd.device.errors import DeviceError
    from gpuperfd.device.factory import open_backend
    from gpuperfd.probe_data.record import RecordError, check_output
    from gpuperfd.probing.sweep.caps import CapSpecError, parse_cap_list
    from gpuperfd.system.logs import setup_logging
    from gpuperfd.system.stopsignals import StopSignals, say

    if args.output:
        try:
            check_output(args.output)
        except RecordError as exc:
            print(f"gpuperfd: --{exc}", file=sys.stderr)
            return 2
    if not 0 <= args.max_slowdown < 1:
        print("gpuperfd: --max-slowdown must be in [0, 1)", file=sys.stderr)
        return 2
    if not args.wait >= 0:
        print("gpuperfd: --wait must be >= 0 seconds", file=sys.stderr)
        return 2
    if args.report:
        try:
            import matplotlib  # noqa: F401  (checked before any GPU time is spent)
        except ImportError:
            print("gpuperfd: --report needs matplotlib: pip install 'gpuperfd[report]'", file=sys.stderr)
            return 2
    try:
        caps_spec = parse_cap_list(args.caps)
        schedules = [
            ScheduleConfig(probe=probe, preset=args.preset, interval_seconds=3600, caps=caps_spec,
                           settle_seconds=args.settle, options=dict(args.option))
            for probe in args.probe
        ]
    except (CapSpecError, ValueError) as exc:
        print(f"gpuperfd: --caps/--option: {_one_line(exc)}", file=sys.stderr)
        return 2
    config = _load(args)
    setup_logging(config.log_level)
    abort = threading.Event()
    # From here on every stop signal only sets `abort`: the cap is put back before we exit.
    with StopSignals(abort) as stop:
        try:
            backend = open_backend(config)
            devices = {d.index: d for d in backend.devices()}
        except DeviceError as exc:
            say(f"gpuperfd: {exc}")
            return 3
        try:
            if args.gpu not in devices:
                say(f"gpuperfd: --gpu {args.gpu}: no such GPU (have {sorted(devices)})")
                return 2
            code = _sweep_owned(args, config, devices[args.gpu], schedules, caps_spec, abort, stop)
        finally:
            backend.close()
    return code


def _sweep_owned(args, config, device, schedules, caps_spec, abort, stop) -> int:  # type: ignore[no-untyped-def]
    """Own GPU ``device``'s cap (cross-process lock), restore what a dead owner left, sweep, report."""
    from gpuperfd.device.errors import DeviceError
    from gpuperfd.probing.executors import child_process_executor, simulated_executor
    from gpuperfd.probing.idle import busy_reason
    from gpuperfd.probing.sweep.caps import CapSpecError, resolve_caps
    from gpuperfd.probing.sweep.journal import CapJournal, restore_pending
    from gpuperfd.probing.sweep.ownership import GpuBusy, GpuLock, is_owned, safe_name
    from gpuperfd.probe_data.recommend import SweepPoint
    from gpuperfd.probing.sweep.sweeper import SweepAborted
    from gpuperfd.system.stopsignals import say

    journal = CapJournal(config.probes.state_dir)
    read_only = _read_only(args, config)
    name = safe_name(device.info().uuid)
    lock: GpuLock | None = GpuLock(journal.state_dir, name)
    try:
        lock.acquire(wait_seconds=args.wait, cancel=abort.is_set)
    except GpuBusy as busy:
        if stop.received is not None:
            say(f"gpuperfd: stopped by {stop.name} while waiting for gpu {device.index}; nothing was changed")
            return stop.exit_code
        say(f"gpuperfd: gpu {device.index}: its power cap is owned by "
            f"{'pid %d' % busy.owner_pid if busy.owner_pid else 'another process'} (a sweep or probe is running); "
            "not sweeping")
        return 1
    except OSError as exc:
        if not read_only:
            say(f"gpuperfd: cannot use the state directory {journal.state_dir} ({exc.strerror or exc}); not sweeping")
            return 1
        if (owner := is_owned(journal.state_dir, name)) is not None:
            say(f"gpuperfd: gpu {device.index}: its power cap is owned by pid {owner}; not probing")
            return 1
        lock = None
    original: float | None = None
    records = SweepRecords(args.output, device.info())
    sweeps: list[tuple[str, list[SweepPoint]]] = []
    try:
        if lock is not None:  # a leftover of this GPU only: its owner is dead (we hold its lock)
            restore_pending(journal, [device], only=[device.info().uuid], lock=False)
        original = device.power_limits().enforced_watts
        if abort.is_set():
            raise SweepAborted("stopped before the sweep started")
        reason = busy_reason(device, config.probes.idle_utilization_threshold, own_pids=(os.getpid(),))
        if reason is not None:
            say(f"gpuperfd: gpu {args.gpu} is busy ({reason}); not sweeping")
            return 1
        try:
            caps = resolve_caps(caps_spec, device.power_limits(), strict=not args.clamp)
        except CapSpecError as exc:
            say(f"gpuperfd: --caps: {exc}")
            return 2
        if config.device.backend == "simulated":
            executor = simulated_executor(config.probes.simulated_measure_seconds, seed=config.simulation.seed)
        else:
            executor = child_process_executor(config.probes.timeout_seconds, config.probes.torch_device,
                                              state_dir=journal.state_dir)
        for schedule in schedules:
            points: list[SweepPoint] = []
            sweeps.append((schedule.probe, points))
            records.start(original)
            _run_with_bar(args, device, journal, caps, schedule, executor, abort, read_only,
                          lambda point, points=points: (points.append(point), records.add(point)))
    except SweepAborted:
        pass  # reported below, with the cap read back
    except DeviceError as exc:
        say(f"gpuperfd: gpu {device.index}: {exc}")
        say(f"gpuperfd: {_cap_report(device, original, journal)}")
        return 1
    except OSError as exc:  # the journal could not be written (read-only or full state directory)
        say(f"gpuperfd: {exc.strerror or exc}")
        say(f"gpuperfd: {_cap_report(device, original, journal)}")
        return 1
    finally:
        if lock is not None:
            lock.release()
    if stop.received is not None:
        say(f"gpuperfd: sweep stopped by {stop.name}; {_cap_report(device, original, journal)}")
        return stop.exit_code
    code = 0
    for probe, points in sweeps:
        code = max(code, _print_results(args, probe, points))
    if args.report:
        code = max(code, _write_report(args, records.records))
    return code


class SweepRecords:
    """Each point as a run record (``gpuperfd.run/1``, what `gpuperfd report` reads), kept for
    ``--report`` and appended to ``path`` as it comes (a stopped sweep keeps its points)."""

    def __init__(self, path: str | None, gpu: Any) -> None:
        self.path = path
        self.gpu = {k: v for k, v in dataclasses.asdict(gpu).items() if k != "serial"}
        self.records: list[dict[str, Any]] = []
        self.original: float | None = None
        self.sweep_id = ""

    def start(self, original: float | None) -> None:
        import uuid

        self.original = original
        self.sweep_id = f"cli-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def add(self, point: Any) -> None:
        from gpuperfd.probe_data.record import RecordError, append_records, build_record
        from gpuperfd.system.stopsignals import say

        record = build_record(point.result, "sweep", gpu=self.gpu, power_cap_watts=point.cap_watts,
                              original_cap_watts=self.original, sweep_id=self.sweep_id)
        self.records.append(record)
        if self.path is not None:
            try:
                append_records(self.path, [record])
            except (RecordError, OSError) as exc:
                say(f"gpuperfd: --output: {exc}")


def _write_report(args: argparse.Namespace, records: list[dict[str, Any]]) -> int:
    """The report of this command's points, written into ``--report DIR`` (inference and training side by side)."""
    from gpuperfd.report import build_report, write_report
    from gpuperfd.report.records import Loaded, ReportError, run_from_history

    loaded = Loaded([run_from_history(r, "gpuperfd sweep") for r in records], ["gpuperfd sweep"])
    try:
        files = write_report(build_report(loaded, args.max_slowdown), args.report)
    except ReportError as exc:
        print(f"gpuperfd: --report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpuperfd: --report: cannot write the report: {exc}", file=sys.stderr)
        return 1
    print(f"report: {files.html}")
    return 0


def _run_with_bar(args, device, journal, caps, schedule, executor, abort, read_only, on_point) -> None:  # type: ignore[no-untyped-def]
    from gpuperfd.console import ProgressBar
    from gpuperfd.probing.executors import open_session
    from gpuperfd.probing.sweep.sweeper import run_sweep

    bar = ProgressBar(1 if read_only else len(caps), desc=f"sweep {schedule.probe} gpu{args.gpu}",
                      enabled=False if args.no_progress else None)

    def quietly(action) -> None:  # type: ignore[no-untyped-def]
        try:  # a closed terminal (EIO) must not cut the sweep short of its restore
            action()
        except (OSError, ValueError):
            pass

    quietly(bar.__enter__)
    session = open_session(executor, device, schedule, abort)  # one warm child for the whole sweep
    try:
        run_sweep(
            device, journal, caps, session.measure,
            settle_seconds=args.settle, read_only=read_only, abort=abort,
            on_cap=lambda watts: quietly(lambda: bar.set_message(f"{watts:.0f} W" if watts else "restored")),
            on_point=lambda point: (on_point(point), quietly(lambda: bar.update(1))),
            stop_early=args.max_slowdown if args.stop_early else None,
        )
    finally:
        session.close()
        quietly(lambda: bar.__exit__(None, None, None))


def _rows(points: list) -> list[dict[str, Any]]:  # type: ignore[type-arg]
    """The table's rows (and the CSV's)."""
    from gpuperfd.probe_data.recommend import work_rate

    rows = []
    for point in points:
        r = point.result
        rows.append({
            "cap_watts": point.cap_watts, "status": r.status, "reason": r.failure_reason or "",
            "units_per_second": work_rate(r), "unit": r.work_unit,
            "energy_per_unit_joules": r.energy_per_unit_joules, "average_power_watts": r.average_power_watts,
            "sm_clock_hertz": r.sm_clock_hertz_mean, "gpu_busy_ratio": r.gpu_busy_ratio,
            "clock_events": " ".join(r.clock_events_seen),
            "settle_seconds": _settle_seconds(r),
        })
    return rows


def _settle_seconds(result: Any) -> float | None:
    """How long the point waited for its cap: the limit's read back plus steady power and clock under load."""
    parts = [result.extra.get("cap_read_back_seconds"), result.extra.get("settle_seconds")]
    known = [p for p in parts if isinstance(p, int | float)]
    return sum(known) if known else None


def _print_results(args: argparse.Namespace, probe: str, points: list) -> int:  # type: ignore[type-arg]
    """The table of one probe's sweep and its recommendation; 1 when a point failed."""
    from gpuperfd.console import format_table
    from gpuperfd.probe_data.recommend import recommend

    rows = _rows(points)
    print(f"\n{probe}:")
    print(format_table(
        ["cap W", "status", "units/s", "J/unit", "avg W", "SM MHz", "busy", "settle s"],
        [[row["cap_watts"], row["status"] if row["status"] == "ok" else f"{row['status']} ({row['reason']})",
          row["units_per_second"], row["energy_per_unit_joules"], row["average_power_watts"],
          (row["sm_clock_hertz"] or 0) / 1e6 or None, row["gpu_busy_ratio"], row["settle_seconds"]]
         for row in rows],
    ))
    best = recommend(points, args.max_slowdown)
    if best is not None and len(points) > 1:
        print(
            f"\nrecommended cap: {best.cap_watts:.0f} W: {100 * best.energy_saving_ratio:.1f}% less energy per "
            f"{points[0].result.work_unit}, {100 * best.slowdown_ratio:.1f}% slower than {best.baseline_cap_watts:.0f} W "
            f"(rule: lowest energy among caps at most {100 * args.max_slowdown:.0f}% slower than the highest)"
        )
    return 0 if all(p.result.status in ("ok", "skipped") for p in points) else 1


def cmd_restore_caps(args: argparse.Namespace) -> int:
    from gpuperfd.device.errors import DeviceError
    from gpuperfd.device.factory import open_backend
    from gpuperfd.probing.sweep.journal import CapJournal, restore_pending
    from gpuperfd.probing.sweep.ownership import is_owned
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
        restore_pending(journal, backend.devices())  # only entries whose owner is gone
    finally:
        backend.close()
    left = 0
    for path, _ in journal.entries():
        owner = is_owned(journal.state_dir, path.name[: -len(CapJournal.SUFFIX)])
        if owner is not None:
            print(f"gpuperfd: {path}: a running sweep (pid {owner}) owns this GPU and restores it; not touched",
                  file=sys.stderr)
        else:
            left += 1
            print(f"gpuperfd: still changed: {path}", file=sys.stderr)
    return 1 if left else 0
