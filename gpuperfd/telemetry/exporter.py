"""Scrape-time assembly of metric families from the sampler's latest readings.

This is the whole scrape path for telemetry: it copies the reading store under
a lock and formats it. No device call happens here, so a scrape costs the same
whether a GPU answers in 1 us, 21 ms or never.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Sequence

from prometheus_client import (
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import (
    generate_latest as generate_openmetrics,
)

import gpuperfd
from gpuperfd.telemetry.collectors.base import COLLECTORS, GPU_LABELS, MetricSpec
from gpuperfd.telemetry.exposition import Family, label_string, render
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
        self._cache: dict[tuple[int, bool], tuple[int, str]] = {}
        self._cache_lock = threading.Lock()
        self._spec_labels = {spec.name: spec.labels for cls in COLLECTORS.values() for spec in cls.metrics}
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

    def telemetry_families(self) -> list[Family]:
        """Telemetry families from the latest readings; no device call happens here."""
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
                ok = reading.ok and fresh and gpu not in lost
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
        return list(families.values())

    def _registry_text(self, index: int, openmetrics: bool) -> str:
        registry, version = self.registries[index]
        encoder = generate_openmetrics if openmetrics else generate_latest
        if version is None:
            text = encoder(registry).decode()
        else:
            current = version()
            with self._cache_lock:
                cached = self._cache.get((index, openmetrics))
            if cached is not None and cached[0] == current:
                return cached[1]
            # Cache the text without the registry's own "# EOF": render() ends the
            # whole exposition with one (a cached copy with it broke every scrape).
            text = encoder(registry).decode().removesuffix("# EOF\n")
            with self._cache_lock:
                self._cache[(index, openmetrics)] = (current, text)
        return text.removesuffix("# EOF\n")

    def render(self, openmetrics: bool = False) -> bytes:
        parts = [render(self.telemetry_families(), openmetrics)]
        parts += [self._registry_text(i, openmetrics) for i in range(len(self.registries))]
        if openmetrics:
            parts.append("# EOF\n")
        return "".join(parts).encode()


SELF_METRICS = (
    MetricSpec("gpuperf_gpu_up", "1 if the GPU answers, 0 if it is lost (its other series are then absent)."),
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
