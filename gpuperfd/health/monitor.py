"""Daemon side of the health stage: gather inputs, keep sticky reasons, publish verdicts.

A background thread evaluates every ``health.interval_seconds``: it reads the sampler's
ReadingStore and XID counts (no device call), the new lines of the probe history file
(read incrementally; rotation is noticed), runs every check of the table
(:func:`gpuperfd.health.evaluate.evaluate_gpu`) and merges the fresh reasons into the
sticky book (:class:`VerdictBook`), which is saved in the state directory so a restart
forgets nothing. The scrape path and ``GET /api/v1/health`` read only the last verdicts.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuperfd.device.base import PeerLink
from gpuperfd.device.errors import DeviceError
from gpuperfd.health.checks import ACTION_CLEARS, CHECKS, Check, by_id, defaults
from gpuperfd.health.evaluate import (
    GpuInputs,
    Series,
    evaluate_gpu,
    metric_name,
    reset_warnings,
    run_key,
    warn_once,
)
from gpuperfd.health.interconnect import interconnect_inputs
from gpuperfd.health.store import HealthStore, SavedState
from gpuperfd.health.verdict import ACTIONS, STATES, Reason, Verdict
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probe_data.peers import peer_key
from gpuperfd.probe_data.record import record_row
from gpuperfd.telemetry.collectors.base import COLLECTORS, GPU_LABELS, MetricSpec
from gpuperfd.telemetry.sampler import lost_gpus
from gpuperfd.telemetry.exposition import Family, label_string

log = logging.getLogger(__name__)

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

#: Counters that go back only when the driver reloads or the GPU is reset: a drop is a reset seen.
RESET_COUNTERS: tuple[str, ...] = ("gpuperf_energy_joules_total", "gpuperf_ecc_errors_total",
                                   "gpuperf_pcie_replays_total")

#: Flat run fields the checks read.
RUN_FIELDS = ("time", "status", "failure_reason", "probe", "preset", "power_cap_watts", "units_per_second",
              "energy_per_unit_joules")

HEALTH_METRICS = (
    MetricSpec("gpuperf_gpu_health_state", "1 for the GPU's current health verdict state, 0 for the others "
               "(healthy, unknown, degraded, unhealthy); see docs/health.md.", labels=("state",)),
    MetricSpec("gpuperf_gpu_health_action", "1 for the action the GPU's health verdict asks for, 0 for the others.",
               labels=("action",)),
    MetricSpec("gpuperf_gpu_health_reason_info", "A check that fired for this GPU (at most one series per check).",
               labels=("check", "severity", "action")),
)


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def clears_of(check: Check, reason: Reason) -> str:
    """How a reason clears: its row's ``clears``, or for rows whose action varies, by the action."""
    return ACTION_CLEARS[reason.action] if check.clears == "per action" else check.clears


def spec_labels() -> dict[str, tuple[str, ...]]:
    """Label names of every collector series, by metric name."""
    return {spec.name: spec.labels for cls in COLLECTORS.values() for spec in cls.metrics}


def points_of(gpu: int, readings: Mapping[tuple[int, str], Any],
              labels: Mapping[str, tuple[str, ...]]) -> dict[str, Series]:
    """The latest value of every series of one GPU, from the sampler's readings (ok ones only)."""
    points: dict[str, Series] = {}
    for (index, _name), reading in readings.items():
        if index != gpu or not reading.ok:
            continue
        for point in reading.points:
            names = labels.get(point.metric, ())
            points.setdefault(point.metric, []).append((dict(zip(names, point.labels)), float(point.value)))
    return points


def read_times(gpu: int, readings: Mapping[tuple[int, str], Any]) -> dict[str, float]:
    """When each series of one GPU was read (the sampler's clock), from its ok readings."""
    return {point.metric: reading.timestamp for (index, _name), reading in readings.items()
            if index == gpu and reading.ok for point in reading.points}


def gpu_name(gpu: int, last_info: Mapping[int, Any], labels: Mapping[str, tuple[str, ...]]) -> str:
    """The model name of one GPU from its last ``gpuperf_gpu_info`` series ("" when none yet)."""
    info = [dict(zip(labels["gpuperf_gpu_info"], p.labels)) for p in last_info.get(gpu, ())]
    return info[0].get("name", "") if info else ""


def snapshot_inputs(sampler: Any, gpus: Iterable[int], now: float) -> list[GpuInputs]:
    """One GPU's inputs per read GPU from one synchronous read of the sampler (``gpuperfd check``):
    the monitor's latest values, lost flag and XIDs, without its windows (busy samples, counter
    rates) or history, which a one-shot read does not have. GPUs without an identity are left out."""
    snap = sampler.store.snapshot()
    readings, last_info, identities = snap.readings, snap.last_good_info, snap.identities
    labels = spec_labels()
    lost = lost_gpus(readings, sampler.interval_seconds)  # from this snapshot, not one more per GPU
    inputs = []
    for index in gpus:
        identity = identities.get(index)
        if identity is None:
            continue
        xids = {int(p.labels[0]): now for p in sampler.xid_counts.points(index)
                if p.metric == "gpuperf_xid_errors_total" and p.value > 0}
        inputs.append(GpuInputs(gpu=index, uuid=identity.uuid, name=gpu_name(index, last_info, labels),
                                lost=index in lost, points=points_of(index, readings, labels), xids=xids))
    return inputs


class VerdictBook:
    """Sticky reasons per GPU, merged from each evaluation's fresh reasons (no I/O, no threads)."""

    def __init__(self, settings: Mapping[str, float], saved: SavedState | None = None) -> None:
        self.settings = dict(settings)
        self.checks = by_id()
        self.reasons: dict[str, dict[tuple[str, str], Reason]] = {}
        self.resets: dict[str, float] = {}
        if saved is not None:
            self.resets = dict(saved.resets)
            for uuid, reasons in saved.reasons.items():
                self.reasons[uuid] = {r.ident: r for r in reasons if r.check in self.checks}

    def reset_seen(self, uuid: str, when: float) -> None:
        self.resets[uuid] = when

    def merge(self, uuid: str, fresh: Iterable[Reason], runs: Sequence[Mapping[str, Any]], now: float,
              probe_required: bool = True) -> list[Reason]:
        """Add or refresh fresh reasons; drop the others whose clearing condition is met."""
        active = self.reasons.setdefault(uuid, {})
        seen = set()
        for reason in fresh:
            seen.add(reason.ident)
            old = active.get(reason.ident)
            if old is None:
                active[reason.ident] = reason
            else:
                old.severity, old.action, old.message = reason.severity, reason.action, reason.message
                old.evidence, old.last_seen = reason.evidence, max(old.last_seen, reason.last_seen)
        for ident, reason in list(active.items()):
            if ident not in seen and self._cleared(uuid, reason, runs, now, probe_required):
                log.info("gpu %s: %s%s cleared", uuid, reason.check, f" ({reason.key})" if reason.key else "")
                del active[ident]
        return list(active.values())

    def _cleared(self, uuid: str, reason: Reason, runs: Sequence[Mapping[str, Any]], now: float,
                 probe_required: bool) -> bool:
        check = self.checks[reason.check]
        clears = clears_of(check, reason)

        def ok_after(when: float) -> bool:
            """An ok run after ``when`` (the runs are walked only by the rows that ask)."""
            return any(float(r.get("time") or 0) > when for r in runs if r.get("status") == "ok")

        if clears == "condition":
            return True
        if clears == "quiet_window":
            return now - reason.last_seen > self.settings["quiet_window_seconds"]
        if clears == "reset_and_probe":
            reset = self.resets.get(uuid)
            if reset is None or reset < reason.last_seen:
                return False
            return not probe_required or ok_after(reset)
        if clears == "passing_probes":
            same = [r for r in runs if r.get("status") == "ok" and float(r.get("time") or 0) > reason.last_seen
                    and "/".join(run_key(r)) == reason.key]
            return len(same) >= self.settings["clear_passing_probes"]
        if clears == "probe_passed":
            return ok_after(reason.since) or not probe_required
        raise ValueError(f"check {check.id}: unknown clears {clears!r}")


#: Check kinds whose answer depends on the probe history alone.
HISTORY_KINDS = frozenset({"baseline", "peers", "consecutive_failures", "failure_reason", "peer_fingerprint"})
HISTORY_CHECKS = tuple(c for c in CHECKS if c.kind in HISTORY_KINDS)
LIVE_CHECKS = tuple(c for c in CHECKS if c.kind not in HISTORY_KINDS)


class HistoryTail:
    """Incremental reader of the JSON-lines probe history: new complete lines only, per GPU uuid.

    Rotation (a new inode or a shorter file) restarts at the new file's beginning; the
    rotated backups are read once, at start, so the baseline survives a rotation.
    """

    def __init__(self, path: Path | str | None, keep_seconds: float, max_runs: int = 2000) -> None:
        self.path = Path(path) if path is not None else None
        self.keep_seconds = keep_seconds
        self.max_runs = max_runs
        self.runs: dict[str, deque[dict[str, Any]]] = {}
        #: Bumped on every run added or aged out: history-derived reasons are recomputed only then.
        self.version = 0
        self._sorted: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._inode: int | None = None
        self._offset = 0
        self._started = False

    def _add_line(self, line: str, where: str) -> None:
        try:
            record = json.loads(line)
            row = record_row(record)
        except Exception as exc:  # noqa: BLE001 - a bad line is skipped, never fatal
            log.warning("%s: skipped a probe history line the health checks cannot read (%s)", where, exc)
            return
        uuid = row.get("gpu_uuid")
        if not uuid:
            return
        run = {k: row.get(k) for k in RUN_FIELDS}
        check = (record.get("result") or {}).get("correctness") or {}
        run["peer_key"] = peer_key(record)  # None: not comparable across GPUs
        run["fingerprint"] = check.get("fingerprint")
        run["failed_checks"] = ", ".join(map(str, check.get("failed_checks") or ())) or None
        self.runs.setdefault(str(uuid), deque(maxlen=self.max_runs)).append(run)
        self.version += 1

    def _read_file(self, path: Path, offset: int = 0) -> int:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
        end = data.rfind(b"\n")
        if end < 0:
            return offset
        for line in data[: end + 1].decode("utf-8", "replace").splitlines():
            if line.strip():
                self._add_line(line, str(path))
        return offset + end + 1

    def poll(self, now: float) -> None:
        if self.path is None:
            return
        if not self._started:
            self._started = True
            backups = sorted((p for p in self.path.parent.glob(self.path.name + ".*") if p.suffix[1:].isdigit()),
                             key=lambda p: -int(p.suffix[1:]))
            for backup in backups:
                try:
                    self._read_file(backup)
                except OSError as exc:
                    log.warning("cannot read probe history %s: %s", backup, exc)
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot read probe history %s: %s", self.path, exc)
            return
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._inode, self._offset = stat.st_ino, 0
        if stat.st_size > self._offset:
            try:
                self._offset = self._read_file(self.path, self._offset)
            except OSError as exc:
                log.warning("cannot read probe history %s: %s", self.path, exc)
        horizon = now - self.keep_seconds
        for runs in self.runs.values():
            while runs and float(runs[0].get("time") or 0) < horizon:
                runs.popleft()
                self.version += 1

    def of(self, uuid: str) -> list[dict[str, Any]]:
        """This GPU's runs, oldest first (sorted once per history version)."""
        cached = self._sorted.get(uuid)
        if cached is None or cached[0] != self.version:
            cached = self._sorted[uuid] = (self.version, sorted(self.runs.get(uuid, ()),
                                                                key=lambda r: float(r.get("time") or 0)))
        return cached[1]


class HealthMonitor:
    """Evaluates the checks on a background thread; thread-safe readers for the scrape and the API."""

    def __init__(
        self,
        sampler: Any,
        state_dir: Path | str | None,
        history_path: Path | str | None,
        *,
        node_uuids: Sequence[str] = (),
        thresholds: Mapping[str, float] | None = None,
        interval_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
        boot_id: Callable[[], str] = read_boot_id,
        node: str | None = None,
        listeners: Sequence[Callable[[list[Verdict]], None]] = (),
    ) -> None:
        self.sampler = sampler
        reset_warnings()
        #: Every GPU the driver listed at this start, selected by ``device.gpus`` or not: "fewer GPUs
        #: than at the first start" is a fact of the node, not of the selection.
        self.node_uuids = list(node_uuids)
        self.settings = {**defaults(), **(thresholds or {})}
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.node = node if node is not None else socket.gethostname()
        self.store = HealthStore(state_dir)
        self.history = HistoryTail(history_path, keep_seconds=self.settings["baseline_days"] * 86400.0 + 86400.0)
        self.probe_required = history_path is not None
        if not self.probe_required:
            log.warning("probe history is off: reset_gpu verdicts clear on a reset alone, performance checks are off")
        saved, self.store_error = self.store.load()
        self.book = VerdictBook(self.settings, saved)
        self.first_gpus: list[str] = list(saved.first_gpus) if saved else []
        now = clock()
        current_boot = boot_id()
        self.boot_id = current_boot
        if saved is not None and saved.boot_id and current_boot and saved.boot_id != current_boot:
            log.info("new boot id since the saved verdicts: every GPU counts as reset")
            for uuid in set(saved.reasons) | set(saved.first_gpus):
                self.book.reset_seen(uuid, now)
        self._busy_signals = sorted({metric_name(c.signal) for c in CHECKS if c.kind == "busy_share"}
                                    | {c.reference for c in CHECKS if c.reference})
        self._rate_signals = sorted({metric_name(c.signal) for c in CHECKS if c.kind == "rate_above"})
        self._spec_labels = spec_labels()
        self._busy: dict[str, deque[tuple[float, dict[str, Series]]]] = {}
        #: Sampler time of the utilization reading that began each GPU's current busy streak.
        self._busy_since: dict[str, float] = {}
        self._counters: dict[str, dict[str, deque[tuple[float, float]]]] = {}
        self._xid_counts: dict[int, dict[int, int]] = {}
        self._xid_last: dict[str, dict[int, float]] = {}
        self._reset_values: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._verdicts: list[Verdict] = []
        self._families_kept: tuple[list[Verdict], list[Family]] | None = None
        self._version = 0
        self._saved_signature: Any = None
        self._history_version = -1
        self._history_gpus = -1
        self._history_reasons: dict[str, list[Reason]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.evaluations = 0
        self.cpu_seconds = 0.0
        #: Called with the verdicts after an evaluation that changed them (and after the first):
        #: e.g. the node-feature-discovery file (:mod:`gpuperfd.health.nfd`). A failing one is logged.
        self.listeners: list[Callable[[list[Verdict]], None]] = list(listeners)
        #: The node's interconnect as the interconnect checks read it (set by :meth:`interconnect_seen`).
        self.interconnect: dict[str, Any] = {}
        #: The number of the sampler's topology reading taken last (the sampler owns the NVML reads).
        self._topology_taken = 0
        sampler.want_topology(self.settings["topology_interval_seconds"])

    def interconnect_seen(self, result: InterconnectResult | None, topology: Sequence[PeerLink],
                          links_per_gpu: Mapping[int, int]) -> None:
        """Hand the checks a new topology reading and, where one ran, the interconnect run's result
        (None: keep judging the last run's copies against the new topology). ``links_per_gpu``: each
        GPU's NVLinks, up or down. Read at the next evaluation."""
        copies = self.interconnect.get("copies", {})
        fresh = interconnect_inputs(result, topology, links_per_gpu)
        if result is None:
            fresh["copies"] = copies
        self.interconnect = fresh

    def _refresh_topology(self, now: float) -> None:
        """Take the sampler's topology reading when it has a new one (read every
        ``topology_interval_seconds`` on the sampler's thread: links that trained down raise no event, only
        a fresh count shows them); a backend that cannot tell is not judged. No NVML call of our own."""
        reading = self.sampler.topology()
        if reading is None or reading.number == self._topology_taken:
            return
        self._topology_taken = reading.number
        readings = self.sampler.store.snapshot().readings
        # Each GPU's NVLinks (up or down) from the nvlink collector's last reading: no NVML calls of our own.
        links = {d.index: len(self._points(d.index, readings).get("gpuperf_nvlink_up", []))
                 for d in self.sampler.devices}
        if reading.error is not None:
            warn_once(f"the GPU topology could not be read ({reading.error}): NVLink pair checks are off")
            return
        topology = list(reading.links)
        self.interconnect_seen(None, topology, links)

    # -- gathering ------------------------------------------------------------------------

    def _points(self, gpu: int, readings: Mapping[tuple[int, str], Any]) -> dict[str, Series]:
        return points_of(gpu, readings, self._spec_labels)

    def _new_xids(self, gpu: int, uuid: str, now: float) -> None:
        counts: dict[int, int] = {}
        for point in self.sampler.xid_counts.points(gpu):
            if point.metric == "gpuperf_xid_errors_total":
                counts[int(point.labels[0])] = int(point.value)
        previous = self._xid_counts.get(gpu, {})
        for code, count in counts.items():
            if count > previous.get(code, 0):
                self._xid_last.setdefault(uuid, {})[code] = now
        self._xid_counts[gpu] = counts

    def _check_reset(self, uuid: str, points: Mapping[str, Series], now: float) -> None:
        values = {name: sum(v for _, v in points[name]) for name in RESET_COUNTERS if name in points}
        before = self._reset_values.get(uuid, {})
        if any(values[name] < before[name] for name in values if name in before):
            log.info("gpu %s: a driver counter went back: GPU reset seen", uuid)
            self.book.reset_seen(uuid, now)
            self._xid_last.pop(uuid, None)
            self._busy.pop(uuid, None)
            self._busy_since.pop(uuid, None)
            self._counters.pop(uuid, None)
        self._reset_values[uuid] = {**before, **values}

    def gather(self, now: float) -> list[GpuInputs]:
        snap = self.sampler.store.snapshot()
        readings, last_info, identities = snap.readings, snap.last_good_info, snap.identities
        lost_now = lost_gpus(readings, self.sampler.interval_seconds)  # one snapshot for every GPU
        busy_limit = self.settings["busy_utilization_ratio"]
        window = max(self.settings["busy_window_seconds"], self.settings["rate_window_seconds"])
        inputs: list[GpuInputs] = []
        for device in self.sampler.devices:
            identity = identities.get(device.index)
            if identity is None:
                continue
            uuid = identity.uuid
            points = self._points(device.index, readings)
            lost = device.index in lost_now
            if not lost:
                self._check_reset(uuid, points, now)
            self._new_xids(device.index, uuid, now)
            util = [v for _, v in points.get("gpuperf_gpu_utilization_ratio", [])]
            samples = self._busy.setdefault(uuid, deque())
            if util and util[0] >= busy_limit and not lost:
                read_at = read_times(device.index, readings)
                since = self._busy_since.setdefault(uuid, read_at["gpuperf_gpu_utilization_ratio"])
                # Only values read during this busy streak: a slow collector's reading (the PCIe
                # link, every 10 s) taken while the GPU idled shows the link trained down, which
                # says nothing about the link under load.
                samples.append((now, {name: points[name] for name in self._busy_signals
                                      if name in points and read_at[name] >= since}))
            else:
                self._busy_since.pop(uuid, None)
            while samples and samples[0][0] < now - window:
                samples.popleft()
            counters = self._counters.setdefault(uuid, {})
            for name in self._rate_signals:
                if name in points:
                    series = counters.setdefault(name, deque())
                    series.append((now, sum(v for _, v in points[name])))
                    while series and series[0][0] < now - window:
                        series.popleft()
            quiet = self.settings["quiet_window_seconds"]
            xids = {code: t for code, t in self._xid_last.get(uuid, {}).items() if now - t <= quiet}
            inputs.append(GpuInputs(
                gpu=device.index, uuid=uuid, name=gpu_name(device.index, last_info, self._spec_labels), lost=lost,
                points=points, busy_samples=list(samples), counters={k: list(v) for k, v in counters.items()},
                xids=xids, runs=self.history.of(uuid),
                store_error=self.store_error if self.evaluations == 0 else None,
                interconnect=self.interconnect,
            ))
        present = {g.uuid for g in inputs} | set(self.node_uuids)
        inputs += [GpuInputs(gpu=None, uuid=u, missing=True) for u in self.first_gpus if u not in present]
        return inputs

    # -- evaluating -----------------------------------------------------------------------

    def evaluate_once(self) -> list[Verdict]:
        start_cpu = time.thread_time()
        now = self.clock()
        self.history.poll(now)
        self._refresh_topology(now)
        inputs = self.gather(now)
        if not self.first_gpus and inputs:
            self.first_gpus = self.node_uuids or [g.uuid for g in inputs if not g.missing]
        verdicts = []
        # Checks that read only the probe history are evaluated again only when it changed: with
        # a week of runs they are most of an evaluation's cost, and their answer cannot move otherwise.
        history_changed = self.history.version != self._history_version or len(inputs) != self._history_gpus
        self._history_version, self._history_gpus = self.history.version, len(inputs)
        for gpu in inputs:
            fresh = evaluate_gpu(gpu, inputs, self.settings, now, LIVE_CHECKS)
            if history_changed or gpu.uuid not in self._history_reasons:
                self._history_reasons[gpu.uuid] = evaluate_gpu(gpu, inputs, self.settings, now, HISTORY_CHECKS)
            fresh = fresh + self._history_reasons[gpu.uuid]
            reasons = self.book.merge(gpu.uuid, fresh, gpu.runs, now, self.probe_required)
            verdicts.append(Verdict(gpu.gpu, gpu.uuid, list(reasons), evaluated_at=now))
        with self._lock:
            changed = [(v.gpu, v.uuid, sorted(r.ident for r in v.reasons)) for v in verdicts] != \
                [(v.gpu, v.uuid, sorted(r.ident for r in v.reasons)) for v in self._verdicts]
            self._verdicts = verdicts
            if changed:
                self._version += 1
        self._save()
        if changed or self.evaluations == 0:
            self._notify(verdicts)
        self.evaluations += 1
        self.cpu_seconds += time.thread_time() - start_cpu
        return verdicts

    def _save(self) -> None:
        state = SavedState(
            boot_id=self.boot_id, first_gpus=self.first_gpus,
            reasons={uuid: list(rs.values()) for uuid, rs in self.book.reasons.items() if rs},
            resets=dict(self.book.resets),
        )
        signature = (state.boot_id, tuple(state.first_gpus),
                     tuple(sorted((u, r.ident, r.since) for u, rs in state.reasons.items() for r in rs)),
                     tuple(sorted(state.resets.items())))
        if signature != self._saved_signature:
            self.store.save(state)
            self._saved_signature = signature

    def _notify(self, verdicts: list[Verdict]) -> None:
        for listener in self.listeners:
            try:
                listener(verdicts)
            except Exception:  # noqa: BLE001 - a listener must not stop the verdicts
                log.exception("health verdict listener failed")

    # -- readers --------------------------------------------------------------------------

    def verdicts(self) -> list[Verdict]:
        with self._lock:
            return list(self._verdicts)

    def version(self) -> int:
        with self._lock:
            return self._version

    def families(self) -> list[Family]:
        """The three health families for /metrics, built once per evaluation: the same list
        object until the verdicts are replaced (the exporter keeps their text by its identity)."""
        with self._lock:
            verdicts = self._verdicts
        kept = self._families_kept
        if kept is not None and kept[0] is verdicts:
            return kept[1]
        state_f, action_f, reason_f = (Family(s.name, s.kind, s.help) for s in HEALTH_METRICS)
        for verdict in verdicts:
            if verdict.gpu is None:
                continue  # a missing GPU has no series of its own; its reason shows in the API
            prefix = label_string(GPU_LABELS, (str(verdict.gpu), verdict.uuid))
            state, action = verdict.state, verdict.action
            for name in STATES:
                state_f.add(f'{prefix},state="{name}"', 1.0 if name == state else 0.0)
            for name in ACTIONS:
                action_f.add(f'{prefix},action="{name}"', 1.0 if name == action else 0.0)
            worst: dict[str, Reason] = {}
            for reason in verdict.reasons:
                if reason.check not in worst or reason.rank() > worst[reason.check].rank():
                    worst[reason.check] = reason
            for check, reason in sorted(worst.items()):
                reason_f.add(prefix + "," + label_string(("check", "severity", "action"),
                                                         (check, reason.severity, reason.action)), 1.0)
        families = [state_f, action_f, reason_f]
        self._families_kept = (verdicts, families)
        return families

    # -- thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.evaluate_once()
            except Exception:  # a bug here must not stop the verdicts forever
                log.exception("health evaluation failed")
            self._stop.wait(self.interval_seconds)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
