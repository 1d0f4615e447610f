"""Scrape-time assembly of metric families from the sampler's latest readings.

This is the whole scrape path for telemetry: it copies the reading store under
a lock and formats it. No device call happens here, so a scrape costs the same
whether a GPU answers in 1 us, 21 ms or never.
"""

from __future__ import annotations

import copy
import platform
import threading
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
from gpuperfd.telemetry.collectors.base import COLLECTORS, GPU_LABELS, MetricSpec
from gpuperfd.telemetry.exposition import (
    Family,
    assemble,
    label_string,
    registry_body,
    render,
)
from gpuperfd.telemetry.sampler import Sampler, lost_gpus

disable_created_metrics()  # _created series would double every counter and histogram


def _family(spec: MetricSpec) -> Family:
    return Family(spec.name, spec.kind, spec.help)


class Exporter:
    """Renders /metrics: telemetry from the reading store, plus other registries (cached)."""

    def __init__(self, sampler: Sampler, backend_name: str, registries: Sequence[tuple[CollectorRegistry, Callable[[], int] | None]] = ()) -> None:
        self.sampler = sampler
        self.backend_name = backend_name
        self.clock = sampler.clock
        self.enabled = sorted({c.name for c in sampler.collectors} | ({"xid"} if sampler.xid_enabled else set()))
        #: (registry, version function or None): a versioned registry is re-rendered only when it changed.
        self.registries = list(registries)
        self._cache: dict[tuple[int, bool], tuple[tuple[int, frozenset[int]], str]] = {}
        self._cache_lock = threading.Lock()
        self._spec_labels = {spec.name: spec.labels for cls in COLLECTORS.values() for spec in cls.metrics}
        #: Callables returning extra families rendered with the telemetry (the health verdicts).
        self.extra_families: list[Callable[[], list[Family]]] = []
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
        """
        families = self._new_families()
        readings, last_info, identities, errors = self.sampler.store.snapshot()
        now = self.clock()
        lost = lost_gpus(readings, self.sampler.interval_seconds)
        prefixes = {gpu: label_string(GPU_LABELS, identity.label_values) for gpu, identity in identities.items()}
        # A GPU whose identity was never read (lost or failing since start) is still reported, with uuid="".
        for gpu in {device.index for device in self.sampler.devices} | {gpu for gpu, _ in readings}:
            prefixes.setdefault(gpu, label_string(GPU_LABELS, (str(gpu), "")))
        up, success = families["gpuperf_gpu_up"], families["gpuperf_collector_success"]
        duration, age_family = families["gpuperf_collector_duration_seconds"], families["gpuperf_collector_age_seconds"]
        for gpu, prefix in sorted(prefixes.items()):
            up.add(prefix, 0.0 if gpu in lost else 1.0)
            for name in self.enabled:
                reading = readings.get((gpu, name))
                if reading is None:
                    continue
                event_driven = getattr(COLLECTORS[name], "event_driven", False)
                age = max(0.0, now - reading.timestamp)
                fresh = event_driven or age <= self.sampler.stale_after(name)
                if gpu in lost:
                    points = reading.points if event_driven and reading.ok else ()
                else:
                    ok = reading.ok and fresh
                    collector_labels = f'collector="{name}",{prefix}'
                    success.add(collector_labels, 1.0 if ok else 0.0)
                    duration.add(collector_labels, reading.duration_seconds)
                    if not event_driven:
                        age_family.add(collector_labels, age)
                    points = reading.points if ok else ()
                if name == "info" and not points:
                    points = last_info.get(gpu, ())  # identity survives a lost GPU
                for point in points:
                    labels = prefix
                    if point.labels:
                        labels = prefix + "," + label_string(self._spec_labels[point.metric], point.labels)
                    families[point.metric].add(labels, point.value)
        for (gpu, collector, reason), count in sorted(errors.items()):
            identity = identities.get(gpu)
            gpu_labels = prefixes.get(gpu) or label_string(GPU_LABELS, (str(gpu), identity.uuid if identity else ""))
            families["gpuperf_device_errors_total"].add(f'collector="{collector}",reason="{reason}",{gpu_labels}', count)
        families["gpuperf_build_info"].add(self._build_labels, 1.0)
        return list(families.values()), frozenset(lost)

    def _registry_text(self, index: int, openmetrics: bool, lost: frozenset[int]) -> str:
        """A registry's families as text without lost GPUs' series, never with '# EOF' (cached by version)."""
        registry, version = self.registries[index]
        encoder = generate_openmetrics if openmetrics else generate_latest
        source = _WithoutGpus(registry, lost) if lost else registry
        if version is None:
            return registry_body(encoder(source).decode())
        current = (version(), lost)
        with self._cache_lock:
            cached = self._cache.get((index, openmetrics))
        if cached is not None and cached[0] == current:
            return cached[1]
        text = registry_body(encoder(source).decode())
        with self._cache_lock:
            self._cache[(index, openmetrics)] = (current, text)
        return text

    def render(self, openmetrics: bool = False) -> bytes:
        families, lost = self.telemetry_families()
        for extra in self.extra_families:
            families = families + extra()
        parts = [render(families, openmetrics)]
        parts += [self._registry_text(i, openmetrics, lost) for i in range(len(self.registries))]
        return assemble(parts, openmetrics).encode()


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
