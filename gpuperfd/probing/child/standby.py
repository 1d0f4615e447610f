"""Probe children started before their GPU qualifies, so that the qualifying moment starts at the build.

From the moment a GPU qualifies to the published result, a probe's time went mostly to the CPU: the
child's spawn and its imports of torch and the model code (13 of 19 s for llm on a lent H200,
``benchmarks/qualify_to_result.py``), none of it on the GPU. So when a result is due (or falls due
within about that time), its child is started now, busy GPU or not (the scheduler decides: issue 60):
it only imports (no CUDA call before its build, so a user's job loses nothing and is not seen by it),
its host memory is reserved with the GPU turns like any child's (:meth:`GpuTurns.reserve_now
<gpuperfd.probing.gates.turns.GpuTurns.reserve_now>`: at once or not at all), it waits through the job, and the run
that starts when the GPU qualifies builds in it (:meth:`ChildProcessExecutor.open` takes it as the
carried child). A result no longer due, a round waiting for host memory, a shutdown: the child ends and
its reservation goes.

One slot per GPU. Its reservation is the round's: a round on a GPU whose slot holds one reserves
nothing more, and :meth:`StandbyChildren.round_ended` ends the slot once its child was taken. A taken
slot leaves the GPU's place free: the child for the GPU's next result may start while the round runs
(a child started only when the round ended made the next result wait out its imports: vit 14.8 s and
train 25.5 s from the qualifying moment on a lent H200, against 5-6 s with a ready child).

Ending a slot never waits: the dispatcher calls :meth:`StandbyChildren.drop` on its every pass, and a
child still importing reads no ``stop`` (on a lent H200 the dispatcher once waited 15 s for one, so
no standby was started again when the job that ended it went, and the next run started its own
child 16.6 s from the result). The slot's own thread ends the child (at once, if it is still
importing) and gives its reservation back; a new slot for the GPU can start meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuperfd.device.base import Device

if TYPE_CHECKING:
    from gpuperfd.probe_data.request import ProbeRequest
    from gpuperfd.probing.gates.admission import Ticket
    from gpuperfd.probing.gates.turns import GpuTurns
    from gpuperfd.probing.child.runner import ProbeChild

log = logging.getLogger(__name__)

__all__ = ["StandbyChildren", "GaveWay", "take_standby", "DEFAULT_READY_SECONDS", "LEAD_MARGIN_SECONDS"]

#: How long a child takes to be ready (spawn and imports) before one was measured here: a lent H200's
#: llm child took 11-13 s (qualify_to_result.py), a 2-core VM's tiny CPU child 8 s.
DEFAULT_READY_SECONDS = 15.0
#: Started this much earlier than the last child took, so that it is ready at the qualifying moment.
LEAD_MARGIN_SECONDS = 5.0
#: After a standby child failed to start (not one ended on purpose), none is started for its GPU for
#: this long: a child that cannot start (a broken install) must not be spawned at every dispatcher pass.
FAILED_BACKOFF_SECONDS = 60.0


#: How often a round waiting for its standby child's imports looks for a user's job on the GPU.
TAKE_WATCH_SECONDS = 0.05


@dataclass(frozen=True)
class GaveWay:
    """A user's job appeared on the GPU while the round waited for its standby child's imports: the
    round gives way at once (nothing of ours is on the GPU) and starts no other child."""

    pids: tuple[int, ...]

    @property
    def message(self) -> str:
        return (f"another compute process appeared on the GPU (pid {', '.join(map(str, self.pids))}) "
                "before the probe's child reached it; probe gave way")


@dataclass
class _Slot:
    """One GPU's standby child: starting (its thread), ready, or taken by a round."""

    child: ProbeChild
    ticket: Ticket | None
    started: float
    thread: threading.Thread | None = None
    failed: bool = False
    taken: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    #: Set when the slot is dropped: a child still importing is ended at once (its ``should_abort``).
    cancel: threading.Event = field(default_factory=threading.Event)
    #: Set when the slot ends: its thread, the child's parent thread, then ends the child (unless a
    #: round took it: the round closes it) and gives the reservation back (see :meth:`_start`).
    ended: threading.Event = field(default_factory=threading.Event)
    close_child: bool = True
    #: A child with no process (a simulated one, ``starts_at_once``) has no thread: whoever ends the
    #: slot releases it inline.
    inline: bool = False


class StandbyChildren:
    """At most one child per GPU started ahead of its qualifying moment; thread-safe.

    ``make_child(device, request, also)``: a new, not yet started probe child for ``request`` on ``device``'s
    GPU that watches no GPU yet (a user's job may be on it while the child imports), importing the code
    of the ``also`` requests too (the round that takes it may run them after ``request``).
    """

    def __init__(self, make_child: Callable[[Device, ProbeRequest, Sequence[ProbeRequest]], ProbeChild],
                 timeout_seconds: float,
                 turns: GpuTurns | None = None, clock: Callable[[], float] = time.monotonic,
                 ready_seconds: float = DEFAULT_READY_SECONDS, lead_margin_seconds: float = LEAD_MARGIN_SECONDS) -> None:
        self.make_child = make_child
        #: A child's time to be ready before one was measured, and how much earlier than that it starts.
        self.default_ready_seconds, self.lead_margin_seconds = ready_seconds, lead_margin_seconds
        self.timeout_seconds = timeout_seconds
        #: Where a child's host memory is reserved (None: nowhere, e.g. a test's children).
        self.turns = turns
        self.clock = clock
        self._slots: dict[int, _Slot] = {}
        #: Slots whose child a round took, by GPU, until :meth:`round_ended`.
        self._taken: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        #: Seconds the last standby child of each probe took to be ready.
        self._ready_seconds: dict[str, float] = {}
        #: When each GPU's last standby child failed to start (on ``clock``): see FAILED_BACKOFF_SECONDS.
        self._failed_at: dict[int, float] = {}
        #: Children started and taken by a round (tests, the landing page's words).
        self.started = 0
        self.taken = 0

    def lead_seconds(self, probe: str) -> float:
        """How long before its GPU qualifies a child of ``probe`` is started."""
        return self._ready_seconds.get(probe, self.default_ready_seconds) + self.lead_margin_seconds

    def reserved(self, gpu: int) -> bool:
        """True if ``gpu``'s standby child holds a host-memory reservation (the round then needs none)."""
        with self._lock:
            slot = self._slots.get(gpu)
            return slot is not None and slot.ticket is not None

    def wait_ready(self, gpu: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until ``gpu``'s standby child has started; True if it is ready
        (False: none there, it failed, or it is still starting)."""
        with self._lock:
            slot = self._slots.get(gpu)
        return slot is not None and slot.done.wait(timeout) and not slot.failed

    def ensure(self, device: Device, request: ProbeRequest, need_bytes: int, abort: threading.Event,
               also: Sequence[ProbeRequest] = ()) -> bool:
        """A child for ``device``'s GPU started now (in a thread) unless one is there; False when the
        host memory has no room for it at once (a standby child never waits for memory: a round may need it).
        ``also``: the requests the round may run after ``request``, whose code the child imports too."""
        gpu = device.index
        with self._lock:
            if gpu in self._slots:
                return True
            if self.clock() < self._failed_at.get(gpu, -FAILED_BACKOFF_SECONDS) + FAILED_BACKOFF_SECONDS:
                return False
        ticket = self.turns.reserve_now(gpu, need_bytes) if self.turns is not None else None
        if ticket is not None and not ticket.granted:
            return False
        slot = _Slot(self.make_child(device, request, also), ticket, self.clock())
        slot.child.should_abort = slot.cancel.is_set
        if getattr(slot.child, "starts_at_once", False):  # no process, no thread: its imports are a time
            slot.child.start(time.monotonic() + self.timeout_seconds, defer_build=True)
            self._ready_seconds[request.probe] = slot.child.imports_seconds
            slot.inline = True
            slot.done.set()
        else:
            slot.thread = threading.Thread(target=self._start, args=(gpu, slot), name=f"probe-standby-gpu{gpu}",
                                           daemon=True)
        with self._lock:
            raced = gpu in self._slots or abort.is_set()  # raced with another ensure, or stopping
            present = gpu in self._slots
            if not raced:
                self._slots[gpu] = slot
                self.started += 1
        if raced:
            self._release_now(slot)  # outside the lock: the turns ask ``reserved`` under theirs
            return present
        log.info("gpu %d: %s's child starts now (imports on the CPU) so that it is ready when the GPU qualifies",
                 gpu, request.probe)
        if slot.thread is not None:
            slot.thread.start()
        return True

    def _start(self, gpu: int, slot: _Slot) -> None:
        t0 = self.clock()
        try:
            failed = slot.child.start(time.monotonic() + self.timeout_seconds, defer_build=True)
        except Exception:  # noqa: BLE001 - a standby that cannot start is no standby; the round starts one
            log.exception("gpu %d: standby child could not start", gpu)
            failed = True
        if failed is not None:
            slot.failed = True
            if not slot.cancel.is_set():  # a dropped slot's child was ended on purpose: nothing to say
                message = getattr(failed, "error_message", "") or "see the log"
                log.warning("gpu %d: standby child could not start (%s); the run starts its own, and no standby "
                            "child is started here for %.0f s", gpu, message, FAILED_BACKOFF_SECONDS)
                with self._lock:
                    self._failed_at[gpu] = self.clock()
        else:
            self._ready_seconds[slot.child.spec.probe] = self.clock() - t0
        slot.done.set()
        if slot.failed:
            self.drop(gpu, "its start failed", only=slot, quiet=True)
        # The child dies with the thread that spawned it (PR_SET_PDEATHSIG follows the parent thread,
        # not the process): this thread lives until the slot ends, then ends what the slot held.
        slot.ended.wait()
        self._release_now(slot)

    def take(self, gpu: int, device: Device) -> ProbeChild | GaveWay | None:
        """The GPU's standby child for the round starting now, watching ``device`` from now on; None if
        there is none or it could not start. While it still imports the round waits, watching the GPU:
        a user's job arriving meanwhile ends it (:class:`GaveWay`: the round gives way at once). Its
        reservation stays the slot's until :meth:`round_ended`."""
        with self._lock:
            slot = self._slots.get(gpu)
            if slot is None or slot.taken:
                return None
            slot.taken = True
            del self._slots[gpu]  # the GPU's next result may have its child started meanwhile
            self._taken[gpu] = slot
        deadline = time.monotonic() + self.timeout_seconds
        own = {os.getpid(), slot.child.pid or 0}
        while not slot.done.wait(TAKE_WATCH_SECONDS) and time.monotonic() < deadline:
            foreign = _foreign_pids(device, own)
            if foreign:
                slot.cancel.set()  # the import is ended at once; round_ended gives the reservation back
                return GaveWay(tuple(foreign))
        if slot.failed or not slot.child.alive:
            return None
        child = slot.child
        child.device, child.own = device, {os.getpid()}
        child.should_abort = None  # the round's session sets its own
        with self._lock:
            self.taken += 1
        return child

    def round_ended(self, gpu: int) -> None:
        """The round on ``gpu`` ended: a slot whose child it took is gone (the round closed the child;
        one it gave way before taking is ended by the slot's thread)."""
        with self._lock:
            slot = self._taken.pop(gpu, None)
            if slot is None:
                return
            slot.close_child = slot.cancel.is_set()
            slot.ended.set()
            inline = slot.inline
        if inline:
            self._release_now(slot)

    def drop(self, gpu: int, why: str, only: _Slot | None = None, quiet: bool = False) -> None:
        """End ``gpu``'s standby child (not one a round took) and its reservation, without waiting:
        the slot's thread ends the child (at once while it imports) and gives the reservation back."""
        with self._lock:
            slot = self._slots.get(gpu)
            if slot is None or slot.taken or (only is not None and slot is not only):
                return
            del self._slots[gpu]
            slot.cancel.set()
            slot.ended.set()
            inline = slot.inline
        if not quiet:
            log.info("gpu %d: standby child ended: %s", gpu, why)
        if inline:
            self._release_now(slot)

    def drop_all(self, why: str, wait_seconds: float = 5.0) -> None:
        """End every standby child not taken (a stop); waits up to ``wait_seconds`` for them to be gone."""
        with self._lock:
            slots = [slot for slot in self._slots.values() if not slot.taken]
        for gpu in list(self._slots):
            self.drop(gpu, why)
        deadline = time.monotonic() + wait_seconds
        for slot in slots:
            if slot.thread is not None:
                slot.thread.join(max(0.0, deadline - time.monotonic()))

    def _release_now(self, slot: _Slot) -> None:
        """End what ``slot`` holds: its child (unless a round took and closed it) and its reservation."""
        if slot.close_child:
            slot.child.close()
        if slot.ticket is not None and self.turns is not None:
            self.turns.free(slot.ticket)
            slot.ticket = None


def take_standby(standby: StandbyChildren, device: Device) -> tuple[ProbeChild | None, str | None]:
    """(the GPU's standby child for the round's first session, or None; why the round gives way, or None)."""
    taken = standby.take(device.index, device)
    return (None, taken.message) if isinstance(taken, GaveWay) else (taken, None)


def _foreign_pids(device: Device, own: set[int]) -> list[int]:
    """Compute processes on ``device`` that are not ours (none when the driver cannot tell)."""
    from gpuperfd.device.errors import DeviceError

    try:
        return sorted(p.pid for p in device.compute_processes() if p.pid not in own)
    except DeviceError:
        return []
