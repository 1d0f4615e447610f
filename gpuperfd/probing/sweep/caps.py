"""Power caps: parsing cap lists, clamping to the board's range, and the guard that restores.

:class:`CapGuard` is the only code that changes a power limit. It writes the
original limit to the journal before the first change and restores it when the
``with`` block ends, whatever ends it (normal end, exception, abort on SIGTERM).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from gpuperfd.device.base import Device, PowerLimits
from gpuperfd.device.errors import DeviceError
from gpuperfd.probing.sweep.journal import CapJournal

log = logging.getLogger(__name__)

NAMED_CAPS = ("min", "max", "default", "current")


class CapSpecError(ValueError):
    """A cap list entry that is neither watts, a fraction of the maximum, nor a name."""


def parse_cap_list(text: str | Sequence[str | float]) -> list[str | float]:
    """Parse '300,450,0.8,max' (or a list) into watts (> 1), fractions (0 < f <= 1) and names."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    caps: list[str | float] = []
    for item in items:
        if isinstance(item, str):
            if item == "":
                raise CapSpecError("empty entry in cap list")
            if item.lower() in NAMED_CAPS:
                caps.append(item.lower())
                continue
            raw = item.lower().removesuffix("w")
            try:
                number = float(raw)
            except ValueError:
                raise CapSpecError(
                    f"cap {item!r} is not watts (e.g. 450), a fraction of the maximum (e.g. 0.8) or one of {', '.join(NAMED_CAPS)}"
                ) from None
        else:
            number = float(item)
        if not number > 0 or number != number or number == float("inf"):
            raise CapSpecError(f"cap {item!r} must be a positive number")
        caps.append(number)
    if not caps:
        raise CapSpecError("cap list is empty")
    return caps


def resolve_caps(caps: Sequence[str | float], limits: PowerLimits, strict: bool = False) -> list[float]:
    """Watts for each entry, clamped to [min, max] with a warning, deduplicated, highest first.

    ``strict`` (the CLI without ``--clamp``): an entry outside the board's range is a CapSpecError
    instead, so a typo (``--caps 9999``, ``--caps 1.5``) never runs at a cap nobody asked for.
    """
    resolved: list[float] = []
    for cap in caps:
        if cap == "min":
            watts = limits.min_watts
        elif cap == "max":
            watts = limits.max_watts
        elif cap == "default":
            watts = limits.default_watts
        elif cap == "current":
            watts = limits.enforced_watts
        elif isinstance(cap, float | int) and cap <= 1.0:
            watts = cap * limits.max_watts
        else:
            watts = float(cap)
        clamped = limits.clamp(watts)
        if clamped != watts and strict:
            raise CapSpecError(
                f"cap {cap!r} is {watts:g} W, outside this GPU's range {limits.min_watts:.0f}-{limits.max_watts:.0f} W; "
                "give caps in that range (watts, or a fraction of the maximum such as 0.8), or add --clamp"
            )
        if clamped != watts:
            log.warning(
                "power cap %.0f W is outside the board's range %.0f-%.0f W; using %.0f W",
                watts, limits.min_watts, limits.max_watts, clamped,
            )
        resolved.append(round(clamped))
    return sorted(set(resolved), reverse=True)


class CapGuard:
    """Change a GPU's power cap inside a ``with`` block; always put the original back."""

    def __init__(self, device: Device, journal: CapJournal) -> None:
        self.device = device
        self.journal = journal
        self.original_watts: float | None = None
        self.current_watts: float | None = None
        #: True on a GPU where ``gpuperfd apply`` holds a cap: the guard returns to the cap it found
        #: (the applied one) and leaves the journal entry, which keeps the operator's cap.
        self.keep_entry = False

    def set(self, watts: float) -> None:
        if self.original_watts is None:
            limits = self.device.power_limits()
            record = self.journal.record(self.device, limits.enforced_watts, limits.default_watts)
            self.keep_entry = record.applied_watts is not None
            self.original_watts = limits.enforced_watts if self.keep_entry else record.original_watts
        self.device.set_power_limit(watts)
        self.current_watts = watts

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
        """Put the original limit back, read it back, then clear the journal.

        The log says what really happened: a limit that does not read back keeps the journal
        (DeviceError); a journal entry that cannot be removed is reported as such, not as a
        failed restore.
        """
        if self.original_watts is None:
            return
        original = self.original_watts
        uuid = self.device.info().uuid
        if self.current_watts is None and self._enforced_is(original):
            # No change went through (e.g. no permission to set limits): nothing to put back, and
            # the journal entry must not outlive us, or every later start would try again.
            message = f"gpu {self.device.index}: power cap was never changed; still {original:.0f} W"
        else:
            self.device.set_power_limit(original)
            back = self.device.power_limits().enforced_watts
            if round(back) != round(original):
                raise DeviceError(f"power cap set to {original:.0f} W but reads back {back:.0f} W")
            message = f"gpu {self.device.index}: power cap restored to {original:.0f} W (read back {back:.0f} W)"
        self.original_watts = None
        self.current_watts = None
        if self.keep_entry:  # apply mode's entry: the operator's cap stays journaled
            log.info("%s; the applied cap's journal entry is kept", message)
            return
        try:
            self.journal.clear(uuid)
        except OSError as exc:
            log.error(
                "%s, but its journal entry %s could not be removed (%s); remove it by hand, "
                "or a later start applies %.0f W again",
                message, self.journal.path_for(uuid), exc.strerror or exc, original,
            )
            return
        log.info("%s", message)

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
        if self.keep_entry:  # apply mode must not take the cap this sweep left for an operator's
            try:
                self.journal.mark_sweep_unrestored(self.device.info().uuid)
            except DeviceError as error:
                log.error("gpu %d: cannot name the GPU to mark its journal entry: %s", self.device.index, error)
