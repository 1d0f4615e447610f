"""The probe child's window sampler records GPM over each measured window (through the device interface)."""

from __future__ import annotations

import pytest

from gpuperfd.config import FaultConfig, SimulationConfig
from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedBackend
from gpuperfd.probe_child.context import Telemetry, WindowSampler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_window_gpm_is_the_mean_between_samples_at_the_window_bounds():
    clock = Clock()
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=3), clock=clock, sleep=lambda s: None)
    gpu = backend.devices()[0]
    sampler = WindowSampler(gpu, interval=60.0)  # no periodic samples inside this short test
    sampler.prime_gpm()
    gpu.begin_load(WORKLOAD_PROFILES["attention/default"])
    sampler.start()
    clock.now += 4.0
    first = sampler.stop()
    gpu.begin_load(WORKLOAD_PROFILES["llm/gpt2"])
    sampler.start()
    clock.now += 12.0
    second = sampler.stop()
    assert [seconds for seconds, _ in first.gpm] == [pytest.approx(4.0)]
    assert first.gpm_mean("tensor_any") > 0.6 and second.gpm_mean("tensor_any") < 0.2
    pooled = Telemetry()
    pooled.merge(first)
    pooled.merge(second)
    expected = (4.0 * first.gpm_mean("dram_active") + 12.0 * second.gpm_mean("dram_active")) / 16.0
    assert pooled.gpm_mean("dram_active") == pytest.approx(expected)


def test_window_without_gpm_records_nothing():
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=3, model="A100"), sleep=lambda s: None)
    sampler = WindowSampler(backend.devices()[0], interval=60.0)
    sampler.start()
    data = sampler.stop()
    assert data.gpm == [] and data.gpm_mean("tensor_any") is None


def test_gpm_fault_leaves_the_window_without_gpm_not_failed():
    backend = SimulatedBackend(
        SimulationConfig(gpus=1, seed=3, faults=[FaultConfig(call="gpm_metrics", kind="gpu_lost")]), sleep=lambda s: None
    )
    sampler = WindowSampler(backend.devices()[0], interval=60.0)
    sampler.prime_gpm()
    sampler.start()
    assert sampler.stop().gpm_mean("sm_active") is None


def test_back_to_back_windows_are_cut_off_one_running_sampler():
    """Windows of a point share one sampling thread (no start/join between them, so no idle gap on the
    GPU for it); each cut closes a window with its own GPM interval and its own samples."""
    clock = Clock()
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=3), clock=clock, sleep=lambda s: None)
    gpu = backend.devices()[0]
    sampler = WindowSampler(gpu, interval=0.001)
    sampler.prime_gpm()
    gpu.begin_load(WORKLOAD_PROFILES["attention/default"])
    sampler.start()
    thread = sampler._thread
    clock.now += 2.0
    _wait_for_samples(sampler)
    first = sampler.cut()
    assert sampler._thread is thread and thread.is_alive()  # the same thread samples the next window
    gpu.begin_load(WORKLOAD_PROFILES["llm/gpt2"])
    clock.now += 3.0
    _wait_for_samples(sampler)
    second = sampler.cut()
    sampler.close()
    assert not thread.is_alive() and sampler._thread is None
    assert [s for s, _ in first.gpm] == [pytest.approx(2.0)] and [s for s, _ in second.gpm] == [pytest.approx(3.0)]
    assert first.gpm_mean("tensor_any") > 0.6 and second.gpm_mean("tensor_any") < 0.2
    assert first.samples > 0 and second.samples > 0 and first.sm_clock and second.sm_clock


def _wait_for_samples(sampler: WindowSampler) -> None:
    import time

    deadline = time.monotonic() + 10.0
    while sampler.data.samples < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
