"""The guard that changes a GPU's power cap and always puts the original back.

:class:`CapGuard` is the only code that changes a power limit. It writes the
original limit to the journal before the first change and restores it when the
``with`` block ends, whatever ends it (normal end, exception, abort on SIGTERM).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from gpuperfd.caps.journal import CapChangedByOther, CapJournal, JournalWriteError, put_back
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError

log = logging.getLogger(__name__)


class CapGuard:
    """Change a GPU's power cap inside a ``with`` block; always put the original back.

    Every write is journaled before it is made (:meth:`CapJournal.intend`) and every write after the
    first, like the restore (:func:`put_back`), first reads the cap: one that is not the cap this
    guard set was changed by someone else (an operator), whose cap stays (:class:`CapChangedByOther`
    ends the sweep; the restore writes nothing)."""

    def __init__(self, device: Device, journal: CapJournal) -> None:
        self.device = device
        self.journal = journal
        self.original_watts: float | None = None
        self.current_watts: float | None = None
        #: True on a GPU where ``gpuperfd apply`` holds a cap: the guard returns to the applied cap and
        #: leaves the journal entry, which keeps the operator's cap.
        self.keep_entry = False
        #: The caps (rounded) this guard may have left on the board: what it found and what it wrote.
        self._ours: set[int] = set()
        self._uuid: str | None = None
        #: Someone else set the cap: theirs stays, nothing more is written.
        self.theirs: float | None = None

    def set(self, watts: float) -> None:
        limits = self.device.power_limits()
        found = limits.enforced_watts
        if self.original_watts is None:
            self._uuid = self.device.info().uuid
            earlier = self.journal.entry(self._uuid)
            if (earlier is not None and earlier.applied_watts is not None and earlier.knows_its_writes()
                    and (round(found) == round(earlier.original_watts) or round(found) not in earlier.ours())):
                # apply mode's cap was replaced by hand before this sweep (the operator's own cap back, or
                # another): the operator's cap now, and the one this sweep returns to
                self._operators(found, f"found {found:.0f} W, not the applied {earlier.applied_watts:.0f} W")
            record = self.journal.record(self.device, found, limits.default_watts, to_watts=watts)
            self.keep_entry = record.applied_watts is not None
            # on an applied GPU the sweep returns to the applied cap (the board may still hold a cap a
            # killed writer of ours left: one of its journaled pair, never the cap to return to)
            self.original_watts = (record.applied_watts if self.keep_entry else record.original_watts)
            self._ours = {round(found)} | (record.ours() if self.keep_entry else set())
        elif self.current_watts is not None and round(found) != round(self.current_watts):
            raise CapChangedByOther(self.device.index, found, self.current_watts)
        if self.journal.intend(self._uuid or self.device.info().uuid, found, watts) is None and self.keep_entry:
            raise JournalWriteError(0, f"the journal entry of gpu {self.device.index} is gone; cap not changed")
        self._ours.add(round(watts))
        # read again right before the write: a hand change during the journal's fsync is seen too (the
        # window left is between this read and the write: NVML has no compare-and-set)
        if self.current_watts is not None and round(now := self.device.power_limits().enforced_watts) != round(found):
            raise CapChangedByOther(self.device.index, now, self.current_watts)
        self.device.set_power_limit(watts)
        self.current_watts = watts

    def _operators(self, found: float, detail: str) -> None:
        """The applied cap's entry gives way to a cap someone set by hand: it stands, the GPU leaves apply mode."""
        assert self._uuid is not None
        self.journal.believe(self._uuid, "operator", found, f"sweep start: {detail}; apply mode's entry dropped")
        log.warning("gpu %d: %s: someone else set the cap; it is the operator's now (apply mode's entry dropped)",
                    self.device.index, detail)
        self.journal.clear(self._uuid)

    def wait_applied(self, max_seconds: float, abort: threading.Event | None = None, poll: float = 0.02) -> float | None:
        """Seconds until the enforced limit reads back as the cap just set (at most ``max_seconds``);
        None if it never did (logged: the point is measured anyway, and says so)."""
        assert self.current_watts is not None
        start = time.monotonic()
        while True:
            try:
                if round(self.device.power_limits().enforced_watts) == round(self.current_watts):
                    return time.monotonic() - start
            except DeviceError:
                pass
            left = max_seconds - (time.monotonic() - start)
            if left <= 0 or (abort is not None and abort.is_set()):
                log.warning("gpu %d: power cap %.0f W does not read back after %.1f s",
                            self.device.index, self.current_watts, time.monotonic() - start)
                return None
            time.sleep(min(poll, left))

    def restore(self) -> None:
        """Put the original limit back, read it back, then clear the journal, by :func:`put_back`:
        only over a cap this guard set. A cap someone else set stays, and the entry goes (the cap on
        the board is theirs: no later start may write over it; apply mode's GPU leaves apply mode).

        The log says what really happened: a limit that does not read back keeps the journal
        (DeviceError); a journal entry that cannot be removed is reported as such, not as a
        failed restore.
        """
        if self.original_watts is None:
            return
        original = self.original_watts
        uuid = self._uuid or self.device.info().uuid
        if self.current_watts is None and self._enforced_is(original):
            # No change went through (e.g. no permission to set limits): nothing to put back, and
            # the journal entry must not outlive us, or every later start would try again.
            message = f"gpu {self.device.index}: power cap was never changed; still {original:.0f} W"
        else:
            done = put_back(self.journal, self.device, uuid, original, self._ours, "the end of a sweep")
            if done.theirs:
                self.theirs = done.found
                self.original_watts = self.current_watts = None
                self.keep_entry = False  # theirs now: apply mode's entry goes too
                message = (f"gpu {self.device.index}: the cap reads {done.found:.0f} W, not one this sweep set: "
                           f"someone else's, left as it is ({original:.0f} W not put back)")
                self._clear(uuid, message, original, log.warning)
                return
            back = self.device.power_limits().enforced_watts
            message = f"gpu {self.device.index}: power cap restored to {original:.0f} W (read back {back:.0f} W)"
        self.original_watts = None
        self.current_watts = None
        if self.keep_entry:  # apply mode's entry: the operator's cap stays journaled
            log.info("%s; the applied cap's journal entry is kept", message)
            return
        self._clear(uuid, message, original, log.info)

    def _clear(self, uuid: str, message: str, original: float, say: Callable[..., None]) -> None:
        try:
            self.journal.clear(uuid)
        except OSError as exc:
            log.error(
                "%s, but its journal entry %s could not be removed (%s); remove it by hand, "
                "or a later start applies %.0f W again",
                message, self.journal.path_for(uuid), exc.strerror or exc, original,
            )
            return
        say("%s", message)

    def _enforced_is(self, watts: float) -> bool:
        try:
            return round(self.device.power_limits().enforced_watts) == round(watts)
        except DeviceError:
            return False

    def __enter__(self) -> CapGuard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.restore()
            return
        except DeviceError as error:
            log.error(
                "gpu %d: could not restore the power cap (%s); the journal keeps the original for the next start",
                self.device.index, error,
            )
        except Exception:
            log.exception(
                "gpu %d: could not restore the power cap; the journal keeps the original for the next start",
                self.device.index,
            )
        if self.keep_entry and self.original_watts is not None:  # apply mode must not take it for an operator's
            try:
                self.journal.mark_sweep_unrestored(self.device.info().uuid)
            except DeviceError as error:
                log.error("gpu %d: cannot name the GPU to mark its journal entry: %s", self.device.index, error)
