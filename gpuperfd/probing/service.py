"""The daemon's probe service: gate, sweep, run, publish.

For one scheduled probe on one GPU it: refuses to overlap another run on that
GPU, checks the GPU has been idle long enough, resolves the cap list, runs the
sweep (each point through an executor: a child process for real GPUs, the
simulator's physics for simulated ones), and publishes every result to the
metrics and the history file. Every outcome, skipped runs included, is counted
with its reason.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuperfd.attribution.allocations import AllocationState
from gpuperfd.config import ProbesConfig, ScheduleConfig
from gpuperfd.device.base import Device, GpuInfo
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.spec import DEFAULT_PRESET
from gpuperfd.probing.executors import Executor, open_session
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.idle import IdleTracker, allocated_reason, busy_reason, mig_reason
from gpuperfd.probing.metrics import ProbeMetrics, cap_label
from gpuperfd.probing.sweep.caps import parse_cap_list, resolve_caps
from gpuperfd.probing.sweep.journal import CapJournal, restore_pending
from gpuperfd.probing.sweep.ownership import GpuBusy, GpuLock, is_owned, safe_name
from gpuperfd.probe_data.recommend import SweepPoint, recommend
from gpuperfd.probing.sweep.sweeper import SweepAborted, run_sweep
from gpuperfd.system.memory import release_free_memory

log = logging.getLogger(__name__)



#: Seconds after our own run on a GPU during which its utilization is read as our run's tail.
OWN_LOAD_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class RunOutcome:
    result: str  # ok, skipped, failed, aborted
    reason: str = ""
    points: tuple[SweepPoint, ...] = ()


def preset_of(schedule: ScheduleConfig) -> str:
    return schedule.preset or DEFAULT_PRESET[schedule.probe]


class ProbeService:
    """Runs scheduled probes on GPUs; thread-safe, one run per GPU at a time."""

    def __init__(
        self,
        config: ProbesConfig,
        devices: list[Device],
        executor: Executor,
        metrics: ProbeMetrics,
        tracker: IdleTracker,
        history: HistoryWriter | None = None,
        on_cap_change: Callable[[int], None] | None = None,
        allocations: Callable[[], AllocationState] | None = None,
        kubelet_socket: str | None = None,
    ) -> None:
        self.config = config
        #: The kubelet's latest pod allocations (None: not on Kubernetes, processes only).
        self.allocations = allocations
        #: Where the kubelet must answer before any probe runs (inside a pod); None on bare metal.
        self.kubelet_socket = kubelet_socket
        #: Told the GPU index after every cap change (the daemon re-reads its power collector).
        self.on_cap_change = on_cap_change
        self.devices = {d.index: d for d in devices}
        self.executor = executor
        self.metrics = metrics
        self.tracker = tracker
        self.history = history
        self.journal = CapJournal(config.state_dir)
        self.abort = threading.Event()
        self._gpu_locks = {index: threading.Lock() for index in self.devices}
        self._node_lock = threading.Lock()  # used when parallel_gpus is off
        self._active = 0
        self._active_lock = threading.Lock()
        self._idle_cv = threading.Condition(self._active_lock)
        self._infos: dict[int, GpuInfo] = {}
        #: Monotonic time our last run on each GPU ended (its utilization tail is ours).
        self._own_load_ended: dict[int, float] = {}
        #: Latest point per (gpu, probe, preset, cap), for the landing page.
        self._latest: dict[tuple[int, str, str], dict[float, SweepPoint]] = {}
        self._latest_lock = threading.Lock()
        #: The operator's cap per GPU as last recorded ("current" in a cap list means this one).
        self._operator_caps: dict[int, float] = {}

    def publish_original_caps(self) -> None:
        """Publish each GPU's cap as the operator's; call after any left-over cap was restored."""
        for device in self.devices.values():
            try:
                watts = device.power_limits().enforced_watts
                self._operator_caps[device.index] = watts
                self.metrics.set_original_cap(device.info(), watts)
            except DeviceError as exc:
                log.warning("gpu %d: cannot read its power cap: %s", device.index, exc)

    def apply_config(self, config: ProbesConfig) -> None:
        """Take a (re)loaded config: results of caps no schedule runs any more are withdrawn.

        A GPU whose limits cannot be read now (lost) keeps what it has; its caps
        are checked at the next reload.
        """
        self.config = config
        scheduled: dict[int, set[tuple[str, str, str]]] = {}
        for index, device in self.devices.items():
            try:
                limits = device.power_limits()
            except DeviceError:
                continue
            limits = replace(limits, enforced_watts=self._operator_caps.get(index, limits.enforced_watts))
            scheduled[index] = {
                (schedule.probe, preset_of(schedule), cap_label(watts))
                for schedule in (config.schedules if config.enabled else ())
                if schedule.gpus is None or index in schedule.gpus
                for watts in resolve_caps(parse_cap_list(schedule.caps), limits)
            }
        gpu_of = {str(index): index for index in scheduled}

        def keep(gpu: str, probe: str, preset: str, cap: str) -> bool:
            return gpu not in gpu_of or (probe, preset, cap) in scheduled[gpu_of[gpu]]

        dropped = self.metrics.retain_caps(keep)
        with self._latest_lock:
            for (gpu, probe, preset), points in self._latest.items():
                for watts in [w for w in points if not keep(str(gpu), probe, preset, cap_label(w))]:
                    del points[watts]
        if dropped:
            log.info("reload: withdrew %d probe result(s) of caps no longer scheduled", dropped)

    def latest(self) -> dict[tuple[int, str, str], list[SweepPoint]]:
        """The latest ok point at each cap, per (gpu, probe, preset), highest cap first."""
        with self._latest_lock:
            return {key: sorted(points.values(), key=lambda p: -p.cap_watts) for key, points in self._latest.items()}

    def stop(self, timeout: float = 30.0) -> None:
        """Abort running probes and wait (bounded) until their caps are restored."""
        self.abort.set()
        deadline = time.monotonic() + timeout
        with self._idle_cv:
            while self._active and time.monotonic() < deadline:
                self._idle_cv.wait(max(0.0, deadline - time.monotonic()))

    def run(self, schedule: ScheduleConfig, gpu: int) -> RunOutcome:
        """One scheduled run of ``schedule`` on GPU ``gpu`` (a sweep if several caps)."""
        device = self.devices[gpu]
        info = self._info(device)
        preset = preset_of(schedule)
        lock = self._gpu_locks[gpu]
        if self.abort.is_set():
            return self._skip(info, schedule, "shutting_down")
        # Runs of different schedules on one GPU queue here (bounded); never two at once.
        if not lock.acquire(timeout=self.config.queue_seconds):
            return self._skip(info, schedule, "overlap")
        node_locked = False
        try:
            if not self.config.parallel_gpus:
                node_locked = self._node_lock.acquire(timeout=self.config.timeout_seconds)
                if not node_locked:
                    return self._skip(info, schedule, "node_busy")
            try:
                device.info()  # a lost GPU is skipped with its reason, not raised into the scheduler
            except DeviceError as exc:
                return self._skip(info, schedule, exc.reason, str(exc))
            state = self.allocations() if self.allocations is not None else None
            held = allocated_reason(device, state, self.config.ours, (os.getpid(),), self.kubelet_socket)
            if held is not None:  # someone's GPU, even at zero utilization
                return self._skip(info, schedule, "allocated", held)
            if (why := mig_reason(device, self.config.allow_mig)) is not None:
                return self._skip(info, schedule, "mig", why)
            idle_for = self.tracker.idle_for(gpu)
            if idle_for < self.config.idle_seconds:
                return self._skip(info, schedule, "not_idle", f"idle {idle_for:.0f} s < {self.config.idle_seconds:.0f} s")
            reason = self._busy_reason(device, gpu)
            if reason is not None:
                return self._skip(info, schedule, "busy", reason)
            with self._active_lock:
                self._active += 1
            try:
                return self._sweep(device, schedule, preset)
            finally:
                with self._idle_cv:
                    self._active -= 1
                    self._idle_cv.notify_all()
                self._own_load_ended[gpu] = time.monotonic()
                release_free_memory()  # a round's results and messages: back to the idle footprint
        finally:
            if node_locked:
                self._node_lock.release()
            lock.release()

    def _busy_reason(self, device: Device, gpu: int) -> str | None:
        """busy_reason, except for the tail of our own run that just ended on this GPU.

        NVML averages utilization over its last sample period (up to a second), so a
        check right after our probe's child exits still reads ~100 %: on an H200 the
        next scheduled probe was skipped as busy 1 ms after the previous one ended.
        Within OWN_LOAD_GRACE_SECONDS of our own run, a high reading is read again
        once that grace is over; foreign processes are never waited for.
        """
        threshold = self.config.idle_utilization_threshold
        reason = busy_reason(device, threshold, own_pids=(os.getpid(),))
        if reason is None or not reason.startswith("utilization"):
            return reason
        wait = OWN_LOAD_GRACE_SECONDS - (time.monotonic() - self._own_load_ended.get(gpu, -math.inf))
        if wait <= 0 or self.abort.wait(wait):
            return reason
        return busy_reason(device, threshold, own_pids=(os.getpid(),))

    def _info(self, device: Device) -> GpuInfo:
        """The GPU's identity, or the last one read while it answered (for labels of a lost GPU)."""
        try:
            self._infos[device.index] = device.info()
        except DeviceError:
            if device.index not in self._infos:
                return GpuInfo(device.index, "", "", "", "", "", 0, "")
        return self._infos[device.index]

    def _cap_changed(self, device: Device, info, watts: float | None) -> None:  # type: ignore[no-untyped-def]
        if self.on_cap_change is not None:  # first the served limit, then the sweep flag
            self.on_cap_change(device.index)
        self.metrics.set_sweep_cap(info, watts)

    def _skip(self, info, schedule: ScheduleConfig, reason: str, detail: str = "") -> RunOutcome:  # type: ignore[no-untyped-def]
        log.info("gpu %d: %s skipped: %s%s", info.index, schedule.probe, reason, f" ({detail})" if detail else "")
        self.metrics.count(info, schedule.probe, preset_of(schedule), "skipped", reason)
        return RunOutcome("skipped", reason)

    def _sweep(self, device: Device, schedule: ScheduleConfig, preset: str) -> RunOutcome:
        """Own the GPU's cap (cross-process lock), put back what a dead owner left, then sweep."""
        info = self._info(device)
        name = safe_name(info.uuid)
        gpu_lock: GpuLock | None = None
        if self.config.read_only:
            # Changes no cap, so writes nothing to the state directory; still never on a swept GPU.
            owner = is_owned(self.journal.state_dir, name)
            if owner is not None:
                return self._skip(info, schedule, "busy", str(GpuBusy(name, owner)))
        else:
            gpu_lock = GpuLock(self.journal.state_dir, name)
            try:
                gpu_lock.acquire()
            except GpuBusy as busy:
                return self._skip(info, schedule, "busy", str(busy))
            except OSError as exc:
                log.error("gpu %d: cannot take the power-cap lock in %s (%s); not sweeping",
                          device.index, self.journal.state_dir, exc.strerror or exc)
                self.metrics.count(info, schedule.probe, preset, "failed", "state_dir")
                return RunOutcome("failed", "state_dir")
        try:
            if gpu_lock is not None:
                restored = restore_pending(self.journal, [device], only=[info.uuid], lock=False)
                if restored:
                    log.warning("gpu %d: took over from an owner that died: restored %s", device.index, "; ".join(restored))
            return self._sweep_owned(device, info, schedule, preset)
        finally:
            if gpu_lock is not None:
                gpu_lock.release()

    def _sweep_owned(self, device: Device, info: GpuInfo, schedule: ScheduleConfig, preset: str) -> RunOutcome:
        try:
            limits = device.power_limits()
        except DeviceError as exc:
            self.metrics.count(info, schedule.probe, preset, "failed", exc.reason)
            return RunOutcome("failed", exc.reason)
        operator_cap = limits.enforced_watts
        self._operator_caps[device.index] = operator_cap
        self.metrics.set_original_cap(info, operator_cap)
        caps = resolve_caps(parse_cap_list(schedule.caps), limits)
        read_only = self.config.read_only or caps == [round(operator_cap)]
        sweep_id = uuidlib.uuid4().hex[:12]
        published: list[SweepPoint] = []

        session = open_session(self.executor, device, schedule, self.abort)  # one warm child per sweep

        def run_point(cap: float) -> ProbeResult:
            self.tracker.mark_ours(device.index, True)
            try:
                return session.measure(cap)
            finally:
                self.tracker.mark_ours(device.index, False)

        def on_point(point: SweepPoint) -> None:
            published.append(point)
            if point.result.status != "ok":
                log.warning(
                    "gpu %d: %s/%s at %.0f W %s (%s): %s", device.index, schedule.probe, preset, point.cap_watts,
                    point.result.status, point.result.failure_reason, point.result.error_message,
                )
            with self._latest_lock:  # a failed point is no candidate: its last ok result goes too
                points = self._latest.setdefault((device.index, schedule.probe, preset), {})
                if point.result.status == "ok":
                    points[round(point.cap_watts)] = point
                else:
                    points.pop(round(point.cap_watts), None)
            at_operator_cap = round(point.cap_watts) == round(operator_cap)
            self.metrics.publish(info, point.result, point.cap_watts, at_operator_cap)
            if self.history is not None:
                self.history.append(info, point.result.to_dict(), point.cap_watts, operator_cap, sweep_id)

        try:
            run_sweep(
                device,
                self.journal,
                caps,
                run_point,
                settle_seconds=schedule.settle_seconds,
                read_only=read_only,
                abort=self.abort,
                on_cap=lambda watts: self._cap_changed(device, info, watts),
                on_point=on_point,
                stop_early=self.config.max_slowdown if self.config.stop_early else None,
            )
        except SweepAborted as exc:
            log.warning("%s", exc)
            self.metrics.count(info, schedule.probe, preset, "aborted", "shutdown")
            return RunOutcome("aborted", "shutdown", tuple(published))
        except DeviceError as exc:
            log.error("gpu %d: sweep failed: %s", device.index, exc)
            self.metrics.count(info, schedule.probe, preset, "failed", exc.reason)
            return RunOutcome("failed", exc.reason, tuple(published))
        except OSError as exc:  # the journal could not be written: no cap was changed
            log.error("gpu %d: sweep not run: %s", device.index, exc.strerror or exc)
            self.metrics.count(info, schedule.probe, preset, "failed", "state_dir")
            return RunOutcome("failed", "state_dir", tuple(published))
        except Exception:  # a bug must be counted and logged, never kill the scheduler's job
            log.exception("gpu %d: %s sweep failed", device.index, schedule.probe)
            self.metrics.count(info, schedule.probe, preset, "failed", "exception")
            return RunOutcome("failed", "exception", tuple(published))
        finally:
            session.close()
        failed = [p for p in published if p.result.status not in ("ok", "skipped")]
        if len(published) > 1:
            best = recommend(published, self.config.max_slowdown)
            if best is not None:
                log.info(
                    "gpu %d %s/%s: recommended cap %.0f W (saves %.1f%% energy, %.1f%% slower than %.0f W)",
                    device.index, schedule.probe, preset, best.cap_watts,
                    100 * best.energy_saving_ratio, 100 * best.slowdown_ratio, best.baseline_cap_watts,
                )
        if failed:
            return RunOutcome(failed[0].result.status, failed[0].result.failure_reason or "unknown", tuple(published))
        return RunOutcome("ok", "", tuple(published))
