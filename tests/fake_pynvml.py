"""A fake libnvidia-ml that counts threads inside it at once: what crashed the real one.

On a 2x H200 node, two threads inside libnvidia-ml together (one in ``nvmlGpmMetricsGet``, one in
``nvmlDeviceGetFieldValues``) killed ``gpuperfd check`` with SIGSEGV in half its runs. A Python
fake cannot crash that way, so it counts: every function below holds the library for a little
while (``hold_seconds``, to widen the window a race needs) and records how many threads were
inside together. Install it with :func:`installed` (it replaces the ``pynvml`` that
``gpuperfd.device.nvml`` uses); code that lets two threads in shows ``max_inside > 1``.

Constants, structs and the NVMLError classes are the real pynvml's, so gpuperfd's translation of
errors and its GPM request structs work as with the real library.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pynvml as real

from gpuperfd.device import nvml as nvml_module


class FakeNvml(types.ModuleType):
    """The fake library: a module object holding real pynvml's names and fake functions."""

    def __init__(self, gpus: int = 2, hold_seconds: float = 0.0005) -> None:
        super().__init__("pynvml")
        self.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("nvml") or k.isupper()})
        self.__dict__.update({k: v for k, v in vars(real).items() if k.startswith("nvmlEventType")})
        self.gpus = gpus
        self.hold_seconds = hold_seconds
        self._count_lock = threading.Lock()
        self._inside = 0
        self.max_inside = 0
        self.calls = 0
        self.concurrent: list[tuple[str, ...]] = []
        self._names_inside: list[str] = []
        self.processes: dict[int, list[SimpleNamespace]] = {i: [] for i in range(gpus)}
        self._energy_mj = [0] * gpus
        self._handles = [ctypes.cast(ctypes.c_void_p(0x7F00_0000_1000 * (i + 1)), real.c_nvmlDevice_t)
                         for i in range(gpus)]
        #: NVML's fabric (state, status) per GPU; by default no fabric (a board without NVSwitch).
        self.fabric: dict[int, tuple[int, int]] = {i: (real.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0) for i in range(gpus)}
        #: The struct versions nvmlDeviceGetGpuFabricInfoV knows (None: a driver without that call).
        #: As driver 580 on a 2x H200 NVSwitch slice: v2 and v3, and the unversioned call answers
        #: state NOT_SUPPORTED whatever the fabric's state (nvidia-smi said Completed there).
        self.fabric_versions: set[int] | None = {real.nvmlGpuFabricInfo_v2, real.nvmlGpuFabricInfo_v3}
        #: The far end of each NVLink (by link number) per GPU: a GPU's index, or "switch"; default:
        #: GPU 0 and GPU 1 joined by their 4 links (the fake lists links 0-3).
        self.nvlink_remote: dict[int, dict[int, int | str]] = {i: {} for i in range(gpus)}
        if gpus == 2:
            self.nvlink_remote = {0: dict.fromkeys(range(4), 1), 1: dict.fromkeys(range(4), 0)}
        #: nvmlGpuTopologyLevel_t of every pair (default: one PCIe switch, MULTIPLE)
        self.topology_level = real.NVML_TOPOLOGY_MULTIPLE
        for name, fn in _FUNCTIONS.items():
            setattr(self, name, self._counted(name, fn))

    # -- the counting ----------------------------------------------------------------

    def _counted(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            with self._count_lock:
                self._inside += 1
                self.calls += 1
                self._names_inside.append(name)
                if self._inside > 1:
                    self.concurrent.append(tuple(self._names_inside))
                self.max_inside = max(self.max_inside, self._inside)
            try:
                time.sleep(self.hold_seconds)
                return fn(self, *args)
            finally:
                with self._count_lock:
                    self._inside -= 1
                    self._names_inside.remove(name)

        call.__name__ = name
        return call

    def index_of(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return next(i for i, h in enumerate(self._handles) if ctypes.cast(h, ctypes.c_void_p).value == address)


def _not_supported() -> real.NVMLError:
    return real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)


def _field_values(fake: FakeNvml, handle: Any, ids: list[Any]) -> list[SimpleNamespace]:
    out = []
    for entry in ids:
        field_id = entry[0] if isinstance(entry, tuple) else entry
        out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=real.NVML_SUCCESS, valueType=1,
                                   value=SimpleNamespace(uiVal=0 if field_id == 230 else 41)))
    return out


def _gpm_metrics(fake: FakeNvml, request: Any) -> Any:
    for i in range(request.numMetrics):
        request.metrics[i].nvmlReturn = real.NVML_SUCCESS
        request.metrics[i].value = 12.5
    return request


def _energy(fake: FakeNvml, handle: Any) -> int:
    index = fake.index_of(handle)
    fake._energy_mj[index] += 70
    return fake._energy_mj[index]


def _event_wait(fake: FakeNvml, event_set: Any, timeout_ms: int) -> Any:
    time.sleep(timeout_ms / 1000.0)  # a blocking wait holds the library, as the real one does
    raise real.NVMLError(real.NVML_ERROR_TIMEOUT)


def _bus(index: int) -> str:
    return f"00000000:{0x18 + index:02X}:00.0"


def _fabric_info(fake: FakeNvml, handle: Any, info_ref: Any) -> int:
    """The unversioned call: blind (NOT_SUPPORTED) where the driver has the versioned one."""
    info = info_ref._obj
    info.state, info.status = fake.fabric[fake.index_of(handle)]
    if fake.fabric_versions is not None:
        info.state, info.status = real.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, real.NVML_SUCCESS
    info.cliqueId = 7
    return real.NVML_SUCCESS


def _fabric_info_v(fake: FakeNvml, handle: Any, info_ref: Any) -> int:
    """nvmlDeviceGetGpuFabricInfoV: the fabric's state for a struct version the driver knows."""
    if fake.fabric_versions is None:
        raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
    info = info_ref._obj
    if info.version not in fake.fabric_versions:
        raise real.NVMLError(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    info.state, info.status = fake.fabric[fake.index_of(handle)]
    info.cliqueId = 7
    return real.NVML_SUCCESS


def _remote_pci(fake: FakeNvml, handle: Any, link: int) -> SimpleNamespace:
    remote = fake.nvlink_remote[fake.index_of(handle)].get(link)
    if remote is None:
        raise _not_supported()
    bus = _bus(remote) if isinstance(remote, int) else "0000:C5:00.0"  # an NVSwitch, 4-digit domain as NVML may
    return SimpleNamespace(busId=bus.encode())


def _raise_not_supported(fake: FakeNvml, *args: Any) -> Any:
    raise _not_supported()


_FUNCTIONS: dict[str, Any] = {
    "nvmlInit": lambda f: None,
    "nvmlShutdown": lambda f: None,
    "nvmlSystemGetDriverVersion": lambda f: "580.159.04",
    "nvmlDeviceGetCount": lambda f: f.gpus,
    "nvmlDeviceGetHandleByIndex": lambda f, i: f._handles[i],
    "nvmlDeviceGetIndex": lambda f, h: f.index_of(h),
    "nvmlDeviceGetUUID": lambda f, h: f"GPU-fake0000-0000-0000-0000-00000000000{f.index_of(h)}",
    "nvmlDeviceGetName": lambda f, h: "NVIDIA H100 80GB HBM3",
    "nvmlDeviceGetPciInfo": lambda f, h: SimpleNamespace(busId=_bus(f.index_of(h)).encode()),
    "nvmlDeviceGetCudaComputeCapability": lambda f, h: (9, 0),
    "nvmlDeviceGetSerial": lambda f, h: f"165322000000{f.index_of(h)}",
    "nvmlDeviceGetMemoryInfo": lambda f, h: SimpleNamespace(total=80 << 30, used=1 << 29, free=(80 << 30) - (1 << 29)),
    "nvmlDeviceGetUtilizationRates": lambda f, h: SimpleNamespace(gpu=0, memory=0),
    "nvmlDeviceGetTemperature": lambda f, h, sensor: 33,
    "nvmlDeviceGetPowerUsage": lambda f, h: 70_000,
    "nvmlDeviceGetTotalEnergyConsumption": _energy,
    "nvmlDeviceGetEnforcedPowerLimit": lambda f, h: 700_000,
    "nvmlDeviceGetPowerManagementDefaultLimit": lambda f, h: 700_000,
    "nvmlDeviceGetPowerManagementLimitConstraints": lambda f, h: (200_000, 700_000),
    "nvmlDeviceSetPowerManagementLimit": lambda f, h, mw: None,
    "nvmlDeviceGetClockInfo": lambda f, h, kind: 1980 if kind == real.NVML_CLOCK_SM else 2619,
    "nvmlDeviceGetMaxClockInfo": lambda f, h, kind: 1980 if kind == real.NVML_CLOCK_SM else 2619,
    "nvmlDeviceGetCurrentClocksEventReasons": lambda f, h: 0x1,
    "nvmlDeviceGetCurrentClocksThrottleReasons": lambda f, h: 0x1,
    "nvmlDeviceGetPcieThroughput": lambda f, h, counter: 120,
    "nvmlDeviceGetTotalEccErrors": lambda f, h, kind, counter: 0,
    "nvmlDeviceGetComputeRunningProcesses": lambda f, h: list(f.processes[f.index_of(h)]),
    "nvmlDeviceGetMigMode": lambda f, h: (0, 0),
    "nvmlDeviceGetMaxMigDeviceCount": lambda f, h: 7,
    "nvmlGpmQueryDeviceSupport": lambda f, h: SimpleNamespace(isSupportedDevice=1),
    "nvmlGpmSampleAlloc": lambda f: ctypes.pointer(real.struct_c_nvmlGpmSample_t()),
    "nvmlGpmSampleGet": lambda f, h, sample: None,
    "nvmlGpmMigSampleGet": _raise_not_supported,
    "nvmlGpmSampleFree": lambda f, sample: None,
    "nvmlGpmMetricsGet": _gpm_metrics,
    "nvmlDeviceGetFieldValues": _field_values,
    "nvmlDeviceGetRemappedRows": lambda f, h: (0, 0, 0, 0),
    "nvmlDeviceGetRetiredPages": _raise_not_supported,
    "nvmlDeviceGetViolationStatus": lambda f, h, policy: SimpleNamespace(violationTime=0),
    "nvmlDeviceGetPcieReplayCounter": lambda f, h: 1,
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda f, h: 5,
    "nvmlDeviceGetCurrPcieLinkWidth": lambda f, h: 16,
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda f, h: 5,
    "nvmlDeviceGetMaxPcieLinkWidth": lambda f, h: 16,
    "nvmlDeviceGetEncoderUtilization": lambda f, h: (0, 1000),
    "nvmlDeviceGetDecoderUtilization": lambda f, h: (0, 1000),
    "nvmlDeviceGetNvLinkState": lambda f, h, link: 1 if link < 4 else _raise_not_supported(f),
    "nvmlDeviceGetNvLinkErrorCounter": lambda f, h, link, counter: 0,
    "nvmlDeviceGetMigDeviceHandleByIndex": _raise_not_supported,
    "nvmlEventSetCreate": lambda f: object(),
    "nvmlDeviceRegisterEvents": lambda f, h, kinds, event_set: None,
    "nvmlEventSetWait_v2": _event_wait,
    "nvmlEventSetFree": lambda f, event_set: None,
    "nvmlErrorString": lambda f, code: f"fake NVML error {code}",
    "nvmlDeviceGetGpuFabricInfo": _fabric_info,
    "nvmlDeviceGetGpuFabricInfoV": _fabric_info_v,
    "nvmlDeviceGetNvLinkRemotePciInfo": _remote_pci,
    "nvmlDeviceGetTopologyCommonAncestor": lambda f, a, b: f.topology_level,
    "nvmlDeviceGetP2PStatus": lambda f, a, b, index: real.NVML_P2P_STATUS_OK,
}


@contextlib.contextmanager
def installed(gpus: int = 2, hold_seconds: float = 0.0005) -> Iterator[FakeNvml]:
    """The fake in place of pynvml inside gpuperfd.device.nvml (restored after)."""
    fake = FakeNvml(gpus, hold_seconds)
    saved = nvml_module.pynvml
    nvml_module.pynvml = fake  # type: ignore[assignment]
    try:
        yield fake
    finally:
        nvml_module.pynvml = saved
