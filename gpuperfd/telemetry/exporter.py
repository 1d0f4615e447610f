"""Scrape-time assembly of metric families from the sampler's latest readings.

This is the whole scrape path for telemetry: it copies the reading store under
a lock and formats it. No device call happens here, so a scrape costs the same
whether a GPU answers in 1 us, 21 ms or never.
"""

from __future__ import annotations

import copy
import math
import platform
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import (
    generate_latest as generate_openmetrics,
)

import gpuperfd
from gpuperfd.telemetry.collectors.base import COLLECTORS, GPU_LABELS, MetricSpec, Point
from gpuperfd.telemetry.exposition import (
    Family,
    assemble_checked,
    check_part,
    label_string,
    registry_body,
    render,
    sample_line,
)
from gpuperfd.telemetry.sampler import Reading, Sampler, lost_gpus

disable_created_metrics()  # _created series would double every counter and histogram


def _family(spec: MetricSpec) -> Family:
    return Family(spec.name, spec.kind, spec.help)


class Exporter:
    """Renders /metrics: telemetry from the reading store, plus other registries (cached)."""

    def __init__(
        self,
        sampler: Sampler,
        backend_name: str,
        registries: Sequence[tuple[CollectorRegistry, Callable[[], int] | None]] = (),
        extra_families: Sequence[Callable[[], list[Family]]] = (),
    ) -> None:
        self.sampler = sampler
        self.backend_name = backend_name
        self.clock = sampler.clock
        self.enabled = sorted({c.name for c in sampler.collectors} | ({"xid"} if sampler.xid_enabled else set()))
        #: (registry, version function or None): a versioned registry is re-rendered only when it changed.
        self.registries = list(registries)
        self._cache: dict[tuple[int, bool], tuple[tuple[int, frozenset[int]], bytes]] = {}
        self._cache_lock = threading.Lock()
        self._spec_labels = {spec.name: spec.labels for cls in COLLECTORS.values() for spec in cls.metrics}
        #: Where gpuperf_collector_age_seconds sits among the families (their order is fixed by ``enabled``).
        self._age_index = list(self._new_families()).index("gpuperf_collector_age_seconds")
        self._event_driven = {name: COLLECTORS[name].event_driven for name in self.enabled}
        #: (gpu, collector) -> that reading's formatted lines; only the scrape thread(s) touch it,
        #: and a race between two scrapes at worst formats the same lines twice.
        self._lines_cache: dict[tuple[int, str], _ReadingLines] = {}
        #: The whole telemetry text per format while the store does not change (see telemetry_text).
        self._text_cache: dict[bool, _KeptText] = {}
        #: Callables returning extra families rendered with the telemetry (the health verdicts).
        self.extra_families: list[Callable[[], list[Family]]] = list(extra_families)
        self._extra_text: dict[tuple[int, bool], tuple[list[Family], bytes]] = {}
        self._build_labels = label_string(
            ("version", "python_version", "backend"), (gpuperfd.__version__, platform.python_version(), backend_name)
        )

    def _new_families(self) -> dict[str, Family]:
        families: dict[str, Family] = {}
        for name in self.enabled:
            for spec in COLLECTORS[name].metrics:
                families[spec.name] = _family(spec)
        for spec in SELF_METRICS:
            families[spec.name] = _family(spec)
        return families

    def telemetry_families(self) -> tuple[list[Family], frozenset[int]]:
        """Telemetry families from the latest readings, and the lost GPUs; no device call happens here.

        A lost GPU keeps only its identity (``gpuperf_gpu_info``), ``gpuperf_gpu_up 0``
        and its counters of events (XID, device errors): the XID raised as a GPU falls
        off the bus arrives with the loss and must still be seen by ``increase()``.

        A reading's lines are formatted once and reused until its collector reads again
        (see :class:`_ReadingLines`); only the age gauge is formatted per scrape, from a
        kept label prefix, as node_exporter recomputes its scrape-time values.
        """
        collected = self._collect(self.clock())
        age_family = collected.families[collected.age_index]
        age_family.extend(collected.age_lines(collected.now))
        return collected.families, collected.lost

    def _collect(self, now: float) -> _Collected:
        """The families with the age gauge left empty, and what the age lines and the cache need."""
        families = self._new_families()
        snap = self.sampler.store.snapshot()
        version, readings, last_info, identities, errors = (snap.version, snap.readings, snap.last_good_info,
                                                            snap.identities, snap.errors)
        lost = lost_gpus(readings, self.sampler.interval_seconds)
        prefixes = {gpu: label_string(GPU_LABELS, identity.label_values) for gpu, identity in identities.items()}
        # A GPU whose identity was never read (lost or failing since start) is still reported, with uuid="".
        for gpu in {device.index for device in self.sampler.devices} | {gpu for gpu, _ in readings}:
            prefixes.setdefault(gpu, label_string(GPU_LABELS, (str(gpu), "")))
        up, success = families["gpuperf_gpu_up"], families["gpuperf_collector_success"]
        duration = families["gpuperf_collector_duration_seconds"]
        cache, used = self._lines_cache, set()
        stale_after = {name: self.sampler.stale_after(name) for name in self.enabled}
        ages: list[tuple[str, float]] = []
        valid_until = math.inf  # the first time a fresh reading turns stale: the kept text is wrong then
        for gpu, prefix in sorted(prefixes.items()):
            up.add(prefix, 0.0 if gpu in lost else 1.0)
            for name in self.enabled:
                reading = readings.get((gpu, name))
                if reading is None:
                    continue
                event_driven = self._event_driven[name]
                age = now - reading.timestamp
                if age < 0.0:
                    age = 0.0
                fresh = event_driven or age <= stale_after[name]
                if gpu in lost:
                    ok = False
                    points = reading.points if event_driven and reading.ok else ()
                else:
                    ok = reading.ok and fresh
                    points = reading.points if ok else ()
                if name == "info" and not points:
                    points = last_info.get(gpu, ())  # identity survives a lost GPU
                key = (gpu, name)
                used.add(key)
                entry = cache.get(key)
                if entry is None or not entry.matches(reading, points, prefix, ok, gpu in lost):
                    entry = cache[key] = _ReadingLines.build(self._spec_labels, name, reading, points, prefix, ok,
                                                             gpu in lost)
                if gpu not in lost:
                    success.lines.append(entry.success)
                    duration.lines.append(entry.duration)
                    if not event_driven:
                        ages.append((entry.age_head, reading.timestamp))
                        if fresh:
                            valid_until = min(valid_until, reading.timestamp + stale_after[name])
                for metric, lines in entry.lines:
                    families[metric].extend(lines)
        for key in cache.keys() - used:
            del cache[key]  # a GPU or collector gone: its lines go too
        for (gpu, collector, reason), count in sorted(errors.items()):
            identity = identities.get(gpu)
            gpu_labels = prefixes.get(gpu) or label_string(GPU_LABELS, (str(gpu), identity.uuid if identity else ""))
            families["gpuperf_device_errors_total"].add(f'collector="{collector}",reason="{reason}",{gpu_labels}', count)
        families["gpuperf_build_info"].add(self._build_labels, 1.0)
        return _Collected(list(families.values()), frozenset(lost), self._age_index, ages, version, valid_until, now)

    def telemetry_text(self, openmetrics: bool) -> tuple[bytes, frozenset[int]]:
        """The telemetry part of a scrape (encoded, checked), and the lost GPUs.

        The text is kept while the reading store's version is unchanged and no fresh
        reading has turned stale: then only the age gauge's lines are written anew
        (from kept label prefixes and timestamps), and the rest is reused as it is.
        """
        now = self.clock()
        kept = self._text_cache.get(openmetrics)
        if kept is None or kept.collected.version != self.sampler.store.version or now > kept.collected.valid_until:
            collected = self._collect(now)
            families, index = collected.families, collected.age_index
            before = render(families[:index], openmetrics) + families[index].header(openmetrics)
            after = render(families[index + 1:], openmetrics)
            kept = _KeptText(collected, check_part(before).encode(), check_part(after).encode())
            self._text_cache[openmetrics] = kept
        ages = "".join(kept.collected.age_lines(now)).encode()
        return b"".join((kept.before, ages, kept.after)), kept.collected.lost

    def _registry_text(self, index: int, openmetrics: bool, lost: frozenset[int]) -> bytes:
        """A registry's families without lost GPUs' series, never with '# EOF' (cached by version)."""
        registry, version = self.registries[index]
        encoder = generate_openmetrics if openmetrics else generate_latest
        source = _WithoutGpus(registry, lost) if lost else registry
        if version is None:
            return check_part(registry_body(encoder(source).decode())).encode()
        current = (version(), lost)
        with self._cache_lock:
            cached = self._cache.get((index, openmetrics))
        if cached is not None and cached[0] == current:
            return cached[1]
        data = check_part(registry_body(encoder(source).decode())).encode()
        with self._cache_lock:
            self._cache[(index, openmetrics)] = (current, data)
        return data

    def render(self, openmetrics: bool = False) -> bytes:
        text, lost = self.telemetry_text(openmetrics)
        parts = [text]
        # Extra families (the health verdicts) change on their own clock: their text is kept while
        # the provider returns the same list object (the monitor builds a new one per evaluation).
        for index, extra in enumerate(self.extra_families):
            families = extra()
            kept = self._extra_text.get((index, openmetrics))
            if kept is None or kept[0] is not families:
                kept = self._extra_text[(index, openmetrics)] = (families, check_part(render(families, openmetrics)).encode())
            parts.append(kept[1])
        parts += [self._registry_text(i, openmetrics, lost) for i in range(len(self.registries))]
        return assemble_checked(parts, openmetrics)


@dataclass(frozen=True)
class _Collected:
    """One pass over the reading store: families (age gauge empty) and what the kept text needs."""

    families: list[Family]
    lost: frozenset[int]
    age_index: int  # where gpuperf_collector_age_seconds is in ``families``
    ages: list[tuple[str, float]]  # (line head, reading timestamp) of each age sample
    version: int  # the store's version the families were built from
    valid_until: float  # clock time after which a fresh reading may have turned stale
    now: float

    def age_lines(self, now: float) -> list[str]:
        """The age samples at ``now``, microsecond resolution ("%.6f" is 3x cheaper than repr here)."""
        return ["%s%.6f\n" % (head, now - ts if now > ts else 0.0) for head, ts in self.ages]


@dataclass(frozen=True)
class _KeptText:
    collected: _Collected
    before: bytes  # every family before the age gauge, and the age gauge's header
    after: bytes  # every family after it


@dataclass(frozen=True)
class _ReadingLines:
    """One reading's exposition lines, formatted once and kept until the reading changes.

    A reading changes only when its collector reads again (every 1-30 s), while
    Prometheus may scrape many times in between (several servers, federation,
    dashboards): re-formatting every sample per scrape was most of the scrape's
    cost. What depends on the scrape time is the age gauge (formatted per scrape
    from ``age_head``) and the freshness and loss of the GPU (part of the key).
    """

    reading: object
    points: tuple[Point, ...]
    prefix: str
    ok: bool
    lost: bool
    success: str
    duration: str
    age_head: str
    lines: tuple[tuple[str, tuple[str, ...]], ...]  # (metric, its lines), in the points' order

    def matches(self, reading: object, points: tuple[Point, ...], prefix: str, ok: bool, lost: bool) -> bool:
        return (self.reading is reading and self.points is points and self.ok == ok and self.lost == lost
                and self.prefix == prefix)

    @classmethod
    def build(cls, spec_labels: dict[str, tuple[str, ...]], name: str, reading: Reading, points: tuple[Point, ...],
              prefix: str, ok: bool, lost: bool) -> _ReadingLines:
        collector_labels = f'collector="{name}",{prefix}'
        by_metric: dict[str, list[str]] = {}
        for point in points:
            labels = prefix
            if point.labels:
                labels = prefix + "," + label_string(spec_labels[point.metric], point.labels)
            by_metric.setdefault(point.metric, []).append(sample_line(point.metric, labels, point.value))
        return cls(
            reading, points, prefix, ok, lost,
            success=sample_line("gpuperf_collector_success", collector_labels, 1.0 if ok else 0.0),
            duration=sample_line("gpuperf_collector_duration_seconds", collector_labels, reading.duration_seconds),
            age_head=f"gpuperf_collector_age_seconds{{{collector_labels}}} ",
            lines=tuple((metric, tuple(lines)) for metric, lines in by_metric.items()),
        )


class _WithoutGpus:
    """A registry's view without the samples of some GPUs (label ``gpu``): a lost GPU's probe
    results and recommendations are not current, so they are not published while it is lost."""

    def __init__(self, registry: CollectorRegistry, gpus: frozenset[int]) -> None:
        self._registry = registry
        self._gpus = {str(gpu) for gpu in gpus}

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.labels.get("gpu") not in self._gpus]
            if len(samples) != len(family.samples):
                family = copy.copy(family)
                family.samples = samples
            yield family


SELF_METRICS = (
    MetricSpec("gpuperf_gpu_up", "1 if the GPU answers, 0 if it is lost (then only gpuperf_gpu_info and its event "
               "counters remain)."),
    MetricSpec("gpuperf_collector_success",
               "1 if the collector's latest background read of this GPU succeeded and is fresh.", labels=("collector",)),
    MetricSpec("gpuperf_collector_duration_seconds",
               "Duration of the collector's latest background read of this GPU, seconds.", labels=("collector",)),
    MetricSpec("gpuperf_collector_age_seconds",
               "Age of the collector's latest reading of this GPU at scrape time, seconds.", labels=("collector",)),
    MetricSpec("gpuperf_device_errors_total", "Failed or slow device reads since start, by collector and reason.",
               kind="counter", labels=("collector", "reason")),
    MetricSpec("gpuperf_build_info", "gpuperfd build: version, Python version and device backend.",
               labels=("version", "python_version", "backend")),
)


def process_registry() -> CollectorRegistry:
    """The daemon's own RSS, CPU time and open files (process_* series)."""
    from prometheus_client import ProcessCollector

    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


#: How long the process_* text is reused: /proc is read at most once a second, not per scrape.
PROCESS_SECONDS = 1.0


def process_version() -> int:
    """A version for :func:`process_registry` that changes once per :data:`PROCESS_SECONDS`, so the
    exporter's registry cache re-reads /proc (0.24 ms on the dev VM) at most once a second: CPU
    seconds and RSS a second old are what a 15 s scrape interval can see anyway."""
    return int(time.monotonic() / PROCESS_SECONDS)
