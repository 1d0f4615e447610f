"""One y-scale per metric across the facets of ``gpuperfd report --facet KEY`` (``--free-y``: each its own).

Facets are separate reports drawn side by side (:mod:`gpuperfd.report.facets`); each panel scaled to
its own data makes a facet at half the throughput look the same as the other. So the power-cap panels
are drawn twice over: first each facet's panels are measured (:func:`panel_ranges`), then every facet is
drawn with the merged range of each panel (workload, metric) in force (:func:`shared`). Ranges are kept
in the panel's base unit (joules, not mJ), so facets that print energy in different units still share
one scale.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["PanelKey", "tag", "panel_values", "panel_ranges", "merge", "shared", "shared_range"]

#: A power-cap panel: (workload (probe, preset), row of the grid: rate, energy, power, ...).
PanelKey = tuple[tuple[str, str], str]

_SHARED: ContextVar[dict[PanelKey, tuple[float, float]] | None] = ContextVar("gpuperfd_shared_y", default=None)


def tag(ax: Any, key: PanelKey, scale: float = 1.0) -> None:
    """Mark ``ax`` as panel ``key``; ``scale`` turns its base unit into what it plots (1000 for mJ)."""
    ax.gpuperfd_panel = (key, scale)


def panel_values(ax: Any) -> list[float]:
    """Every y value the panel plots (lines and the p50-p99 bands), NaN left out."""
    values = [float(y) for line in ax.get_lines() for y in line.get_ydata() if y == y]
    values += [float(y) for collection in ax.collections for path in collection.get_paths()
               for y in path.vertices[:, 1] if y == y]
    return values


def panel_ranges(fig: Any) -> dict[PanelKey, tuple[float, float]]:
    """(lowest, highest) of each tagged panel of ``fig``, in base units; panels without data left out."""
    out: dict[PanelKey, tuple[float, float]] = {}
    for ax in fig.get_axes() if fig is not None else []:
        tagged = getattr(ax, "gpuperfd_panel", None)
        values = panel_values(ax) if tagged else []
        if values:
            key, scale = tagged
            out[key] = (min(values) / scale, max(values) / scale)
    return out


def merge(ranges: Iterable[dict[PanelKey, tuple[float, float]]]) -> dict[PanelKey, tuple[float, float]]:
    """The widest range of each panel over every facet."""
    out: dict[PanelKey, tuple[float, float]] = {}
    for one in ranges:
        for key, (lo, hi) in one.items():
            have = out.get(key)
            out[key] = (lo, hi) if have is None else (min(have[0], lo), max(have[1], hi))
    return out


@contextmanager
def shared(ranges: dict[PanelKey, tuple[float, float]] | None) -> Iterator[None]:
    """Draw with ``ranges`` in force (None: every panel scales to its own data)."""
    token = _SHARED.set(ranges)
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared_range(ax: Any) -> tuple[float, float] | None:
    """The shared (lowest, highest) of a tagged panel in the units it plots, or None (not shared)."""
    ranges, tagged = _SHARED.get(), getattr(ax, "gpuperfd_panel", None)
    if not ranges or tagged is None or tagged[0] not in ranges:
        return None
    lo, hi = ranges[tagged[0]]
    return lo * tagged[1], hi * tagged[1]
