"""Tests for gpuperfd.device.nvml against an autospecced pynvml (no GPU needed).

Every pynvml function the module uses is replaced, on the very module object that
gpuperfd.device.nvml imports, with ``patch.object(..., autospec=True)``: a call with the
wrong arguments fails the test. Return values are real pynvml ctypes structs and real
``pynvml.NVMLError`` instances where the real library would produce them.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from unittest import mock

import pytest

from gpuperfd.device import nvml as nvml_module
from gpuperfd.device.base import CLOCK_EVENT_REASONS, ComputeProcess, GpuInfo
from gpuperfd.device.errors import (
    DeviceError,
    DeviceTimeout,
    DriverNotFound,
    GpuLost,
    InvalidArgument,
    NoPermission,
    NotSupported,
    UnknownDeviceError,
)
from gpuperfd.device.nvml import NvmlBackend, NvmlDevice, _translate
from nvml_fakes import backend, gpu, handle_at, nvml_error  # noqa: F401  (backend, gpu: fixtures)

pynvml = nvml_module.pynvml

#: Every pynvml function gpuperfd.device.nvml calls.
NVML_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)

GIB = 1024**3


HANDLE_ADDRESSES = (0x7F00_0000_1000, 0x7F00_0000_2000)


@pytest.fixture
def nvml() -> Iterator[SimpleNamespace]:
    """Autospecced pynvml functions with a healthy two-GPU node as the default."""
    with mock.patch.multiple(pynvml, **{name: mock.DEFAULT for name in NVML_FUNCTIONS}, autospec=True) as mocks:
        fake = SimpleNamespace(**mocks)
        fake.nvmlDeviceGetCount.return_value = 2
        fake.nvmlDeviceGetHandleByIndex.side_effect = lambda index: handle_at(HANDLE_ADDRESSES[index])
        fake.nvmlSystemGetDriverVersion.return_value = "580.159.04"
        fake.nvmlEventSetCreate.return_value = pynvml.c_nvmlEventSet_t()
        yield fake


def address_of(handle: object) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


# --- unit conversions -------------------------------------------------------------


def test_power_milliwatts_to_watts(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetPowerUsage.return_value = 345_678
    assert gpu.power_watts() == pytest.approx(345.678)
    assert address_of(nvml.nvmlDeviceGetPowerUsage.call_args.args[0]) == HANDLE_ADDRESSES[0]


def test_energy_millijoules_to_joules(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetTotalEnergyConsumption.return_value = 123_456_789
    assert gpu.energy_joules() == pytest.approx(123_456.789)


def test_memory_bytes_pass_through(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    # H200: 143771 MiB total, as nvidia-smi shows it; NVML reports bytes.
    total = 143_771 * 1024 * 1024
    info = pynvml.c_nvmlMemory_t(total=total, free=total - 7 * GIB, used=7 * GIB)
    nvml.nvmlDeviceGetMemoryInfo.return_value = info
    usage = gpu.memory()
    assert (usage.total_bytes, usage.used_bytes, usage.free_bytes) == (total, 7 * GIB, total - 7 * GIB)


def test_utilization_percent_to_ratio(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetUtilizationRates.return_value = pynvml.c_nvmlUtilization_t(gpu=87, memory=42)
    util = gpu.utilization()
    assert util.gpu_ratio == pytest.approx(0.87)
    assert util.memory_ratio == pytest.approx(0.42)


def test_temperature_reads_gpu_sensor(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetTemperature.return_value = 38
    assert gpu.temperature_celsius() == 38.0
    assert nvml.nvmlDeviceGetTemperature.call_args.args[1] == pynvml.NVML_TEMPERATURE_GPU


def test_clocks_megahertz_to_hertz(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    current = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201, pynvml.NVML_CLOCK_GRAPHICS: 1975}
    maximum = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}
    nvml.nvmlDeviceGetClockInfo.side_effect = lambda handle, clock: current[clock]
    nvml.nvmlDeviceGetMaxClockInfo.side_effect = lambda handle, clock: maximum[clock]
    clocks = gpu.clocks()
    assert clocks.sm_hertz == pytest.approx(1.98e9)
    assert clocks.memory_hertz == pytest.approx(3.201e9)
    assert clocks.graphics_hertz is None  # not read: no series uses it
    assert clocks.sm_max_hertz == pytest.approx(1.98e9)
    assert clocks.memory_max_hertz == pytest.approx(3.201e9)


def test_max_clocks_are_read_once(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    """Max clocks are board constants and cost ~2.7 ms a call on an H200: cached after the first read."""
    nvml.nvmlDeviceGetClockInfo.return_value = 1500
    nvml.nvmlDeviceGetMaxClockInfo.return_value = 1980
    for _ in range(3):
        assert gpu.clocks().sm_max_hertz == pytest.approx(1.98e9)
    assert nvml.nvmlDeviceGetMaxClockInfo.call_count == 2  # SM and memory, once each
    assert nvml.nvmlDeviceGetClockInfo.call_count == 6


def test_max_clocks_are_optional(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetClockInfo.return_value = 1500
    nvml.nvmlDeviceGetMaxClockInfo.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    clocks = gpu.clocks()
    assert clocks.sm_hertz == pytest.approx(1.5e9)
    assert clocks.sm_max_hertz is None and clocks.memory_max_hertz is None


def test_pcie_kilobytes_to_bytes(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    rates = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 250}
    nvml.nvmlDeviceGetPcieThroughput.side_effect = lambda handle, counter: rates[counter]
    pcie = gpu.pcie_throughput()
    assert pcie.tx_bytes_per_second == 1_024_000
    assert pcie.rx_bytes_per_second == 256_000


def test_power_limits_milliwatts_to_watts(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetEnforcedPowerLimit.return_value = 650_000
    nvml.nvmlDeviceGetPowerManagementDefaultLimit.return_value = 700_000
    nvml.nvmlDeviceGetPowerManagementLimitConstraints.return_value = [200_000, 700_000]
    limits = gpu.power_limits()
    assert (limits.enforced_watts, limits.default_watts, limits.min_watts, limits.max_watts) == (
        650.0,
        700.0,
        200.0,
        700.0,
    )


def test_ecc_reads_volatile_corrected_and_uncorrected(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    counts = {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 12, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 3}

    def total_ecc(handle: object, error_type: int, counter_type: int) -> int:
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        return counts[error_type]

    nvml.nvmlDeviceGetTotalEccErrors.side_effect = total_ecc
    ecc = gpu.ecc_errors()
    assert (ecc.corrected_total, ecc.uncorrected_total) == (12, 3)


def test_compute_processes_memory_may_be_unknown(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    known = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v3_t(pid=4242, usedGpuMemory=3 * GIB))
    unknown = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v3_t(pid=77))
    unknown.usedGpuMemory = None  # what pynvml does for NVML_VALUE_NOT_AVAILABLE
    nvml.nvmlDeviceGetComputeRunningProcesses.return_value = [known, unknown]
    assert gpu.compute_processes() == [ComputeProcess(4242, 3 * GIB), ComputeProcess(77, None)]


# --- info -------------------------------------------------------------------------


def _set_identity(nvml: SimpleNamespace) -> None:
    nvml.nvmlDeviceGetUUID.return_value = "GPU-4516fb7b-9b9a-85d6-b227-90754327831b"
    nvml.nvmlDeviceGetName.return_value = "NVIDIA H200"
    nvml.nvmlDeviceGetMemoryInfo.return_value = pynvml.c_nvmlMemory_t(total=141 * GIB, free=140 * GIB, used=GIB)
    nvml.nvmlDeviceGetPciInfo.return_value = pynvml.nvmlPciInfo_t(busId=b"00000000:19:00.0")
    nvml.nvmlDeviceGetCudaComputeCapability.return_value = (9, 0)
    nvml.nvmlDeviceGetSerial.return_value = "1654123456789"


def test_info_fields(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    _set_identity(nvml)
    assert gpu.info() == GpuInfo(
        index=0,
        uuid="GPU-4516fb7b-9b9a-85d6-b227-90754327831b",
        name="NVIDIA H200",
        pci_bus_id="00000000:19:00.0",
        driver_version="580.159.04",
        compute_capability="9.0",
        memory_total_bytes=141 * GIB,
        backend="nvml",
        serial="1654123456789",
    )


def test_info_is_cached(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    _set_identity(nvml)
    first = gpu.info()
    nvml.nvmlDeviceGetName.return_value = "something else"
    assert gpu.info() is first
    assert nvml.nvmlDeviceGetName.call_count == 1
    assert nvml.nvmlDeviceGetUUID.call_count == 1


def test_info_optional_fields_empty_when_unsupported(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    _set_identity(nvml)
    nvml.nvmlDeviceGetSerial.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    nvml.nvmlDeviceGetCudaComputeCapability.side_effect = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    info = gpu.info()
    assert info.serial == "" and info.compute_capability == ""
    assert info.name == "NVIDIA H200"


def test_info_required_field_error_propagates(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    _set_identity(nvml)
    nvml.nvmlDeviceGetUUID.side_effect = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuLost):
        gpu.info()


# --- error mapping ----------------------------------------------------------------

ERROR_MAP = [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, NotSupported),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, NotSupported),
    (pynvml.NVML_ERROR_NO_PERMISSION, NoPermission),
    (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost),
    (pynvml.NVML_ERROR_GPU_NOT_FOUND, GpuLost),
    (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost),
    (pynvml.NVML_ERROR_TIMEOUT, DeviceTimeout),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, InvalidArgument),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, DriverNotFound),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, DriverNotFound),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, DriverNotFound),
    (pynvml.NVML_ERROR_UNINITIALIZED, UnknownDeviceError),
    (pynvml.NVML_ERROR_CORRUPTED_INFOROM, UnknownDeviceError),
    (pynvml.NVML_ERROR_UNKNOWN, UnknownDeviceError),
]


@pytest.mark.parametrize(("code", "expected"), ERROR_MAP)
def test_translate_maps_each_code(code: int, expected: type[DeviceError]) -> None:
    translated = _translate(nvml_error(code), "GPU 3: nvmlDeviceGetPowerUsage")
    assert type(translated) is expected
    assert "GPU 3: nvmlDeviceGetPowerUsage" in str(translated)
    assert f"NVML error {code}" in str(translated)


@pytest.mark.parametrize(("code", "expected"), ERROR_MAP)
def test_getter_raises_project_error_not_pynvml(
    nvml: SimpleNamespace, gpu: NvmlDevice, code: int, expected: type[DeviceError]
) -> None:
    original = nvml_error(code)
    nvml.nvmlDeviceGetPowerUsage.side_effect = original
    with pytest.raises(expected) as caught:
        gpu.power_watts()
    assert type(caught.value) is expected
    assert not isinstance(caught.value, pynvml.NVMLError)
    assert caught.value.__cause__ is original


def test_unknown_error_keeps_nvml_text() -> None:
    message = str(_translate(nvml_error(pynvml.NVML_ERROR_CORRUPTED_INFOROM), "GPU 1: x"))
    assert "Corrupted infoROM" in message


# --- NotSupported is checked once -------------------------------------------------


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
def test_not_supported_is_cached(
    nvml: SimpleNamespace, backend: NvmlBackend, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    gpu0, gpu1 = backend.devices()
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = nvml_error(code)
    with caplog.at_level(logging.DEBUG, logger=nvml_module.__name__):
        for _ in range(3):
            with pytest.raises(NotSupported):
                gpu0.energy_joules()
    assert nvml.nvmlDeviceGetTotalEnergyConsumption.call_count == 1
    assert len([r for r in caplog.records if "energy" in r.getMessage()]) == 1
    # The cache is per GPU: the other GPU still asks NVML.
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = None
    nvml.nvmlDeviceGetTotalEnergyConsumption.return_value = 5_000
    assert gpu1.energy_joules() == 5.0
    assert nvml.nvmlDeviceGetTotalEnergyConsumption.call_count == 2
    # ... and per field: another getter on the same GPU is unaffected.
    nvml.nvmlDeviceGetPowerUsage.return_value = 100_000
    assert gpu0.power_watts() == 100.0


def test_other_errors_are_not_cached(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetPowerUsage.side_effect = [nvml_error(pynvml.NVML_ERROR_TIMEOUT), 80_000]
    with pytest.raises(DeviceTimeout):
        gpu.power_watts()
    assert gpu.power_watts() == 80.0
    assert nvml.nvmlDeviceGetPowerUsage.call_count == 2


# --- set_power_limit --------------------------------------------------------------


@pytest.fixture
def constrained(nvml: SimpleNamespace) -> SimpleNamespace:
    nvml.nvmlDeviceGetPowerManagementLimitConstraints.return_value = [200_000, 700_000]
    return nvml


@pytest.mark.parametrize("watts", [199.9, 700.5, 0.0, -5.0, 1e6])
def test_set_power_limit_rejects_out_of_range(
    constrained: SimpleNamespace, gpu: NvmlDevice, watts: float
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        gpu.set_power_limit(watts)
    message = str(caught.value)
    assert f"{watts:g}" in message and "200" in message and "700" in message
    constrained.nvmlDeviceSetPowerManagementLimit.assert_not_called()


@pytest.mark.parametrize("watts", [math.nan, math.inf])
def test_set_power_limit_rejects_non_finite(
    constrained: SimpleNamespace, gpu: NvmlDevice, watts: float
) -> None:
    with pytest.raises(InvalidArgument):
        gpu.set_power_limit(watts)
    constrained.nvmlDeviceSetPowerManagementLimit.assert_not_called()


@pytest.mark.parametrize(
    ("watts", "milliwatts"), [(350.4, 350_400), (250.0006, 250_001), (200, 200_000), (700.0, 700_000)]
)
def test_set_power_limit_sends_whole_milliwatts(
    constrained: SimpleNamespace, gpu: NvmlDevice, watts: float, milliwatts: int
) -> None:
    gpu.set_power_limit(watts)
    constrained.nvmlDeviceSetPowerManagementLimit.assert_called_once()
    handle, sent = constrained.nvmlDeviceSetPowerManagementLimit.call_args.args
    assert address_of(handle) == HANDLE_ADDRESSES[0]
    assert sent == milliwatts and type(sent) is int


def test_set_power_limit_without_root(constrained: SimpleNamespace, gpu: NvmlDevice) -> None:
    constrained.nvmlDeviceSetPowerManagementLimit.side_effect = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NoPermission, match="root"):
        gpu.set_power_limit(300)


# --- clock events -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("bit", "name"),
    [
        (0x1, "gpu_idle"),
        (0x2, "applications_clocks_setting"),
        (0x4, "sw_power_cap"),
        (0x8, "hw_slowdown"),
        (0x10, "sync_boost"),
        (0x20, "sw_thermal_slowdown"),
        (0x40, "hw_thermal_slowdown"),
        (0x80, "hw_power_brake_slowdown"),
        (0x100, "display_clock_setting"),
    ],
)
def test_each_clock_event_bit(nvml: SimpleNamespace, gpu: NvmlDevice, bit: int, name: str) -> None:
    nvml.nvmlDeviceGetCurrentClocksEventReasons.return_value = bit
    assert gpu.clock_events().active == frozenset({name})


def test_clock_event_mask_combines_and_ignores_unknown_bits(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetCurrentClocksEventReasons.return_value = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown | 0x8000
    )
    assert gpu.clock_events().active == frozenset({"sw_power_cap", "hw_thermal_slowdown"})
    nvml.nvmlDeviceGetCurrentClocksEventReasons.return_value = 0
    assert gpu.clock_events().active == frozenset()
    nvml.nvmlDeviceGetCurrentClocksEventReasons.return_value = 0x1FF
    assert gpu.clock_events().active == frozenset(CLOCK_EVENT_REASONS)


def test_clock_events_fall_back_to_throttle_reasons(
    nvml: SimpleNamespace, gpu: NvmlDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons.return_value = 0x20
    assert gpu.clock_events().active == frozenset({"sw_thermal_slowdown"})
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons.assert_called_once()


# --- init, driver, devices, close -------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
        nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
        OSError("libnvidia-ml.so.1: cannot open shared object file"),
    ],
    ids=["library_not_found", "driver_not_loaded", "oserror"],
)
def test_missing_driver_raises_driver_not_found(nvml: SimpleNamespace, failure: Exception) -> None:
    nvml.nvmlInit.side_effect = failure
    backend = NvmlBackend()
    with pytest.raises(DriverNotFound) as caught:
        backend.devices()
    message = str(caught.value)
    assert "no NVIDIA driver found" in message
    assert "gpuperfd run --simulate N" in message and "--device cpu" in message and "sweep --simulate N" in message
    assert "probe PROBE --simulate N" in message
    assert str(failure) in message  # names the underlying error
    backend.close()
    nvml.nvmlShutdown.assert_not_called()


def test_init_is_lazy_and_once(nvml: SimpleNamespace) -> None:
    backend = NvmlBackend()
    nvml.nvmlInit.assert_not_called()
    backend.devices()
    backend.driver_version()
    backend.devices()
    nvml.nvmlInit.assert_called_once_with()
    backend.close()


def test_driver_version(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    assert backend.driver_version() == "580.159.04"
    assert backend.driver_version() == "580.159.04"
    nvml.nvmlSystemGetDriverVersion.assert_called_once_with()
    assert backend.name == "nvml"


def test_devices_all_and_selected(nvml: SimpleNamespace) -> None:
    every = NvmlBackend()
    assert [d.index for d in every.devices()] == [0, 1]
    assert every.devices()[1] is every.devices()[1]  # same objects: caches survive
    every.close()
    nvml.nvmlDeviceGetHandleByIndex.reset_mock()
    selected = NvmlBackend(indices=[1])
    (only,) = selected.devices()
    assert only.index == 1
    nvml.nvmlDeviceGetHandleByIndex.assert_called_once_with(1)
    selected.close()


def test_selecting_a_missing_gpu_is_an_error(nvml: SimpleNamespace) -> None:
    backend = NvmlBackend(indices=[0, 5])
    with pytest.raises(InvalidArgument, match="5"):
        backend.devices()
    backend.close()


def test_close_is_idempotent(nvml: SimpleNamespace) -> None:
    backend = NvmlBackend()
    backend.close()  # never initialized: nothing to shut down
    nvml.nvmlShutdown.assert_not_called()
    backend.devices()
    backend.close()
    backend.close()
    nvml.nvmlShutdown.assert_called_once_with()


# --- XID events -------------------------------------------------------------------


def xid_event(address: int, xid: int) -> pynvml.c_nvmlEventData_t:
    data = pynvml.c_nvmlEventData_t()
    data.device = handle_at(address)  # a new pointer object, as NVML hands back
    data.eventType = pynvml.nvmlEventTypeXidCriticalError
    data.eventData = xid
    return data


def test_xid_wait_returns_events(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    timeout = nvml_error(pynvml.NVML_ERROR_TIMEOUT)
    nvml.nvmlEventSetWait_v2.side_effect = [
        xid_event(HANDLE_ADDRESSES[1], 79),
        xid_event(HANDLE_ADDRESSES[0], 48),
        timeout,
    ]
    events = backend.wait_xid_events(1.5)
    assert [(e.gpu_index, e.xid) for e in events] == [(1, 79), (0, 48)]
    assert all(e.timestamp > 0 for e in events)
    timeouts = [c.args[1] for c in nvml.nvmlEventSetWait_v2.call_args_list]
    assert timeouts == [0, 0, 0]  # polled, never blocking inside NVML; drains what is queued
    nvml.nvmlDeviceGetIndex.assert_not_called()  # mapped by handle, no NVML call
    registered = nvml.nvmlDeviceRegisterEvents.call_args_list
    assert [(address_of(c.args[0]), c.args[1]) for c in registered] == [
        (HANDLE_ADDRESSES[0], pynvml.nvmlEventTypeXidCriticalError),
        (HANDLE_ADDRESSES[1], pynvml.nvmlEventTypeXidCriticalError),
    ]


def test_xid_wait_timeout_is_no_events(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    nvml.nvmlEventSetWait_v2.side_effect = nvml_error(pynvml.NVML_ERROR_TIMEOUT)
    start = time.monotonic()
    assert backend.wait_xid_events(0.6) == []
    waited = time.monotonic() - start
    # Polled every XID_POLL_SECONDS with a zero timeout (the blocking wait would hold the gate).
    assert 0.6 <= waited < 1.5
    calls = [c.args[1] for c in nvml.nvmlEventSetWait_v2.call_args_list]
    assert set(calls) == {0} and 2 <= len(calls) <= 0.6 / nvml_module.XID_POLL_SECONDS + 2


def test_xid_poll_leaves_nvml_free_between_polls(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    """While the XID watcher waits, other threads' calls are not held up by it."""
    nvml.nvmlEventSetWait_v2.side_effect = nvml_error(pynvml.NVML_ERROR_TIMEOUT)
    nvml.nvmlDeviceGetPowerUsage.return_value = 1000
    gpu = backend.devices()[0]
    watcher = threading.Thread(target=backend.wait_xid_events, args=(1.0,))
    watcher.start()
    time.sleep(0.1)
    start = time.monotonic()
    for _ in range(20):
        gpu.power_watts()
    assert time.monotonic() - start < 0.2
    watcher.join()


def test_xid_registration_is_lazy_and_remembers_unsupported(
    nvml: SimpleNamespace, backend: NvmlBackend
) -> None:
    backend.devices()
    nvml.nvmlEventSetCreate.assert_not_called()

    def register(handle: object, event_types: int, event_set: object) -> None:
        if address_of(handle) == HANDLE_ADDRESSES[0]:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvml.nvmlDeviceRegisterEvents.side_effect = register
    nvml.nvmlEventSetWait_v2.side_effect = nvml_error(pynvml.NVML_ERROR_TIMEOUT)
    backend.wait_xid_events(0.01)
    backend.wait_xid_events(0.01)
    assert nvml.nvmlDeviceRegisterEvents.call_count == 2  # once per GPU, not per wait
    nvml.nvmlEventSetCreate.assert_called_once_with()


def test_xid_not_supported_anywhere(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    nvml.nvmlDeviceRegisterEvents.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        backend.wait_xid_events(0.01)
    nvml.nvmlEventSetWait_v2.assert_not_called()


def test_xid_wait_error_is_translated(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    nvml.nvmlEventSetWait_v2.side_effect = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuLost):
        backend.wait_xid_events(0.01)


def test_close_frees_event_set(nvml: SimpleNamespace) -> None:
    backend = NvmlBackend()
    nvml.nvmlEventSetWait_v2.side_effect = nvml_error(pynvml.NVML_ERROR_TIMEOUT)
    backend.wait_xid_events(0.01)
    backend.close()
    nvml.nvmlEventSetFree.assert_called_once()
    nvml.nvmlShutdown.assert_called_once_with()


def test_autospec_rejects_wrong_call_signature(nvml: SimpleNamespace) -> None:
    # Guard for the fixture itself: the mocks really check signatures.
    with pytest.raises(TypeError):
        pynvml.nvmlDeviceGetPowerUsage()
