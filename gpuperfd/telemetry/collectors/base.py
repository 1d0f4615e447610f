"""What a telemetry collector is, and the registry that lists them.

A collector is a small class with a name, the metric families it exports and a
``read(device)`` that runs in the background sampler (never during a scrape)
and returns :class:`Point` values in SI units. The exporter turns the latest
points of every GPU into Prometheus families at scrape time.

Collectors register themselves with :func:`register`, as node_exporter's do;
the config's ``sampler.collectors`` keys and ``gpuperfd collectors`` come from
that registry, not from a hand-kept list.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Literal

from gpuperfd.device.base import Device

#: Labels every per-GPU series carries, in this order.
GPU_LABELS: tuple[str, ...] = ("gpu", "uuid")


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: full exposition name (counters end in _total)."""

    name: str
    help: str
    kind: Literal["gauge", "counter"] = "gauge"
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name} must end in _total")
        if not self.name.startswith("gpuperf_"):
            raise ValueError(f"metric {self.name} must start with gpuperf_")


@dataclass(frozen=True)
class Point:
    """One sample: metric name, values of the spec's extra labels, value."""

    metric: str
    value: float
    labels: tuple[str, ...] = ()


class Collector(abc.ABC):
    """A group of fields read together from one device."""

    name: ClassVar[str]
    help: ClassVar[str]
    metrics: ClassVar[tuple[MetricSpec, ...]]
    #: Slow collectors run on their own thread so they never delay the cheap ones.
    slow: ClassVar[bool] = False
    #: Seconds between reads; None uses the sampler's interval.
    default_interval_seconds: ClassVar[float | None] = None
    enabled_by_default: ClassVar[bool] = True
    #: Read on events, not on an interval (XID: the sampler's watcher fills it; no lane reads it,
    #: and the exporter never treats its reading as stale).
    event_driven: ClassVar[bool] = False

    @abc.abstractmethod
    def read(self, device: Device) -> list[Point]:
        """Read the fields; raise NotSupported when the GPU has none of them.

        A field the GPU lacks among several is simply left out of the list.
        """


COLLECTORS: dict[str, type[Collector]] = {}


def register(cls: type[Collector]) -> type[Collector]:
    """Class decorator adding a collector to the registry (names are unique)."""
    if cls.name in COLLECTORS:
        raise ValueError(f"collector {cls.name!r} registered twice")
    COLLECTORS[cls.name] = cls
    return cls


def optional(read, *args):  # type: ignore[no-untyped-def]
    """Call ``read(*args)``; None if the field is not supported (other errors propagate)."""
    from gpuperfd.device.errors import NotSupported

    try:
        return read(*args)
    except NotSupported:
        return None
