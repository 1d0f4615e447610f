"""The fabric collector: one-hot state and status on an NVSwitch board, absent without one."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.config import InterconnectFaultConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.exporter import Exporter
from gpuperfd.telemetry.sampler import Sampler


def scrape(config: SimulationConfig) -> dict[tuple[str, str, str], float]:
    backend = SimulatedBackend(config)
    sampler = Sampler(backend, backend.devices(), [COLLECTORS[name]() for name in ("info", "fabric")])
    sampler.sample_once()
    out = {}
    for family in text_string_to_metric_families(Exporter(sampler, backend.name).render().decode()):
        for s in family.samples:
            if s.name.startswith("gpuperf_fabric") or s.name == "gpuperf_collector_success":
                out[(s.name, s.labels.get("gpu", ""), s.labels.get("state", s.labels.get("collector", "")))] = s.value
    return out


def test_hgx_fabric_completed_and_a_gpu_not_started() -> None:
    fault = InterconnectFaultConfig(kind="fabric", gpu=2, fabric_state="not_started")
    got = scrape(SimulationConfig(gpus=4, seed=1, interconnect_faults=[fault]))
    assert got[("gpuperf_fabric_state", "0", "completed")] == 1.0
    assert got[("gpuperf_fabric_state", "0", "not_started")] == 0.0
    assert got[("gpuperf_fabric_status_ok", "0", "")] == 1.0
    assert got[("gpuperf_fabric_state", "2", "not_started")] == 1.0
    assert ("gpuperf_fabric_status_ok", "2", "") not in got


def test_completed_with_an_error_status() -> None:
    fault = InterconnectFaultConfig(kind="fabric", gpu="*", fabric_state="completed", fabric_status="NVML_ERROR_UNKNOWN")
    got = scrape(SimulationConfig(gpus=4, seed=1, interconnect_faults=[fault]))
    assert got[("gpuperf_fabric_status_ok", "3", "")] == 0.0


def test_no_fabric_series_on_an_nvlink_pair_or_pcie() -> None:
    for config in (SimulationConfig(gpus=2, seed=1), SimulationConfig(gpus=4, seed=1, topology="pcie")):
        got = scrape(config)
        assert not [key for key in got if key[0].startswith("gpuperf_fabric")], got
