"""Who holds each GPU now, and who gets it next: the daemon's one owner of GPU turns (issue 62).

A probe round, an interconnect run (every GPU of its set), apply mode's cap change and ``gpuperfd check``'s
probe each need a GPU to themselves. Each takes the GPU's turn here: one holder per GPU at a time, the
others queued in arrival order and served one at a time. Apply mode queues for several GPUs at once
(:meth:`GpuTurns.take_each`): a round on one GPU does not hold up its change on another, and its place in
each GPU's line is kept meanwhile. On a serial node (``probes.parallel_gpus`` off) a round also takes the
node's turn, so one round runs on the node at a time. Whoever needs to know when a GPU is given back (our
load's tail, the GPU-time ledger, apply mode's next pass) listens here instead of asking each holder.

A claimant that starts a probe child (a round, the check's probe) states the host memory the child needs
when it queues (``memory``), and the GPU and the memory are granted in one step, by one rule
(:meth:`GpuTurns._grant`, under the turns' lock): a claimant gets the GPU when

1. it is the head of the GPU's line and nobody holds the GPU, and
2. it states no memory, or its memory is booked now: it is the first of the memory line (the claimants
   that passed 1 and wait only for memory, across GPUs, in the order they got there) and its bytes fit
   the budget of the memory book (:class:`~gpuperfd.probing.gates.admission.Admission`: budget, what is
   reserved, the series, the words of a wait and a refusal; the book queues nobody).

So the memory line is served first come first served, a small child never overtakes its head, and a
memory waiter keeps the head of its GPU's line (no later claimant of that GPU passes it, as when a round
held the GPU while it waited) but holds no GPU: :meth:`GpuTurns.holder` is None until its memory is booked.
Its memory is asked once, when 1 first holds (a round whose GPU's standby child holds a reservation needs
none), and bytes more than the whole budget are refused at once (:attr:`Turn.REFUSED`, reason
``memory_budget``, one error line), never queued. The wait for the line is bounded by ``timeout``, the
wait for memory by ``memory_timeout`` (None: as long as it takes, as a round waits); ``stop()`` ends
either (:attr:`Turn.STOPPED`). Memory waiters look again every ``POLL_SECONDS`` (the budget moves with
the daemon's RSS) and at every release. The GPU's release frees the reservation its holder got with it
(the holder releases once its child is gone). A reservation that must never queue before a claimant's (a
standby child, :meth:`GpuTurns.reserve_now`) is made at once or not at all, and never while anyone
waits for memory.

Lock order: the turns' lock, then a ``memory`` callable's (the standby children's) and the book's;
neither calls back into the turns while holding its own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from gpuperfd.probing.gates.admission import POLL_SECONDS, Admission, Ticket

__all__ = ["GpuTurns", "Holder", "HolderKind", "Memory", "Release", "Turn"]

log = logging.getLogger(__name__)


class HolderKind(str, Enum):
    """What holds a GPU."""

    ROUND = "round"  # a probe round (ProbeService.run)
    INTERCONNECT = "interconnect_run"  # an interconnect run: every GPU of its set
    APPLY = "apply"  # apply mode's cap change or revert (ApplyController, in the daemon)
    CHECK = "check"  # gpuperfd check's probe on the GPU (its own turns, in the check's process)


@dataclass(frozen=True)
class Holder:
    """Who holds (or waits for) a GPU: its kind and a name for log lines (a job key, the set)."""

    kind: HolderKind
    name: str = ""


class Turn(str, Enum):
    """What a claimant waiting for a GPU got."""

    GRANTED = "granted"  # the GPU is its own until it releases it
    SERVED = "served"  # its ``served`` check came true first (a round ran its schedule): nothing to hold
    TIMEOUT = "timeout"  # the wait passed its timeout (the line's, or the memory's)
    REFUSED = "refused"  # its memory is more than the whole budget: it never fits (memory_budget)
    STOPPED = "stopped"  # its ``stop`` check came true first (the service stops, the check's deadline)


#: Host memory a claimant states: bytes, or a callable asked once, when the GPU's line is the claimant's.
Memory = int | Callable[[], int]


@dataclass(frozen=True)
class Release:
    """A GPU given back: by whom, the monotonic span our load ran on it (None: none ran), and whether
    the holder may have changed the GPU's cap (``wrote``: apply mode's pass is due now)."""

    gpu: int
    holder: Holder
    load: tuple[float, float] | None
    wrote: bool


@dataclass(eq=False)
class _Claim:
    """One claimant in a line: who, the memory it states and, once asked, its bytes, since when (the
    book's clock) it waits for them and whether it said so; until when (monotonic) it waits at all."""

    holder: Holder
    gpu: int = -1
    memory: Memory | None = None
    memory_timeout: float | None = None
    deadline: float = math.inf
    need: int | None = None
    since: float = 0.0
    told: bool = False


@dataclass
class _Slot:
    """One turn (a GPU's, or the node's): its holder, the memory booked with it, and the claimants
    queued for it, oldest first."""

    holder: Holder | None = None
    queue: deque[_Claim] = field(default_factory=deque)
    ticket: Ticket | None = None


class GpuTurns:
    """The turns of a node's GPUs (thread-safe): :meth:`take` and :meth:`release` each GPU (with the host
    memory of its child, in the ``memory`` book), :meth:`take_node` and :meth:`release_node` the node;
    :meth:`holder` says who holds a GPU."""

    def __init__(self, gpus: Iterable[int], memory: Admission | None = None) -> None:
        self._cond = threading.Condition()
        self._slots = {gpu: _Slot() for gpu in gpus}
        self._node = _Slot()
        #: The host-memory book the claimants' reservations are kept in (None: no child needs any, e.g.
        #: the simulator: a claimant's ``memory`` is then ignored).
        self.memory = memory
        #: The claimants at the head of a free GPU's line waiting only for memory, in the order they got there.
        self._memory_line: deque[_Claim] = deque()
        #: Told every :class:`Release`, before the GPU goes to the next claimant (so its gate sees our tail).
        self.listeners: list[Callable[[Release], None]] = []

    def take(self, gpu: int, holder: Holder, timeout: float, served: Callable[[], bool] | None = None, *,
             stop: Callable[[], bool] | None = None, memory: Memory | None = None,
             memory_timeout: float | None = None) -> Turn:
        """Wait (at most ``timeout`` s, in arrival order) for ``gpu``, and for ``memory`` bytes of host
        memory booked with it (at most ``memory_timeout`` s more; None: until ``stop()``); SERVED as soon as
        ``served()`` is true, STOPPED as soon as ``stop()`` is (both checked under the turns' lock, again at
        every :meth:`nudge`), REFUSED where the memory never fits."""
        claim = _Claim(holder, gpu, memory if self.memory is not None else None, memory_timeout)
        return self._take(self._slots[gpu], claim, timeout, served, stop)

    def release(self, gpu: int, load: tuple[float, float] | None = None, wrote: bool = False) -> None:
        """Give ``gpu`` back (its holder only, once its child is gone): the memory booked with it is freed,
        the listeners hear it, then the next claimant gets it."""
        slot = self._slots[gpu]
        with self._cond:
            holder, ticket, slot.ticket = slot.holder, slot.ticket, None
        assert holder is not None, f"GPU {gpu} released while nobody held it"
        self.free(ticket)
        done = Release(gpu, holder, load, wrote)
        for listener in self.listeners:
            try:
                listener(done)
            except Exception:  # noqa: BLE001 - a listener's bug must not keep the GPU held
                log.exception("gpu %d: a turn listener failed", gpu)
        with self._cond:
            slot.holder = None
            self._cond.notify_all()

    def reserve_now(self, gpu: int, need: int) -> Ticket | None:
        """Book ``need`` bytes for ``gpu``'s child now if they fit and nobody waits for memory, else a
        refused ticket (``no_room``): a reservation that must never queue before a claimant's (a standby
        child, :mod:`~gpuperfd.probing.child.standby`). None: no book here, nothing to reserve. Free it with
        :meth:`free`."""
        book = self.memory
        if book is None:
            return None
        with self._cond:
            if self._memory_line or not book.fits(need):
                ticket = book.refuse(gpu, need, 0.0, "no_room")
            else:
                ticket = book.reserve(gpu, need)
        book.publish()
        return ticket

    def free(self, ticket: Ticket | None) -> None:
        """End a reservation (its child is gone): the memory waiters look again now."""
        book = self.memory
        if ticket is None or not ticket.granted or book is None:
            return
        with self._cond:
            book.release(ticket)
            self._cond.notify_all()
        book.publish()

    def memory_waiters(self) -> int:
        """How many claimants wait for memory now (a standby child then gives its own back: a round goes first)."""
        with self._cond:
            return len(self._memory_line)

    def queued(self, gpu: int | None = None) -> int:
        """How many claimants are in ``gpu``'s line (None: the node's) now, a memory waiter at its head included."""
        with self._cond:
            return len((self._node if gpu is None else self._slots[gpu]).queue)

    def take_each(self, gpus: Iterable[int], holder: Holder, timeout: float, work: Callable[[int], bool],
                  stop: Callable[[], bool] | None = None) -> list[int]:
        """Queue for every GPU of ``gpus`` at once (each in its own line, by the one rule) and, as each
        GPU's turn comes, hold it, run ``work(gpu)`` and give it back (``wrote``: what ``work`` returned).
        One claimant of several GPUs never leaves a free GPU waiting on a held one. Returns the GPUs whose
        turn did not come within ``timeout``, or before ``stop()`` (checked at every :meth:`nudge`)."""
        deadline = time.monotonic() + max(0.0, timeout)
        claims = {gpu: _Claim(holder, gpu, deadline=deadline) for gpu in gpus}
        with self._cond:
            for gpu, claim in claims.items():
                self._slots[gpu].queue.append(claim)
        try:
            while (gpu := self._next_turn(claims, deadline, stop)) is not None:
                wrote = True  # a ``work`` that raised may have changed the cap
                try:
                    wrote = work(gpu)
                finally:
                    self.release(gpu, wrote=wrote)
            return list(claims)
        finally:
            with self._cond:
                for gpu, claim in claims.items():
                    self._slots[gpu].queue.remove(claim)
                self._cond.notify_all()  # the next in line may be the head now

    def _next_turn(self, claims: dict[int, _Claim], deadline: float, stop: Callable[[], bool] | None) -> int | None:
        """The first GPU of ``claims`` whose turn comes (taken, its claim out of ``claims`` and of its
        line); None once ``stop()`` is true, the deadline passed or no GPU is left."""
        with self._cond:
            while claims:
                if stop is not None and stop():
                    return None
                for gpu, claim in claims.items():
                    slot = self._slots[gpu]
                    if self._grant(slot, claim) is Turn.GRANTED:
                        del claims[gpu]
                        slot.queue.remove(claim)
                        self._cond.notify_all()
                        return gpu
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return None

    def take_node(self, holder: Holder, timeout: float, stop: Callable[[], bool] | None = None) -> bool:
        """The node's turn (a serial node's one round at a time), in arrival order; False after
        ``timeout`` or once ``stop()`` is true (checked at every :meth:`nudge`)."""
        return self._take(self._node, _Claim(holder), timeout, None, stop) is Turn.GRANTED

    def release_node(self) -> None:
        with self._cond:
            self._node.holder = None
            self._cond.notify_all()

    def holder(self, gpu: int) -> Holder | None:
        """Who holds ``gpu`` now (None: nobody)."""
        with self._cond:
            return self._slots[gpu].holder

    def nudge(self) -> None:
        """Make every waiter look at its ``served``/``stop`` check now (a round took a run in, a stop)."""
        with self._cond:
            self._cond.notify_all()

    def wait_released(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until no GPU is held; True if none is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(slot.holder is not None for slot in self._slots.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def _take(self, slot: _Slot, claim: _Claim, timeout: float, served: Callable[[], bool] | None,
              stop: Callable[[], bool] | None) -> Turn:
        """Queue ``claim`` in ``slot``'s line and wait, under the lock, until the one rule grants it the turn
        (or refuses it), ``served()`` or ``stop()`` comes true, or its deadline passes."""
        claim.deadline = time.monotonic() + max(0.0, timeout)
        turn = Turn.TIMEOUT
        with self._cond:
            slot.queue.append(claim)
            try:
                while True:
                    if served is not None and served():
                        turn = Turn.SERVED
                        break
                    if stop is not None and stop():
                        turn = Turn.STOPPED
                        break
                    granted = self._grant(slot, claim)
                    if granted is not None:
                        turn = granted
                        break
                    remaining = claim.deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    # a memory waiter looks again every POLL_SECONDS: the budget moves with the daemon's RSS
                    self._cond.wait(min(remaining, POLL_SECONDS) if claim.need is not None else remaining)
            finally:
                slot.queue.remove(claim)
                self._leave_memory_line(claim, turn)
                self._cond.notify_all()  # the next in line may be the head now
        if claim.need and self.memory is not None:
            self.memory.publish()
        return turn

    def _grant(self, slot: _Slot, claim: _Claim) -> Turn | None:
        """The one rule (under the lock): the head of the line gets the turn once nobody holds it, and
        once the memory it states is booked (:meth:`_book`). None: not yet."""
        if slot.holder is not None or slot.queue[0] is not claim:
            return None
        if claim.memory is not None:
            booked = self._book(slot, claim)
            if booked is not Turn.GRANTED:
                return booked
        slot.holder = claim.holder
        return Turn.GRANTED

    def _book(self, slot: _Slot, claim: _Claim) -> Turn | None:
        """The rule's memory step, for the head of a free GPU's line: its bytes (asked the first time) are
        booked once it is the first of the memory line and they fit; REFUSED if they never can."""
        book = self.memory
        assert book is not None and claim.memory is not None
        if claim.need is None:  # its GPU's turn came: from now on it waits for memory only
            claim.need = claim.memory() if callable(claim.memory) else claim.memory
            claim.since = book.now()
            if claim.need > 0:
                claim.deadline = (math.inf if claim.memory_timeout is None
                                  else time.monotonic() + max(0.0, claim.memory_timeout))
        if claim.need <= 0:  # nothing to book (a standby child's reservation is the round's)
            return Turn.GRANTED
        if book.never_fits(claim.gpu, claim.need):
            self._leave_memory_line(claim, Turn.REFUSED)
            book.refuse(claim.gpu, claim.need, book.now() - claim.since, "memory_budget")
            return Turn.REFUSED
        line = self._memory_line
        if claim not in line:
            line.append(claim)
            book.set_waiting(claim.gpu, claim.need, len(line))
        if line[0] is claim and book.fits(claim.need):
            line.popleft()
            book.set_waiting(claim.gpu, claim.need, len(line))
            slot.ticket = book.reserve(claim.gpu, claim.need, book.now() - claim.since, claim.told)
            return Turn.GRANTED
        if not claim.told:
            claim.told = True
            book.set_waiting(claim.gpu, claim.need, len(line), told=True)
            book.publish()  # the waiting count (under the turns' lock: listeners only record it)
        return None

    def _leave_memory_line(self, claim: _Claim, turn: Turn) -> None:
        """A claimant that leaves while waiting for memory (timed out, stopped, served, refused): out of
        the memory line, its wait counted (a granted one was booked already)."""
        if claim not in self._memory_line:
            return
        self._memory_line.remove(claim)
        book = self.memory
        assert book is not None and claim.need is not None
        book.set_waiting(claim.gpu, claim.need, len(self._memory_line))
        if turn is not Turn.REFUSED:
            reason = {Turn.STOPPED: "aborted", Turn.TIMEOUT: "deadline"}.get(turn, turn.value)
            book.refuse(claim.gpu, claim.need, book.now() - claim.since, reason)
        self._cond.notify_all()  # the memory line's next may be its head now
