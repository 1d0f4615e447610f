"""What a telemetry collector is, and the registry that lists them.

A collector is a small class with a name, the metric families it exports and a
``read(device)`` that runs in the background sampler (never during a scrape)
and returns :class:`Point` values in SI units. The exporter turns the latest
points of every GPU into Prometheus families at scrape time.

Collectors register themselves with :func:`register`, as node_exporter's do;
the config's ``sampler.collectors`` keys and ``gpuperfd collectors`` come from
that registry, not from a hand-kept list. Each collector also reads its own
settings (:meth:`Collector.is_enabled`, :meth:`Collector.interval_seconds`,
:meth:`Collector.from_config`); :func:`gpuperfd.telemetry.collectors.build_collectors`
is the one place that builds the sampler's set from them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from gpuperfd.device.base import Device

if TYPE_CHECKING:
    from gpuperfd.config import CollectorToggle, Config

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
    #: Publishes the power cap: read again right after a probe changes it (:meth:`Sampler.cap_changed`).
    reads_power_cap: ClassVar[bool] = False

    @classmethod
    def settings(cls, config: Config) -> CollectorToggle | None:
        """This collector's section, ``sampler.collectors.<name>``; None when the config has none."""
        return config.sampler.collectors.get(cls.name)

    @classmethod
    def is_enabled(cls, config: Config) -> bool:
        """Switched on by its section's ``enabled``, else by ``enabled_by_default``."""
        settings = cls.settings(config)
        return settings.enabled if settings is not None else cls.enabled_by_default

    @classmethod
    def interval_seconds(cls, config: Config) -> float:
        """Seconds between reads: its section's ``interval_seconds``, else ``default_interval_seconds``,
        else the sampler's ``sampler.interval_seconds``."""
        settings = cls.settings(config)
        override = settings.interval_seconds if settings is not None else None
        return override or cls.default_interval_seconds or config.sampler.interval_seconds

    @classmethod
    def from_config(cls, config: Config) -> Collector:
        """An instance with whatever options the collector takes from the config (none by default)."""
        return cls()

    @abc.abstractmethod
    def read(self, device: Device) -> list[Point]:
        """Read the fields; raise NotSupported when the GPU has none of them.

        A field the GPU lacks among several is simply left out of the list.
        """


@dataclass(frozen=True)
class Field:
    """One gauge of a :class:`FieldsCollector`: its metric, the reading's attribute it publishes, its help."""

    metric: str
    attribute: str
    help: str


class FieldsCollector(Collector):
    """A collector whose every series is one attribute of one device reading (memory, clocks, PCIe...):
    it names the reading and its fields, and the read, the same for all of them, is written once here."""

    #: What it publishes; an attribute that is None (a field this GPU lacks) is left out.
    fields: ClassVar[tuple[Field, ...]]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.metrics = tuple(MetricSpec(field.metric, field.help) for field in cls.fields)

    @abc.abstractmethod
    def reading(self, device: Device) -> object:
        """The device reading whose attributes the fields name (one typed device call)."""

    def read(self, device: Device) -> list[Point]:
        reading = self.reading(device)
        values = ((field.metric, getattr(reading, field.attribute)) for field in self.fields)
        return [Point(metric, value) for metric, value in values if value is not None]


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
