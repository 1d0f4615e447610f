"""Telemetry collectors, one module each; importing this package registers them all.

:func:`build_collectors` is the one place that turns the configuration into the sampler's
collectors: each collector says whether it is on, how often it reads and how it is built
(:class:`~gpuperfd.telemetry.collectors.base.Collector`), so no caller keeps a table of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuperfd.telemetry.collectors import (  # noqa: F401  (imported to register)
    allocation,
    clock_events,
    clocks,
    codec,
    ecc,
    energy,
    fabric,
    gpm,
    health,
    info,
    memory,
    mig,
    nvlink,
    pcie,
    power,
    processes,
    temperature,
    utilization,
    violations,
    xid,
)
from gpuperfd.telemetry.collectors.allocation import AllocationCollector
from gpuperfd.telemetry.collectors.base import COLLECTORS, Collector, MetricSpec, Point
from gpuperfd.telemetry.collectors.xid import XidCollector

if TYPE_CHECKING:
    from gpuperfd.attribution.allocations import PodResourcesWatcher
    from gpuperfd.config import Config

COLLECTOR_NAMES: tuple[str, ...] = tuple(sorted(COLLECTORS))

__all__ = ["COLLECTORS", "COLLECTOR_NAMES", "Collector", "CollectorSet", "MetricSpec", "Point", "build_collectors"]


@dataclass(frozen=True)
class CollectorSet:
    """The enabled collectors, built from the config, and what the sampler needs to know of them."""

    #: One instance per enabled collector, by name (event-driven ones included: the sampler reads none of them).
    collectors: tuple[Collector, ...]
    #: Seconds between reads of each enabled collector.
    intervals: dict[str, float]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.collectors]

    @property
    def xid_enabled(self) -> bool:
        """Whether the sampler's XID watcher runs (it feeds the event-driven xid collector)."""
        return XidCollector.name in self.names

    @property
    def pod_resources(self) -> PodResourcesWatcher | None:
        """The allocation collector's kubelet poller (None when that collector is off)."""
        return next((c.watcher for c in self.collectors if isinstance(c, AllocationCollector)), None)


def build_collectors(config: Config) -> CollectorSet:
    """Every collector that ``sampler.collectors`` (or its default) switches on, in name order,
    built from its own settings."""
    enabled = [cls for _, cls in sorted(COLLECTORS.items()) if cls.is_enabled(config)]
    return CollectorSet(
        collectors=tuple(cls.from_config(config) for cls in enabled),
        intervals={cls.name: cls.interval_seconds(config) for cls in enabled},
    )
