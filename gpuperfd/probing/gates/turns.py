"""Who holds each GPU now, and who gets it next: the daemon's one owner of GPU turns (issue 62).

A probe round and an interconnect run (every GPU of its set) each need a GPU to themselves. Each
takes the GPU's turn here: one holder per GPU at a time, the others queued in arrival order and
served one at a time, the queue's head as soon as the holder gives it back. On a serial node
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
                    if slot.holder is None and slot.queue[0] is token:
                        slot.holder = holder
                        return Turn.GRANTED
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return Turn.TIMEOUT
                    self._cond.wait(remaining)
            finally:
                slot.queue.remove(token)
                self._cond.notify_all()  # the next in line may be the head now
