"""Telemetry collectors, one module each; importing this package registers them all."""

from gpuperfd.telemetry.collectors import (  # noqa: F401  (imported to register)
    allocation,
    clock_events,
    clocks,
    codec,
    ecc,
    energy,
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
from gpuperfd.telemetry.collectors.base import COLLECTORS, Collector, MetricSpec, Point

COLLECTOR_NAMES: tuple[str, ...] = tuple(sorted(COLLECTORS))

__all__ = ["COLLECTORS", "COLLECTOR_NAMES", "Collector", "MetricSpec", "Point"]
