"""Scrape-time assembly of metric families from the sampler's latest readings.

This is the whole scrape path for telemetry: it copies the reading store under
a lock and formats it. No device call happens here, so a scrape costs the same
whether a GPU answers in 1 us, 21 ms or never.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

import gpuperfd
from gpuperfd.collectors.base import COLLECTORS, GPU_LABELS, MetricSpec
from gpuperfd.device.errors import GpuLost
from gpuperfd.sampler import Sampler


def _family(spec: MetricSpec, labels: tuple[str, ...]) -> Metric:
    name = spec.name[: -len("_total")] if spec.kind == "counter" else spec.name
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return cls(name, spec.help, labels=list(labels))


class TelemetryCollector(PromCollector):
    """prometheus_client collector serving the sampler's latest per-GPU readings."""

    def __init__(self, sampler: Sampler, backend_name: str) -> None:
        self.sampler = sampler
        self.backend_name = backend_name
        self.clock = sampler.clock
        self.enabled = {c.name for c in sampler.collectors} | ({"xid"} if sampler.xid_enabled else set())

    def describe(self) -> Iterator[Metric]:
        """Families without samples, so registering never triggers a read."""
        return iter(self._empty_families().values())

    def _empty_families(self) -> dict[str, Metric]:
        families: dict[str, Metric] = {}
        for name in sorted(self.enabled):
            for spec in COLLECTORS[name].metrics:
                families[spec.name] = _family(spec, GPU_LABELS + spec.labels)
        families["gpuperf_gpu_up"] = GaugeMetricFamily(
            "gpuperf_gpu_up", "1 if the GPU answers, 0 if it is lost (its other series are then absent).", labels=list(GPU_LABELS)
        )
        families["gpuperf_collector_success"] = GaugeMetricFamily(
            "gpuperf_collector_success",
            "1 if the collector's latest background read of this GPU succeeded and is fresh.",
            labels=["collector", *GPU_LABELS],
        )
        families["gpuperf_collector_duration_seconds"] = GaugeMetricFamily(
            "gpuperf_collector_duration_seconds",
            "Duration of the collector's latest background read of this GPU, seconds.",
            labels=["collector", *GPU_LABELS],
        )
        families["gpuperf_collector_age_seconds"] = GaugeMetricFamily(
            "gpuperf_collector_age_seconds",
            "Age of the collector's latest reading of this GPU at scrape time, seconds.",
            labels=["collector", *GPU_LABELS],
        )
        families["gpuperf_device_errors"] = CounterMetricFamily(
            "gpuperf_device_errors",
            "Failed or slow device reads since start, by collector and reason.",
            labels=["collector", "reason", *GPU_LABELS],
        )
        families["gpuperf_build_info"] = GaugeMetricFamily(
            "gpuperf_build_info",
            "gpuperfd build: version, Python version and device backend.",
            labels=["version", "python_version", "backend"],
        )
        return families

    def collect(self) -> Iterator[Metric]:
        families = self._empty_families()
        readings, last_info, identities, errors = self.sampler.store.snapshot()
        now = self.clock()
        lost = {gpu for (gpu, _), reading in readings.items() if reading.error == GpuLost.reason}
        for gpu, identity in sorted(identities.items()):
            gpu_labels = identity.label_values
            families["gpuperf_gpu_up"].add_metric(list(gpu_labels), 0.0 if gpu in lost else 1.0)
            for name in sorted(self.enabled):
                reading = readings.get((gpu, name))
                if reading is None:
                    continue
                event_driven = getattr(COLLECTORS[name], "event_driven", False)
                age = max(0.0, now - reading.timestamp)
                fresh = event_driven or age <= self.sampler.stale_after(name)
                ok = reading.ok and fresh and gpu not in lost
                col_labels = [name, *gpu_labels]
                families["gpuperf_collector_success"].add_metric(col_labels, 1.0 if ok else 0.0)
                families["gpuperf_collector_duration_seconds"].add_metric(col_labels, reading.duration_seconds)
                if not event_driven:
                    families["gpuperf_collector_age_seconds"].add_metric(col_labels, age)
                points = reading.points if ok else ()
                if name == "info" and not points:
                    points = last_info.get(gpu, ())  # identity survives a lost GPU
                for point in points:
                    families[point.metric].add_metric([*gpu_labels, *point.labels], point.value)
        for (gpu, collector, reason), count in sorted(errors.items()):
            identity = identities.get(gpu)
            uuid = identity.uuid if identity else ""
            families["gpuperf_device_errors"].add_metric([collector, reason, str(gpu), uuid], float(count))
        families["gpuperf_build_info"].add_metric(
            [gpuperfd.__version__, platform.python_version(), self.backend_name], 1.0
        )
        yield from families.values()


def build_registry(sampler: Sampler, backend_name: str) -> CollectorRegistry:
    """A private registry with telemetry and the process collector (RSS, CPU, fds)."""
    from prometheus_client import ProcessCollector, disable_created_metrics

    disable_created_metrics()  # _created series would double every counter and histogram
    registry = CollectorRegistry(auto_describe=True)
    registry.register(TelemetryCollector(sampler, backend_name))
    ProcessCollector(registry=registry)
    return registry
