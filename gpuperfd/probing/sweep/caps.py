"""Which power caps a sweep tries: parsing cap lists and clamping them to the board's range.

The guard that changes a cap and puts it back is :class:`gpuperfd.caps.guard.CapGuard`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpuperfd.device.base import PowerLimits

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
