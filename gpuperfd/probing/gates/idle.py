"""Idle gating: is this GPU someone else's, and has it been idle long enough?

A GPU allocated to a pod (kubelet PodResources) or running any compute process
but ours belongs to someone, even at zero utilization: :func:`allocated_reason`
says so before any idle check, unless the operator marked the pods holding it
as ours (``probes.ours``). The tracker listens to the sampler's readings
(utilization and processes), so idle gating costs no device call of its own.
Our own probe processes do not count as load: the caller passes their PIDs.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from gpuperfd.attribution.allocations import Allocation, AllocationState
from gpuperfd.config import OursConfig, ProbesConfig
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError, NotSupported
from gpuperfd.telemetry.sampler import Reading


#: ``probes.idle_utilization_threshold``'s default: the one threshold, where a caller has no config.
DEFAULT_IDLE_THRESHOLD: float = ProbesConfig.model_fields["idle_utilization_threshold"].default


#: A free stretch shorter than this between two busy readings is the sampler's rhythm, not a gap.
GAP_MIN_SECONDS = 2.5
#: How many of each GPU's last gaps are kept.
GAPS_KEPT = 5


class IdleTracker:
    """Remembers since when each GPU has been idle."""

    def __init__(
        self, utilization_threshold: float, clock: Callable[[], float] = time.monotonic, grace_seconds: float = 2.0
    ) -> None:
        self.utilization_threshold = utilization_threshold
        #: Readings this soon after our probe ended still show its load (NVML averages); ignored.
        self.grace_seconds = grace_seconds
        self._ours_ended: dict[int, float] = {}
        self.clock = clock
        self._lock = threading.Lock()
        self._busy_until: dict[int, float] = {}  # last time the GPU was seen busy
        self._seen: set[int] = set()
        #: GPUs where our own probe runs now: their load is not "busy".
        self._ours: set[int] = set()
        self._start = clock()
        #: GPUs the scheduler handed over as free (Slurm's epilog, POST /api/v1/free): when, on ``clock``.
        self._handed: dict[int, float] = {}
        #: Each GPU's last free stretches (seconds, oldest first) that a user's job ended: what an operator
        #: reads to tell "no gap" from "gaps too short" (issue 60).
        self._gaps: dict[int, deque[float]] = {}

    def observe(self, gpu: int, collector: str, reading: Reading) -> None:
        """Sampler listener: a busy reading moves the GPU's busy mark to now."""
        if collector not in ("utilization", "processes") or not reading.ok:
            return
        with self._lock:
            self._seen.add(gpu)
            if gpu in self._ours or reading.timestamp < self._ours_ended.get(gpu, -1e18) + self.grace_seconds:
                return
            values = {p.metric: p.value for p in reading.points}
            busy = values.get("gpuperf_gpu_utilization_ratio", 0.0) > self.utilization_threshold or (
                values.get("gpuperf_compute_processes", 0.0) > 0
            )
            if busy:
                free = reading.timestamp - self._busy_until.get(gpu, self._start)
                if free >= GAP_MIN_SECONDS:  # more than a sampler period or two since the last busy reading
                    self._gaps.setdefault(gpu, deque(maxlen=GAPS_KEPT)).append(free)
                self._busy_until[gpu] = reading.timestamp
                handed = self._handed.get(gpu)
                # A job's last readings can trail its end (NVML averages utilization): busy readings
                # within the grace after the hand-off do not undo it; a later one does.
                if handed is not None and reading.timestamp > handed + self.grace_seconds:
                    del self._handed[gpu]

    def mark_ours(self, gpu: int, running: bool) -> None:
        """Tell the tracker our probe runs (or stopped) on this GPU: our own load is not "busy"."""
        with self._lock:
            if running:
                self._ours.add(gpu)
            else:
                self._ours.discard(gpu)
                self._ours_ended[gpu] = self.clock()

    def hand_off(self, gpu: int) -> None:
        """The scheduler says ``gpu`` is free now (its job ended): it qualifies without waiting out
        ``probes.idle_seconds``, until a reading shows it busy again."""
        with self._lock:
            self._handed[gpu] = self.clock()

    def handed_since(self, gpu: int) -> float | None:
        """When the scheduler handed ``gpu`` over as free (on ``clock``), if not seen busy since; else None."""
        with self._lock:
            return self._handed.get(gpu)

    def recent_gaps(self, gpu: int) -> list[float]:
        """The GPU's last free stretches that ended (seconds, oldest first; at most GAPS_KEPT)."""
        with self._lock:
            return list(self._gaps.get(gpu, ()))

    def idle_for(self, gpu: int) -> float:
        """Seconds since the GPU was last seen busy (since start if never); 0 if never sampled."""
        with self._lock:
            if gpu not in self._seen:
                return 0.0
            return self.clock() - self._busy_until.get(gpu, self._start)


class BusyKind(str, Enum):
    """Why a GPU is not free to probe, as a value callers can branch on (never a message to parse)."""

    ALLOCATED = "allocated"  # a pod holds it (kubelet), or who holds it cannot be known
    FOREIGN_PROCESS = "foreign_process"  # a compute process that is not ours
    UTILIZATION = "utilization"  # SM utilization above the configured threshold
    OWN_TAIL = "own_tail"  # still our own run's load, and the wait for it to pass was cut short
    UNREADABLE = "unreadable"  # the driver could not say (a lost GPU, an NVML error): busy, to be safe
    MIG = "mig"  # MIG mode is on: its instances are other tenants' (probes.allow_mig off)
    GPUPERFD_PROBE = "gpuperfd_probe"  # a gpuperfd probe child (a daemon's or a CLI's): not a user's job


#: The probe child's module (``python -m``): how a gpuperfd probe child is told from a user's process.
PROBE_CHILD_MODULE = "gpuperfd.probe_child.child"
#: The interconnect probe's workers (one per GPU of its set): probe children too.
INTERCONNECT_WORKER_MODULE = "gpuperfd.probe_child.interconnect.worker"


def is_probe_child(pid: int) -> bool:
    """True if ``pid`` runs ``python -m gpuperfd.probe_child.child`` (its /proc cmdline; False when unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(a == "-m" and b in (PROBE_CHILD_MODULE, INTERCONNECT_WORKER_MODULE) for a, b in zip(args, args[1:]))


def foreign_reason(pids: list[int]) -> BusyReason:
    """The reason for compute processes not ours: a gpuperfd probe child is named as such (``gpuperfd
    check`` beside a probing daemon must not call the daemon's child a user's job)."""
    children = [pid for pid in pids if is_probe_child(pid)]
    if children and len(children) == len(pids):
        return BusyReason(BusyKind.GPUPERFD_PROBE,
                          f"gpuperfd is probing this GPU (pid {', '.join(map(str, children[:5]))})")
    users = [pid for pid in pids if pid not in children]
    return BusyReason(BusyKind.FOREIGN_PROCESS, f"compute process(es) {', '.join(map(str, users[:5]))} running")


@dataclass(frozen=True)
class BusyReason:
    """One reason a GPU is busy: its kind and the words for the operator."""

    kind: BusyKind
    message: str

    def __str__(self) -> str:
        return self.message


def _read_busy(device: Device, utilization_threshold: float, own: set[int]) -> BusyReason | None:
    """One reading. The one policy for fields the driver cannot read, as in :func:`allocated_reason`:
    a process list or utilization that cannot be read (not supported, an NVML error, a lost GPU)
    makes the GPU busy (UNREADABLE): we never probe a GPU we cannot see is free."""
    try:
        foreign = [p.pid for p in device.compute_processes() if p.pid not in own]
        if foreign:
            return foreign_reason(foreign)
        utilization = device.utilization().gpu_ratio
    except DeviceError as exc:
        return BusyReason(BusyKind.UNREADABLE, f"cannot check the GPU is idle: {exc.reason}")
    if utilization > utilization_threshold:
        return BusyReason(BusyKind.UTILIZATION,
                          f"utilization {utilization:.0%} above {utilization_threshold:.0%}")
    return None


def busy_reason(
    device: Device,
    utilization_threshold: float,
    own_pids: Iterable[int] = (),
    *,
    wait_seconds: float = 0.0,
    poll_interval: float = 0.25,
) -> BusyReason | None:
    """The one live "is this GPU busy?" check (daemon gate, CLI sweep, probe runner, warm child).

    Busy: a compute process not in ``own_pids``, SM utilization above ``utilization_threshold``
    (``probes.idle_utilization_threshold``), or a GPU the driver cannot read (see
    :func:`_read_busy`). ``wait_seconds``: keep reading (every ``poll_interval``) while a
    transient reason (a foreign process, utilization) lasts: NVML's utilization covers its
    last sample period and a child that just exited can still be listed.
    """
    own = set(own_pids)
    deadline = time.monotonic() + max(wait_seconds, 0.0)
    while True:
        reason = _read_busy(device, utilization_threshold, own)
        if reason is None or reason.kind is BusyKind.UNREADABLE or time.monotonic() >= deadline:
            return reason
        time.sleep(poll_interval)


def busy_after_own_run(
    device: Device,
    utilization_threshold: float,
    own_pids: Iterable[int],
    since_own_run: float,
    grace_seconds: float,
    abort: threading.Event,
    wait: bool = True,
) -> BusyReason | None:
    """:func:`busy_reason`, except for the tail of our own run that ended ``since_own_run`` seconds ago.

    NVML averages utilization over its last sample period (up to a second), so a check right after
    our probe's child exits still reads ~100 %: on an H200 the next scheduled probe was skipped as
    busy 1 ms after the previous one ended. Within ``grace_seconds`` of our own run a utilization
    reading is taken again once the grace is over (OWN_TAIL if ``abort`` cuts that wait short);
    foreign processes are never waited for. ``wait`` False: OWN_TAIL at once instead of the wait (the
    gap dispatcher, one thread for every GPU, looks again at its next pass).
    """
    reason = busy_reason(device, utilization_threshold, own_pids)
    if reason is None or reason.kind is not BusyKind.UTILIZATION:
        return reason
    left = grace_seconds - since_own_run
    if left <= 0:
        return reason
    if not wait or abort.wait(left):
        return BusyReason(BusyKind.OWN_TAIL, f"{reason.message}, within {grace_seconds:.0f} s of our own run")
    return busy_reason(device, utilization_threshold, own_pids)


def is_ours(allocation: Allocation, ours: OursConfig) -> bool:
    """True if the operator marked this pod's GPUs as ours to probe (namespace or pod name pattern)."""
    return allocation.namespace in ours.namespaces or any(fnmatch.fnmatchcase(allocation.pod, p) for p in ours.pods)


def allocated_reason(
    device: Device,
    state: AllocationState | None,
    ours: OursConfig,
    own_pids: Iterable[int] = (),
    kubelet_socket: str | None = None,
) -> BusyReason | None:
    """Why this GPU belongs to someone else (a pod, a foreign process), or None if it is free.

    A kubelet that exists but never answered leaves the allocation unknown: the
    GPU counts as allocated. After one answer the last good map is used while
    the kubelet is away (a restart does not free GPUs). ``kubelet_socket`` is
    set where the kubelet's answer is required (inside a Kubernetes pod): a
    socket never seen there, or no watcher at all, leaves every GPU allocated.
    """
    if kubelet_socket is not None and state is None:
        return BusyReason(BusyKind.ALLOCATED, "allocation unknown: the allocation collector is off, and in Kubernetes the kubelet must answer")
    if kubelet_socket is not None and state is not None and not state.seen:
        return BusyReason(BusyKind.ALLOCATED, (
            f"allocation unknown: no kubelet PodResources socket at {kubelet_socket} (mount it read-only, "
            "as deploy/kubernetes does, or set attribution.kubernetes.required: false)"
        ))
    if state is not None and state.seen and not state.answered:
        return BusyReason(BusyKind.ALLOCATED, f"kubelet PodResources never answered ({state.reason}): allocation unknown")
    if (pod := pod_reason(device, state, ours)) is not None:
        return pod
    try:
        own = set(own_pids)
        pids = [p.pid for p in device.compute_processes() if p.pid not in own]
    except DeviceError as exc:
        return BusyReason(BusyKind.UNREADABLE, f"cannot check who holds the GPU: {exc.reason}")
    return foreign_reason(pids) if pids else None


def pod_reason(device: Device, state: AllocationState | None, ours: OursConfig) -> BusyReason | None:
    """Why a pod of someone else's now holds this GPU (kubelet map), or None: the check a running round
    repeats between points (our own child's process is on the GPU then, so processes are not read)."""
    if state is None or not state.seen or not state.answered:
        return None  # the gate before the round refused an unknown allocation; the last good map holds
    try:
        uuid = device.info().uuid
        try:
            ids = [uuid, *device.mig_uuids()]
        except DeviceError:
            ids = [uuid]
    except DeviceError as exc:
        return BusyReason(BusyKind.UNREADABLE, f"cannot check who holds the GPU: {exc.reason}")
    foreign = [a for a in state.for_devices(ids) if not is_ours(a, ours)]
    if not foreign:
        return None
    first = foreign[0]
    return BusyReason(BusyKind.ALLOCATED,
                      f"allocated to pod {first.namespace}/{first.pod} container {first.container} ({first.resource})")


def gave_way(busy: BusyReason) -> tuple[str, str]:
    """(status, failure_reason) of a point not started because the GPU is busy.

    A user's job (a process, a pod, load) that arrived after the gate is a preemption: skipped,
    ``preempted``, never a failure. A GPU the driver cannot read stays failed, ``gpu_busy``: that
    may be the GPU's own fault."""
    return ("failed", "gpu_busy") if busy.kind is BusyKind.UNREADABLE else ("skipped", "preempted")


def mig_reason(device: Device, allow_mig: bool) -> BusyReason | None:
    """Why a probe must not run on a GPU in MIG mode (its instances are other tenants'), or None.

    ``allow_mig`` (probes.allow_mig) lets it run. A GPU that cannot report MIG mode has none.
    """
    if allow_mig:
        return None
    try:
        enabled = device.mig_enabled()
    except NotSupported:
        return None
    except DeviceError as exc:
        return BusyReason(BusyKind.UNREADABLE, f"cannot check MIG mode: {exc.reason}")
    return BusyReason(BusyKind.MIG, "MIG mode is on (set probes.allow_mig to probe it)") if enabled else None


def not_idle_text(idle_for_seconds: float, required_seconds: float) -> str:
    """Why a probe was skipped as not idle, with enough digits to see the gap (never "idle 5 s < 5 s")."""
    digits = 0 if required_seconds - idle_for_seconds >= 1 else 1
    if round(idle_for_seconds, digits) >= round(required_seconds, digits):
        digits = 2
    return f"idle for {idle_for_seconds:.{digits}f} s, needs {required_seconds:g} s"
