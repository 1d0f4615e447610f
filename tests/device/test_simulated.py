"""Tests of the simulated GPU (gpuperfd.device.simulated), on a fake clock.

Time only moves when a test moves it, and sleeps are recorded (or advance the
fake clock) instead of waiting, so every schedule is checked exactly.
"""

from __future__ import annotations

import math
import re
import threading
import time

import pytest

from gpuperfd.config import (
    DegradeConfig,
    EccInjectConfig,
    FaultConfig,
    SimulationConfig,
    XidConfig,
)
from gpuperfd.device.base import CLOCK_EVENT_REASONS, Backend, Device
from gpuperfd.device.errors import (
    DeviceError,
    DeviceTimeout,
    GpuLost,
    InvalidArgument,
    NoPermission,
    NotSupported,
    UnknownDeviceError,
)
from gpuperfd.device.simulated import (
    BASE_MEMORY_BYTES,
    GPU_MODELS,
    THERMAL_THROTTLE_CLOCK_FACTOR,
    WORKLOAD_PROFILES,
    SimulatedBackend,
    SimulatedGpu,
)
from manual_clock import FakeClock

TRAIN = WORKLOAD_PROFILES["train/gpt2"]
DECODE = WORKLOAD_PROFILES["llm/gpt2"]

DEVICE_CALLS = (
    "info",
    "utilization",
    "memory",
    "temperature_celsius",
    "power_watts",
    "energy_joules",
    "power_limits",
    "clocks",
    "clock_events",
    "pcie_throughput",
    "ecc_errors",
    "compute_processes",
    "gpm_activity",
    "gpm_metrics",
    "memory_temperature_celsius",
    "remapped_rows",
    "retired_pages",
    "violation_seconds",
    "pcie_replays",
    "codec_utilization",
    "nvlink",
    "mig_enabled",
    "mig_instances",
)


def make_backend(clock: FakeClock, **config: object) -> SimulatedBackend:
    config.setdefault("seed", 1)
    return SimulatedBackend(SimulationConfig(**config), clock=clock, sleep=clock.sleep)


def caps_for(model_key: str, step: float = 25.0) -> list[float]:
    model = GPU_MODELS[model_key]
    count = int(round((model.max_power_watts - model.min_power_watts) / step))
    return [model.min_power_watts + step * i for i in range(count + 1)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(sleep_advances=False)


@pytest.fixture
def backend(clock: FakeClock) -> SimulatedBackend:
    return make_backend(clock, gpus=2, model="H100")


@pytest.fixture
def gpu(backend: SimulatedBackend) -> SimulatedGpu:
    return backend.devices()[0]


# -- identity ---------------------------------------------------------------------


def test_backend_lists_gpus_in_index_order_with_model_identity(backend: SimulatedBackend) -> None:
    assert isinstance(backend, Backend) and backend.name == "simulated"
    gpus = backend.devices()
    assert [g.index for g in gpus] == [0, 1]
    assert all(isinstance(g, Device) for g in gpus)
    info = gpus[1].info()
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.backend == "simulated"
    assert info.compute_capability == "9.0"
    assert info.memory_total_bytes == 80 * 2**30
    assert info.driver_version == backend.driver_version() == "580.159.04-sim"
    assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", info.pci_bus_id)
    assert gpus[0].info().pci_bus_id != info.pci_bus_id


def test_uuid_is_nvml_formatted_and_deterministic_per_model_and_index() -> None:
    first = make_backend(FakeClock(), gpus=2, model="H200").devices()
    again = make_backend(FakeClock(), gpus=2, model="H200", seed=99).devices()
    other_model = make_backend(FakeClock(), gpus=1, model="A100").devices()
    pattern = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    assert re.fullmatch(pattern, first[0].info().uuid)
    assert first[0].info().uuid == again[0].info().uuid
    assert first[0].info().uuid != first[1].info().uuid
    assert first[0].info().uuid != other_model[0].info().uuid


@pytest.mark.parametrize(
    ("model", "name", "memory_bytes", "limits"),
    [
        ("H100", "NVIDIA H100 80GB HBM3", 80 * 2**30, (700, 700, 200, 700)),
        ("H200", "NVIDIA H200", 143771 * 2**20, (700, 700, 200, 700)),
        ("A100", "NVIDIA A100-SXM4-80GB", 80 * 2**30, (400, 400, 100, 400)),
    ],
)
def test_model_presets(model: str, name: str, memory_bytes: int, limits: tuple[float, ...]) -> None:
    gpu = make_backend(FakeClock(), gpus=1, model=model).devices()[0]
    assert gpu.info().name == name
    assert gpu.memory().total_bytes == memory_bytes
    got = gpu.power_limits()
    assert (got.enforced_watts, got.default_watts, got.min_watts, got.max_watts) == limits


# -- energy, power, temperature ---------------------------------------------------------


def test_energy_integrates_power_exactly_over_piecewise_periods(clock: FakeClock, gpu: SimulatedGpu) -> None:
    idle = GPU_MODELS["H100"].idle_watts
    start = gpu.energy_joules()
    clock.advance(10.0)
    gpu.begin_load(TRAIN, pid=4242)
    busy = gpu.operating_point(TRAIN).power_watts
    assert busy > idle + 300
    clock.advance(5.0)
    assert gpu.energy_joules() - start == pytest.approx(10.0 * idle + 5.0 * busy, rel=1e-12)

    # A cap change mid-run: the stretch before it is integrated at the old power.
    gpu.set_power_limit(400.0)
    capped = gpu.operating_point(TRAIN).power_watts
    assert capped == pytest.approx(400.0)
    clock.advance(3.0)
    gpu.end_load()
    clock.advance(2.0)
    expected = 10.0 * idle + 5.0 * busy + 3.0 * capped + 2.0 * idle
    assert gpu.energy_joules() - start == pytest.approx(expected, rel=1e-12)


def test_energy_counter_is_monotonic_while_noisy_readings_vary(clock: FakeClock, gpu: SimulatedGpu) -> None:
    gpu.begin_load(TRAIN)
    energies, powers = [], []
    for step in range(200):
        clock.advance(0.01 * (step % 3))  # includes zero-length steps
        powers.append(gpu.power_watts())
        energies.append(gpu.energy_joules())
    assert all(b >= a for a, b in zip(energies, energies[1:]))
    assert len(set(powers)) > 100  # the readings do carry noise
    true_power = gpu.true_power_watts()
    assert sum(powers) / len(powers) == pytest.approx(true_power, rel=0.01)
    assert all(abs(p - true_power) < 0.05 * true_power for p in powers)


def test_power_reading_never_negative(clock: FakeClock) -> None:
    gpu = make_backend(clock, gpus=1).devices()[0]
    assert min(gpu.power_watts() for _ in range(2000)) > 0.0


def test_temperature_follows_power_with_a_first_order_lag(clock: FakeClock, gpu: SimulatedGpu) -> None:
    model = GPU_MODELS["H100"]
    idle_target = model.ambient_celsius + model.idle_watts * model.thermal_resistance_kelvin_per_watt
    assert gpu.temperature_celsius() == pytest.approx(idle_target, abs=1.5)
    gpu.begin_load(TRAIN)
    busy_power = gpu.operating_point(TRAIN).power_watts
    busy_target = model.ambient_celsius + busy_power * model.thermal_resistance_kelvin_per_watt
    assert gpu.temperature_celsius() == pytest.approx(idle_target, abs=1.5)  # no jump
    clock.advance(model.thermal_time_constant_seconds)
    one_tau = idle_target + (busy_target - idle_target) * (1 - math.exp(-1))
    assert gpu.temperature_celsius() == pytest.approx(one_tau, abs=1.5)
    clock.advance(20 * model.thermal_time_constant_seconds)
    assert gpu.temperature_celsius() == pytest.approx(busy_target, abs=1.5)
    assert busy_target > idle_target + 20


# -- power caps and the energy optimum ---------------------------------------------------


def test_lower_cap_lowers_clock_and_power_and_throughput(clock: FakeClock, gpu: SimulatedGpu) -> None:
    gpu.begin_load(TRAIN, pid=1)
    full_point = gpu.operating_point(TRAIN)
    full_clock = gpu.clocks().sm_hertz
    assert full_clock == pytest.approx(GPU_MODELS["H100"].sm_max_hertz)
    assert "sw_power_cap" not in gpu.clock_events().active

    gpu.set_power_limit(400.0)
    capped_point = gpu.operating_point(TRAIN)
    assert gpu.clocks().sm_hertz == pytest.approx(capped_point.sm_hertz)
    assert capped_point.sm_hertz < 0.9 * full_clock
    assert capped_point.power_watts <= 400.0 + 1e-9
    assert capped_point.units_per_second < full_point.units_per_second
    assert gpu.clock_events().active == frozenset({"sw_power_cap"})
    readings = [gpu.power_watts() for _ in range(100)]
    assert sum(readings) / len(readings) == pytest.approx(400.0, rel=0.01)


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
@pytest.mark.parametrize("profile", sorted(WORKLOAD_PROFILES))
def test_every_cap_is_met_and_throughput_falls_with_the_cap(model: str, profile: str) -> None:
    gpu = make_backend(FakeClock(), gpus=1, model=model).devices()[0]
    points = [gpu.operating_point(WORKLOAD_PROFILES[profile], cap) for cap in caps_for(model)]
    for cap, point in zip(caps_for(model), points):
        assert point.power_watts <= cap + 1e-9
    for lower, higher in zip(points, points[1:]):
        assert lower.sm_hertz <= higher.sm_hertz
        assert lower.units_per_second <= higher.units_per_second
    assert points[0].units_per_second < points[-1].units_per_second


@pytest.mark.parametrize("model", ["H100", "H200"])
@pytest.mark.parametrize("profile", sorted(WORKLOAD_PROFILES))
def test_energy_per_unit_has_an_interior_optimum_within_ten_percent_slowdown(model: str, profile: str) -> None:
    gpu = make_backend(FakeClock(), gpus=1, model=model).devices()[0]
    workload = WORKLOAD_PROFILES[profile]
    caps = caps_for(model)
    points = {cap: gpu.operating_point(workload, cap) for cap in caps}
    reference = points[max(caps)].units_per_second

    # Brute force, independent of true_optimal_cap's code.
    eligible = [cap for cap in caps if points[cap].units_per_second >= 0.9 * reference]
    best_energy = min(points[cap].energy_per_unit_joules for cap in eligible)
    best = min(cap for cap in eligible if points[cap].energy_per_unit_joules == best_energy)

    assert min(caps) < best < max(caps)
    assert points[best].energy_per_unit_joules < 0.95 * points[max(caps)].energy_per_unit_joules
    assert "sw_power_cap" in points[best].clock_events
    assert gpu.true_optimal_cap(workload, caps) == best


def test_true_optimal_cap_respects_the_slowdown_bound_and_prefers_lower_cap_on_ties(gpu: SimulatedGpu) -> None:
    caps = caps_for("H100")
    strict = gpu.true_optimal_cap(TRAIN, caps, max_slowdown=0.02)
    loose = gpu.true_optimal_cap(TRAIN, caps, max_slowdown=0.10)
    assert loose < strict < 700.0
    # No slowdown allowed: every cap at or above the full-clock power ties; the lowest of them wins
    # (the rule's tie-break, docs/architecture.md): the lowest cap that costs nothing.
    full = gpu.operating_point(TRAIN, 700.0)
    tied = [cap for cap in caps if gpu.operating_point(TRAIN, cap) == full]
    assert len(tied) >= 2
    assert gpu.true_optimal_cap(TRAIN, caps, max_slowdown=0.0) == min(tied)


def test_operating_point_defaults_to_the_enforced_cap(gpu: SimulatedGpu) -> None:
    gpu.set_power_limit(350.0)
    assert gpu.operating_point(DECODE) == gpu.operating_point(DECODE, 350.0)
    assert gpu.operating_point(DECODE) != gpu.operating_point(DECODE, 700.0)


def test_measured_models_use_their_own_figures_and_others_scale(backend: SimulatedBackend) -> None:
    h100 = backend.devices()[0]
    h200 = make_backend(FakeClock(), gpus=1, model="H200").devices()[0]
    a100 = make_backend(FakeClock(), gpus=1, model="A100").devices()[0]
    assert h100.operating_point(DECODE).units_per_second == pytest.approx(104_269.5)
    assert h200.operating_point(DECODE).units_per_second == pytest.approx(109_637.9)
    # The A100 has no figures: the H100's calibration scaled by its compute and memory speed,
    # so memory-bound decode loses less to the A100's slower tensor cores than training does.
    decode = a100.operating_point(DECODE, 400.0).units_per_second / h100.operating_point(DECODE).units_per_second
    train = a100.operating_point(TRAIN, 400.0).units_per_second / h100.operating_point(TRAIN).units_per_second
    assert train < decode < 1.0
    assert a100.operating_point(TRAIN, 400.0).units_per_second < 0.5 * h100.operating_point(TRAIN).units_per_second


@pytest.mark.parametrize("watts", [199.0, 700.5, -1.0, float("nan")])
def test_set_power_limit_out_of_range_raises_and_keeps_the_limit(gpu: SimulatedGpu, watts: float) -> None:
    gpu.set_power_limit(500.0)
    with pytest.raises(InvalidArgument) as excinfo:
        gpu.set_power_limit(watts)
    message = str(excinfo.value)
    assert str(watts) in message and "200" in message and "700" in message
    assert gpu.power_limits().enforced_watts == 500.0


def test_set_power_limit_accepts_the_range_edges(gpu: SimulatedGpu) -> None:
    for watts in (200.0, 700.0, 431.5):
        gpu.set_power_limit(watts)
        limits = gpu.power_limits()
        assert limits.enforced_watts == watts
        assert limits.default_watts == 700.0


# -- live state -------------------------------------------------------------------------


def test_idle_gpu_reports_idle(gpu: SimulatedGpu) -> None:
    assert gpu.utilization().gpu_ratio == 0.0
    assert gpu.clock_events().active == frozenset({"gpu_idle"})
    assert gpu.clocks().sm_hertz == pytest.approx(345e6)
    assert gpu.compute_processes() == []
    assert gpu.memory().used_bytes == 0
    assert gpu.true_power_watts() == GPU_MODELS["H100"].idle_watts


def test_begin_load_lists_pid_and_drives_utilization_and_memory(gpu: SimulatedGpu) -> None:
    gpu.begin_load(DECODE, pid=4242)
    processes = gpu.compute_processes()
    assert [p.pid for p in processes] == [4242]
    assert processes[0].used_memory_bytes == DECODE.memory_bytes
    utilization = gpu.utilization()
    assert utilization.gpu_ratio == pytest.approx(DECODE.activity, abs=0.05)
    assert utilization.memory_ratio == pytest.approx(gpu.operating_point(DECODE).gpm.dram_active, abs=0.05)
    memory = gpu.memory()
    assert memory.used_bytes == BASE_MEMORY_BYTES + DECODE.memory_bytes
    assert memory.free_bytes == memory.total_bytes - memory.used_bytes
    assert "gpu_idle" not in gpu.clock_events().active
    assert set(gpu.clock_events().active) <= set(CLOCK_EVENT_REASONS)

    gpu.end_load()
    assert gpu.compute_processes() == []
    assert gpu.utilization().gpu_ratio == 0.0


def test_load_without_pid_lists_no_process(gpu: SimulatedGpu) -> None:
    gpu.begin_load(TRAIN)
    assert gpu.compute_processes() == []
    assert gpu.utilization().gpu_ratio > 0.8


def test_foreign_process_makes_the_gpu_look_busy(gpu: SimulatedGpu) -> None:
    gpu.add_foreign_process(777, 10 * 2**30)
    assert [p.pid for p in gpu.compute_processes()] == [777]
    assert gpu.utilization().gpu_ratio > 0.85
    assert gpu.true_power_watts() > GPU_MODELS["H100"].idle_watts + 200
    assert gpu.memory().used_bytes == BASE_MEMORY_BYTES + 10 * 2**30
    gpu.remove_foreign_process(777)
    assert gpu.compute_processes() == []
    assert gpu.utilization().gpu_ratio == 0.0


def test_pcie_traffic_is_higher_when_busy(gpu: SimulatedGpu) -> None:
    idle = gpu.pcie_throughput()
    gpu.begin_load(TRAIN)
    busy = gpu.pcie_throughput()
    assert busy.rx_bytes_per_second > 100 * idle.rx_bytes_per_second > 0
    assert busy.tx_bytes_per_second > 100 * idle.tx_bytes_per_second > 0


def test_seed_makes_readings_reproducible() -> None:
    def readings(seed: int, index: int = 0) -> list[float]:
        clock = FakeClock()
        gpu = make_backend(clock, gpus=2, seed=seed).devices()[index]
        gpu.begin_load(TRAIN)
        values = []
        for _ in range(5):
            clock.advance(1.0)
            values += [gpu.power_watts(), gpu.temperature_celsius(), gpu.utilization().gpu_ratio]
        return values

    assert readings(7) == readings(7)
    assert readings(7) != readings(8)
    assert readings(7, index=0) != readings(7, index=1)


# -- degrade ------------------------------------------------------------------------------


def test_degraded_gpu_is_slower_than_a_healthy_peer(clock: FakeClock) -> None:
    backend = make_backend(
        clock,
        gpus=3,
        degrade=[
            DegradeConfig(gpu=1, sm_clock_factor=0.85),
            DegradeConfig(gpu=2, memory_bandwidth_factor=0.7),
        ],
    )
    healthy, slow_sm, slow_memory = backend.devices()
    assert slow_sm.operating_point(TRAIN).units_per_second < 0.9 * healthy.operating_point(TRAIN).units_per_second
    assert slow_sm.clocks().sm_max_hertz == pytest.approx(0.85 * healthy.clocks().sm_max_hertz)
    # A memory-bound workload suffers more from slower memory than a compute-bound one.
    decode_loss = slow_memory.operating_point(DECODE).units_per_second / healthy.operating_point(DECODE).units_per_second
    train_loss = slow_memory.operating_point(TRAIN).units_per_second / healthy.operating_point(TRAIN).units_per_second
    assert decode_loss < train_loss < 1.0
    for gpu in backend.devices():
        gpu.begin_load(TRAIN)
    assert slow_sm.clocks().sm_hertz < healthy.clocks().sm_hertz


def test_thermal_throttle_shows_thermal_clock_events_when_busy(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=2, degrade=[DegradeConfig(gpu=0, thermal_throttle=True)])
    hot, peer = backend.devices()
    assert hot.clock_events().active == frozenset({"gpu_idle"})
    for gpu in (hot, peer):
        gpu.begin_load(TRAIN)
    assert {"hw_thermal_slowdown", "sw_thermal_slowdown"} <= hot.clock_events().active
    assert not {"hw_thermal_slowdown", "sw_thermal_slowdown"} & peer.clock_events().active
    assert hot.clocks().sm_hertz == pytest.approx(THERMAL_THROTTLE_CLOCK_FACTOR * peer.clocks().sm_hertz)
    clock.advance(600.0)
    assert hot.temperature_celsius() > peer.temperature_celsius() + 5


# -- faults -------------------------------------------------------------------------------


ERROR_FOR_KIND = {
    "not_supported": NotSupported,
    "no_permission": NoPermission,
    "gpu_lost": GpuLost,
    "unknown": UnknownDeviceError,
    "timeout": DeviceTimeout,
}


@pytest.mark.parametrize("kind", sorted(ERROR_FOR_KIND))
def test_fault_raises_only_for_matching_gpu_and_call_within_its_window(clock: FakeClock, kind: str) -> None:
    fault = FaultConfig(gpu=1, call="power_watts", kind=kind, after_seconds=5.0, duration_seconds=10.0)
    backend = make_backend(clock, gpus=2, faults=[fault])
    healthy, faulty = backend.devices()

    clock.advance(4.9)
    faulty.power_watts()  # not yet
    clock.advance(0.1)
    with pytest.raises(ERROR_FOR_KIND[kind]):
        faulty.power_watts()
    faulty.clocks()  # other calls are fine
    healthy.power_watts()  # other GPUs are fine
    clock.advance(9.9)
    with pytest.raises(ERROR_FOR_KIND[kind]):
        faulty.power_watts()
    clock.advance(0.1)
    faulty.power_watts()  # over


@pytest.mark.parametrize("call", DEVICE_CALLS)
def test_every_device_call_checks_faults(clock: FakeClock, call: str) -> None:
    backend = make_backend(clock, gpus=1, faults=[FaultConfig(gpu=0, call=call, kind="unknown")])
    with pytest.raises(UnknownDeviceError):
        getattr(backend.devices()[0], call)()


def test_set_power_limit_fault_leaves_the_limit(clock: FakeClock, gpu: SimulatedGpu) -> None:
    gpu.inject(FaultConfig(call="set_power_limit", kind="no_permission"))
    with pytest.raises(NoPermission):
        gpu.set_power_limit(300.0)
    assert gpu.power_limits().enforced_watts == 700.0


def test_timeout_fault_sleeps_its_delay_before_raising(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=1, faults=[FaultConfig(call="energy_joules", kind="timeout", delay_seconds=3.0)])
    with pytest.raises(DeviceTimeout):
        backend.devices()[0].energy_joules()
    assert clock.slept == [3.0]


def test_slow_fault_sleeps_its_delay_then_answers(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=1, faults=[FaultConfig(call="clocks", kind="slow", delay_seconds=1.5)])
    gpu = backend.devices()[0]
    assert gpu.clocks().sm_hertz == pytest.approx(345e6)
    assert clock.slept == [1.5]
    gpu.memory()
    assert clock.slept == [1.5]


def test_a_slow_call_holds_the_library_until_it_counts_as_hung(clock: FakeClock) -> None:
    """As on NVML: one caller in the library at a time, so a slow call on GPU 0 holds GPU 1's
    reads, but only until the call timeout; then GPU 0 gets no calls until its slow one returns."""
    released = threading.Event()
    backend = SimulatedBackend(
        SimulationConfig(gpus=2, seed=1, faults=[FaultConfig(gpu=0, call="power_watts", kind="slow")]),
        clock=clock, sleep=lambda seconds: released.wait(10.0), call_timeout_seconds=0.3,
    )
    gpu0, gpu1 = backend.devices()
    slow = threading.Thread(target=gpu0.power_watts)
    slow.start()
    time.sleep(0.05)
    start = time.monotonic()
    gpu1.memory()
    assert 0.2 <= time.monotonic() - start < 1.5  # held until the slow call was set aside
    with pytest.raises(DeviceTimeout, match="power_watts has not returned"):
        gpu0.memory()  # the hung GPU's next call is refused at once
    start = time.monotonic()
    gpu1.memory()
    assert time.monotonic() - start < 0.2  # the rest of the node goes on
    released.set()
    slow.join(5.0)
    gpu0.memory()  # back once the slow call returned
    stats = backend.library.gate.stats()
    assert stats.set_aside == 1 and stats.refused == 1 and stats.max_inside == 2
    assert backend.library.entries.concurrent_entries == 2  # GPU 1's two reads beside the stuck call


def test_threads_enter_the_simulated_library_one_at_a_time(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=4)

    def read(gpu: Device) -> None:
        for _ in range(200):
            for call in DEVICE_CALLS:
                try:
                    getattr(gpu, call)()
                except DeviceError:
                    pass

    threads = [threading.Thread(target=read, args=(gpu,)) for gpu in backend.devices() for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = backend.library.entries
    assert entries.entries >= 8 * 200 and entries.concurrent_entries == 0 and entries.max_inside == 1


def test_entry_counter_sees_two_threads_without_the_gate() -> None:
    """The counter the tests rely on does count a concurrent entry (it can fail)."""
    from gpuperfd.device.serial import EntryCounter

    counter, inside = EntryCounter(), threading.Barrier(2)
    threads = [threading.Thread(target=counter.run, args=(inside.wait,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.concurrent_entries == 1 and counter.max_inside == 2


def test_wildcard_fault_hits_every_gpu_and_call(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=2, faults=[FaultConfig(kind="not_supported")])
    for gpu in backend.devices():
        for call in DEVICE_CALLS:
            with pytest.raises(NotSupported):
                getattr(gpu, call)()
        with pytest.raises(NotSupported):
            gpu.set_power_limit(500.0)


def test_lost_gpu_comes_back_when_the_fault_ends(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=1, faults=[FaultConfig(kind="gpu_lost", after_seconds=1.0, duration_seconds=30.0)])
    gpu = backend.devices()[0]
    gpu.begin_load(TRAIN, pid=9)
    before = gpu.energy_joules()
    clock.advance(2.0)
    for call in DEVICE_CALLS:
        with pytest.raises(GpuLost):
            getattr(gpu, call)()
    clock.advance(29.0)
    assert gpu.info().name == "NVIDIA H100 80GB HBM3"
    assert gpu.energy_joules() > before
    assert [p.pid for p in gpu.compute_processes()] == [9]


def test_runtime_inject_and_clear_faults(clock: FakeClock, backend: SimulatedBackend) -> None:
    first, second = backend.devices()
    second.inject(FaultConfig(gpu=0, kind="gpu_lost"))  # the GPU's inject aims at itself
    first.power_watts()
    with pytest.raises(GpuLost):
        second.power_watts()
    backend.inject(FaultConfig(gpu="*", call="memory", kind="no_permission"))
    second.clear_faults()  # removes the GPU's own fault, not the "*" one
    second.power_watts()
    with pytest.raises(NoPermission):
        second.memory()
    backend.clear_faults()
    first.memory()
    second.memory()


# -- XID and ECC ------------------------------------------------------------------------


def test_xid_events_come_due_once_per_repeat(clock: FakeClock) -> None:
    backend = make_backend(clock, gpus=2, xid_events=[XidConfig(gpu=1, xid=79, after_seconds=5.0, repeat=3)])
    assert backend.wait_xid_events(1.0) == []
    assert sum(clock.slept) == pytest.approx(1.0)
    assert max(clock.slept) <= 0.1 + 1e-9  # sleeps in small steps
    clock.advance(7.0)  # read 2 s after the events fell due
    events = backend.wait_xid_events(1.0)
    assert [(e.gpu_index, e.xid) for e in events] == [(1, 79)] * 3
    # Wall-clock timestamps of when they fell due, as the NVML backend reports them.
    assert all(e.timestamp == pytest.approx(time.time() - 2.0, abs=5.0) for e in events)
    assert backend.wait_xid_events(0.5) == []


def test_wait_xid_events_returns_early_when_an_event_falls_due() -> None:
    clock = FakeClock(sleep_advances=True)
    backend = make_backend(clock, gpus=1, xid_events=[XidConfig(gpu=0, xid=48, after_seconds=0.35)])
    events = backend.wait_xid_events(10.0)
    assert [(e.gpu_index, e.xid) for e in events] == [(0, 48)]
    assert sum(clock.slept) == pytest.approx(0.35, abs=0.01)


def test_injected_xid_is_returned_once_without_sleeping(clock: FakeClock, backend: SimulatedBackend) -> None:
    backend.inject_xid(0, 31)
    assert [(e.gpu_index, e.xid) for e in backend.wait_xid_events(5.0)] == [(0, 31)]
    assert clock.slept == []
    assert backend.wait_xid_events(0.0) == []


def test_ecc_counters_grow_when_injections_fall_due(clock: FakeClock) -> None:
    backend = make_backend(
        clock,
        gpus=2,
        ecc_errors=[
            EccInjectConfig(gpu=0, corrected=5, uncorrected=1, after_seconds=10.0),
            EccInjectConfig(gpu=0, corrected=2, after_seconds=20.0),
        ],
    )
    gpu, peer = backend.devices()
    assert (gpu.ecc_errors().corrected_total, gpu.ecc_errors().uncorrected_total) == (0, 0)
    clock.advance(10.0)
    assert (gpu.ecc_errors().corrected_total, gpu.ecc_errors().uncorrected_total) == (5, 1)
    clock.advance(10.0)
    assert (gpu.ecc_errors().corrected_total, gpu.ecc_errors().uncorrected_total) == (7, 1)
    gpu.inject_ecc(uncorrected=2)
    assert (gpu.ecc_errors().corrected_total, gpu.ecc_errors().uncorrected_total) == (7, 3)
    assert (peer.ecc_errors().corrected_total, peer.ecc_errors().uncorrected_total) == (0, 0)


def test_close_is_idempotent(backend: SimulatedBackend) -> None:
    backend.close()
    backend.close()
