"""The daemon's interconnect schedule (``probe: interconnect``): one node probe over a set of GPUs.

It runs only when *every* GPU of the set may be probed now, by the same gate as a round
(:meth:`~gpuperfd.probing.gates.gate.GpuGate.refusal`: not lost, not allocated, not in MIG mode, idle
long enough, not busy), and it holds every GPU of the set for the whole run: each GPU's turn
(:class:`~gpuperfd.probing.gates.turns.GpuTurns`, shared with the rounds: no single-GPU round starts on
one of them meanwhile, and it waits in line for a round that is running) and
each GPU's cross-process lock (:class:`~gpuperfd.caps.ownership.GpuLock`: no CLI sweep or ``gpuperfd
check`` under it). GPUs are taken in index order, so two runs never wait on each other.

Like any probe it gives way to a user's job (the executor watches the set and ends every worker:
skipped / ``preempted``) and stops at shutdown. Its result is published (the runs counter of every
GPU of the set, and the interconnect series where the build has them) and appended to its history file (beside the probe history).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuperfd.caps.ownership import GpuBusy, GpuLock, safe_name
from gpuperfd.config import ScheduleConfig
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.probe_data.kinds import INTERCONNECT
from gpuperfd.probing.gates.turns import Holder, HolderKind, Turn
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.interconnect.executor import InterconnectExecutor
from gpuperfd.probing.interconnect.gpu_set import check_set
from gpuperfd.probing.scheduling.service import ProbeService

__all__ = ["InterconnectService", "request_of", "PROBE", "PRESET"]

log = logging.getLogger(__name__)

PROBE = INTERCONNECT
#: The preset label of its counters (the probe has no presets: the collective library it ran on).
PRESET = "nccl"
#: Its history records, in their own file beside the per-GPU history.
HISTORY_SCHEMA = "gpuperfd.interconnect/1"


def request_of(schedule: ScheduleConfig, gpus: tuple[int, ...], timeout_seconds: float) -> InterconnectRequest:
    """The schedule's request (its options are InterconnectRequest's fields, checked by the config)."""
    options: dict[str, Any] = dict(schedule.options)
    if "allreduce_bytes" in options:
        options["allreduce_bytes"] = tuple(int(v) for v in options["allreduce_bytes"])
    options.setdefault("timeout_seconds", timeout_seconds)
    return InterconnectRequest(gpus=gpus, **options)


def history_beside(history: HistoryWriter | None) -> HistoryWriter | None:
    """A writer of ``<probe history>.interconnect.jsonl`` with the same rotation (None: no history)."""
    if history is None:
        return None
    path = history.path.with_name(f"{history.path.stem}.interconnect.jsonl")
    return HistoryWriter(path, history.max_bytes, history.backups)


class InterconnectService:
    """Runs ``probe: interconnect`` schedules beside the per-GPU rounds of ``service``."""

    def __init__(self, service: ProbeService, make_executor: Callable[[], InterconnectExecutor],
                 publish: Callable[[InterconnectResult], None] | None = None) -> None:
        self.service = service
        #: Builds the executor at the first run (a daemon with no interconnect schedule builds none).
        self.make_executor = make_executor
        self._executor: InterconnectExecutor | None = None
        #: The interconnect series (``gpuperfd.probing.interconnect.metrics``), where the build has them.
        self.publish = publish
        #: Its own history file beside the probe history (``NAME.interconnect.jsonl``): the per-GPU
        #: readers (health, report) read run records of one GPU, which this is not.
        self.history = history_beside(service.history)
        self._running = threading.Lock()

    def run(self, schedule: ScheduleConfig) -> InterconnectResult | None:
        """One scheduled run; its result (None: not run, counted as skipped with the reason)."""
        service = self.service
        try:
            gpus = check_set(schedule.gpus, sorted(service.devices))
        except ValueError as exc:
            log.error("interconnect schedule: %s; not run", exc)
            self._count(sorted(set(schedule.gpus or ()) & set(service.devices)), "failed", "bad_set")
            return None
        if service.abort.is_set() or not self._running.acquire(blocking=False):
            self._count(gpus, "skipped", "shutting_down" if service.abort.is_set() else "overlap")
            return None
        try:
            return self._held(gpus, schedule)
        finally:
            self._running.release()

    def _held(self, gpus: tuple[int, ...], schedule: ScheduleConfig) -> InterconnectResult | None:
        """Take every GPU's turn (in index order), gate each, take each lock, run, give all back."""
        service, turns = self.service, self.service.turns
        held: list[tuple[int, float]] = []  # (gpu, when its turn was taken)
        locks: list[GpuLock] = []
        holder = Holder(HolderKind.INTERCONNECT, ",".join(map(str, gpus)))
        try:
            for gpu in sorted(gpus):
                if turns.take(gpu, holder, service.config.queue_seconds) is not Turn.GRANTED:
                    return self._skip(gpus, "overlap", f"GPU {gpu}: a round kept it")
                held.append((gpu, time.monotonic()))
            for gpu in gpus:
                refused = service.gate.refusal(service.devices[gpu])
                if refused is not None:
                    return self._skip(gpus, refused[0], f"GPU {gpu}: {refused[1]}")
            for gpu in gpus:
                lock, why = self._lock(service.devices[gpu])
                if why is not None:
                    return self._skip(gpus, "busy", f"GPU {gpu}: {why}")
                if lock is not None:
                    locks.append(lock)
            return self._measure(gpus, schedule)
        finally:
            for lock in locks:
                lock.release()
            for gpu, since in held:  # our load's tail starts now; where it held the cap locks, apply's turn
                service.gate.tracker.mark_ours(gpu, False)
                turns.release(gpu, (since, time.monotonic()), wrote=bool(locks))

    def _lock(self, device: Device) -> tuple[GpuLock | None, str | None]:
        """The GPU's cross-process lock, or why it cannot be had (a sweep or check of another process)."""
        try:
            uuid = device.info().uuid
            lock = GpuLock(self.service.config.state_dir, safe_name(uuid))
            lock.acquire(0.0)
            return lock, None
        except GpuBusy as exc:
            return None, f"owned by pid {exc.owner_pid} (a sweep or probe of another process)"
        except (OSError, DeviceError) as exc:
            return None, f"cannot take its lock: {exc}"

    def _measure(self, gpus: tuple[int, ...], schedule: ScheduleConfig) -> InterconnectResult:
        service = self.service
        devices = [service.devices[gpu] for gpu in gpus]
        for gpu in gpus:
            service.gate.tracker.mark_ours(gpu, True)
        request = request_of(schedule, gpus, service.config.timeout_seconds)
        log.info("interconnect probe on GPUs %s", ",".join(map(str, gpus)))
        try:
            if self._executor is None:
                self._executor = self.make_executor()
            result = self._executor.run(devices, request, service.abort)
        except Exception as exc:  # noqa: BLE001 - the scheduler's thread must go on
            log.exception("interconnect probe failed")
            result = InterconnectResult(gpus=gpus, status="failed", failure_reason="exception",
                                        error_message=str(exc), started_at=time.time())
        self._record(result)
        return result

    def _record(self, result: InterconnectResult) -> None:
        """Counted on every GPU of the set, published, and appended to its history file (beside the probe history)."""
        if result.ok:
            log.info("interconnect GPUs %s: %s", result.gpus, ", ".join(
                f"{a.bytes} B busbw {a.bus_bandwidth_bytes_per_second / 1e9:.1f} GB/s" for a in result.allreduce))
        else:
            log.warning("interconnect GPUs %s %s (%s): %s", result.gpus, result.status, result.failure_reason,
                        result.error_message)
        self._count(result.gpus, result.status, result.failure_reason or "")
        if self.publish is not None:
            self.publish(result)
        history = self.history
        if history is not None:
            history.append_record(self.record(result, history.node))

    def record(self, result: InterconnectResult, host: str) -> dict[str, Any]:
        """The run's history record (``gpuperfd.interconnect/1``): the set's identities and the result."""
        gpus = []
        for gpu in result.gpus:
            info = self.service.info(gpu)
            gpus.append({"index": gpu, "uuid": info.uuid, "name": info.name, "pci_bus_id": info.pci_bus_id})
        return {"schema": HISTORY_SCHEMA, "time": float(result.started_at or time.time()), "host": host,
                "source": "daemon", "gpus": gpus, "result": result.to_dict()}

    def _skip(self, gpus: tuple[int, ...], reason: str, detail: str) -> None:
        log.info("interconnect GPUs %s skipped: %s (%s)", ",".join(map(str, gpus)), reason, detail)
        self._count(gpus, "skipped", reason)
        return None

    def _count(self, gpus: Any, result: str, reason: str) -> None:
        for gpu in gpus:
            self.service.metrics.count(self.service.info(gpu), PROBE, PRESET, result, reason)
