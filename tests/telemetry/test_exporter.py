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
    gpu.begin_load(WORKLOAD_PROFILES["train/gpt2"], pid=4242)
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
    assert value(exporter, "gpuperf_collector_success", gpu=1, collector="power") is None  # gpu_up says it all
    assert value(exporter, "gpuperf_device_errors_total", gpu=1, collector="power", reason="gpu_lost") == 1.0
    left = {s.name for s in samples(exporter) if s.labels.get("gpu") == "1"}
    assert left == {"gpuperf_gpu_info", "gpuperf_gpu_up", "gpuperf_device_errors_total", "gpuperf_xid_events_total"}  # docs/runbook.md#gpulost

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
    assert 40 <= len(per_gpu) <= 160  # documented in docs/metrics.md (151 on a simulated H100 SXM)


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


# -- every render parses, in both formats (issue 18: a cached probe registry kept its own '# EOF') --


def _probe_result(cap: float, rate: float, status: str = "ok"):
    from gpuperfd.probe_data.result import ProbeResult

    return ProbeResult(probe="llm", variant="generate", preset="gpt2", status=status, wall_seconds=2.0,
                       failure_reason=None if status == "ok" else "oom", measured_seconds=1.0,
                       units_of_work=rate, work_unit="token", energy_per_unit_joules=cap / rate,
                       average_power_watts=cap * 0.9, latencies={"ttft_seconds": [0.02], "tpot_seconds": [0.001]})


def make_daemon_exporter(clock):
    """The exporter as the daemon wires it: telemetry, the versioned probe registry, the process registry."""
    from prometheus_client import CollectorRegistry

    from gpuperfd.probing.metrics import ProbeMetrics
    from gpuperfd.telemetry.exporter import process_registry

    backend, sampler, _ = make(clock)
    registry = CollectorRegistry(auto_describe=True)
    metrics = ProbeMetrics(registry)
    exporter = Exporter(sampler, backend.name, [(registry, metrics.version), (process_registry(), None)])
    sampler.sample_once()
    return backend, metrics, exporter


def check_exposition(text: str, openmetrics: bool) -> set:
    """Parse with prometheus_client (the OpenMetrics parser is strict: one '# EOF', last); lint text with promtool."""
    import shutil
    import subprocess

    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_om,
    )

    if openmetrics:
        assert text.count("# EOF") == 1 and text.endswith("\n# EOF\n")
        families = list(parse_om(text))
    else:
        assert "# EOF" not in text
        families = list(text_string_to_metric_families(text))
        promtool = shutil.which("promtool")
        assert promtool, "promtool is required (apt-get install prometheus)"
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    return {(s.name, tuple(sorted(s.labels.items()))) for f in families for s in f.samples if not s.name.startswith("process_")}


@pytest.mark.parametrize("renders", [1, 2, 25])
def test_every_render_parses_in_both_formats_cached_or_not(clock, renders):
    backend, metrics, exporter = make_daemon_exporter(clock)
    gpu = backend.devices()[0].info()
    metrics.set_original_cap(gpu, 700.0)
    metrics.publish(gpu, _probe_result(700, 1000.0), 700, at_operator_cap=True)
    for i in range(renders):
        if i and i % 5 == 0:  # the probe registry changes between some renders and not others
            metrics.publish(gpu, _probe_result(500, 900.0 + i), 500, at_operator_cap=False)
        om = check_exposition(exporter.render(openmetrics=True).decode(), True)
        text = check_exposition(exporter.render(openmetrics=False).decode(), False)
        assert om == text  # the same samples whichever format a scrape asked for
    assert ("gpuperf_probe_work_units_per_second",
            (("gpu", "0"), ("power_cap", "700"), ("preset", "gpt2"), ("probe", "llm"), ("unit", "token"), ("uuid", gpu.uuid))) in om


def test_a_part_carrying_its_own_eof_is_refused_not_served():
    from gpuperfd.telemetry.exposition import assemble, registry_body

    assert assemble(["a 1\n", registry_body("b 2\n# EOF\n")], openmetrics=True) == "a 1\nb 2\n# EOF\n"
    assert assemble(["a 1\n"], openmetrics=False) == "a 1\n"
    with pytest.raises(ValueError, match="EOF"):
        assemble(["a 1\n# EOF\n", "b 2\n"], openmetrics=True)


@pytest.mark.prometheus
def test_a_real_prometheus_scrapes_every_time_across_probe_runs(tmp_path):
    """Stock Prometheus (OpenMetrics first) at 1 s over ~30 s of 10 s sweeps: no scrape fails, stored == served."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "scrape_success.py"), "--simulate", "2",
                           "--seconds", "30", "--json", str(out)], capture_output=True, text=True, timeout=180, cwd=root)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["scrapes"] >= 20, result
    assert result["scrapes_ok"] == result["scrapes"], result  # count_over_time(up) == sum_over_time(up)
    assert result["last_error"] == "", result
    assert result["probe_points"] >= 12, result  # at least two sweeps of 3 caps on 2 GPUs: several cache states
    assert result["series_compared"] >= 9 and result["mismatches"] == [], result
    assert result["daemon_alive"] and proc.returncode == 0, result


def test_lost_gpu_publishes_no_probe_results_until_it_answers_again(clock):
    backend, metrics, exporter = make_daemon_exporter(clock)
    gpus = [d.info() for d in backend.devices()]
    for gpu in gpus:
        metrics.set_original_cap(gpu, 700.0)
        metrics.publish(gpu, _probe_result(700, 1000.0), 700, at_operator_cap=True)
        metrics.publish(gpu, _probe_result(500, 950.0), 500, at_operator_cap=False)
    before = {(s.name, tuple(sorted(s.labels.items())), s.value) for s in samples(exporter) if s.labels.get("gpu") == "1"}
    backend.inject(FaultConfig(gpu=1, call="*", kind="gpu_lost"))
    clock.advance(1.0)
    exporter.sampler.sample_once()
    for openmetrics in (True, False):
        text = exporter.render(openmetrics).decode()
        left = {s.name for s in check_exposition_families(text, openmetrics) if s.labels.get("gpu") == "1"}
        assert left == {"gpuperf_gpu_info", "gpuperf_gpu_up", "gpuperf_device_errors_total", "gpuperf_xid_events_total"}, left
        kept = [s for s in check_exposition_families(text, openmetrics) if s.labels.get("gpu") == "0"]
        assert any(s.name == "gpuperf_probe_work_units_per_second" for s in kept)  # the other GPU is untouched
    backend.clear_faults()  # back: its results, counters and caps return as they were
    clock.advance(1.0)
    exporter.sampler.sample_once()
    after = {(s.name, tuple(sorted(s.labels.items())), s.value) for s in samples(exporter) if s.labels.get("gpu") == "1"}
    probe = {x for x in before if x[0].startswith(("gpuperf_probe_", "gpuperf_power_cap_original"))}
    assert probe and probe <= after


def check_exposition_families(text: str, openmetrics: bool) -> list:
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_om,
    )

    parse = parse_om if openmetrics else text_string_to_metric_families
    return [s for family in parse(text) for s in family.samples]


def test_xid_raised_as_the_gpu_is_lost_is_kept(clock):
    """XID 79 (fallen off the bus) arrives together with the loss: its count must still be served."""
    backend, sampler, exporter = make(clock, gpus=2)
    sampler.xid_enabled = True
    exporter = Exporter(sampler, "simulated")
    sampler._publish_xid()
    sampler.sample_once()
    assert value(exporter, "gpuperf_xid_events_total", gpu=1) == 0
    backend.inject_xid(1, 79)
    backend.inject(FaultConfig(gpu=1, call="*", kind="gpu_lost"))
    for event in backend.wait_xid_events(0.0):
        sampler.xid_counts.add(event)
    sampler._publish_xid()
    clock.advance(1.0)
    sampler.sample_once()
    assert value(exporter, "gpuperf_gpu_up", gpu=1) == 0.0
    assert value(exporter, "gpuperf_xid_errors_total", gpu=1, xid="79") == 1
    assert value(exporter, "gpuperf_xid_events_total", gpu=1) == 1


def test_cached_registry_text_keeps_one_eof_in_openmetrics(clock):
    """A versioned registry is rendered once and served from cache while its version holds;
    the cached OpenMetrics text must not carry the registry's own "# EOF" (Prometheus
    refused every scrape after the first: "unexpected data after # EOF")."""
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_om,
    )

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


# --- the kept scrape text (issue 36) -------------------------------------------------------------


def test_kept_text_follows_new_readings_ages_and_staleness_like_a_fresh_render(clock):
    """Between two reads the scrape reuses its formatted text; it must still say exactly what a
    render from nothing says: new values after a read, the age growing with the clock, and a
    reading that turns stale (no new read at all) reported as failed."""
    backend, sampler, exporter = make(clock, gpus=2)
    sampler.sample_once()

    def fresh_render() -> set:
        uncached = Exporter(sampler, backend.name)
        return {(s.name, tuple(sorted(s.labels.items())), s.value) for s in samples(uncached)}

    def kept() -> set:
        return {(s.name, tuple(sorted(s.labels.items())), s.value) for s in samples(exporter)}

    first = kept()
    assert kept() == first == fresh_render()
    clock.advance(2.0)  # no read: only the ages moved
    assert kept() == fresh_render() != first
    assert value(exporter, "gpuperf_collector_age_seconds", collector="power") == pytest.approx(2.0)
    assert value(exporter, "gpuperf_collector_success", collector="power") == 1.0
    idle_power = value(exporter, "gpuperf_power_draw_watts")
    backend.devices()[0].begin_load(WORKLOAD_PROFILES["train/gpt2"], pid=4242)
    clock.advance(1.0)
    sampler.sample_once()  # a new read: new values
    assert kept() == fresh_render()
    assert value(exporter, "gpuperf_power_draw_watts") > idle_power
    assert value(exporter, "gpuperf_collector_age_seconds", collector="power") == pytest.approx(0.0)
    clock.advance(sampler.stale_after("power") + 0.5)  # every reading stale, still no new read
    assert kept() == fresh_render()
    assert value(exporter, "gpuperf_collector_success", collector="power") == 0.0


def test_extra_families_text_is_kept_while_the_provider_returns_the_same_list(clock):
    from gpuperfd.telemetry.exposition import Family

    _, sampler, exporter = make(clock, gpus=1)
    sampler.sample_once()
    current = [Family("gpuperf_test_extra", "gauge", "A test family.")]
    current[0].add('gpu="0"', 1.0)
    exporter.extra_families.append(lambda: current)
    assert 'gpuperf_test_extra{gpu="0"} 1.0' in exporter.render().decode()
    current[0].lines.clear()  # the same list object: its kept text is served (the monitor never mutates it)
    assert 'gpuperf_test_extra{gpu="0"} 1.0' in exporter.render().decode()
    current = [Family("gpuperf_test_extra", "gauge", "A test family.")]  # a new evaluation: a new list
    current[0].add('gpu="0"', 0.0)
    text = exporter.render().decode()
    assert 'gpuperf_test_extra{gpu="0"} 0.0' in text and 'gpuperf_test_extra{gpu="0"} 1.0' not in text
