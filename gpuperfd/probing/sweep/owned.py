"""The one owned sweep, for the daemon and ``gpuperfd sweep`` alike.

Own the GPU's cap (a cross-process lock, :mod:`.ownership`), put back what an owner that died
left changed, check the GPU is still free, resolve the caps against its limits, then run each
schedule's sweep (:func:`.sweeper.run_sweep`) through one warm session of the executor
(:func:`gpuperfd.probing.executors.choose_executor`). The caller says what to do with each cap and
point (a :class:`~gpuperfd.probing.observer.SweepObserver`) and turns the typed
:class:`OwnedSweep` outcome into its own words: skip counters for the daemon, messages and exit
codes for the CLI.

A read-only run changes no cap, so it writes nothing to the state directory (no lock, no journal):
it only refuses a GPU whose cap a live process owns. (Until issue 29 the CLI's read-only run took
the lock where it could and the daemon's did not; the daemon's rule, which the tests hold it to,
is now the one rule.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from gpuperfd.caps.journal import CapChangedByOther, CapJournal, restore_pending
from gpuperfd.caps.ownership import GpuBusy, GpuLock, is_owned, safe_name
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.executors import Executor, open_session
from gpuperfd.probing.gates.idle import BusyReason
from gpuperfd.probing.observer import SweepObserver
from gpuperfd.probing.sweep.caps import CapSpecError, parse_cap_list, resolve_caps
from gpuperfd.probing.sweep.sweeper import SweepAborted, SweepPreempted, run_sweep

__all__ = ["OwnedStatus", "OwnedSweep", "SweepRequest", "run_owned_sweep"]

log = logging.getLogger(__name__)


class OwnedStatus(str, Enum):
    """How an owned sweep ended."""

    DONE = "done"  # every planned probe ran (points may still have failed: see the points)
    OWNED = "owned"  # another live process owns the GPU's cap
    STATE_DIR = "state_dir"  # the lock or the journal could not be written; no cap was changed
    BUSY = "busy"  # the GPU was busy when checked under the lock
    BAD_CAPS = "bad_caps"  # a cap is outside the board's range (strict)
    ABORTED = "aborted"  # stopped (shutdown, a signal); the cap was restored
    PREEMPTED = "preempted"  # gave the GPU back to a user's job (not a failure); the cap was restored
    DEVICE_ERROR = "device_error"  # the GPU failed mid-sweep
    EXCEPTION = "exception"  # a bug: logged with its traceback, the cap restored


@dataclass(frozen=True)
class PlannedProbe:
    """One probe of an owned sweep: what to run and the caps to run it at (``caps`` None: the sweep's).

    ``origin`` is the caller's own handle, handed back with the probe's observer and points (the
    daemon's round: the YAML schedule it publishes under; a CLI: nothing)."""

    request: ProbeRequest
    caps: Sequence[str | float] | None = None
    origin: Any = None


@dataclass(frozen=True)
class SweepRequest:
    """What one owned sweep runs: the planned probes over ``caps``, one after another.

    ``probes`` is iterated lazily, one at a time, only once the GPU is owned: the daemon's round
    (:class:`gpuperfd.probing.scheduling.service.ProbeService`) yields the schedules that join it while it
    runs. ``caps`` None: each planned probe's own ``caps``.
    """

    probes: Iterable[PlannedProbe]
    caps: Sequence[str | float] | None
    read_only: bool = False
    #: Caps outside the board's range are an error (the CLI), not clamped (the daemon).
    strict_caps: bool = False
    #: The recommendation's max_slowdown for the early stop; None runs every cap.
    stop_early: float | None = None
    #: How long to wait for another owner of the cap (0: refuse at once).
    wait_seconds: float = 0.0
    #: Asked before each point: why a user's job now holds the GPU (a pod allocated it), or None.
    #: A foreign process is the probe child's own watch (it gives way mid-measurement too).
    wanted: Callable[[], str | None] | None = None
    #: What ``current`` in a cap list means when it is not the cap set now: the operator's cap of a GPU
    #: where apply mode holds another (docs/apply.md). None: the cap set now.
    current_watts: float | None = None


@dataclass
class OwnedSweep:
    """The outcome: a status, the words for it, and each planned probe's points so far."""

    status: OwnedStatus
    detail: str = ""
    #: The cap the operator had before the sweep (None if never read).
    original_cap_watts: float | None = None
    #: The resolved caps (with per-probe caps: those of the probe started last).
    caps_watts: list[float] = field(default_factory=list)
    #: True when no cap is changed (asked for, or the only cap is the one set now; per probe as caps_watts).
    read_only: bool = False
    #: (planned probe, its points) per probe started, in order.
    sweeps: list[tuple[PlannedProbe, list[SweepPoint]]] = field(default_factory=list)
    #: The DeviceError's reason when status is DEVICE_ERROR.
    reason: str = ""
    #: The live owner's pid when status is OWNED (0 when unknown).
    owner_pid: int = 0


class _Collect:
    """Keeps a planned probe's points while passing them on."""

    def __init__(self, points: list[SweepPoint], observer: SweepObserver) -> None:
        self.points, self.observer = points, observer

    def on_cap(self, watts: float | None) -> None:
        self.observer.on_cap(watts)

    def on_point(self, point: SweepPoint) -> None:
        self.points.append(point)
        self.observer.on_point(point)

    def measuring(self, measure: Callable[[float], ProbeResult]) -> Callable[[float], ProbeResult]:
        """``measure``, with the observer told while our load runs on the GPU."""
        def run_point(cap_watts: float) -> ProbeResult:
            self.observer.on_measuring(True)
            try:
                return measure(cap_watts)
            finally:
                self.observer.on_measuring(False)

        return run_point


def _take_lock(journal: CapJournal, name: str, request: SweepRequest,
               abort: threading.Event) -> tuple[GpuLock | None, OwnedSweep | None]:
    """The cap's lock (None for a read-only run, which writes nothing to the state directory), or why not."""
    if request.read_only:
        if (owner := is_owned(journal.state_dir, name)) is not None:
            return None, OwnedSweep(OwnedStatus.OWNED, str(GpuBusy(name, owner)), owner_pid=owner)
        return None, None
    lock = journal.lock(name)
    try:
        lock.acquire(wait_seconds=request.wait_seconds, cancel=abort.is_set)
    except GpuBusy as busy:
        return None, OwnedSweep(OwnedStatus.OWNED, str(busy), owner_pid=busy.owner_pid)
    except OSError as exc:
        return None, OwnedSweep(OwnedStatus.STATE_DIR, str(exc.strerror or exc))
    return lock, None


def run_owned_sweep(
    device: Device,
    journal: CapJournal,
    request: SweepRequest,
    executor: Executor,
    observer_for: Callable[[PlannedProbe, OwnedSweep], SweepObserver],
    abort: threading.Event,
    busy: Callable[[], BusyReason | None] | None = None,
) -> OwnedSweep:
    """Lock, restore a dead owner's cap, check ``busy``, resolve caps, sweep each planned probe.

    ``observer_for(planned, outcome)`` gives each planned probe's observer (``outcome`` holds the original
    cap and the resolved caps by then). Never raises for
    a GPU or state-directory failure: the outcome says what happened, and the cap is restored.
    """
    try:
        uuid = device.info().uuid
    except DeviceError as exc:
        return OwnedSweep(OwnedStatus.DEVICE_ERROR, str(exc), reason=exc.reason)
    name = safe_name(uuid)
    lock, refused = _take_lock(journal, name, request, abort)
    if refused is not None:
        return refused
    outcome = OwnedSweep(OwnedStatus.DONE)
    try:
        if lock is not None:  # a leftover of this GPU only: its owner is dead (we hold its lock)
            restored = restore_pending(journal, [device], only=[uuid], lock=False)
            if restored:
                log.warning("gpu %d: took over from an owner that died: restored %s", device.index, "; ".join(restored))
        limits = device.power_limits()
        outcome.original_cap_watts = limits.enforced_watts
        if abort.is_set():
            raise SweepAborted("stopped before the sweep started")
        if busy is not None and (why := busy()) is not None:
            outcome.status, outcome.detail = OwnedStatus.BUSY, str(why)
            return outcome

        def resolve(spec: Sequence[str | float], parse: bool = False) -> bool:
            try:
                named = limits if request.current_watts is None else replace(limits, enforced_watts=request.current_watts)
                outcome.caps_watts = resolve_caps(parse_cap_list(spec) if parse else spec, named,
                                                  strict=request.strict_caps)
            except CapSpecError as exc:
                outcome.status, outcome.detail = OwnedStatus.BAD_CAPS, str(exc)
                return False
            outcome.read_only = request.read_only or outcome.caps_watts == [round(limits.enforced_watts)]
            return True

        if request.caps is not None and not resolve(request.caps):
            return outcome
        _sweep_probes(device, journal, request, executor, observer_for, abort, outcome, resolve)
    except SweepAborted as exc:
        log.warning("%s", exc)
        outcome.status, outcome.detail = OwnedStatus.ABORTED, str(exc)
    except CapChangedByOther as exc:  # an operator's cap: it stays (the guard wrote nothing over it)
        log.warning("%s; the sweep stops", exc)
        outcome.status, outcome.detail = OwnedStatus.ABORTED, str(exc)
    except SweepPreempted as exc:
        log.info("gpu %d: %s", device.index, exc)
        outcome.status, outcome.detail = OwnedStatus.PREEMPTED, str(exc)
    except DeviceError as exc:
        log.error("gpu %d: sweep failed: %s", device.index, exc)
        outcome.status, outcome.detail, outcome.reason = OwnedStatus.DEVICE_ERROR, str(exc), exc.reason
    except OSError as exc:  # the journal could not be written: no cap was changed
        log.error("gpu %d: sweep not run: %s", device.index, exc.strerror or exc)
        outcome.status, outcome.detail = OwnedStatus.STATE_DIR, str(exc.strerror or exc)
    except Exception as exc:  # a bug must be counted and logged, never kill the scheduler's job
        log.exception("gpu %d: sweep failed", device.index)
        outcome.status, outcome.detail = OwnedStatus.EXCEPTION, str(exc)
    finally:
        if lock is not None:
            lock.release()
    return outcome


def _sweep_probes(device: Device, journal: CapJournal, request: SweepRequest, executor: Executor,
                     observer_for: Callable[[PlannedProbe, OwnedSweep], SweepObserver], abort: threading.Event,
                     outcome: OwnedSweep, resolve: Callable[..., bool]) -> None:
    """Each planned probe's sweep through one warm session (one child per GPU for the whole round: the
    next probe is built in it); raises :class:`SweepPreempted` once a point gave way to a user."""
    session = None
    try:
        for planned in request.probes:
            if request.caps is None and not resolve(planned.caps, parse=True):
                return
            points: list[SweepPoint] = []
            outcome.sweeps.append((planned, points))
            collect = _Collect(points, observer_for(planned, outcome))
            session = open_session(executor, device, planned.request, abort, after=session)
            session.prepare()  # the child's imports before any cap changes (not GPU time)
            run_sweep(device, journal, outcome.caps_watts, collect.measuring(session.measure),
                      settle_seconds=planned.request.settle_seconds, read_only=outcome.read_only, abort=abort,
                      observer=collect, stop_early=request.stop_early, wanted=request.wanted)
            if points and points[-1].result.preempted:  # the round ends: the GPU is the user's now
                raise SweepPreempted(points[-1].result.error_message or "a user's job wants the GPU")
    finally:
        if session is not None:
            session.close()
