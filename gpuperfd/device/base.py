"""The one device interface every part of gpuperfd talks to.

Two implementations exist: :mod:`gpuperfd.device.nvml` (real GPUs through
nvidia-ml-py) and :mod:`gpuperfd.device.simulated` (a physics-like model used by
tests and the demo). Units inside the code are SI base units: watts, joules,
seconds, bytes, hertz, celsius, ratios in [0, 1]. Implementations convert from
their library's units (mW, mJ, MiB, MHz, percent) at this boundary.

A getter raises :class:`~gpuperfd.device.errors.NotSupported` for a field the
GPU does not have; callers leave that sample out. Other failures raise the other
:class:`~gpuperfd.device.errors.DeviceError` subclasses.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

#: Clock-event (throttle) reasons, as stable label values, in NVML bit order.
CLOCK_EVENT_REASONS: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)


@dataclass(frozen=True)
class GpuInfo:
    """Static identity of one GPU, read once at start."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    driver_version: str
    compute_capability: str  # "9.0"
    memory_total_bytes: int
    backend: str  # "nvml" or "simulated"
    serial: str = ""


@dataclass(frozen=True)
class Utilization:
    """Share of the last sample period the GPU (SMs) and memory controller were busy."""

    gpu_ratio: float
    memory_ratio: float


@dataclass(frozen=True)
class MemoryUsage:
    used_bytes: int
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Clocks:
    """Current and maximum clocks in hertz."""

    sm_hertz: float
    memory_hertz: float
    graphics_hertz: float | None = None
    sm_max_hertz: float | None = None
    memory_max_hertz: float | None = None


@dataclass(frozen=True)
class PowerLimits:
    """Power limits in watts: the one enforced now, the default and the allowed range."""

    enforced_watts: float
    default_watts: float
    min_watts: float
    max_watts: float

    def clamp(self, watts: float) -> float:
        """The nearest limit the GPU accepts."""
        return min(self.max_watts, max(self.min_watts, watts))


@dataclass(frozen=True)
class PcieThroughput:
    """PCIe traffic over the driver's sampling window, bytes per second."""

    tx_bytes_per_second: float
    rx_bytes_per_second: float


@dataclass(frozen=True)
class EccErrors:
    """ECC error counts since the driver loaded (volatile), monotonic."""

    corrected_total: int
    uncorrected_total: int


@dataclass(frozen=True)
class ComputeProcess:
    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True)
class XidEvent:
    """One XID (critical error) event reported by the driver."""

    gpu_index: int
    xid: int
    timestamp: float = 0.0


@dataclass
class ClockEvents:
    """Active clock-event reasons (the set of names in CLOCK_EVENT_REASONS that are on)."""

    active: frozenset[str] = field(default_factory=frozenset)


class Device(abc.ABC):
    """One GPU. Methods are thread-safe; each may raise a DeviceError."""

    index: int

    @abc.abstractmethod
    def info(self) -> GpuInfo:
        """Static identity (cached by implementations)."""

    @abc.abstractmethod
    def utilization(self) -> Utilization: ...

    @abc.abstractmethod
    def memory(self) -> MemoryUsage: ...

    @abc.abstractmethod
    def temperature_celsius(self) -> float: ...

    @abc.abstractmethod
    def power_watts(self) -> float:
        """Power draw as the driver reports it (averaged, lags by up to a second)."""

    @abc.abstractmethod
    def energy_joules(self) -> float:
        """Total energy since the driver loaded, monotonic. Slow on NVML (~3 ms)."""

    @abc.abstractmethod
    def power_limits(self) -> PowerLimits: ...

    @abc.abstractmethod
    def set_power_limit(self, watts: float) -> None:
        """Set the enforced power limit; raises InvalidArgument outside [min, max]."""

    @abc.abstractmethod
    def clocks(self) -> Clocks: ...

    @abc.abstractmethod
    def clock_events(self) -> ClockEvents: ...

    @abc.abstractmethod
    def pcie_throughput(self) -> PcieThroughput:
        """Slow on NVML (~21 ms per direction): call from the background sampler only."""

    @abc.abstractmethod
    def ecc_errors(self) -> EccErrors: ...

    @abc.abstractmethod
    def compute_processes(self) -> list[ComputeProcess]: ...

    def mig_uuids(self) -> list[str]:
        """UUIDs of this GPU's MIG devices (``MIG-...``): the ids the kubelet lists for MIG pods.

        Empty when MIG is off; NotSupported on GPUs without MIG (the default here).
        """
        from gpuperfd.device.errors import NotSupported

        raise NotSupported(f"GPU {self.index}: MIG is not supported")


class Backend(abc.ABC):
    """A set of GPUs behind one library (NVML, or the simulator)."""

    name: str

    @abc.abstractmethod
    def devices(self) -> list[Device]:
        """Every GPU this backend manages, in index order."""

    @abc.abstractmethod
    def driver_version(self) -> str: ...

    @abc.abstractmethod
    def wait_xid_events(self, timeout_seconds: float) -> list[XidEvent]:
        """Block up to timeout for XID events; return those seen (possibly none)."""

    def close(self) -> None:
        """Release the library (nvmlShutdown); safe to call twice."""
