"""The exporter on simulated GPUs: values, labels, absent fields, lost GPUs, staleness."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.config import FaultConfig, SimulationConfig
from gpuperfd.device.base import CLOCK_EVENT_REASONS
from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedBackend
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.exporter import Exporter
from gpuperfd.telemetry.sampler import Sampler

GIB = 1024**3


def make(clock, gpus: int = 2, **sim):
    """A simulated backend, a sampler over every collector and its exporter."""
    backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=1, **sim), clock=clock, sleep=clock.sleep)
    collectors = [cls() for name, cls in sorted(COLLECTORS.items()) if name != "xid"]
    sampler = Sampler(backend, backend.devices(), collectors, interval_seconds=1.0, clock=clock)
    return backend, sampler, Exporter(sampler, backend.name)


def samples(exporter, openmetrics=False):
    """Parse what a scrape returns: the test goes through the real exposition text."""
    text = exporter.render(openmetrics).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(exporter, metric_name, gpu=0, **labels):
    """The value of the one sample with these labels, or None if absent."""
    for sample in samples(exporter):
        if sample.name == metric_name and sample.labels.get("gpu") == str(gpu) and all(
            sample.labels.get(k) == v for k, v in labels.items()
        ):
            return sample.value
    return None


def test_known_idle_state_is_exported_with_values_and_labels(clock):
    backend, sampler, exporter = make(clock)
    gpu0 = backend.devices()[0]
    gpu0.set_power_limit(500.0)
    sampler.sample_once()

    info = gpu0.info()
    assert value(exporter, "gpuperf_gpu_info", 0, uuid=info.uuid, name="NVIDIA H100 80GB HBM3", backend="simulated",
                 compute_capability="9.0", pci_bus_id=info.pci_bus_id) == 1.0
    assert value(exporter, "gpuperf_power_limit_watts") == 500.0
    assert value(exporter, "gpuperf_power_limit_min_watts") == 200.0
    assert value(exporter, "gpuperf_power_limit_max_watts") == 700.0
    assert value(exporter, "gpuperf_power_limit_default_watts") == 700.0
    assert value(exporter, "gpuperf_power_limit_watts", gpu=1) == 700.0  # the other GPU is untouched
    assert value(exporter, "gpuperf_memory_total_bytes") == 80 * GIB
    assert 0 <= value(exporter, "gpuperf_memory_used_bytes") < 2 * GIB
    assert 60 <= value(exporter, "gpuperf_power_draw_watts") <= 100  # idle near 80 W
    assert value(exporter, "gpuperf_gpu_utilization_ratio") < 0.05
    assert value(exporter, "gpuperf_clock_event_active", reason="gpu_idle") == 1.0
    assert value(exporter, "gpuperf_clock_event_active", reason="sw_power_cap") == 0.0
    for reason in CLOCK_EVENT_REASONS:  # one series per reason, always
        assert value(exporter, "gpuperf_clock_event_active", reason=reason) in (0.0, 1.0)
    assert value(exporter, "gpuperf_compute_processes") == 0
    assert value(exporter, "gpuperf_ecc_errors_total", type="uncorrected") == 0
    assert value(exporter, "gpuperf_gpu_up") == 1.0
    for name in COLLECTORS:
        if name != "xid":
            assert value(exporter, "gpuperf_collector_success", collector=name) == 1.0, name


def test_busy_capped_gpu_shows_load_power_cap_and_energy(clock):
    backend, sampler, exporter = make(clock, gpus=1)
    gpu = backend.devices()[0]
    sampler.sample_once()
    e0 = value(exporter, "gpuperf_energy_joules_total")
    gpu.set_power_limit(300.0)
    gpu.begin_load(WORKLOAD_PROFILES["train"], pid=4242)
    clock.advance(10.0)
    sampler.sample_once()

    assert value(exporter, "gpuperf_compute_processes") == 1
    assert value(exporter, "gpuperf_gpu_utilization_ratio") > 0.5
    assert value(exporter, "gpuperf_clock_event_active", reason="sw_power_cap") == 1.0
    assert value(exporter, "gpuperf_clock_event_active", reason="gpu_idle") == 0.0
    assert value(exporter, "gpuperf_power_draw_watts") <= 300.0 * 1.03
    sm = value(exporter, "gpuperf_sm_clock_hertz")
    assert 345e6 < sm < value(exporter, "gpuperf_sm_clock_max_hertz")
    # the counter integrates the true (capped) power over the 10 s: ~300 W x 10 s
    e1 = value(exporter, "gpuperf_energy_joules_total")
    assert 2700 <= e1 - e0 <= 3000


def test_unsupported_field_is_absent_not_nan_and_not_a_failure(clock):
    backend, sampler, exporter = make(clock, faults=[FaultConfig(gpu=0, call="pcie_throughput", kind="not_supported")])
    sampler.sample_once()
    text = exporter.render().decode()
    assert "NaN" not in text
    assert value(exporter, "gpuperf_pcie_tx_bytes_per_second", gpu=0) is None
    assert value(exporter, "gpuperf_pcie_tx_bytes_per_second", gpu=1) is not None
    assert value(exporter, "gpuperf_collector_success", gpu=0, collector="pcie") == 1.0


def test_lost_gpu_goes_down_while_others_are_reported(clock):
    backend, sampler, exporter = make(clock, gpus=3)
    sampler.sample_once()
    uuid1 = backend.devices()[1].info().uuid
    backend.inject(FaultConfig(gpu=1, call="*", kind="gpu_lost"))
    clock.advance(1.0)
    sampler.sample_once()

    assert value(exporter, "gpuperf_gpu_up", gpu=1) == 0.0
    assert value(exporter, "gpuperf_gpu_up", gpu=0) == 1.0 and value(exporter, "gpuperf_gpu_up", gpu=2) == 1.0
    assert value(exporter, "gpuperf_power_draw_watts", gpu=1) is None
    assert value(exporter, "gpuperf_temperature_celsius", gpu=1) is None
    assert value(exporter, "gpuperf_power_draw_watts", gpu=2) is not None
    assert value(exporter, "gpuperf_gpu_info", gpu=1, uuid=uuid1) == 1.0  # identity kept
    assert value(exporter, "gpuperf_collector_success", gpu=1, collector="power") == 0.0
    assert value(exporter, "gpuperf_device_errors_total", gpu=1, collector="power", reason="gpu_lost") == 1.0

    backend.clear_faults()  # the GPU comes back
    clock.advance(1.0)
    sampler.sample_once()
    assert value(exporter, "gpuperf_gpu_up", gpu=1) == 1.0
    assert value(exporter, "gpuperf_power_draw_watts", gpu=1) is not None


@pytest.mark.parametrize("kind,reason", [("no_permission", "no_permission"), ("unknown", "unknown"), ("timeout", "timeout")])
def test_failing_collector_is_marked_down_and_counted_others_unaffected(clock, kind, reason):
    backend, sampler, exporter = make(clock, faults=[FaultConfig(gpu=0, call="temperature_celsius", kind=kind, delay_seconds=0.01)])
    sampler.sample_once()
    assert value(exporter, "gpuperf_temperature_celsius", gpu=0) is None
    assert value(exporter, "gpuperf_collector_success", gpu=0, collector="temperature") == 0.0
    assert value(exporter, "gpuperf_device_errors_total", gpu=0, collector="temperature", reason=reason) == 1.0
    assert value(exporter, "gpuperf_temperature_celsius", gpu=1) is not None
    assert value(exporter, "gpuperf_power_draw_watts", gpu=0) is not None


def test_stale_reading_is_reported_as_failed(clock):
    backend, sampler, exporter = make(clock, gpus=1)
    sampler.sample_once()
    assert value(exporter, "gpuperf_collector_success", collector="power") == 1.0
    clock.advance(sampler.stale_after("power") + 1)  # the lane stopped (e.g. a hung call)
    assert value(exporter, "gpuperf_collector_success", collector="power") == 0.0
    assert value(exporter, "gpuperf_power_draw_watts") is None
    assert value(exporter, "gpuperf_collector_age_seconds", collector="power") > sampler.stale_after("power")


def test_xid_events_are_counted_per_code_and_repeats_not_lost(clock):
    backend, sampler, exporter = make(clock, gpus=2)
    sampler.xid_enabled = True
    for xid in (79, 79, 48):
        backend.inject_xid(0, xid)
    for event in backend.wait_xid_events(0.0):
        sampler.xid_counts.add(event)
    sampler.sample_once()
    found = {(s.name, s.labels.get("gpu"), s.labels.get("xid")): s.value for s in samples(Exporter(sampler, "simulated"))}
    assert found[("gpuperf_xid_errors_total", "0", "79")] == 2
    assert found[("gpuperf_xid_errors_total", "0", "48")] == 1
    assert found[("gpuperf_xid_events_total", "0", None)] == 3
    assert found[("gpuperf_xid_events_total", "1", None)] == 0


def test_series_per_gpu_is_bounded(clock):
    backend, sampler, exporter = make(clock, gpus=1)
    sampler.sample_once()
    per_gpu = [s for s in samples(exporter) if s.labels.get("gpu") == "0"]
    assert 40 <= len(per_gpu) <= 80  # documented in docs/metrics.md


def test_openmetrics_and_text_carry_the_same_samples(clock):
    backend, sampler, exporter = make(clock, gpus=2)
    sampler.sample_once()
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_om,
    )

    om = exporter.render(openmetrics=True).decode()
    assert om.endswith("# EOF\n")
    om_samples = {(s.name, tuple(sorted(s.labels.items()))) for f in parse_om(om) for s in f.samples}
    text_samples = {(s.name, tuple(sorted(s.labels.items()))) for s in samples(exporter)}
    assert om_samples == text_samples


def test_hostile_label_values_are_escaped(clock):
    backend, sampler, exporter = make(clock, gpus=1)
    sampler.sample_once()
    gpu = backend.devices()[0]
    import dataclasses

    hostile = 'NVIDIA "H100"\\ line\nbreak {x="y"} ü'
    gpu._info = dataclasses.replace(gpu._info, name=hostile)
    sampler.sample_once()
    assert value(exporter, "gpuperf_gpu_info", name=hostile) == 1.0


def test_gpu_that_comes_back_is_up_at_its_first_good_read(clock):
    backend, sampler, exporter = make(clock, gpus=1)
    sampler.sample_once()
    backend.inject(FaultConfig(gpu=0, call="*", kind="gpu_lost"))
    clock.advance(1.0)
    sampler.sample_once()
    assert value(exporter, "gpuperf_gpu_up") == 0.0
    backend.clear_faults()
    for _ in range(2):  # two fast-lane rounds; the slow lane (pcie) has not read it again
        clock.advance(1.0)
        for collector in sampler.collectors:
            if not collector.slow:
                sampler.read_one(backend.devices()[0], collector)
    assert value(exporter, "gpuperf_gpu_up") == 1.0
    assert value(exporter, "gpuperf_power_draw_watts") is not None
    assert value(exporter, "gpuperf_collector_success", collector="pcie") == 0.0  # not re-read yet


def test_cached_registry_text_keeps_one_eof_in_openmetrics(clock):
    """A versioned registry is rendered once and served from cache while its version holds;
    the cached OpenMetrics text must not carry the registry's own "# EOF" (Prometheus
    refused every scrape after the first: "unexpected data after # EOF")."""
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

    backend, sampler, _ = make(clock, gpus=1)
    registry = CollectorRegistry()
    Gauge("gpuperf_test_value", "A test gauge.", registry=registry).set(1)
    exporter = Exporter(sampler, backend.name, [(registry, lambda: 7)])
    sampler.sample_once()
    for _ in range(3):  # first render fills the cache, the next ones read it
        text = exporter.render(openmetrics=True).decode()
        assert text.count("# EOF") == 1 and text.endswith("# EOF\n")
        assert any(f.name == "gpuperf_test_value" for f in parse_om(text))
        assert "gpuperf_test_value" in exporter.render(openmetrics=False).decode()
