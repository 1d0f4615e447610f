"""NVML deeper telemetry (GPM, field values, remapping, violations, NVLink, MIG) against an autospecced pynvml.

As in test_nvml.py, every pynvml function is patched with ``autospec=True`` on the module object
gpuperfd.device.nvml imports, and return values are real pynvml ctypes structs.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from gpuperfd.device import nvml as nvml_module
from gpuperfd.device.base import GPM_FIELDS, PcieLink
from gpuperfd.device.errors import GpuLost, NoPermission, NotSupported
from gpuperfd.device.nvml import GPM_METRICS, NvmlBackend, NvmlDevice
from nvml_fakes import backend, gpu, handle_at, nvml_error  # noqa: F401  (backend, gpu: fixtures)

pynvml = nvml_module.pynvml

FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetMemoryInfo",
)
MIB = 1 << 20

#: What the H200 of the issue measured during a bf16 matmul loop (percent), plus rates in MiB/s.
H200_GPM = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 95.7,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 14.1,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 92.9,
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 92.9,
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.0,
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 16.9,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 1.5,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 3.0,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.0,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 10.0,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 20.0,
}  # NVLink metrics: not in the dict -> NOT_SUPPORTED per metric, as on the VM of the issue


def address(pointer: object) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


def field_value(field_id: int, value: float | None, value_type: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT):
    """One c_nvmlFieldValue_t as NVML fills it; value None: NOT_SUPPORTED for that entry."""
    out = pynvml.c_nvmlFieldValue_t()
    out.fieldId = field_id
    out.valueType = value_type
    if value is None:
        out.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    elif value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
        out.value.dVal = value
    elif value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        out.value.ullVal = int(value)
    else:
        out.value.uiVal = int(value)
    return out


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    monkeypatch.setattr(nvml_module, "GPM_FIRST_INTERVAL_SECONDS", 0.0)
    with mock.patch.multiple(pynvml, **{name: mock.DEFAULT for name in FUNCTIONS}, autospec=True) as mocks:
        fake = SimpleNamespace(**mocks)
        fake.nvmlDeviceGetCount.return_value = 1
        fake.nvmlDeviceGetHandleByIndex.side_effect = lambda index: handle_at(0x7F00_0000_1000)
        fake.nvmlSystemGetDriverVersion.return_value = "580.159.04"
        fake.allocated = []
        fake.freed = []

        def alloc():  # a distinct opaque pointer per sample, as NVML returns
            sample = ctypes.cast(ctypes.c_void_p(0x5000 + 0x10 * len(fake.allocated)), pynvml.c_nvmlGpmSample_t)
            fake.allocated.append(sample)
            return sample

        fake.nvmlGpmSampleAlloc.side_effect = alloc
        fake.nvmlGpmSampleFree.side_effect = lambda sample: fake.freed.append(sample)
        fake.nvmlGpmSampleGet.side_effect = lambda handle, sample: sample
        fake.nvmlGpmMigSampleGet.side_effect = lambda handle, gi, sample: sample
        fake.nvmlGpmQueryDeviceSupport.return_value = pynvml.c_nvmlGpmSupport_t(version=1, isSupportedDevice=1)
        fake.gpm_values = dict(H200_GPM)
        fake.metric_requests = []

        def metrics_get(request):
            fake.metric_requests.append(
                (request.sample1, request.sample2, [request.metrics[i].metricId for i in range(request.numMetrics)])
            )
            for i in range(request.numMetrics):
                metric = request.metrics[i]
                if metric.metricId in fake.gpm_values:
                    metric.value = fake.gpm_values[metric.metricId]
                    metric.nvmlReturn = pynvml.NVML_SUCCESS
                else:
                    metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return request

        fake.nvmlGpmMetricsGet.side_effect = metrics_get
        yield fake


# --- GPM -----------------------------------------------------------------------------


def test_gpm_first_read_takes_two_samples_and_converts_units(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    metrics = gpu.gpm_metrics()
    assert len(nvml.allocated) == 2 and list(map(address, nvml.freed)) == [address(nvml.allocated[0])]  # the older sample is freed at once
    first, second, ids = nvml.metric_requests[0]
    assert ids == [getattr(pynvml, GPM_METRICS[key][0]) for key in GPM_FIELDS]
    assert (address(first), address(second)) == (address(nvml.allocated[0]), address(nvml.allocated[1]))
    values = metrics.values
    assert values["sm_active"] == pytest.approx(0.957)
    assert values["sm_occupancy"] == pytest.approx(0.141)
    assert values["tensor_any"] == pytest.approx(0.929)
    assert values["dram_active"] == pytest.approx(0.169)
    assert values["pcie_tx_bytes_per_second"] == pytest.approx(10 * MIB)
    assert values["pcie_rx_bytes_per_second"] == pytest.approx(20 * MIB)
    # metrics NVML did not give are left out, never NaN
    assert "nvlink_tx_bytes_per_second" not in values and "nvlink_rx_bytes_per_second" not in values
    assert metrics.interval_seconds >= 0.0
    activity = metrics.activity()
    assert activity is not None and activity.tensor_active == pytest.approx(0.929)


def test_gpm_keeps_one_sample_per_round_and_frees_it_at_close(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    gpu = backend.devices()[0]
    gpu.gpm_metrics()
    gpu.gpm_metrics()
    assert len(nvml.allocated) == 3  # second round: one new sample against the kept one
    assert list(map(address, nvml.freed)) == list(map(address, nvml.allocated[:2]))
    first, second, _ = nvml.metric_requests[1]
    assert (address(first), address(second)) == (address(nvml.allocated[1]), address(nvml.allocated[2]))
    backend.close()
    assert list(map(address, nvml.freed)) == list(map(address, nvml.allocated))  # nothing leaks


def test_gpm_ratios_are_clamped_to_one(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.gpm_values[pynvml.NVML_GPM_METRIC_SM_UTIL] = 100.4  # GPM rounding can pass 100 %
    assert gpu.gpm_metrics().values["sm_active"] == 1.0


def test_gpm_unsupported_device_is_not_supported_and_remembered(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlGpmQueryDeviceSupport.return_value = pynvml.c_nvmlGpmSupport_t(version=1, isSupportedDevice=0)
    for _ in range(2):
        with pytest.raises(NotSupported):
            gpu.gpm_metrics()
    assert nvml.nvmlGpmQueryDeviceSupport.call_count == 1
    assert nvml.allocated == []


def test_gpm_query_not_supported_by_driver(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlGpmQueryDeviceSupport.side_effect = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    with pytest.raises(NotSupported):
        gpu.gpm_metrics()


def test_gpm_error_is_translated_and_no_sample_leaks(nvml: SimpleNamespace, backend: NvmlBackend) -> None:
    gpu = backend.devices()[0]
    gpu.gpm_metrics()
    nvml.nvmlGpmMetricsGet.side_effect = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuLost) as caught:
        gpu.gpm_metrics()
    assert "nvmlGpmMetricsGet" in str(caught.value)
    nvml.nvmlGpmSampleGet.side_effect = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NoPermission):
        gpu.gpm_metrics()
    backend.close()
    assert sorted(map(address, nvml.freed)) == sorted(map(address, nvml.allocated))


# --- field values ---------------------------------------------------------------------


def test_memory_temperature_from_field_values(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetFieldValues.return_value = [field_value(pynvml.NVML_FI_DEV_MEMORY_TEMP, 41)]
    assert gpu.memory_temperature_celsius() == 41.0
    assert nvml.nvmlDeviceGetFieldValues.call_args.args[1] == [pynvml.NVML_FI_DEV_MEMORY_TEMP]


def test_field_value_types_are_decoded(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetFieldValues.return_value = [
        field_value(pynvml.NVML_FI_DEV_MEMORY_TEMP, 40.5, pynvml.NVML_VALUE_TYPE_DOUBLE)
    ]
    assert gpu.memory_temperature_celsius() == 40.5


def test_unsupported_field_is_not_supported_and_remembered(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetFieldValues.return_value = [field_value(pynvml.NVML_FI_DEV_MEMORY_TEMP, None)]
    for _ in range(2):
        with pytest.raises(NotSupported):
            gpu.memory_temperature_celsius()
    assert nvml.nvmlDeviceGetFieldValues.call_count == 1


def test_field_entry_error_is_translated(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    value = field_value(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)
    value.nvmlReturn = pynvml.NVML_ERROR_GPU_IS_LOST
    nvml.nvmlDeviceGetFieldValues.return_value = [value]
    with pytest.raises(GpuLost):
        gpu.memory_temperature_celsius()


# --- health and throttling -----------------------------------------------------------


def test_remapped_rows(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetRemappedRows.return_value = (3, 1, 1, 0)
    rows = gpu.remapped_rows()
    assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failure) == (3, 1, True, False)


def test_retired_pages_not_supported_on_hopper(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetRetiredPages.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        gpu.retired_pages()


def test_retired_pages_counts_by_cause(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    pages = {
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1000, 0x2000],
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3000],
    }
    nvml.nvmlDeviceGetRetiredPages.side_effect = lambda handle, cause: pages[cause]
    retired = gpu.retired_pages()
    assert (retired.multiple_single_bit_ecc, retired.double_bit_ecc) == (2, 1)


def test_violation_nanoseconds_to_seconds_unsupported_left_out(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    times = {pynvml.NVML_PERF_POLICY_POWER: 2_500_000_000, pynvml.NVML_PERF_POLICY_THERMAL: 1_000}

    def status(handle, policy):
        if policy not in times:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlViolationTime_t(referenceTime=123, violationTime=times[policy])

    nvml.nvmlDeviceGetViolationStatus.side_effect = status
    assert gpu.violation_seconds() == {"power": 2.5, "thermal": 1e-6}


def test_violation_nothing_supported(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetViolationStatus.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        gpu.violation_seconds()


def test_pcie_replays_and_codec(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetPcieReplayCounter.return_value = 17
    nvml.nvmlDeviceGetEncoderUtilization.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    nvml.nvmlDeviceGetDecoderUtilization.return_value = [25, 167000]
    assert gpu.pcie_replays() == 17
    codec = gpu.codec_utilization()
    assert codec.encoder_ratio is None and codec.decoder_ratio == pytest.approx(0.25)


# --- NVLink ---------------------------------------------------------------------------


def test_nvlink_links_errors_and_bytes(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    def state(handle, link):
        if link >= 18:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link == 5 else 1

    nvml.nvmlDeviceGetNvLinkState.side_effect = state
    nvml.nvmlDeviceGetNvLinkErrorCounter.side_effect = lambda handle, link, counter: (
        2 if counter == pynvml.NVML_NVLINK_ERROR_DL_REPLAY else 0
    )
    nvml.nvmlDeviceGetFieldValues.return_value = [
        field_value(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1000, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG),
        field_value(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 4, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG),
    ]
    status = gpu.nvlink()
    assert len(status.links) == 18 and dict(status.links)[5] is False and dict(status.links)[0] is True
    assert status.errors["replay"] == 36 and status.errors["crc_flit"] == 0
    assert status.tx_bytes_total == 1000 * 1024 and status.rx_bytes_total == 4 * 1024
    ids = nvml.nvmlDeviceGetFieldValues.call_args.args[1]
    assert ids[0] == (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)


def test_nvlink_absent_is_not_supported_and_remembered(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetNvLinkState.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        gpu.nvlink()
    calls = nvml.nvmlDeviceGetNvLinkState.call_count
    with pytest.raises(NotSupported):
        gpu.nvlink()
    assert nvml.nvmlDeviceGetNvLinkState.call_count == calls


# --- MIG ------------------------------------------------------------------------------


def test_mig_off(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetMigMode.return_value = [0, 0]
    assert gpu.mig_enabled() is False
    assert gpu.mig_instances() == []


def test_mig_instances_with_memory_and_gpm_per_gpu_instance(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetMigMode.return_value = [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]
    nvml.nvmlDeviceGetMaxMigDeviceCount.return_value = 3
    handles = {0: handle_at(0x1), 1: handle_at(0x2)}

    def by_index(handle, slot):
        if slot not in handles:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return handles[slot]

    nvml.nvmlDeviceGetMigDeviceHandleByIndex.side_effect = by_index
    ids = {0x1: (1, 0), 0x2: (2, 0)}
    nvml.nvmlDeviceGetGpuInstanceId.side_effect = lambda h: ids[address(h)][0]
    nvml.nvmlDeviceGetComputeInstanceId.side_effect = lambda h: ids[address(h)][1]
    nvml.nvmlDeviceGetMemoryInfo.return_value = pynvml.c_nvmlMemory_t(total=20 * 1024**3, free=15 * 1024**3, used=5 * 1024**3)
    instances = gpu.mig_instances()
    assert [(i.gpu_instance, i.compute_instance) for i in instances] == [(1, 0), (2, 0)]
    assert instances[0].memory_used_bytes == 5 * 1024**3
    assert instances[0].gpm is not None and instances[0].gpm.values["tensor_any"] == pytest.approx(0.929)
    assert [call.args[1] for call in nvml.nvmlGpmMigSampleGet.call_args_list] == [1, 1, 2, 2]


# --- PCIe link and GPU recovery action (health checks) -------------------------------------------

#: Read-only NVML reads on a real, healthy H100 (driver 580.159.04), kept by the lead developer.
H100_FIELDS = Path("/work/shared/reference/h100-health-fields.json")


def h100_reference() -> dict:
    """The first GPU's fields from the reference file; the figures below are copied from it and
    checked against it here, so the test also runs where /work/shared is absent."""
    expected = {"pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16,
                "gpu_recovery_action": 0}
    if H100_FIELDS.exists():
        gpu = json.loads(H100_FIELDS.read_text())["gpus"][0]
        for key in ("pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max"):
            assert gpu[key] == {"ok": True, "value": expected[key]}, key
        assert gpu["gpu_recovery_action"]["ok"] and "'value_ui': 0" in gpu["gpu_recovery_action"]["value"]
        assert "'field_id': 230" in gpu["gpu_recovery_action"]["value"]
    return expected


def test_pcie_link_as_on_a_healthy_h100(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    ref = h100_reference()
    nvml.nvmlDeviceGetCurrPcieLinkGeneration.return_value = ref["pcie_gen_current"]
    nvml.nvmlDeviceGetCurrPcieLinkWidth.return_value = ref["pcie_width_current"]
    nvml.nvmlDeviceGetMaxPcieLinkGeneration.return_value = ref["pcie_gen_max"]
    nvml.nvmlDeviceGetMaxPcieLinkWidth.return_value = ref["pcie_width_max"]
    assert gpu.pcie_link() == PcieLink(generation=5, width=16, max_generation=5, max_width=16)
    for fn in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
               "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):
        assert address(getattr(nvml, fn).call_args.args[0]) == 0x7F00_0000_1000, fn


def test_pcie_link_trained_down(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetCurrPcieLinkGeneration.return_value = 3
    nvml.nvmlDeviceGetCurrPcieLinkWidth.return_value = 8
    nvml.nvmlDeviceGetMaxPcieLinkGeneration.return_value = 5
    nvml.nvmlDeviceGetMaxPcieLinkWidth.return_value = 16
    assert gpu.pcie_link() == PcieLink(generation=3, width=8, max_generation=5, max_width=16)


def test_pcie_link_not_supported_is_remembered(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetCurrPcieLinkGeneration.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    for _ in range(2):
        with pytest.raises(NotSupported):
            gpu.pcie_link()
    assert nvml.nvmlDeviceGetCurrPcieLinkGeneration.call_count == 1
    assert nvml.nvmlDeviceGetMaxPcieLinkWidth.call_count == 0


def test_pcie_link_lost_gpu_is_not_not_supported(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    nvml.nvmlDeviceGetCurrPcieLinkGeneration.return_value = 5
    nvml.nvmlDeviceGetCurrPcieLinkWidth.side_effect = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuLost):
        gpu.pcie_link()


def test_gpu_recovery_action_as_on_a_healthy_h100(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    ref = h100_reference()
    nvml.nvmlDeviceGetFieldValues.return_value = [field_value(230, ref["gpu_recovery_action"])]
    assert gpu.gpu_recovery_action() == 0
    assert nvml.nvmlDeviceGetFieldValues.call_args.args[1] == [230]


@pytest.mark.parametrize("value", [1, 2, 3, 4])
def test_gpu_recovery_action_values(nvml: SimpleNamespace, gpu: NvmlDevice, value: int) -> None:
    nvml.nvmlDeviceGetFieldValues.return_value = [field_value(230, value)]
    assert gpu.gpu_recovery_action() == value


def test_gpu_recovery_action_not_supported_by_the_driver(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    """An older driver answers the field entry NOT_SUPPORTED: NotSupported, asked once."""
    nvml.nvmlDeviceGetFieldValues.return_value = [field_value(230, None)]
    for _ in range(2):
        with pytest.raises(NotSupported):
            gpu.gpu_recovery_action()
    assert nvml.nvmlDeviceGetFieldValues.call_count == 1


def test_gpu_recovery_action_unknown_field_call(nvml: SimpleNamespace, gpu: NvmlDevice) -> None:
    """A driver without nvmlDeviceGetFieldValues support at all."""
    nvml.nvmlDeviceGetFieldValues.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        gpu.gpu_recovery_action()


def test_gpu_recovery_action_field_id_is_nvmls() -> None:
    assert nvml_module._GPU_RECOVERY_ACTION_FIELD == 230
    if hasattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):
        assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230
