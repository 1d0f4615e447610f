"""The deeper-telemetry collectors on simulated GPUs: present, values, labels, absent when unsupported."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedBackend
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.exporter import Exporter
from gpuperfd.telemetry.sampler import Sampler

DEEP = ("gpm", "health", "violations", "codec", "nvlink", "mig")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scrape(config: SimulationConfig, load: dict[int, str] | None = None, seconds: float = 0.0, before=None):
    clock = FakeClock()
    backend = SimulatedBackend(config, clock=clock, sleep=lambda s: None)
    for gpu, profile in (load or {}).items():
        backend.devices()[gpu].begin_load(WORKLOAD_PROFILES[profile])
    if before is not None:
        before(backend)
    sampler = Sampler(backend, backend.devices(), [COLLECTORS[name]() for name in ("info", *DEEP)], clock=clock)
    sampler.sample_once()
    clock.now += seconds
    sampler.sample_once()
    samples = {}
    for family in text_string_to_metric_families(Exporter(sampler, backend.name).render().decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "uuid")))] = s.value
    return samples


def value(samples, name, gpu=0, **labels):
    return samples.get((name, tuple(sorted({"gpu": str(gpu), **labels}.items()))))


def names(samples, gpu=0):
    return {name for name, labels in samples if ("gpu", str(gpu)) in labels}


def test_gpm_follows_the_workload():
    samples = scrape(SimulationConfig(gpus=2, seed=1), load={0: "attention/default", 1: "llm/gpt2"})
    attention_tensor = value(samples, "gpuperf_gpm_tensor_active_ratio", 0, precision="any")
    decode_tensor = value(samples, "gpuperf_gpm_tensor_active_ratio", 1, precision="any")
    attention_dram = value(samples, "gpuperf_gpm_dram_bandwidth_active_ratio", 0)
    decode_dram = value(samples, "gpuperf_gpm_dram_bandwidth_active_ratio", 1)
    assert attention_tensor > 0.6 and decode_tensor < 0.2  # tensor-bound vs DRAM-bound
    assert decode_dram > 0.5 and decode_dram > 2 * attention_dram
    for precision in ("any", "hmma", "imma", "dfma"):
        assert value(samples, "gpuperf_gpm_tensor_active_ratio", 0, precision=precision) is not None
    for pipe in ("fp16", "fp32", "fp64"):
        assert 0.0 <= value(samples, "gpuperf_gpm_pipe_active_ratio", 0, pipe=pipe) <= 1.0
    assert value(samples, "gpuperf_gpm_sm_active_ratio", 0) > 0.9
    assert value(samples, "gpuperf_gpm_pcie_rx_bytes_per_second", 0) > 1e8


def test_gpm_idle_is_zero_not_absent():
    samples = scrape(SimulationConfig(gpus=1, seed=1))
    assert value(samples, "gpuperf_gpm_sm_active_ratio") == 0.0
    assert value(samples, "gpuperf_gpm_tensor_active_ratio", precision="any") == 0.0


def test_gpm_absent_before_hopper_and_collector_still_succeeds():
    samples = scrape(SimulationConfig(gpus=1, seed=1, model="A100"), load={0: "vit/vit-b16"})
    assert not any(name.startswith("gpuperf_gpm_") for name in names(samples))
    assert value(samples, "gpuperf_collector_success", collector="gpm") == 1.0
    assert "NaN" not in repr(samples.values())


def test_memory_health_values_and_injection():
    def inject(backend):
        gpu = backend.devices()[1]
        gpu.inject_remapped_rows(correctable=3, uncorrectable=1, pending=True)
        gpu.inject_pcie_replays(40)
        gpu.inject_memory_heat(50.0)

    samples = scrape(SimulationConfig(gpus=2, seed=1), before=inject)
    assert 30.0 < value(samples, "gpuperf_memory_temperature_celsius", 0) < 50.0
    assert value(samples, "gpuperf_memory_temperature_celsius", 1) > 80.0
    assert value(samples, "gpuperf_remapped_rows", 0, cause="correctable") == 0.0
    assert value(samples, "gpuperf_remapped_rows", 1, cause="correctable") == 3.0
    assert value(samples, "gpuperf_remapped_rows", 1, cause="uncorrectable") == 1.0
    assert value(samples, "gpuperf_remapped_rows_pending", 1) == 1.0
    assert value(samples, "gpuperf_remapped_rows_failure", 1) == 0.0
    assert value(samples, "gpuperf_pcie_replays_total", 1) == 40.0
    # Hopper remaps rows: retired pages are left out, not zero and not NaN
    assert "gpuperf_retired_pages" not in names(samples, 0)


def test_power_violation_time_accrues_while_the_cap_binds():
    samples = scrape(SimulationConfig(gpus=2, seed=1), load={0: "vit/vit-b16", 1: "llm/gpt2"}, seconds=30.0)
    # ViT binds the 700 W cap on an H100 (sw_power_cap): all 30 s are power violation time
    assert value(samples, "gpuperf_violation_seconds_total", 0, reason="power") == pytest.approx(30.0)
    # batch decode does not bind: no violation time
    assert value(samples, "gpuperf_violation_seconds_total", 1, reason="power") == 0.0
    assert value(samples, "gpuperf_violation_seconds_total", 0, reason="thermal") == 0.0


def test_thermal_violation_on_a_throttled_part():
    samples = scrape(
        SimulationConfig(gpus=1, seed=1, degrade=[{"gpu": 0, "thermal_throttle": True}]),
        load={0: "llm/gpt2"},
        seconds=10.0,
    )
    assert value(samples, "gpuperf_violation_seconds_total", reason="thermal") == pytest.approx(10.0)


def test_codec_series():
    samples = scrape(SimulationConfig(gpus=1, seed=1))
    assert value(samples, "gpuperf_codec_utilization_ratio", engine="encoder") == 0.0
    assert value(samples, "gpuperf_codec_utilization_ratio", engine="decoder") == 0.0


def test_nvlink_links_and_errors():
    def inject(backend):
        backend.devices()[0].inject_nvlink(down=[3], errors={"replay": 5})

    samples = scrape(SimulationConfig(gpus=1, seed=1), before=inject)
    links = {dict(labels)["link"]: v for (name, labels), v in samples.items() if name == "gpuperf_nvlink_up"}
    assert len(links) == 18 and links["3"] == 0.0 and sum(links.values()) == 17.0
    assert value(samples, "gpuperf_nvlink_errors_total", type="replay") == 5.0
    assert value(samples, "gpuperf_nvlink_errors_total", type="crc_flit") == 0.0
    assert value(samples, "gpuperf_nvlink_tx_bytes_total") == 0.0


def test_nvlink_absent_without_links():
    samples = scrape(SimulationConfig(gpus=1, seed=1, nvlink_links=0))
    assert not any(name.startswith("gpuperf_nvlink") for name in names(samples))
    assert "gpuperf_gpm_nvlink_tx_bytes_per_second" not in names(samples)
    assert value(samples, "gpuperf_collector_success", collector="nvlink") == 1.0


def test_mig_instances_labelled_by_gpu_and_compute_instance():
    samples = scrape(SimulationConfig(gpus=2, seed=1, mig=[{"gpu": 1, "instances": 3}]), load={1: "vit/vit-b16"})
    assert value(samples, "gpuperf_mig_enabled", 0) == 0.0
    assert not any(name.startswith("gpuperf_mig_memory") for name in names(samples, 0))
    assert value(samples, "gpuperf_mig_enabled", 1) == 1.0
    totals = [value(samples, "gpuperf_mig_memory_total_bytes", 1, gpu_instance=str(i), compute_instance="0")
              for i in (1, 2, 3)]
    assert all(t is not None and t > 20 * 2**30 for t in totals)
    assert value(samples, "gpuperf_mig_gpm_tensor_active_ratio", 1, gpu_instance="1", compute_instance="0") > 0.3
    assert value(samples, "gpuperf_mig_memory_used_bytes", 1, gpu_instance="4", compute_instance="0") is None
