"""Who holds each GPU now, and who gets it next: the daemon's one owner of GPU turns (issue 62).

A probe round, an interconnect run (every GPU of its set) and apply mode's cap change each need a GPU
to themselves. Each takes the GPU's turn here: one holder per GPU at a time, the others queued in
arrival order and served one at a time, the queue's head as soon as the holder gives it back. Apply
mode queues for several GPUs at once (:meth:`GpuTurns.take_each`): a round on one GPU does not hold
up its change on another, and its place in each GPU's line is kept meanwhile. On a serial node
(``probes.parallel_gpus`` off) a round also takes the node's turn, so one round runs on the node at a
time. Whoever needs to know when a GPU is given back (our load's tail, the GPU-time ledger, apply
mode's next pass) listens here instead of asking each holder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["GpuTurns", "Holder", "HolderKind", "Release", "Turn"]

log = logging.getLogger(__name__)


class HolderKind(str, Enum):
    """What holds a GPU."""

    ROUND = "round"  # a probe round (ProbeService.run)
    INTERCONNECT = "interconnect_run"  # an interconnect run: every GPU of its set
    APPLY = "apply"  # apply mode's cap change or revert (ApplyController, in the daemon)


@dataclass(frozen=True)
class Holder:
    """Who holds (or waits for) a GPU: its kind and a name for log lines (a job key, the set)."""

    kind: HolderKind
    name: str = ""


class Turn(str, Enum):
    """What a claimant waiting for a GPU got."""

    GRANTED = "granted"  # the GPU is its own until it releases it
    SERVED = "served"  # its ``served`` check came true first (a round ran its schedule): nothing to hold
    TIMEOUT = "timeout"  # the wait passed its timeout


@dataclass(frozen=True)
class Release:
    """A GPU given back: by whom, the monotonic span our load ran on it (None: none ran), and whether
    the holder may have changed the GPU's cap (``wrote``: apply mode's pass is due now)."""

    gpu: int
    holder: Holder
    load: tuple[float, float] | None
    wrote: bool


@dataclass
class _Slot:
    """One turn (a GPU's, or the node's): its holder and the claimants queued for it, oldest first."""

    holder: Holder | None = None
    queue: deque[object] = field(default_factory=deque)


class GpuTurns:
    """The turns of a node's GPUs (thread-safe): :meth:`take` and :meth:`release` each GPU,
    :meth:`take_node` and :meth:`release_node` the node; :meth:`holder` says who holds a GPU."""

    def __init__(self, gpus: Iterable[int]) -> None:
        self._cond = threading.Condition()
        self._slots = {gpu: _Slot() for gpu in gpus}
        self._node = _Slot()
        #: Told every :class:`Release`, before the GPU goes to the next claimant (so its gate sees our tail).
        self.listeners: list[Callable[[Release], None]] = []

    def take(self, gpu: int, holder: Holder, timeout: float, served: Callable[[], bool] | None = None) -> Turn:
        """Wait (at most ``timeout`` s, in arrival order) for ``gpu``; SERVED as soon as ``served()`` is
        true (checked under the turns' lock, again at every :meth:`nudge`)."""
        return self._take(self._slots[gpu], holder, timeout, served)

    def release(self, gpu: int, load: tuple[float, float] | None = None, wrote: bool = False) -> None:
        """Give ``gpu`` back (its holder only): the listeners hear it, then the next claimant gets it."""
        slot = self._slots[gpu]
        with self._cond:
            holder = slot.holder
        assert holder is not None, f"GPU {gpu} released while nobody held it"
        done = Release(gpu, holder, load, wrote)
        for listener in self.listeners:
            try:
                listener(done)
            except Exception:  # noqa: BLE001 - a listener's bug must not keep the GPU held
                log.exception("gpu %d: a turn listener failed", gpu)
        with self._cond:
            slot.holder = None
            self._cond.notify_all()

    def take_each(self, gpus: Iterable[int], holder: Holder, timeout: float, work: Callable[[int], bool],
                  stop: Callable[[], bool] | None = None) -> list[int]:
        """Queue for every GPU of ``gpus`` at once (each in its own line, by the one rule) and, as each
        GPU's turn comes, hold it, run ``work(gpu)`` and give it back (``wrote``: what ``work`` returned).
        One claimant of several GPUs never leaves a free GPU waiting on a held one. Returns the GPUs whose
        turn did not come within ``timeout``, or before ``stop()`` (checked at every :meth:`nudge`)."""
        deadline = time.monotonic() + max(0.0, timeout)
        tokens = {gpu: object() for gpu in gpus}
        with self._cond:
            for gpu, token in tokens.items():
                self._slots[gpu].queue.append(token)
        try:
            while (gpu := self._next_turn(tokens, holder, deadline, stop)) is not None:
                wrote = True  # a ``work`` that raised may have changed the cap
                try:
                    wrote = work(gpu)
                finally:
                    self.release(gpu, wrote=wrote)
            return list(tokens)
        finally:
            with self._cond:
                for gpu, token in tokens.items():
                    self._slots[gpu].queue.remove(token)
                self._cond.notify_all()  # the next in line may be the head now

    def _next_turn(self, tokens: dict[int, object], holder: Holder, deadline: float,
                   stop: Callable[[], bool] | None) -> int | None:
        """The first GPU of ``tokens`` whose turn comes (taken, its token out of ``tokens`` and of its
        line); None once ``stop()`` is true, the deadline passed or no GPU is left."""
        with self._cond:
            while tokens:
                if stop is not None and stop():
                    return None
                for gpu, token in tokens.items():
                    slot = self._slots[gpu]
                    if self._grant(slot, token, holder):
                        del tokens[gpu]
                        slot.queue.remove(token)
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
        return self._take(self._node, holder, timeout, stop) is Turn.GRANTED

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

    def _take(self, slot: _Slot, holder: Holder, timeout: float, served: Callable[[], bool] | None) -> Turn:
        """The queue's rule, under the lock: the head of the queue gets the turn once nobody holds it."""
        deadline = time.monotonic() + max(0.0, timeout)
        token = object()
        with self._cond:
            slot.queue.append(token)
            try:
                while True:
                    if served is not None and served():
                        return Turn.SERVED
                    if self._grant(slot, token, holder):
                        return Turn.GRANTED
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return Turn.TIMEOUT
                    self._cond.wait(remaining)
            finally:
                slot.queue.remove(token)
                self._cond.notify_all()  # the next in line may be the head now

    @staticmethod
    def _grant(slot: _Slot, token: object, holder: Holder) -> bool:
        """The one rule (under the lock): the head of the line gets the turn once nobody holds it."""
        if slot.holder is None and slot.queue[0] is token:
            slot.holder = holder
            return True
        return False
