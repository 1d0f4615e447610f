"""Real GPUs through NVML (nvidia-ml-py): the bottom of gpuperfd's data flow.

    NVML (libnvidia-ml)  ->  this module  ->  background sampler / collectors /
                                              power-cap sweeps  ->  /metrics

This is the only module that imports :mod:`pynvml`. It implements the
:class:`~gpuperfd.device.base.Backend` and :class:`~gpuperfd.device.base.Device`
interface and converts NVML's units to the project's SI units at this boundary:
milliwatts -> watts, millijoules -> joules, MHz -> hertz, KB/s -> bytes/s,
percent -> ratio in [0, 1]. (Memory sizes already come from NVML in bytes.)

Errors: every NVML call goes through :func:`_call`, and every NVML error is
turned into one of the project's exceptions (:mod:`gpuperfd.device.errors`) by
:func:`_translate`, the one place that knows NVML's error codes. Callers never
see a ``pynvml.NVMLError``.

Unsupported fields: the first ``NotSupported`` for a (GPU, field) pair is
remembered (and logged once at debug level); later reads of that field raise
``NotSupported`` at once, without calling NVML again. No getter ever returns NaN:
a field the GPU lacks raises ``NotSupported`` and the caller leaves the sample out.

Cost (H200, see ``shared/reference/README.md``): most getters take about 1 us;
:meth:`NvmlDevice.energy_joules` about 3 ms and :meth:`NvmlDevice.pcie_throughput`
about 21 ms per direction, so those two belong to the background sampler, never
to the scrape path.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from typing import Any, Callable, TypeVar

import pynvml

from gpuperfd.device.base import (
    CLOCK_EVENT_REASONS,
    GPM_FIELDS,
    NVLINK_ERROR_TYPES,
    VIOLATION_REASONS,
    Backend,
    ClockEvents,
    Clocks,
    CodecUtilization,
    ComputeProcess,
    Device,
    EccErrors,
    FabricState,
    GpmMetrics,
    GpuInfo,
    MemoryUsage,
    MigInstance,
    NvLinkStatus,
    PcieLink,
    PeerLink,
    PcieThroughput,
    PowerLimits,
    RemappedRows,
    RetiredPages,
    Utilization,
    XidEvent,
)
from gpuperfd.device.serial import CallGate
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

__all__ = ["NvmlBackend", "NvmlDevice", "CLOCK_EVENT_BITS"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: An NVML device handle (``pynvml.c_nvmlDevice_t``, an opaque pointer).
Handle = Any

#: NVML clock-event (throttle) reason bits, by the label names of base.CLOCK_EVENT_REASONS.
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
assert tuple(CLOCK_EVENT_BITS) == CLOCK_EVENT_REASONS, "keep CLOCK_EVENT_BITS in CLOCK_EVENT_REASONS order"

MIB = 1 << 20

#: GPM metrics by base.GPM_FIELDS key: (NVML_GPM_METRIC_* name, factor to SI). NVML gives
#: percent (-> ratio) and MiB/s (-> bytes/s). One table, one loop (see _gpm_values).
GPM_METRICS: dict[str, tuple[str, float]] = {
    "sm_active": ("NVML_GPM_METRIC_SM_UTIL", 0.01),
    "sm_occupancy": ("NVML_GPM_METRIC_SM_OCCUPANCY", 0.01),
    "tensor_any": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    "tensor_hmma": ("NVML_GPM_METRIC_HMMA_TENSOR_UTIL", 0.01),
    "tensor_imma": ("NVML_GPM_METRIC_IMMA_TENSOR_UTIL", 0.01),
    "tensor_dfma": ("NVML_GPM_METRIC_DFMA_TENSOR_UTIL", 0.01),
    "dram_active": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    "fp16": ("NVML_GPM_METRIC_FP16_UTIL", 0.01),
    "fp32": ("NVML_GPM_METRIC_FP32_UTIL", 0.01),
    "fp64": ("NVML_GPM_METRIC_FP64_UTIL", 0.01),
    "pcie_tx_bytes_per_second": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", float(MIB)),
    "pcie_rx_bytes_per_second": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", float(MIB)),
    "nvlink_tx_bytes_per_second": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", float(MIB)),
    "nvlink_rx_bytes_per_second": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", float(MIB)),
}
assert tuple(GPM_METRICS) == GPM_FIELDS, "keep GPM_METRICS in GPM_FIELDS order"
#: The metrics per MIG GPU instance (NVML gives fewer per instance; these are the ones series use).
MIG_GPM_FIELDS: tuple[str, ...] = ("sm_active", "tensor_any", "dram_active")
#: Seconds between the two samples of a first GPM read.
GPM_FIRST_INTERVAL_SECONDS = 0.1
#: NVML_PERF_POLICY_* by base.VIOLATION_REASONS label.
VIOLATION_POLICIES: dict[str, str] = {
    "power": "NVML_PERF_POLICY_POWER",
    "thermal": "NVML_PERF_POLICY_THERMAL",
    "sync_boost": "NVML_PERF_POLICY_SYNC_BOOST",
    "board_limit": "NVML_PERF_POLICY_BOARD_LIMIT",
    "low_utilization": "NVML_PERF_POLICY_LOW_UTILIZATION",
    "reliability": "NVML_PERF_POLICY_RELIABILITY",
}
assert tuple(VIOLATION_POLICIES) == VIOLATION_REASONS
#: NVML_NVLINK_ERROR_DL_* by base.NVLINK_ERROR_TYPES label.
NVLINK_ERROR_COUNTERS: dict[str, str] = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "ecc_data": "NVML_NVLINK_ERROR_DL_ECC_DATA",
}
assert tuple(NVLINK_ERROR_COUNTERS) == NVLINK_ERROR_TYPES
#: Field-value scope meaning "all links, summed".
_ALL_LINKS_SCOPE = 0xFFFFFFFF
_FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

_SIMULATE_HINT = ("Without a GPU: run probes on the CPU with `gpuperfd probe PROBE --device cpu`; try probes, sweeps "
                  "and the daemon on simulated GPUs with `gpuperfd probe PROBE --simulate N`, "
                  "`gpuperfd sweep --simulate N ...` and `gpuperfd run --simulate N`.")

#: Most XID events returned by one wait_xid_events call (the rest wait for the next call).
_MAX_EVENTS_PER_WAIT = 64
#: Seconds between polls of the XID event set (an XID is counted at most this late).
XID_POLL_SECONDS = 0.25


def _codes(*names: str) -> frozenset[int]:
    """The values of the NVML_ERROR_* constants this pynvml has (older ones lack some)."""
    return frozenset(getattr(pynvml, name) for name in names if hasattr(pynvml, name))


_NOT_SUPPORTED_CODES = _codes("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
_NO_PERMISSION_CODES = _codes("NVML_ERROR_NO_PERMISSION")
_GPU_LOST_CODES = _codes("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_NOT_FOUND", "NVML_ERROR_RESET_REQUIRED")
_TIMEOUT_CODES = _codes("NVML_ERROR_TIMEOUT")
_INVALID_ARGUMENT_CODES = _codes("NVML_ERROR_INVALID_ARGUMENT")
_DRIVER_NOT_FOUND_CODES = _codes(
    "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
)


def _nvml_text(error: pynvml.NVMLError) -> str:
    """NVML's own description of an error; never raises (str() may call into NVML)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a failing error string must not hide the error
        return f"NVML error {getattr(error, 'value', '?')}"


def _translate(error: pynvml.NVMLError, what: str = "NVML") -> DeviceError:
    """Map an NVML error onto the project's exceptions; the only place that knows NVML codes.

    ``what`` says which GPU and call failed (e.g. ``"GPU 0: nvmlDeviceGetPowerUsage"``);
    the message keeps NVML's own text and code. UNINITIALIZED and any code not listed
    here become :class:`UnknownDeviceError`.
    """
    code = getattr(error, "value", None)
    message = f"{what}: {_nvml_text(error)} (NVML error {code})"
    if code in _NOT_SUPPORTED_CODES:
        return NotSupported(message)
    if code in _NO_PERMISSION_CODES:
        return NoPermission(message)
    if code in _GPU_LOST_CODES:
        return GpuLost(message)
    if code in _TIMEOUT_CODES:
        return DeviceTimeout(message)
    if code in _INVALID_ARGUMENT_CODES:
        return InvalidArgument(message)
    if code in _DRIVER_NOT_FOUND_CODES:
        return DriverNotFound(f"no NVIDIA driver found ({message}). {_SIMULATE_HINT}")
    return UnknownDeviceError(message)


#: nvml.h NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvidia-ml-py 12.570+ names it; the number is stable).
_GPU_RECOVERY_ACTION_FIELD = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)


#: The one way into libnvidia-ml for every thread of this process (gpuperfd.device.serial says why).
#: Its hang threshold is ``device.call_timeout_seconds`` (:class:`NvmlBackend` sets it).
GATE = CallGate("libnvidia-ml")


def _call(what: str, fn: Callable[..., T], *args: Any, scope: int | None = None) -> T:
    """Call one NVML function through :data:`GATE`; an NVML error is raised as the project's
    exception (see _translate), translated inside the gate: its text comes from nvmlErrorString.
    ``scope`` is the GPU index the call is about (None: node-level)."""
    name = getattr(fn, "__name__", "nvml")

    def guarded() -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError as error:
            raise _translate(error, f"{what}: {name}") from error

    return GATE.call(scope, name, guarded)


#: NVML_ERROR_ARGUMENT_VERSION_MISMATCH: a versioned struct this driver does not know.
_VERSION_MISMATCH = getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25)

#: nvmlGpuFabricState_t -> FABRIC_STATES.
#: (nvml.h's numbers where an older pynvml lacks the names.)
_FABRIC_STATES: dict[int, str] = {
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED", 0): "not_supported",
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_NOT_STARTED", 1): "not_started",
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_IN_PROGRESS", 2): "in_progress",
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3): "completed",
}

#: nvmlGpuTopologyLevel_t -> PEER_PATHS (as ``nvidia-smi topo -m`` names them).
_TOPOLOGY_PATHS: dict[int, str] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "pix",
    pynvml.NVML_TOPOLOGY_SINGLE: "pix",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "pxb",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "phb",
    pynvml.NVML_TOPOLOGY_NODE: "node",
    pynvml.NVML_TOPOLOGY_SYSTEM: "sys",
}

#: pynvml 12/13 spell NVML_P2P_CAPS_INDEX_READ as a one-element tuple.
_P2P_READ = pynvml.NVML_P2P_CAPS_INDEX_READ[0] if isinstance(pynvml.NVML_P2P_CAPS_INDEX_READ, tuple) \
    else pynvml.NVML_P2P_CAPS_INDEX_READ


def _bus_id(value: str | bytes) -> str:
    """A PCI bus id as one spelling: upper case, 8-digit domain (NVML gives both 8 and 4 digits)."""
    text = _text(value).upper()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):08X}:{rest}" if rest else text


def _pair_link(a: NvmlDevice, b: NvmlDevice, remotes: dict[int, list[str] | None], bus: dict[int, str]) -> PeerLink:
    """How GPUs ``a`` and ``b`` are linked: direct NVLinks (a's links whose far end is b), NVSwitch
    (both have links to something that is not a GPU of this node), else the PCIe path."""
    level = a._nvml(pynvml.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle)
    path = _TOPOLOGY_PATHS.get(int(level), "sys")
    try:
        p2p: bool | None = int(a._nvml(pynvml.nvmlDeviceGetP2PStatus, a.handle, b.handle, _P2P_READ)) \
            == pynvml.NVML_P2P_STATUS_OK
    except NotSupported:
        p2p = None
    gpus = set(bus.values())
    far_a, far_b = remotes[a.index] or [], remotes[b.index] or []
    direct = sum(1 for remote in far_a if remote == bus[b.index])
    if direct:
        return PeerLink(a.index, b.index, "nvlink", direct, False, p2p)
    switch_a = sum(1 for remote in far_a if remote not in gpus)
    switch_b = sum(1 for remote in far_b if remote not in gpus)
    if switch_a and switch_b:
        return PeerLink(a.index, b.index, "nvlink", min(switch_a, switch_b), True, p2p)
    return PeerLink(a.index, b.index, path, 0, False, p2p)


class _EmptySlot(Exception):
    """A MIG slot with no device in it (NVML_ERROR_NOT_FOUND): skipped, not an error."""


def _text(value: str | bytes) -> str:
    """NVML strings arrive as str from pynvml's wrappers but as bytes from ctypes struct fields."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _field_number(value: Any) -> float:
    """The number in one nvmlFieldValue_t, by its valueType."""
    member = _FIELD_VALUE_MEMBERS.get(int(value.valueType))
    if member is None:
        raise UnknownDeviceError(f"field {value.fieldId}: unknown value type {value.valueType}")
    return float(getattr(value.value, member))


def _handle_address(handle: Handle) -> int | None:
    """The pointer value of a device handle, to recognize it in event data; None if not a pointer."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class NvmlDevice(Device):
    """One GPU behind NVML. Thread-safe. ``index`` is the NVML index (as nvidia-smi shows it).

    Every getter raises :class:`NotSupported` for a field this GPU lacks (remembered: later
    calls skip NVML), and the other :class:`DeviceError` subclasses for other failures.
    """

    def __init__(self, backend: NvmlBackend, index: int, handle: Handle) -> None:
        self.index = index
        self._backend = backend
        self._handle = handle
        self._lock = threading.Lock()
        self._unsupported: set[str] = set()
        #: The fabric call (function, struct) this driver answered: asked alone from then on.
        self._fabric_call: tuple[Callable[..., int], Any] | None = None
        self._info: GpuInfo | None = None
        #: (max SM, max memory) clocks in hertz, read once: board constants.
        self._max_clocks: tuple[float | None, float | None] | None = None
        #: GPM: the previous sample and its time, per scope (None: the GPU; an int: a MIG GPU instance).
        self._gpm_lock = threading.Lock()
        self._gpm_samples: dict[int | None, tuple[Any, float]] = {}
        #: NVLink link numbers that answered a state query (found once).
        self._nvlink_links: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"NvmlDevice(index={self.index})"

    @property
    def handle(self) -> Handle:
        """The NVML device handle (for the backend's event set)."""
        return self._handle

    # --- the one path from a getter to NVML -------------------------------------------

    def _nvml(self, fn: Callable[..., T], *args: Any) -> T:
        """One NVML call about this GPU, through the gate (scope: this GPU)."""
        return _call(f"GPU {self.index}", fn, *args, scope=self.index)

    def _nvml_mig(self, slot: int, fn: Callable[..., T], *args: Any) -> T:
        """One NVML call about one of this GPU's MIG devices (scope: this GPU)."""
        return _call(f"GPU {self.index} MIG {slot}", fn, *args, scope=self.index)

    def _read(self, field: str, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn(handle, *args)`` for ``field``; NotSupported once means NotSupported forever."""
        with self._lock:
            if field in self._unsupported:
                raise NotSupported(f"GPU {self.index}: {field} is not supported (checked earlier)")
        try:
            return self._nvml(fn, self._handle, *args)
        except NotSupported:
            with self._lock:
                first = field not in self._unsupported
                self._unsupported.add(field)
            if first:
                log.debug("GPU %d: %s is not supported; not asking NVML again", self.index, field)
            raise

    def _optional(self, field: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Like _read, but None when the field is unsupported."""
        try:
            return self._read(field, fn, *args)
        except NotSupported:
            return None

    def _fields(self, field: str, ids: list[Any]) -> list[float | None]:
        """nvmlDeviceGetFieldValues for ``ids`` (an id, or (id, scope)); None for an entry NVML does not
        support; another per-entry error is raised translated. NotSupported if no entry is supported."""
        values = self._read(field, pynvml.nvmlDeviceGetFieldValues, ids)
        out: list[float | None] = []
        for value in values:
            code = int(value.nvmlReturn)
            if code == pynvml.NVML_SUCCESS:
                out.append(_field_number(value))
                continue
            error = GATE.call(self.index, "nvmlErrorString", _translate, pynvml.NVMLError(code),
                              f"GPU {self.index}: field {value.fieldId}")
            if not isinstance(error, NotSupported):
                raise error
            out.append(None)
        if all(v is None for v in out):
            with self._lock:
                self._unsupported.add(field)
            raise NotSupported(f"GPU {self.index}: {field} is not supported")
        return out

    # --- Device interface -------------------------------------------------------------

    def info(self) -> GpuInfo:
        """Static identity, read once and cached.

        uuid, name and total memory are required (their errors propagate); PCI bus id,
        compute capability ("major.minor") and serial are "" when unsupported.
        """
        with self._lock:
            if self._info is not None:
                return self._info
        uuid = _text(self._read("uuid", pynvml.nvmlDeviceGetUUID))
        name = _text(self._read("name", pynvml.nvmlDeviceGetName))
        memory_total = int(self._read("memory", pynvml.nvmlDeviceGetMemoryInfo).total)
        pci = self._optional("pci_info", pynvml.nvmlDeviceGetPciInfo)
        capability = self._optional("compute_capability", pynvml.nvmlDeviceGetCudaComputeCapability)
        serial = self._optional("serial", pynvml.nvmlDeviceGetSerial)
        info = GpuInfo(
            index=self.index,
            uuid=uuid,
            name=name,
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            driver_version=self._backend.driver_version(),
            compute_capability=f"{capability[0]}.{capability[1]}" if capability is not None else "",
            memory_total_bytes=memory_total,
            backend=NvmlBackend.name,
            serial=_text(serial) if serial is not None else "",
        )
        with self._lock:
            self._info = info
        return info

    def utilization(self) -> Utilization:
        """GPU (SM) and memory-controller busy share over NVML's last sample period, ratios 0..1."""
        rates = self._read("utilization", pynvml.nvmlDeviceGetUtilizationRates)
        return Utilization(gpu_ratio=rates.gpu / 100.0, memory_ratio=rates.memory / 100.0)

    def memory(self) -> MemoryUsage:
        """Frame-buffer memory in bytes (NVML reports bytes; no conversion)."""
        mem = self._read("memory", pynvml.nvmlDeviceGetMemoryInfo)
        return MemoryUsage(used_bytes=int(mem.used), total_bytes=int(mem.total), free_bytes=int(mem.free))

    def temperature_celsius(self) -> float:
        """GPU die temperature in degrees Celsius."""
        return float(self._read("temperature", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU))

    def power_watts(self) -> float:
        """Power draw in watts (NVML: milliwatts, averaged by the driver, lags up to a second)."""
        return self._read("power", pynvml.nvmlDeviceGetPowerUsage) / 1000.0

    def energy_joules(self) -> float:
        """Total energy since the driver loaded, joules (NVML: millijoules). About 3 ms per call."""
        return self._read("energy", pynvml.nvmlDeviceGetTotalEnergyConsumption) / 1000.0

    def power_limits(self) -> PowerLimits:
        """Enforced, default, min and max power limit in watts (NVML: milliwatts).

        NotSupported if any of the three reads is unsupported.
        """
        enforced = self._read("power_limit_enforced", pynvml.nvmlDeviceGetEnforcedPowerLimit)
        default = self._read("power_limit_default", pynvml.nvmlDeviceGetPowerManagementDefaultLimit)
        low, high = self._read("power_limit_constraints", pynvml.nvmlDeviceGetPowerManagementLimitConstraints)
        return PowerLimits(
            enforced_watts=enforced / 1000.0,
            default_watts=default / 1000.0,
            min_watts=low / 1000.0,
            max_watts=high / 1000.0,
        )

    def set_power_limit(self, watts: float) -> None:
        """Set the enforced power limit, in watts (sent to NVML as whole milliwatts).

        Raises InvalidArgument, naming the value and the allowed range, when ``watts`` is
        outside the GPU's [min, max] constraints (NVML is not called then); NoPermission
        without root; NotSupported where limits cannot be read or set.
        """
        if not isinstance(watts, (int, float)) or not math.isfinite(watts):
            raise InvalidArgument(f"GPU {self.index}: power limit {watts!r} W is not a finite number")
        low_mw, high_mw = self._read(
            "power_limit_constraints", pynvml.nvmlDeviceGetPowerManagementLimitConstraints
        )
        if not low_mw / 1000.0 <= watts <= high_mw / 1000.0:
            raise InvalidArgument(
                f"GPU {self.index}: power limit {watts:g} W is outside the allowed range "
                f"{low_mw / 1000.0:g}-{high_mw / 1000.0:g} W"
            )
        milliwatts = min(high_mw, max(low_mw, int(round(watts * 1000.0))))
        try:
            self._read("set_power_limit", pynvml.nvmlDeviceSetPowerManagementLimit, milliwatts)
        except NoPermission as error:
            raise NoPermission(f"{error}; setting a power limit needs root (CAP_SYS_ADMIN)") from error

    def clocks(self) -> Clocks:
        """Current SM and memory clocks in hertz (NVML: MHz), required.

        The maximum SM and memory clocks are None when unsupported. They are board
        constants and cost ~2.7 ms of CPU a read on an H200 (measured, see
        docs/benchmarks.md), so they are read once and cached. The graphics clock is
        not read (no series uses it; on Hopper it equals the SM clock).
        """
        sm = self._read("clock_sm", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        mem = self._read("clock_mem", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM)
        if self._max_clocks is None:
            sm_max = self._optional("clock_sm_max", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM)
            mem_max = self._optional("clock_mem_max", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM)
            self._max_clocks = (
                None if sm_max is None else sm_max * 1e6,
                None if mem_max is None else mem_max * 1e6,
            )
        return Clocks(
            sm_hertz=sm * 1e6,
            memory_hertz=mem * 1e6,
            sm_max_hertz=self._max_clocks[0],
            memory_max_hertz=self._max_clocks[1],
        )

    def clock_events(self) -> ClockEvents:
        """Active clock-event (throttle) reasons, as names from base.CLOCK_EVENT_REASONS.

        Uses nvmlDeviceGetCurrentClocksEventReasons, or the older ...ThrottleReasons where
        this pynvml lacks it. Bits with no name here are ignored.
        """
        getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is None:
            getter = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = int(self._read("clock_events", getter))
        return ClockEvents(active=frozenset(name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit))

    def pcie_throughput(self) -> PcieThroughput:
        """PCIe TX and RX in bytes/s (NVML: KB/s, x1024). About 21 ms per direction: sampler only."""
        tx = self._read("pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._read("pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return PcieThroughput(tx_bytes_per_second=tx * 1024.0, rx_bytes_per_second=rx * 1024.0)

    def ecc_errors(self) -> EccErrors:
        """Corrected and uncorrected ECC error counts since the driver loaded (volatile counter).

        NotSupported on GPUs without ECC (or with ECC mode off).
        """
        corrected = self._read(
            "ecc_corrected",
            pynvml.nvmlDeviceGetTotalEccErrors,
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        uncorrected = self._read(
            "ecc_uncorrected",
            pynvml.nvmlDeviceGetTotalEccErrors,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return EccErrors(corrected_total=int(corrected), uncorrected_total=int(uncorrected))

    def compute_processes(self) -> list[ComputeProcess]:
        """Compute processes on this GPU; used memory in bytes, None where NVML cannot tell."""
        processes = self._read("compute_processes", pynvml.nvmlDeviceGetComputeRunningProcesses)
        result = []
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            memory = None if used is None else int(used)
            result.append(ComputeProcess(pid=int(process.pid), used_memory_bytes=memory))
        return result

    def mig_uuids(self) -> list[str]:
        """MIG device UUIDs while MIG mode is on; [] when off; NotSupported without MIG."""
        current, _pending = self._read("mig_mode", pynvml.nvmlDeviceGetMigMode)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        uuids = []
        for slot in range(int(self._read("mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount))):
            try:
                handle = self._nvml_mig(slot, self._mig_handle, slot)
            except _EmptySlot:
                continue
            uuids.append(_text(self._nvml_mig(slot, pynvml.nvmlDeviceGetUUID, handle)))
        return uuids


    def _mig_handle(self, slot: int) -> Handle:
        """The MIG device handle in ``slot`` (called inside the gate); _EmptySlot if none is there."""
        try:
            return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(self._handle, slot)
        except pynvml.NVMLError as error:
            if error.value == pynvml.NVML_ERROR_NOT_FOUND:
                raise _EmptySlot() from error
            raise

    # --- deeper telemetry (slow lane) ---------------------------------------------------

    def _gpm_supported(self) -> None:
        """NotSupported (remembered) unless nvmlGpmQueryDeviceSupport says this GPU has GPM."""
        support = self._read("gpm", pynvml.nvmlGpmQueryDeviceSupport)
        if not support.isSupportedDevice:
            with self._lock:
                self._unsupported.add("gpm")
            raise NotSupported(f"GPU {self.index}: no GPM on this GPU (Hopper and newer)")

    def _gpm_sample(self, gpu_instance: int | None) -> Any:
        """A fresh GPM sample of the GPU (or of one MIG GPU instance); freed here if taking it fails."""
        sample = self._nvml(pynvml.nvmlGpmSampleAlloc)
        try:
            if gpu_instance is None:
                self._read("gpm", pynvml.nvmlGpmSampleGet, sample)
            else:
                self._read("gpm_mig", pynvml.nvmlGpmMigSampleGet, gpu_instance, sample)
        except DeviceError:
            self._gpm_free(sample)
            raise
        return sample

    def _gpm_free(self, sample: Any) -> None:
        try:
            self._nvml(pynvml.nvmlGpmSampleFree, sample)
        except DeviceError as error:
            log.debug("GPU %d: nvmlGpmSampleFree failed: %s", self.index, error)

    def _gpm_values(self, first: Any, second: Any, keys: tuple[str, ...]) -> dict[str, float]:
        """nvmlGpmMetricsGet over two samples; metrics NVML did not give are left out."""
        wanted = [(key, getattr(pynvml, GPM_METRICS[key][0], None), GPM_METRICS[key][1]) for key in keys]
        wanted = [item for item in wanted if item[1] is not None]
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = first
        request.sample2 = second
        for i, (_, metric_id, _) in enumerate(wanted):
            request.metrics[i].metricId = metric_id
        result = self._nvml(pynvml.nvmlGpmMetricsGet, request)
        values: dict[str, float] = {}
        for i, (key, _, factor) in enumerate(wanted):
            metric = result.metrics[i]
            if int(metric.nvmlReturn) != pynvml.NVML_SUCCESS or not math.isfinite(metric.value):
                continue
            value = float(metric.value) * factor
            values[key] = min(1.0, max(0.0, value)) if factor < 1.0 else max(0.0, value)
        return values

    def _gpm_round(self, gpu_instance: int | None, keys: tuple[str, ...]) -> GpmMetrics:
        """Take a sample, compute the metrics against the previous one, keep the new one, free the old."""
        with self._gpm_lock:
            previous = self._gpm_samples.pop(gpu_instance, None)
            if previous is None:
                previous = (self._gpm_sample(gpu_instance), time.monotonic())
                time.sleep(GPM_FIRST_INTERVAL_SECONDS)
            try:
                current = (self._gpm_sample(gpu_instance), time.monotonic())
            except DeviceError:
                self._gpm_samples[gpu_instance] = previous  # still valid for the next round
                raise
            self._gpm_samples[gpu_instance] = current
            try:
                values = self._gpm_values(previous[0], current[0], keys)
            finally:
                self._gpm_free(previous[0])
        return GpmMetrics(values=values, interval_seconds=current[1] - previous[1])

    def gpm_metrics(self) -> GpmMetrics:
        """GPM ratios (NVML: percent) and PCIe/NVLink rates (NVML: MiB/s -> bytes/s) since the last call.

        The sample is kept for the next call and the older one freed (nvmlGpmSampleFree); the
        first call takes two samples GPM_FIRST_INTERVAL_SECONDS apart. NotSupported without GPM.
        """
        self._gpm_supported()
        return self._gpm_round(None, GPM_FIELDS)

    def release_gpm(self) -> None:
        """Free every kept GPM sample (at close)."""
        with self._gpm_lock:
            samples, self._gpm_samples = list(self._gpm_samples.values()), {}
        for sample, _ in samples:
            self._gpm_free(sample)

    def memory_temperature_celsius(self) -> float:
        """HBM temperature in Celsius (field NVML_FI_DEV_MEMORY_TEMP, ~1.1 ms on an H200)."""
        (value,) = self._fields("memory_temperature", [pynvml.NVML_FI_DEV_MEMORY_TEMP])
        assert value is not None  # _fields raises when every entry is unsupported
        return value

    def remapped_rows(self) -> RemappedRows:
        """Rows remapped for correctable/uncorrectable errors, pending and failure flags (~1 ms)."""
        corr, unc, pending, failure = self._read("remapped_rows", pynvml.nvmlDeviceGetRemappedRows)
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def retired_pages(self) -> RetiredPages:
        """Retired page counts by cause; NotSupported on GPUs that remap rows instead (Hopper)."""
        single = self._read(
            "retired_pages", pynvml.nvmlDeviceGetRetiredPages,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        double = self._read(
            "retired_pages", pynvml.nvmlDeviceGetRetiredPages, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        return RetiredPages(multiple_single_bit_ecc=len(single), double_bit_ecc=len(double))

    def violation_seconds(self) -> dict[str, float]:
        """Violation time by reason, seconds (NVML: violationTime in ns); unsupported policies left out."""
        out: dict[str, float] = {}
        for reason, policy in VIOLATION_POLICIES.items():
            status = self._optional(f"violation_{reason}", pynvml.nvmlDeviceGetViolationStatus, getattr(pynvml, policy))
            if status is not None:
                out[reason] = int(status.violationTime) / 1e9
        if not out:
            raise NotSupported(f"GPU {self.index}: no violation policy is supported")
        return out

    def pcie_replays(self) -> int:
        """PCIe replay counter since the driver loaded."""
        return int(self._read("pcie_replays", pynvml.nvmlDeviceGetPcieReplayCounter))

    def pcie_link(self) -> PcieLink:
        """Current and maximum PCIe link generation and width (the maximum is the lower of the
        GPU's and the slot's, as nvidia-smi's "Max"; ~1 us each)."""
        return PcieLink(
            generation=int(self._read("pcie_link_generation", pynvml.nvmlDeviceGetCurrPcieLinkGeneration)),
            width=int(self._read("pcie_link_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth)),
            max_generation=int(self._read("pcie_link_max_generation", pynvml.nvmlDeviceGetMaxPcieLinkGeneration)),
            max_width=int(self._read("pcie_link_max_width", pynvml.nvmlDeviceGetMaxPcieLinkWidth)),
        )

    def gpu_recovery_action(self) -> int:
        """Field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (id 230): 0 none, 1 GPU reset, 2 node reboot,
        3 drain P2P, 4 drain and reset. NotSupported where the driver does not report it."""
        (value,) = self._fields("gpu_recovery_action", [_GPU_RECOVERY_ACTION_FIELD])
        assert value is not None  # _fields raises when every entry is unsupported
        return int(value)

    def codec_utilization(self) -> CodecUtilization:
        """Encoder and decoder utilization (NVML: percent -> ratio); NotSupported if neither is there."""
        encoder = self._optional("encoder", pynvml.nvmlDeviceGetEncoderUtilization)
        decoder = self._optional("decoder", pynvml.nvmlDeviceGetDecoderUtilization)
        if encoder is None and decoder is None:
            raise NotSupported(f"GPU {self.index}: no video encoder or decoder utilization")
        return CodecUtilization(
            encoder_ratio=None if encoder is None else encoder[0] / 100.0,
            decoder_ratio=None if decoder is None else decoder[0] / 100.0,
        )

    def _nvlink_link_numbers(self) -> tuple[int, ...]:
        """Links that answer nvmlDeviceGetNvLinkState, found once; NotSupported (remembered) if none."""
        if self._nvlink_links is None:
            found = []
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    self._nvml(pynvml.nvmlDeviceGetNvLinkState, self._handle, link)
                except (NotSupported, InvalidArgument, UnknownDeviceError):
                    continue
                found.append(link)
            self._nvlink_links = tuple(found)
        if not self._nvlink_links:
            with self._lock:
                self._unsupported.add("nvlink")
            raise NotSupported(f"GPU {self.index}: no NVLink")
        return self._nvlink_links

    def nvlink(self) -> NvLinkStatus:
        """Per-link state, errors by type summed over links, and data bytes sent/received
        (fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX over all links; KiB -> bytes)."""
        with self._lock:
            if "nvlink" in self._unsupported:
                raise NotSupported(f"GPU {self.index}: no NVLink (checked earlier)")
        numbers = self._nvlink_link_numbers()
        links = tuple(
            (link, bool(self._read("nvlink", pynvml.nvmlDeviceGetNvLinkState, link))) for link in numbers
        )
        errors: dict[str, int] = {}
        for kind, counter in NVLINK_ERROR_COUNTERS.items():
            total = None
            for link in numbers:
                count = self._optional(
                    f"nvlink_error_{kind}", pynvml.nvmlDeviceGetNvLinkErrorCounter, link, getattr(pynvml, counter)
                )
                if count is not None:
                    total = (total or 0) + int(count)
            if total is not None:
                errors[kind] = total
        tx = rx = None
        try:
            tx_kib, rx_kib = self._fields("nvlink_throughput", [
                (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS_SCOPE),
                (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS_SCOPE),
            ])
            tx = None if tx_kib is None else tx_kib * 1024.0
            rx = None if rx_kib is None else rx_kib * 1024.0
        except NotSupported:
            pass
        return NvLinkStatus(links=links, errors=errors, tx_bytes_total=tx, rx_bytes_total=rx)

    def _fabric_info(self) -> Any:
        """nvmlDeviceGetGpuFabricInfoV (the struct versions this nvidia-ml-py has, newest first), else
        the unversioned nvmlDeviceGetGpuFabricInfo. The versioned call first: on a 2x H200 slice of an
        NVSwitch board (driver 580) the unversioned one answered NOT_SUPPORTED where nvidia-smi (and
        the versioned call) said Completed/Success. A driver that does not know a struct version
        answers ARGUMENT_VERSION_MISMATCH; one without the call, FUNCTION_NOT_FOUND (NotSupported)."""
        with self._lock:
            if "fabric" in self._unsupported:
                raise NotSupported(f"GPU {self.index}: GPU fabric is not supported (checked earlier)")
        if self._fabric_call is not None:
            calls = [self._fabric_call]
        else:
            calls = [(pynvml.nvmlDeviceGetGpuFabricInfoV, getattr(pynvml, name))
                     for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")
                     if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV") and hasattr(pynvml, name)]
            if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfo") and hasattr(pynvml, "c_nvmlGpuFabricInfo_t"):
                calls.append((pynvml.nvmlDeviceGetGpuFabricInfo, pynvml.c_nvmlGpuFabricInfo_t))
        for fn, struct in calls:
            info = struct()
            try:
                self._nvml(fn, self._handle, ctypes.byref(info))
                self._fabric_call = (fn, struct)
                return info
            except NotSupported:
                continue  # FUNCTION_NOT_FOUND: an older driver; the next call
            except UnknownDeviceError as exc:
                if not isinstance(exc.__cause__, pynvml.NVMLError) or exc.__cause__.value != _VERSION_MISMATCH:
                    raise
        with self._lock:
            self._unsupported.add("fabric")
        raise NotSupported(f"GPU {self.index}: this driver or nvidia-ml-py has no GPU fabric call")

    def fabric_state(self) -> FabricState:
        """The GPU fabric's state: NotSupported on a board without an NVSwitch fabric (NVML's state
        NOT_SUPPORTED, or a driver without the call). ``status`` is nvmlErrorString of the fabric's
        status when it is not NVML_SUCCESS. Read with the versioned call (see _fabric_info)."""
        info = self._fabric_info()
        state = _FABRIC_STATES.get(int(info.state))
        if state is None:
            raise UnknownDeviceError(f"GPU {self.index}: unknown GPU fabric state {int(info.state)}")
        if state == "not_supported":
            with self._lock:
                self._unsupported.add("fabric")
            raise NotSupported(f"GPU {self.index}: no GPU fabric (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)")
        status = None
        if state == "completed" and int(info.status) != pynvml.NVML_SUCCESS:
            status = _text(self._nvml(pynvml.nvmlErrorString, int(info.status)))
        cluster = bytes(info.clusterUuid)
        return FabricState(state, status, int(info.cliqueId) if state == "completed" else None,
                           cluster.hex() if any(cluster) else None)

    def nvlink_remote_bus_ids(self) -> list[str]:
        """The PCI bus id at the far end of each NVLink that is up (nvmlDeviceGetNvLinkRemotePciInfo),
        upper case; a GPU of this node or an NVSwitch. NotSupported without NVLink."""
        remotes = []
        for link, up in self.nvlink_states():
            if not up:
                continue
            try:
                pci = self._nvml(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, self._handle, link)
            except (NotSupported, InvalidArgument):
                continue  # a link that is up but has no far end to name: not counted
            remotes.append(_bus_id(pci.busId))
        return remotes

    def nvlink_states(self) -> list[tuple[int, bool]]:
        """(link, up) of every NVLink NVML lists (NotSupported without NVLink)."""
        return [(link, bool(self._read("nvlink", pynvml.nvmlDeviceGetNvLinkState, link)))
                for link in self._nvlink_link_numbers()]

    def mig_enabled(self) -> bool:
        """True when MIG is on now (nvmlDeviceGetMigMode's current mode)."""
        current, _pending = self._read("mig", pynvml.nvmlDeviceGetMigMode)
        return int(current) == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_instances(self) -> list[MigInstance]:
        """Each MIG device: GPU/compute instance ids, its memory, and GPM of its GPU instance
        (nvmlGpmMigSampleGet; None where GPM is unsupported). [] with MIG off."""
        if not self.mig_enabled():
            return []
        count = int(self._read("mig", pynvml.nvmlDeviceGetMaxMigDeviceCount))
        gpm_ok = True
        try:
            self._gpm_supported()
        except NotSupported:
            gpm_ok = False
        gpm_by_instance: dict[int, GpmMetrics | None] = {}
        instances = []
        for slot in range(count):
            try:
                mig = self._nvml(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, self._handle, slot)
            except (InvalidArgument, NotSupported, UnknownDeviceError):
                continue  # an empty slot
            gi = int(self._nvml_mig(slot, pynvml.nvmlDeviceGetGpuInstanceId, mig))
            ci = int(self._nvml_mig(slot, pynvml.nvmlDeviceGetComputeInstanceId, mig))
            memory = self._nvml_mig(slot, pynvml.nvmlDeviceGetMemoryInfo, mig)
            if gpm_ok and gi not in gpm_by_instance:
                try:
                    gpm_by_instance[gi] = self._gpm_round(gi, MIG_GPM_FIELDS)
                except NotSupported:
                    gpm_by_instance[gi] = None
            instances.append(MigInstance(
                gpu_instance=gi, compute_instance=ci, memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total), gpm=gpm_by_instance.get(gi),
            ))
        return instances


class NvmlBackend(Backend):
    """All (or the selected) GPUs of this node through NVML.

    NVML is initialized on first use (devices(), driver_version(), wait_xid_events()),
    once, under a lock. Without a driver that first use raises :class:`DriverNotFound`,
    whose message suggests ``gpuperfd run --simulate N``.
    """

    name = "nvml"

    def __init__(self, indices: list[int] | None = None, call_timeout_seconds: float | None = None) -> None:
        """``indices``: NVML indices of the GPUs to manage (None: every GPU on the node);
        ``call_timeout_seconds``: after this long inside NVML a call is set aside as hung
        (:data:`GATE`, process-wide; None keeps the gate's setting)."""
        if call_timeout_seconds is not None:
            GATE.hang_seconds = call_timeout_seconds
        self._indices = None if indices is None else sorted(set(indices))
        self._lock = threading.Lock()
        self._initialized = False
        self._devices: list[NvmlDevice] | None = None
        self._driver_version: str | None = None
        # XID events: created and registered on the first wait_xid_events call.
        self._xid_lock = threading.Lock()
        self._event_set: Any = None
        self._xid_registered: set[int] = set()  # GPU indices
        self._xid_by_address: dict[int, int] = {}  # device handle pointer -> GPU index
        self._xid_unsupported: set[int] = set()
        self._xid_failed: set[int] = set()  # GPUs whose registration failed (warned once)

    def _ensure_init(self) -> None:
        """nvmlInit once; DriverNotFound (with the --simulate hint) when there is no driver."""
        with self._lock:
            if self._initialized:
                return
            try:
                _call("NVML", pynvml.nvmlInit)
            except OSError as error:  # libnvidia-ml present but unloadable
                raise DriverNotFound(
                    f"no NVIDIA driver found: cannot load libnvidia-ml ({error}). {_SIMULATE_HINT}"
                ) from error
            self._initialized = True

    def devices(self) -> list[Device]:
        """The selected GPUs, in index order; InvalidArgument if a selected index does not exist."""
        self._ensure_init()
        with self._lock:
            if self._devices is None:
                count = _call("NVML", pynvml.nvmlDeviceGetCount)
                indices = list(range(count)) if self._indices is None else self._indices
                missing = [i for i in indices if not 0 <= i < count]
                if missing:
                    present = f"indices 0-{count - 1}" if count else "none"
                    raise InvalidArgument(
                        f"GPU index {', '.join(map(str, missing))} not found: "
                        f"this node has {count} GPU(s) ({present})"
                    )
                self._devices = [
                    NvmlDevice(self, i, _call(f"GPU {i}", pynvml.nvmlDeviceGetHandleByIndex, i, scope=i))
                    for i in indices
                ]
            return list(self._devices)

    def topology(self) -> list[PeerLink]:
        """Every pair of the selected GPUs once: PCIe path (nvmlDeviceGetTopologyCommonAncestor),
        NVLinks up joining them (directly or through NVSwitch, from each link's remote PCI info) and
        whether peer reads work (nvmlDeviceGetP2PStatus). Read-only; a few hundred NVML calls on 8 GPUs."""
        devices = [d for d in self.devices() if isinstance(d, NvmlDevice)]
        bus = {d.index: _bus_id(d.info().pci_bus_id) for d in devices}
        remotes: dict[int, list[str] | None] = {}
        for device in devices:
            try:
                remotes[device.index] = device.nvlink_remote_bus_ids()
            except NotSupported:
                remotes[device.index] = None
        return [_pair_link(a, b, remotes, bus) for i, a in enumerate(devices) for b in devices[i + 1:]]

    def driver_version(self) -> str:
        """The NVIDIA driver version, e.g. "580.159.04" (read once)."""
        self._ensure_init()
        with self._lock:
            if self._driver_version is None:
                self._driver_version = _text(_call("NVML", pynvml.nvmlSystemGetDriverVersion))
            return self._driver_version

    def _register_xid(self) -> None:
        """Create the event set and register XID events for GPUs not yet registered (under _xid_lock)."""
        if self._event_set is None:
            self._event_set = _call("NVML", pynvml.nvmlEventSetCreate)
        for device in self.devices():
            if device.index in self._xid_unsupported or device.index in self._xid_registered:
                continue
            try:
                _call(
                    f"GPU {device.index}",
                    pynvml.nvmlDeviceRegisterEvents,
                    device.handle,
                    pynvml.nvmlEventTypeXidCriticalError,
                    self._event_set,
                    scope=device.index,
                )
            except NotSupported:
                self._xid_unsupported.add(device.index)
                log.debug("GPU %d does not report XID events", device.index)
                continue
            except DeviceError as error:
                if device.index not in self._xid_failed:
                    self._xid_failed.add(device.index)
                    log.warning(
                        "GPU %d: cannot register for XID events (will retry): %s", device.index, error
                    )
                continue
            self._xid_registered.add(device.index)
            address = _handle_address(device.handle)
            if address is not None:
                self._xid_by_address[address] = device.index

    def _xid_gpu_index(self, handle: Handle) -> int:
        """Our index for the GPU an event came from: by handle pointer, else nvmlDeviceGetIndex, else -1."""
        address = _handle_address(handle)
        if address is not None and address in self._xid_by_address:
            return self._xid_by_address[address]
        try:
            return int(_call("NVML", pynvml.nvmlDeviceGetIndex, handle))
        except DeviceError as error:
            log.warning("XID event from a GPU that cannot be identified (reported as GPU -1): %s", error)
            return -1

    def wait_xid_events(self, timeout_seconds: float) -> list[XidEvent]:
        """Wait up to ``timeout_seconds`` for XID (critical error) events; [] when none came.

        NVML's wait blocks inside the library, which would hold the gate (:data:`GATE`) and stop
        every other call: so the event set is polled (a zero-timeout wait, one ioctl) every
        XID_POLL_SECONDS, sleeping outside the library between polls.

        On the first call the GPUs are registered for XID events; GPUs that cannot report
        them are remembered and skipped. Raises NotSupported (at once) when no selected GPU
        reports XID events. After a first event, any others already queued are returned too.
        Timestamps are the time the event was received (time.time()).
        """
        with self._xid_lock:
            self._register_xid()
            if not self._xid_registered:
                raise NotSupported("no selected GPU can report XID events")
            event_set = self._event_set
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        while True:
            events = self._collect_xid(event_set)
            remaining = deadline - time.monotonic()
            if events or remaining <= 0:
                return events
            time.sleep(min(XID_POLL_SECONDS, remaining))

    def _collect_xid(self, event_set: Any) -> list[XidEvent]:
        """The XID events queued now (each a zero-timeout wait); [] when none."""
        events: list[XidEvent] = []
        for _ in range(_MAX_EVENTS_PER_WAIT):
            try:
                data = _call("NVML", pynvml.nvmlEventSetWait_v2, event_set, 0)
            except DeviceTimeout:
                break
            except DeviceError:
                if not events:
                    raise
                log.warning("error while collecting further XID events", exc_info=True)
                break
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                gpu_index = self._xid_gpu_index(data.device)
                events.append(XidEvent(gpu_index=gpu_index, xid=int(data.eventData), timestamp=time.time()))
        return events

    def close(self) -> None:
        """Free the event set and shut NVML down; safe to call twice (later calls do nothing)."""
        with self._xid_lock:
            if self._event_set is not None:
                try:
                    _call("NVML", pynvml.nvmlEventSetFree, self._event_set)
                except DeviceError as error:
                    log.debug("nvmlEventSetFree failed: %s", error)
                self._event_set = None
                self._xid_registered.clear()
                self._xid_by_address.clear()
                self._xid_unsupported.clear()
                self._xid_failed.clear()
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            for device in self._devices or []:
                device.release_gpm()
            self._devices = None
            self._driver_version = None
            try:
                _call("NVML", pynvml.nvmlShutdown)
            except DeviceError as error:
                log.debug("nvmlShutdown failed: %s", error)
