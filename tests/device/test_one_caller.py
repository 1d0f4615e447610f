"""One thread inside libnvidia-ml at a time, for every process of ours that calls it.

Each test drives real gpuperfd code (the sampler's lanes and XID watcher, ``gpuperfd check``, the
probe service's gate, the probe child's window sampler) against :mod:`tests.fake_pynvml`, which
counts threads inside the library at once. Before device/serial.py each of these let two in:
the crash of a real 2x H200 node (``gpuperfd check`` died in 13 of 23 runs).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fake_pynvml import FakeNvml, installed
from gpuperfd.config import Config, ProbesConfig, ScheduleConfig
from gpuperfd.device.nvml import GATE, NvmlBackend
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.sampler import Sampler


@pytest.fixture
def fake() -> FakeNvml:
    with installed(gpus=4) as library:
        yield library


def assert_one_at_a_time(fake: FakeNvml, least_calls: int) -> None:
    assert fake.calls >= least_calls, f"only {fake.calls} NVML calls: the test exercised too little"
    assert fake.max_inside == 1, f"threads inside NVML together: {fake.concurrent[:5]}"


def start_sampler(backend: NvmlBackend) -> Sampler:
    collectors = [cls() for name, cls in COLLECTORS.items() if name != "allocation"]
    sampler = Sampler(backend, backend.devices(), collectors, interval_seconds=0.02,
                      intervals={"pcie": 0.05, "energy": 0.05}, xid_enabled=True)
    sampler.start()
    return sampler


def test_sampler_lanes_and_xid_watcher(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    sampler = start_sampler(backend)
    time.sleep(1.5)
    sampler.stop()
    backend.close()
    readings = sampler.store.snapshot().readings
    assert {gpu for gpu, _ in readings} == {0, 1, 2, 3}
    assert all(r.ok for (_, name), r in readings.items()), [k for k, r in readings.items() if not r.ok]
    assert_one_at_a_time(fake, 500)


def test_check_passive_read_and_gate(fake: FakeNvml, tmp_path: Path) -> None:
    from gpuperfd.probing.check.flow import CheckRequest, run_check

    config = Config(probes=ProbesConfig(state_dir=tmp_path / "state"))
    outcome = run_check(config, CheckRequest(quick=True, timeout_seconds=20), opener=lambda c: NvmlBackend())
    assert [v.state for v in outcome.verdicts] == ["healthy"] * 4, [v.reasons for v in outcome.verdicts]
    assert_one_at_a_time(fake, 100)


def test_probe_service_beside_the_sampler(fake: FakeNvml, tmp_path: Path) -> None:
    """The service's gate (allocation, MIG, idle, busy checks, cap reads) on every GPU at once,
    while the sampler reads them: the daemon's threads, all entering NVML."""
    from prometheus_client import CollectorRegistry

    from gpuperfd.probing.executors import PerPointExecutor
    from gpuperfd.probing.gates.idle import IdleTracker
    from gpuperfd.probing.metrics import ProbeMetrics
    from gpuperfd.probing.scheduling.service import ProbeService

    backend = NvmlBackend()
    sampler = start_sampler(backend)
    tracker = IdleTracker(0.0)
    sampler.listeners.append(tracker.observe)
    time.sleep(0.2)

    def executor(device, schedule, abort):  # a probe's parent side reads power while it runs
        for _ in range(20):
            device.power_watts()
            device.energy_joules()
        return ProbeResult(probe=schedule.probe, variant="", preset="gpt2", work_unit="token", units_of_work=1.0,
                           measured_seconds=1.0, device=f"cuda:{device.index}")

    config = ProbesConfig(state_dir=tmp_path / "state", idle_seconds=0, read_only=True, parallel_gpus=True)
    service = ProbeService(config, backend.devices(), PerPointExecutor(executor), ProbeMetrics(CollectorRegistry()),
                           tracker)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["current"])
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda g=gpu: outcomes.append(service.run(schedule, g).result))
               for gpu in range(4) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    sampler.stop()
    backend.close()
    assert "ok" in outcomes, outcomes
    assert_one_at_a_time(fake, 300)


def test_probe_child_window_sampler(fake: FakeNvml) -> None:
    """The child's sampling thread and its main thread (energy counter, window bounds) together."""
    from gpuperfd.probe_child.context import WindowSampler

    device = NvmlBackend().devices()[0]
    sampler = WindowSampler(device, interval=0.002)
    sampler.prime_gpm()
    sampler.start()
    end = time.monotonic() + 0.8
    while time.monotonic() < end:
        device.energy_joules()
        device.power_limits()
    telemetry = sampler.stop()
    assert telemetry.samples > 10 and telemetry.gpm
    assert_one_at_a_time(fake, 200)


def test_gate_counts_what_serialization_cost(fake: FakeNvml) -> None:
    before = GATE.stats()
    backend = NvmlBackend()
    sampler = start_sampler(backend)
    time.sleep(0.5)
    sampler.stop()
    after = GATE.stats()
    assert after.calls - before.calls >= 100
    assert after.waited > before.waited  # 8 lanes and a watcher: some calls did queue
    assert after.max_inside == 1 and after.set_aside == before.set_aside
