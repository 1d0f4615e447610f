"""``gpuperfd sweep`` (one power-cap sweep from the command line) and ``gpuperfd restore-caps``.

The flags become one typed :class:`SweepArgs` at the door; the sweep itself is the one owned
sweep the daemon runs too (:func:`gpuperfd.probing.sweep.owned.run_owned_sweep`), with the executor
of :func:`gpuperfd.probing.executors.choose_executor`; this module only words its outcome, draws the
progress bar and writes the run records (:class:`CliObserver`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuperfd.caps.journal import CapJournal, journals_for
from gpuperfd.config import Config, config_with_flags
from gpuperfd.console import ProgressBar, format_table
from gpuperfd.device.base import Device, GpuInfo
from gpuperfd.device.errors import DeviceError
from gpuperfd.device.factory import open_backend, with_devices
from gpuperfd.probe_data.record import RecordError, append_records, build_record, check_output, parse_labels
from gpuperfd.probe_data.recommend import (SweepPoint, comparison_words, cut_short, point_words, read_only_note,
                                           recommend_latest, work_rate)
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.spec import PROBES, check_options
from gpuperfd.probing.executors import choose_executor
from gpuperfd.probing.gates.idle import busy_reason
from gpuperfd.probing.sweep.caps import CapSpecError, parse_cap_list, resolve_caps
from gpuperfd.probing.sweep.owned import OwnedStatus, OwnedSweep, PlannedProbe, SweepRequest, run_owned_sweep
from gpuperfd.system.logs import setup_logging
from gpuperfd.system.stopsignals import StopSignals, say

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
    sweep.add_argument("--gpu", type=int, default=SweepArgs.gpu, metavar="I", help="GPU index (default 0)")
    sweep.add_argument("--wait", type=float, default=SweepArgs.wait, metavar="SECONDS",
                       help="when another process owns the GPU's cap, wait this long for it (default: refuse at once)")
    sweep.add_argument("--preset", help="probe preset (default: the probe's default)")
    sweep.add_argument("--option", action="append", type=_parse_option, default=[], metavar="KEY=VALUE",
                       help="probe option, repeatable (e.g. batch_size=8)")
    sweep.add_argument("--settle", type=float, default=SweepArgs.settle, metavar="SECONDS",
                       help="after each cap change, wait at most this long for the limit to read back and for "
                            "power and SM clock to be steady under load (default 5)")
    sweep.add_argument("--no-stop-early", dest="stop_early", action="store_false",
                       help="run every cap, even below one already clearly slower than --max-slowdown allows")
    sweep.add_argument("--max-slowdown", type=float, default=SweepArgs.max_slowdown, help="slowdown allowed for the recommendation")
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
    sweep.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="repeatable: a label kept in each record and the CSV (dataset=cifar10); the report "
                            "never merges runs whose labels differ and can plot, group or facet by a label")
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



@dataclass(frozen=True)
class SweepArgs:
    """``gpuperfd sweep``'s flags, typed (see :func:`register` for what each means)."""

    probes: list[str]
    caps: str
    gpu: int = 0
    wait: float = 0.0
    preset: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    settle: float = 5.0
    stop_early: bool = True
    max_slowdown: float = 0.10
    read_only: bool = False
    simulate: int | None = None
    config: str | None = None
    state_dir: str | None = None
    clamp: bool = False
    output: str | None = None
    report: str | None = None
    progress: bool = True
    labels: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> SweepArgs:
        return cls(probes=list(ns.probe), caps=ns.caps, gpu=ns.gpu, wait=ns.wait, preset=ns.preset,
                   options=dict(ns.option), settle=ns.settle, stop_early=ns.stop_early,
                   max_slowdown=ns.max_slowdown, read_only=ns.read_only, simulate=ns.simulate, config=ns.config,
                   state_dir=ns.state_dir, clamp=ns.clamp, output=ns.output, report=ns.report,
                   progress=not ns.no_progress, labels=list(ns.label))

    def usage_error(self) -> str | None:
        """What is wrong with the flags before any GPU is touched, or None."""
        try:
            parse_labels(self.labels)
        except RecordError as exc:
            return f"--{exc}"
        if self.output is not None:
            try:
                check_output(self.output)
            except RecordError as exc:
                return f"--{exc}"
        if not 0 <= self.max_slowdown < 1:
            return "--max-slowdown must be in [0, 1)"
        if not self.wait >= 0:
            return "--wait must be >= 0 seconds"
        if not 0 <= self.settle <= 600:
            return "--settle must be in [0, 600] seconds"
        if self.report:
            try:
                import matplotlib  # noqa: F401  (optional dependency, checked before any GPU time is spent)
            except ImportError:
                return "--report needs matplotlib: pip install 'gpuperfd[report]'"
            from gpuperfd.report import check_out_dir
            from gpuperfd.report.records import ReportError

            try:
                check_out_dir(self.report, "--report")
            except ReportError as exc:
                return str(exc)
        return None


def _load(config: str | None, state_dir: str | None, simulate: int | None) -> Config:
    return config_with_flags(config, {"probes.state_dir": state_dir}, simulate=simulate)


def needs_private_state_dir(config: Config) -> bool:
    """Simulated GPUs without a ``simulation.state_file`` and no state directory asked for: their caps die
    with this process, so a journal and a cap lock outside it serve no one, and the default
    ``/var/lib/gpuperfd`` (a real node's) must not be created for them; a temporary one is used instead."""
    return (config.device.backend == "simulated" and config.simulation.state_file is None
            and "state_dir" not in config.probes.model_fields_set)


def _one_line(exc: Exception) -> str:
    """A validation error as one line naming the field (no pydantic class names or URLs)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {message}" if where and not message.startswith(("options", "caps")) else message
    return str(exc)



def _read_only(args: SweepArgs, config: Config) -> bool:
    """--read-only, or ``probes.read_only`` when the config file sets it. Its default (true) guards the
    daemon against a half-written file; ``gpuperfd sweep --caps ...`` typed by hand is explicit consent."""
    return bool(args.read_only or ("read_only" in config.probes.model_fields_set and config.probes.read_only))


def _cap_report(device: Device, original: float | None, journal: CapJournal) -> str:
    """What the cap really is now (read back from the GPU), for the last line of a stopped sweep."""
    try:
        back = device.power_limits().enforced_watts
    except DeviceError as exc:
        return f"gpu {device.index}: cannot read the power cap back ({exc}); run `gpuperfd restore-caps`"
    pending = os.path.lexists(journal.path_for(device.info().uuid))
    if original is not None and round(back) == round(original) and not pending:
        return f"gpu {device.index}: power cap restored, reads back {back:.0f} W (the original)"
    kept = f"; the journal keeps the original {original:.0f} W" if pending and original is not None else ""
    return f"gpu {device.index}: power cap NOT restored, reads back {back:.0f} W{kept}; run `gpuperfd restore-caps`"


def cmd_sweep(ns: argparse.Namespace) -> int:
    args = SweepArgs.from_namespace(ns)
    if (problem := args.usage_error()) is not None:
        print(f"gpuperfd: {problem}", file=sys.stderr)
        return 2
    try:
        caps_spec = parse_cap_list(args.caps)
        for probe in args.probes:  # what a schedule's validation checked, before any GPU is touched
            check_options(probe, dict(args.options), args.preset)
        probes = [PlannedProbe(ProbeRequest(probe=probe, preset=args.preset, options=dict(args.options),
                                            settle_seconds=args.settle)) for probe in args.probes]
    except (CapSpecError, ValueError) as exc:
        print(f"gpuperfd: --caps/--option: {_one_line(exc)}", file=sys.stderr)
        return 2
    config = _load(args.config, args.state_dir, args.simulate)
    if needs_private_state_dir(config):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="gpuperfd-sweep-simulated-") as private:
            return _sweep_with(args, probes, caps_spec, _load(args.config, private, args.simulate))
    return _sweep_with(args, probes, caps_spec, config)


def _sweep_with(args: SweepArgs, probes: list[PlannedProbe], caps_spec: list[str | float], config: Config) -> int:
    """Open the GPUs of ``config``, check ``--gpu`` and the caps against them, sweep; the exit code."""
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
            if (problem := _caps_out_of_range(args, devices[args.gpu], caps_spec)) is not None:
                say(f"gpuperfd: --caps: {problem}")
                return 2
            code = _sweep(args, config, backend.name, devices[args.gpu], probes, caps_spec, abort, stop)
        finally:
            backend.close()
    return code


def _caps_out_of_range(args: SweepArgs, device: Device, caps_spec: list[str | float]) -> str | None:
    """Why a cap is outside the board's range (without --clamp), read before the state directory is
    touched: a refused sweep creates no lock, no journal, no directory. None when the caps fit, or
    when the limits cannot be read here (the owned sweep then says so with the cap restored)."""
    if args.clamp:
        return None
    try:
        resolve_caps(caps_spec, device.power_limits(), strict=True)
    except CapSpecError as exc:
        return str(exc)
    except DeviceError:
        return None
    return None


def _sweep(args: SweepArgs, config: Config, backend_name: str, device: Device, probes: list[PlannedProbe],
           caps_spec: list[str | float], abort: threading.Event, stop: StopSignals) -> int:
    """The owned sweep of every probe on ``device``, its tables and report; the exit code."""
    journal = CapJournal.for_config(config)  # registered: a start with another state_dir finds it
    records = SweepRecords(args.output, device.info(), parse_labels(args.labels))
    request = SweepRequest(probes, caps_spec, read_only=_read_only(args, config), strict_caps=not args.clamp,
                           stop_early=args.max_slowdown if args.stop_early else None, wait_seconds=args.wait)
    threshold = config.probes.idle_utilization_threshold
    bars: list[CliObserver] = []
    planned_points: dict[int, int] = {}  # id(probe) -> how many points its sweep was to measure

    def observer_for(probe: PlannedProbe, planned: OwnedSweep) -> CliObserver:
        if planned.read_only and planned.original_cap_watts is not None and not bars:
            # Never drop an asked-for cap silently (`--read-only --caps current,max`).
            say(f"gpuperfd: gpu {args.gpu}: {read_only_note(planned.caps_watts, planned.original_cap_watts)}")
        records.start(planned.original_cap_watts)
        total = 1 if planned.read_only else len(planned.caps_watts)
        records.planned = total
        planned_points[id(probe)] = total
        bars.append(CliObserver(ProgressBar(total, desc=f"sweep {probe.request.probe} gpu{args.gpu}",
                                            enabled=None if args.progress else False), records))
        return bars[-1]

    try:
        outcome = run_owned_sweep(device, journal, request, choose_executor(config, backend_name), observer_for,
                                  abort, busy=lambda: busy_reason(device, threshold, (os.getpid(),)))
    finally:
        for bar in bars:
            bar.close()
    if (early := _refusal(args, device, journal, outcome, stop)) is not None:
        return early
    if stop.received is not None:
        done = sum(1 for _, points in outcome.sweeps for p in points
                   if p.result.status != "aborted" and not p.result.preempted)
        say(f"gpuperfd: sweep stopped by {stop.name}: interrupted after {done} of {sum(planned_points.values())} "
            f"points, no recommendation; {_cap_report(device, outcome.original_cap_watts, journal)}")
        return stop.exit_code
    if outcome.status is OwnedStatus.PREEMPTED:  # not a failure: the table shows it skipped (preempted)
        say(f"gpuperfd: gave way to a user's job ({outcome.detail}); "
            f"{_cap_report(device, outcome.original_cap_watts, journal)}")
    code = 0
    for probe, points in outcome.sweeps:
        code = max(code, _print_results(args.max_slowdown, probe.request.probe, points,
                                        planned_points.get(id(probe), len(points))))
    if args.report:
        code = max(code, _write_report(args.report, args.max_slowdown, records.records))
    return code


def _refusal(args: SweepArgs, device: Device, journal: CapJournal, outcome: OwnedSweep,
             stop: StopSignals) -> int | None:
    """The message and exit code of a sweep that was refused or failed; None when it ran (or was stopped)."""
    status, original = outcome.status, outcome.original_cap_watts
    if status is OwnedStatus.OWNED:
        if stop.received is not None:
            say(f"gpuperfd: stopped by {stop.name} while waiting for gpu {device.index}; nothing was changed")
            return stop.exit_code
        owner = f"pid {outcome.owner_pid}" if outcome.owner_pid else "another process"
        say(f"gpuperfd: gpu {device.index}: its power cap is owned by {owner} (a sweep or probe is running); "
            "not sweeping")
        return 1
    if status is OwnedStatus.STATE_DIR and not outcome.sweeps:
        say(f"gpuperfd: cannot use the state directory {journal.state_dir} ({outcome.detail}); not sweeping")
        return 1
    if status is OwnedStatus.BUSY:
        say(f"gpuperfd: gpu {args.gpu} is busy ({outcome.detail}); not sweeping")
        return 1
    if status is OwnedStatus.BAD_CAPS:
        say(f"gpuperfd: --caps: {outcome.detail}")
        return 2
    if status is OwnedStatus.ABORTED and stop.received is None:  # the cap was changed under the sweep
        say(f"gpuperfd: sweep stopped: {outcome.detail}; nothing more was written")
        return 1
    if status in (OwnedStatus.DEVICE_ERROR, OwnedStatus.STATE_DIR, OwnedStatus.EXCEPTION):
        prefix = f"gpu {device.index}: " if status is OwnedStatus.DEVICE_ERROR else ""
        say(f"gpuperfd: {prefix}{outcome.detail}")
        say(f"gpuperfd: {_cap_report(device, original, journal)}")
        return 1
    return None


class SweepRecords:
    """Each point as a run record (``gpuperfd.run/1``, what `gpuperfd report` reads), kept for
    ``--report`` and appended to ``path`` as it comes (a stopped sweep keeps its points)."""

    def __init__(self, path: str | None, gpu: GpuInfo, labels: dict[str, str] | None = None) -> None:
        self.path = path
        self.labels = dict(labels or {})
        self.gpu = {k: v for k, v in dataclasses.asdict(gpu).items() if k != "serial"}
        self.records: list[dict[str, Any]] = []
        self.original: float | None = None
        self.sweep_id = ""
        #: How many points the current sweep is to measure (each record says so: see build_record).
        self.planned: int | None = None

    def start(self, original: float | None) -> None:
        self.original = original
        self.sweep_id = f"cli-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def add(self, point: SweepPoint) -> None:
        record = build_record(point.result, "sweep", gpu=self.gpu, power_cap_watts=point.cap_watts,
                              original_cap_watts=self.original, sweep_id=self.sweep_id,
                              labels=self.labels, sweep_points=self.planned)
        self.records.append(record)
        if self.path is not None:
            try:
                append_records(self.path, [record])
            except (RecordError, OSError) as exc:
                say(f"gpuperfd: --output: {exc}")


class CliObserver:
    """The CLI's :class:`~gpuperfd.probing.observer.SweepObserver`: the progress bar and the run records."""

    def __init__(self, bar: ProgressBar, records: SweepRecords) -> None:
        self.bar, self.records = bar, records
        self._quietly(bar.__enter__)

    @staticmethod
    def _quietly(action: Callable[[], object]) -> None:
        try:  # a closed terminal (EIO) must not cut the sweep short of its restore
            action()
        except (OSError, ValueError):
            pass

    def on_cap(self, watts: float | None) -> None:
        self._quietly(lambda: self.bar.set_message(f"{watts:.0f} W" if watts else "restored"))

    def on_measuring(self, running: bool) -> None:
        pass

    def on_point(self, point: SweepPoint) -> None:
        self.records.add(point)
        self._quietly(lambda: self.bar.update(1))
        self._quietly(lambda: self.bar.point_done(_point_what(point), point_words(point.result)))

    def close(self) -> None:
        self._quietly(lambda: self.bar.__exit__(None, None, None))


def _point_what(point: SweepPoint) -> str:
    return f"{point.cap_watts:.0f} W" if point.cap_watts else "current cap"


def _write_report(directory: str, max_slowdown: float, records: list[dict[str, Any]]) -> int:
    """The report of this command's points, written into ``--report DIR`` (inference and training side by side)."""
    # matplotlib is optional (gpuperfd[report]): the report package is imported only when asked for.
    from gpuperfd.report import build_report, write_report
    from gpuperfd.report.records import Loaded, ReportError, run_from_history

    loaded = Loaded([run_from_history(r, "gpuperfd sweep") for r in records], ["gpuperfd sweep"])
    try:
        files = write_report(build_report(loaded, max_slowdown), directory)
    except ReportError as exc:
        print(f"gpuperfd: --report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpuperfd: --report: cannot write the report: {exc}", file=sys.stderr)
        return 1
    print(f"report: {files.html}")
    return 0


def _rows(points: list[SweepPoint]) -> list[dict[str, Any]]:
    """The table's rows (and the CSV's)."""
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


def _settle_seconds(result: ProbeResult) -> float | None:
    """How long the point waited for its cap: the limit's read back plus steady power and clock under load."""
    parts = [result.extra.get("cap_read_back_seconds"), result.extra.get("settle_seconds")]
    known = [p for p in parts if isinstance(p, int | float)]
    return sum(known) if known else None


def _print_results(max_slowdown: float, probe: str, points: list[SweepPoint], planned: int | None = None) -> int:
    """The table of one probe's sweep and its recommendation (none when it was cut short of its
    ``planned`` points, default: as many as it has); 1 when a point failed."""
    rows = _rows(points)
    print(f"\n{probe}:")
    print(format_table(
        ["cap W", "status", "units/s", "J/unit", "avg W", "SM MHz", "busy", "settle s"],
        [[row["cap_watts"], row["status"] if row["status"] == "ok" else f"{row['status']} ({row['reason']})",
          row["units_per_second"], row["energy_per_unit_joules"], row["average_power_watts"],
          (row["sm_clock_hertz"] or 0) / 1e6 or None, row["gpu_busy_ratio"], row["settle_seconds"]]
         for row in rows],
    ))
    best = recommend_latest(points, max_slowdown)  # the one rule, as the landing page, top and report
    unit = points[0].result.work_unit or "unit" if points else "unit"
    rule = f"(rule: lowest energy among caps at most {100 * max_slowdown:.0f}% slower than the highest)"
    if (why := cut_short(points, len(points) if planned is None else planned)) is not None:
        print(f"\nsweep {why}")
    elif best is not None:
        print(f"\nrecommended cap: {best.cap_watts:.0f} W: {comparison_words(best, unit)} {rule}")
    elif any(p.result.failure_reason == "early_stop" for p in points):  # "0.0% less energy" once said this
        print(f"\nno recommendation: the lower caps were ruled out (clearly more than {100 * max_slowdown:.0f}% "
              "slower): keep the highest cap tested")
    return 0 if all(p.result.status in ("ok", "skipped") for p in points) else 1


def cmd_restore_caps(args: argparse.Namespace) -> int:
    """Restore every cap journaled in the state directory and every other one this node used (the
    emergency command, :mod:`gpuperfd.caps.emergency`: apply mode's entries too, under each GPU's
    lock); 0 when none is left changed (and says "nothing to restore" when there was nothing), 1 when
    one is, 2 when the configured state directory is missing or unreadable and no other held anything
    to restore (one that did is restored, and the missing directory still named)."""
    from gpuperfd.caps.emergency import restore_everything, state_dir_problem

    config = _load(args.config, args.state_dir, args.simulate)
    setup_logging(config.log_level)
    if needs_private_state_dir(config):  # as sweep --simulate journals: in a directory gone with the sweep
        print("gpuperfd: restore-caps: nothing to restore (simulated GPUs without simulation.state_file keep no "
              "cap past their process; --state-dir DIR names a simulated sweep's journal)")
        return 0
    missing = state_dir_problem(config.probes.state_dir)
    if missing is not None:
        print(f"gpuperfd: restore-caps: {missing}", file=sys.stderr)
    journals = journals_for(config)  # the configured state directory and every other one this node used
    if not any(journal.entries() for journal in journals):
        if missing is None:
            searched = ", ".join(str(j.state_dir) for j in journals)
            print(f"gpuperfd: restore-caps: nothing to restore (no power-cap journal entry in {searched})")
        return 2 if missing is not None else 0
    try:
        results = with_devices(config, lambda devices: restore_everything(journals, devices, wait_seconds=2.0))
    except DeviceError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 3
    left = 0
    for result in results:
        if result.owned:
            print(f"gpuperfd: {result.words}", file=sys.stderr)
        elif not result.ok:
            left += 1
            print(f"gpuperfd: still changed: {result.words}", file=sys.stderr)
        else:
            print(f"gpuperfd: restore-caps: {result.words}")
    return 1 if left else 0
