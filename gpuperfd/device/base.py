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
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuperfd.device.errors import NotSupported

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


@dataclass(frozen=True)
class GpmActivity:
    """GPM-style activity ratios (0..1), as NVML's GPM metrics report them (percent / 100).

    ``sm_active``: SMs with a warp resident; ``sm_occupancy``: resident warps
    over the maximum; ``tensor_active``, ``fp16/fp32/fp64_active``: cycles the
    pipe is busy; ``dram_active``: DRAM bandwidth used over the peak.
    """

    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    fp16_active: float
    fp32_active: float
    fp64_active: float

    @staticmethod
    def mix(parts: Sequence[tuple[float, GpmActivity]]) -> GpmActivity:
        """Sum of ``weight * activity`` per field (weights are time shares)."""
        return GpmActivity(
            **{f.name: sum(w * getattr(a, f.name) for w, a in parts) for f in dataclasses.fields(GpmActivity)}
        )


#: GPM fields the device layer reports, by key: ratios (0..1) and rates (bytes/s).
#: ``tensor_*``: tensor pipes by precision (any; hmma: fp16/bf16/tf32/fp8 matrix ops;
#: imma: integer; dfma: fp64); ``fp16/fp32/fp64``: the non-tensor pipes.
GPM_FIELDS: tuple[str, ...] = (
    "sm_active",
    "sm_occupancy",
    "tensor_any",
    "tensor_hmma",
    "tensor_imma",
    "tensor_dfma",
    "dram_active",
    "fp16",
    "fp32",
    "fp64",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)


@dataclass(frozen=True)
class GpmMetrics:
    """GPM rates over the interval between two GPM samples.

    ``values`` maps keys of GPM_FIELDS to ratios (0..1) or bytes/s; a metric the
    GPU did not give is absent (never NaN). ``interval_seconds``: time between the samples.
    """

    values: Mapping[str, float]
    interval_seconds: float

    def activity(self) -> GpmActivity | None:
        """The ratios as a GpmActivity (None unless every ratio it needs is present)."""
        keys = {
            "sm_active": "sm_active", "sm_occupancy": "sm_occupancy", "tensor_active": "tensor_any",
            "dram_active": "dram_active", "fp16_active": "fp16", "fp32_active": "fp32", "fp64_active": "fp64",
        }
        if not all(key in self.values for key in keys.values()):
            return None
        return GpmActivity(**{name: self.values[key] for name, key in keys.items()})


@dataclass(frozen=True)
class RemappedRows:
    """HBM row remapping: rows remapped for correctable and uncorrectable errors (since
    manufacture), a remap waiting for a GPU reset, and a failed remap (the GPU needs service)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class PcieLink:
    """PCIe link generation and width: as trained now, and the most the GPU and slot allow.

    Links train down at idle to save power on many boards, so a current value below the
    maximum means something only while the GPU is busy (the health check counts busy samples).
    """

    generation: int
    width: int
    max_generation: int
    max_width: int


@dataclass(frozen=True)
class RetiredPages:
    """Pages retired (pre-Ampere page retirement) by cause."""

    multiple_single_bit_ecc: int
    double_bit_ecc: int


#: Violation (clock held back) policies, as label values, in NVML's NVML_PERF_POLICY_* order.
VIOLATION_REASONS: tuple[str, ...] = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
)


@dataclass(frozen=True)
class CodecUtilization:
    """Video encoder and decoder busy ratio (0..1); None where the GPU lacks one."""

    encoder_ratio: float | None
    decoder_ratio: float | None


#: NVLink error counter types, as label values, in NVML_NVLINK_ERROR_DL_* order.
NVLINK_ERROR_TYPES: tuple[str, ...] = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")


@dataclass(frozen=True)
class NvLinkStatus:
    """NVLink state of one GPU.

    ``links``: (link number, up) for every link the GPU has; ``errors``: error
    counts by NVLINK_ERROR_TYPES summed over the links (monotonic); ``tx/rx_bytes_total``:
    data bytes sent and received over every link since the driver loaded (None if unsupported).
    """

    links: tuple[tuple[int, bool], ...]
    errors: Mapping[str, int]
    tx_bytes_total: float | None = None
    rx_bytes_total: float | None = None


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: its GPU instance and compute instance ids, memory, and GPM of its GPU instance."""

    gpu_instance: int
    compute_instance: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    gpm: GpmMetrics | None = None


#: How two GPUs reach each other, as ``nvidia-smi topo -m`` names it: NVLink (direct or through
#: NVSwitch), or PCIe through a switch (PIX/PXB), the host bridge (PHB), the NUMA node (NODE) or
#: across sockets (SYS). "none": no peer path at all.
PEER_PATHS: tuple[str, ...] = ("nvlink", "pix", "pxb", "phb", "node", "sys", "none")

#: NVML's GPU fabric states (nvmlDeviceGetGpuFabricInfoV), as label values.
FABRIC_STATES: tuple[str, ...] = ("not_supported", "not_started", "in_progress", "completed")


@dataclass(frozen=True)
class PeerLink:
    """How one unordered pair of GPUs of a node is linked (the interconnect probe's expected figure,
    and the link-count check, come from it).

    ``nvlink_links``: NVLinks joining the pair (0 on a PCIe path); ``via_nvswitch``: the pair meets in
    an NVSwitch (HGX 8-GPU boards) rather than by direct links (NV18 on a 2-GPU H200 NVL pair);
    ``p2p``: whether peer copies are possible (NVML's P2P status; None: not told)."""

    gpu_a: int
    gpu_b: int
    path: str
    nvlink_links: int = 0
    via_nvswitch: bool = False
    p2p: bool | None = None


@dataclass(frozen=True)
class FabricState:
    """The GPU fabric's state for one GPU (NVLink fabric of NVSwitch systems, managed by the Fabric
    Manager): ``state`` one of FABRIC_STATES; ``status`` None when it completed well, else NVML's
    error text; ``clique_id``/``cluster_uuid`` where the driver reports them."""

    state: str
    status: str | None = None
    clique_id: int | None = None
    cluster_uuid: str | None = None


def _unsupported(device: object, what: str) -> NotSupported:
    return NotSupported(f"GPU {getattr(device, 'index', '?')}: {what} is not supported by this backend")


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

    # --- deeper telemetry: slow-lane reads; NotSupported unless a backend has them ---

    def gpm_metrics(self) -> GpmMetrics:
        """GPM rates since this device's previous call (Hopper and newer).

        Each call takes one GPM sample and keeps it for the next; the first call takes
        two samples a short interval apart. NVML: ~0.7 ms a sample and ~4 ms for the
        metrics (H200), so slow lane only. NotSupported on GPUs without GPM.
        """
        raise _unsupported(self, "GPM")

    def memory_temperature_celsius(self) -> float:
        """HBM (memory) temperature in degrees Celsius (NVML field value, ~1.1 ms)."""
        raise _unsupported(self, "memory temperature")

    def remapped_rows(self) -> RemappedRows:
        """Row-remapping state (Ampere and newer HBM parts)."""
        raise _unsupported(self, "row remapping")

    def retired_pages(self) -> RetiredPages:
        """Retired pages by cause (pre-Ampere page retirement; NotSupported on Hopper)."""
        raise _unsupported(self, "page retirement")

    def violation_seconds(self) -> dict[str, float]:
        """Seconds the clock was held back since the driver loaded, by VIOLATION_REASONS
        (policies the GPU does not report are left out); monotonic."""
        raise _unsupported(self, "violation status")

    def pcie_replays(self) -> int:
        """PCIe replay (link-level retransmission) count since the driver loaded; monotonic."""
        raise _unsupported(self, "PCIe replay counter")

    def pcie_link(self) -> PcieLink:
        """Current and maximum PCIe link generation and width."""
        raise _unsupported(self, "PCIe link state")

    def gpu_recovery_action(self) -> int:
        """The driver's GPU recovery action (nvmlGpuRecoveryAction_t: 0 none, 1 GPU reset,
        2 node reboot, 3 drain P2P, 4 drain and reset); NotSupported on older drivers."""
        raise _unsupported(self, "GPU recovery action")

    def codec_utilization(self) -> CodecUtilization:
        """Video encoder and decoder utilization over the driver's sampling period."""
        raise _unsupported(self, "encoder/decoder utilization")

    def nvlink(self) -> NvLinkStatus:
        """NVLink per-link state, errors and traffic; NotSupported without NVLink."""
        raise _unsupported(self, "NVLink")

    def fabric_state(self) -> FabricState:
        """The GPU fabric's state (NVSwitch systems); NotSupported where the board has none."""
        raise _unsupported(self, "GPU fabric state")

    def mig_enabled(self) -> bool:
        """True when MIG mode is on now (the current mode, not a pending one)."""
        raise _unsupported(self, "MIG")

    def mig_instances(self) -> list[MigInstance]:
        """The MIG devices of this GPU ([] with MIG off), with memory and GPM per GPU instance."""
        raise _unsupported(self, "MIG")


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

    def topology(self) -> list[PeerLink]:
        """Every unordered pair of this node's GPUs once, (0, 1), (0, 2), ... (NotSupported: not told)."""
        raise NotSupported(f"{self.name}: GPU topology is not supported by this backend")

    def close(self) -> None:
        """Release the library (nvmlShutdown); safe to call twice."""
