"""A physics-like simulated GPU: the second implementation of the device interface.

Tests, the demo and CI run the whole daemon (collectors, sampler, power-cap
sweeps) against this module instead of NVML. It is a model, not a mock: a GPU
here has an operating point (SM clock, power, throughput) that follows from the
workload it runs and the power cap it is given, an energy counter that is the
exact integral of its power, a temperature that follows power with a lag, and
faults, XID events and ECC errors that appear on a schedule (from
:class:`~gpuperfd.config.SimulationConfig`) or when a test injects them.

The physics, per GPU model (:class:`GpuModel`) and workload
(:class:`WorkloadProfile`), with ``x = f_sm / f_sm_max`` (the SM clock ratio):

* busy power ``P(x) = P_idle + activity * (P_static_busy + P_dynamic * x**3)``;
  dynamic power goes with f*V**2 and V roughly with f, hence the cube;
* a power cap lowers ``x`` until ``P(x) <= cap`` (closed form; never below the
  model's minimum clock);
* throughput ``T(x) = U / (c / (x * s_compute) + (1 - c) / (b * s_memory))``:
  a share ``c`` of each unit's time scales with the SM clock, the rest with
  memory bandwidth ``b`` (1 on a healthy part); ``U`` is the rate of an H100 at
  full clock and ``s_*`` scale it to other models;
* energy per unit ``E = P / T``.

The constants are chosen so that, for every workload preset on H100 and H200,
the cap with the lowest energy per unit among caps that keep throughput within
10% of the full-cap throughput lies strictly between the minimum and maximum
cap: the power-cap sweep has a non-trivial answer to find
(:meth:`SimulatedGpu.true_optimal_cap` gives it, for tests of the sweep).

Units are SI, as everywhere behind the device interface: watts, joules,
seconds, bytes, hertz, celsius, ratios in [0, 1]. Time comes from an injectable
clock and every wait goes through an injectable sleep, so tests run on a fake
clock without real waiting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from gpuperfd.config import DegradeConfig, FaultConfig, SimulationConfig
from gpuperfd.device.base import (
    Backend,
    ClockEvents,
    Clocks,
    ComputeProcess,
    Device,
    EccErrors,
    GpuInfo,
    MemoryUsage,
    PcieThroughput,
    PowerLimits,
    Utilization,
    XidEvent,
)
from gpuperfd.device.errors import (
    DeviceError,
    DeviceTimeout,
    GpuLost,
    InvalidArgument,
    NoPermission,
    NotSupported,
    UnknownDeviceError,
)

MIB = 1 << 20
GIB = 1 << 30
MHZ = 1e6

#: Driver version the simulated backend reports (the reference H200's, marked).
SIMULATED_DRIVER_VERSION = "580.159.04-sim"

#: Memory the driver and CUDA context hold on a GPU with any process on it, bytes.
BASE_MEMORY_BYTES = GIB // 2

#: Clock ratio left to a GPU that is thermally throttled while busy.
THERMAL_THROTTLE_CLOCK_FACTOR = 0.8
#: A throttled part runs hot: its thermal resistance is this many times the model's.
THERMAL_THROTTLE_RESISTANCE_FACTOR = 2.0

#: Longest single sleep in :meth:`SimulatedBackend.wait_xid_events`, seconds: it
#: returns at most this late after an event becomes due.
XID_POLL_STEP_SECONDS = 0.1

#: Relative standard deviation of the noise on power readings.
POWER_NOISE_RATIO = 0.005
#: Standard deviation of the noise on temperature readings, celsius.
TEMPERATURE_NOISE_CELSIUS = 0.2
#: Standard deviation of the noise on busy utilization readings (ratio).
UTILIZATION_NOISE = 0.01


@dataclass(frozen=True)
class GpuModel:
    """Static facts and physics constants of one GPU model.

    Powers in watts, clocks in hertz, memory in bytes, thermal resistance in
    kelvin per watt, the thermal time constant in seconds. ``compute_scale`` and
    ``memory_scale`` are this model's compute rate and memory bandwidth relative
    to an H100 SXM, which is what :attr:`WorkloadProfile.units_per_second_at_max`
    is quoted for.
    """

    key: str
    name: str
    compute_capability: str
    memory_total_bytes: int
    min_power_watts: float
    max_power_watts: float
    default_power_watts: float
    sm_max_hertz: float
    sm_min_hertz: float
    sm_idle_hertz: float
    memory_hertz: float
    idle_watts: float
    static_busy_watts: float
    dynamic_watts: float
    compute_scale: float
    memory_scale: float
    ambient_celsius: float = 30.0
    thermal_resistance_kelvin_per_watt: float = 0.06
    thermal_time_constant_seconds: float = 20.0
    pci_bus_base: int = 0x18

    @property
    def sm_min_ratio(self) -> float:
        """Lowest SM clock ratio a power cap can push the GPU to."""
        return self.sm_min_hertz / self.sm_max_hertz

    def busy_power_watts(self, activity: float, ratio: float) -> float:
        """Power at SM clock ratio ``ratio`` while running work of this activity, watts."""
        return self.idle_watts + activity * (self.static_busy_watts + self.dynamic_watts * ratio**3)


#: Model presets by the key SimulationConfig.model uses. Static busy power is
#: kept low enough (about 110 W on H100) that every model can hold its minimum
#: cap at its minimum clock, so an enforced cap is always met.
_H100 = GpuModel(
    key="H100",
    name="NVIDIA H100 80GB HBM3",
    compute_capability="9.0",
    memory_total_bytes=80 * GIB,
    min_power_watts=200.0,
    max_power_watts=700.0,
    default_power_watts=700.0,
    sm_max_hertz=1980 * MHZ,
    sm_min_hertz=210 * MHZ,
    sm_idle_hertz=345 * MHZ,
    memory_hertz=2619 * MHZ,
    idle_watts=78.0,
    static_busy_watts=110.0,
    dynamic_watts=502.0,  # P(1) = 690 W at activity 1
    compute_scale=1.0,
    memory_scale=1.0,
)

GPU_MODELS: dict[str, GpuModel] = {
    "H100": _H100,
    "H200": dataclasses.replace(  # an H100 with more, faster HBM3e
        _H100,
        key="H200",
        name="NVIDIA H200",
        memory_total_bytes=143771 * MIB,
        memory_hertz=3201 * MHZ,
        idle_watts=80.0,
        dynamic_watts=500.0,  # P(1) = 690 W at activity 1
        memory_scale=4.8 / 3.35,  # HBM3e 4.8 TB/s vs HBM3 3.35 TB/s
    ),
    "A100": GpuModel(
        key="A100",
        name="NVIDIA A100-SXM4-80GB",
        compute_capability="8.0",
        memory_total_bytes=80 * GIB,
        min_power_watts=100.0,
        max_power_watts=400.0,
        default_power_watts=400.0,
        sm_max_hertz=1410 * MHZ,
        sm_min_hertz=210 * MHZ,
        sm_idle_hertz=210 * MHZ,
        memory_hertz=1593 * MHZ,
        idle_watts=55.0,
        static_busy_watts=35.0,
        dynamic_watts=300.0,  # P(1) = 390 W at activity 1
        compute_scale=312 / 989,  # dense bf16 TFLOP/s vs H100 SXM
        memory_scale=2.04 / 3.35,
    ),
}


@dataclass(frozen=True)
class WorkloadProfile:
    """What a job does to a GPU, for the physics above.

    ``compute_fraction``: share (0..1) of one unit's time that scales with the
    SM clock; the rest is memory-bound and scales with memory bandwidth.
    ``units_per_second_at_max``: throughput of an H100 SXM at full clock with no
    binding cap (units are ``unit``: tokens, images, iterations).
    ``activity``: how hard it drives the SMs (0..1); scales busy power and is
    the reported GPU utilization. ``memory_bytes``: device memory it occupies.
    """

    name: str
    compute_fraction: float
    units_per_second_at_max: float
    activity: float
    memory_bytes: int
    unit: str = "units"

    def __post_init__(self) -> None:
        if not 0.0 <= self.compute_fraction <= 1.0:
            raise ValueError(f"compute_fraction {self.compute_fraction} outside [0, 1]")
        if not 0.0 <= self.activity <= 1.0:
            raise ValueError(f"activity {self.activity} outside [0, 1]")
        if self.units_per_second_at_max <= 0:
            raise ValueError(f"units_per_second_at_max {self.units_per_second_at_max} must be > 0")
        if self.memory_bytes < 0:
            raise ValueError(f"memory_bytes {self.memory_bytes} must be >= 0")


#: Workload presets, throughputs for an H100 SXM (scaled for other models by
#: GpuModel.compute_scale / memory_scale). Decode is memory-bound (the reference
#: puts GPT-2 batch-1 decode's bandwidth floor near 19,000 tokens/s); ViT-B/16
#: measured ~10,300 images/s on an H200.
WORKLOAD_PROFILES: dict[str, WorkloadProfile] = {
    "llm_decode": WorkloadProfile("llm_decode", 0.35, 19_000.0, 0.6, 4 * GIB, "tokens"),
    "llm_prefill": WorkloadProfile("llm_prefill", 0.9, 600_000.0, 1.0, 12 * GIB, "tokens"),
    "vit": WorkloadProfile("vit", 0.85, 11_000.0, 0.9, 6 * GIB, "images"),
    "attention": WorkloadProfile("attention", 0.8, 3_000.0, 0.95, 2 * GIB, "iterations"),
    "train": WorkloadProfile("train", 0.88, 150_000.0, 0.95, 40 * GIB, "tokens"),
}

#: What another user's job (add_foreign_process) does to the GPU when gpuperfd
#: runs nothing on it itself.
FOREIGN_PROFILE = WorkloadProfile("foreign", 0.8, 1.0, 0.95, 0, "units")


@dataclass(frozen=True)
class OperatingPoint:
    """Steady state of a GPU running one workload under one cap (no noise).

    ``clock_events`` are the reasons the clock is below the part's maximum
    (``sw_power_cap``, the thermal ones), as names from CLOCK_EVENT_REASONS.
    """

    sm_hertz: float
    power_watts: float
    units_per_second: float
    energy_per_unit_joules: float
    clock_events: frozenset[str]


def compute_operating_point(
    model: GpuModel,
    profile: WorkloadProfile,
    cap_watts: float,
    *,
    sm_clock_factor: float = 1.0,
    memory_bandwidth_factor: float = 1.0,
    thermal_throttle: bool = False,
) -> OperatingPoint:
    """The busy operating point of ``model`` running ``profile`` under ``cap_watts``.

    Pure. The clock ratio starts at the part's maximum (``sm_clock_factor``,
    times THERMAL_THROTTLE_CLOCK_FACTOR when throttled) and is lowered, in closed
    form, until power meets the cap; it never goes below the model's minimum
    clock, where power may stay above an unreachable cap.
    """
    if not cap_watts > 0:
        raise ValueError(f"cap_watts must be > 0, got {cap_watts}")
    events: set[str] = set()
    ratio = sm_clock_factor
    if thermal_throttle:
        ratio *= THERMAL_THROTTLE_CLOCK_FACTOR
        events.update(("hw_thermal_slowdown", "sw_thermal_slowdown"))
    activity = profile.activity
    power = model.busy_power_watts(activity, ratio)
    if power > cap_watts and activity > 0:
        headroom = (cap_watts - model.idle_watts) / activity - model.static_busy_watts
        capped = math.copysign(abs(headroom / model.dynamic_watts) ** (1 / 3), headroom)
        events.add("sw_power_cap")
        if capped > model.sm_min_ratio:
            ratio, power = capped, cap_watts
        else:
            ratio = model.sm_min_ratio
            power = model.busy_power_watts(activity, ratio)
    c = profile.compute_fraction
    seconds_per_unit_at_max = c / (ratio * model.compute_scale) + (1.0 - c) / (
        memory_bandwidth_factor * model.memory_scale
    )
    units_per_second = profile.units_per_second_at_max / seconds_per_unit_at_max
    return OperatingPoint(
        sm_hertz=ratio * model.sm_max_hertz,
        power_watts=power,
        units_per_second=units_per_second,
        energy_per_unit_joules=power / units_per_second,
        clock_events=frozenset(events),
    )


def optimal_cap(
    points: Sequence[tuple[float, OperatingPoint]], max_slowdown: float = 0.10
) -> float:
    """The cap with the lowest energy per unit whose throughput is within ``max_slowdown``.

    ``points`` are (cap watts, operating point) pairs. Throughput is compared
    with that at the highest cap, as a sweep measures it. Ties go to the higher
    cap: lowering the cap further would cost speed margin for no energy.
    """
    if not points:
        raise ValueError("no caps to choose from")
    if not 0.0 <= max_slowdown < 1.0:
        raise ValueError(f"max_slowdown {max_slowdown} outside [0, 1)")
    reference = max(points, key=lambda item: item[0])[1].units_per_second
    floor = (1.0 - max_slowdown) * reference
    eligible = [(cap, point) for cap, point in points if point.units_per_second >= floor]
    return min(eligible, key=lambda item: (item[1].energy_per_unit_joules, -item[0]))[0]


def _node_prefix(node: str) -> str:
    """The node name as a key part; "" for the default node, so its identities never change."""
    return f"{node}:" if node else ""


def simulated_serial(model_key: str, index: int, node: str = "") -> str:
    """A 13-digit board serial, deterministic in node, model and index."""
    digest = hashlib.sha256(f"gpuperfd-sim-serial:{_node_prefix(node)}{model_key}:{index}".encode()).hexdigest()
    return str(int(digest, 16) % 10**13).zfill(13)


def simulated_uuid(model_key: str, index: int, node: str = "") -> str:
    """A UUID in NVML's format, deterministic in node (SimulationConfig.node), model and index."""
    digest = hashlib.sha256(f"gpuperfd-sim:{_node_prefix(node)}{model_key}:{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class _FaultSchedule:
    """Faults in force, shared by the backend and its GPUs.

    A fault is active from ``after_seconds`` after the backend started (on the
    injected clock) for ``duration_seconds`` (None: forever), for a matching GPU
    index and call name ("*" matches any).
    """

    def __init__(self, faults: Sequence[FaultConfig], start: float) -> None:
        self._lock = threading.Lock()
        self._faults: list[FaultConfig] = list(faults)
        self.start = start

    def add(self, fault: FaultConfig) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear(self, gpu: int | None = None) -> None:
        """Remove every fault, or (``gpu`` given) those aimed at that GPU index only."""
        with self._lock:
            if gpu is None:
                self._faults.clear()
            else:
                self._faults = [fault for fault in self._faults if fault.gpu != gpu]

    def active(self, gpu: int, call: str, now: float) -> list[FaultConfig]:
        elapsed = now - self.start
        with self._lock:
            faults = list(self._faults)
        return [
            fault
            for fault in faults
            if fault.gpu in ("*", gpu)
            and fault.call in ("*", call)
            and fault.after_seconds <= elapsed
            and (fault.duration_seconds is None or elapsed < fault.after_seconds + fault.duration_seconds)
        ]


_FAULT_ERRORS: dict[str, type[DeviceError]] = {
    "not_supported": NotSupported,
    "no_permission": NoPermission,
    "gpu_lost": GpuLost,
    "unknown": UnknownDeviceError,
}


class SimulatedGpu(Device):
    """One simulated GPU; thread-safe (one lock, never held while a fault sleeps).

    State changes (load, cap) first bring the energy counter and temperature up
    to the current time, so each stretch of constant power is integrated
    exactly. Readings carry small noise from a per-GPU random generator; the
    energy counter does not (it integrates the true power), so it stays exact
    and monotonic.
    """

    def __init__(
        self,
        index: int,
        model: GpuModel,
        *,
        faults: _FaultSchedule,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        rng: random.Random,
        degrade: DegradeConfig | None = None,
        ecc_schedule: Sequence[tuple[float, int, int]] = (),
        node: str = "",
    ) -> None:
        self.index = index
        self.model = model
        self._faults = faults
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._lock = threading.Lock()
        self._sm_clock_factor = degrade.sm_clock_factor if degrade else 1.0
        self._memory_bandwidth_factor = degrade.memory_bandwidth_factor if degrade else 1.0
        self._thermal_throttle = bool(degrade and degrade.thermal_throttle)
        resistance = model.thermal_resistance_kelvin_per_watt
        if self._thermal_throttle:
            resistance *= THERMAL_THROTTLE_RESISTANCE_FACTOR
        self._thermal_resistance = resistance
        #: (seconds after start, corrected, uncorrected), from the config.
        self._ecc_schedule = tuple(ecc_schedule)
        self._ecc_injected = (0, 0)
        self._info = GpuInfo(
            index=index,
            uuid=simulated_uuid(model.key, index, node),
            name=model.name,
            pci_bus_id=f"00000000:{model.pci_bus_base + index:02X}:00.0",
            driver_version=SIMULATED_DRIVER_VERSION,
            compute_capability=model.compute_capability,
            memory_total_bytes=model.memory_total_bytes,
            backend="simulated",
            serial=simulated_serial(model.key, index, node),
        )
        self._enforced_watts = model.default_power_watts
        #: Called after every limit change (the backend persists limits through it).
        self._on_limit_change: Callable[[], None] | None = None
        self._load: WorkloadProfile | None = None
        self._load_pid: int | None = None
        self._foreign: dict[int, int] = {}
        self._mig_uuids: list[str] | None = None  # None: MIG not supported
        self._energy_joules = 0.0
        self._last_time = clock()
        self._power_watts = model.idle_watts
        self._temperature = self._target_temperature()

    # -- simulation control (not part of the Device interface; no faults) -------

    def begin_load(self, profile: WorkloadProfile, pid: int | None = None) -> None:
        """Start running ``profile`` (replacing any current load), as process ``pid``.

        With ``pid`` None the work shows in utilization and power but no compute
        process is listed (as for a process in another PID namespace).
        """
        with self._lock:
            self._advance()
            self._load, self._load_pid = profile, pid
            self._update_power()

    def end_load(self) -> None:
        """Stop the current load; the GPU goes idle unless a foreign process runs."""
        with self._lock:
            self._advance()
            self._load, self._load_pid = None, None
            self._update_power()

    def add_foreign_process(self, pid: int, memory_bytes: int) -> None:
        """Simulate another user's job on this GPU: it shows as a busy compute process."""
        with self._lock:
            self._advance()
            self._foreign[pid] = memory_bytes
            self._update_power()

    def remove_foreign_process(self, pid: int) -> None:
        with self._lock:
            self._advance()
            self._foreign.pop(pid, None)
            self._update_power()

    def set_mig_devices(self, count: int | None) -> list[str]:
        """Partition into ``count`` MIG devices (0: MIG off, None: no MIG support); returns their UUIDs.

        Identity only: the physics (power, clocks) stays that of the whole GPU.
        """
        base = self.info().uuid.removeprefix("GPU-")
        with self._lock:
            self._mig_uuids = None if count is None else [f"MIG-{base[:-2]}{slot:02x}" for slot in range(count)]
            return list(self._mig_uuids or [])

    def inject(self, fault: FaultConfig) -> None:
        """Add a fault aimed at this GPU (its ``gpu`` field is replaced by this index)."""
        self._faults.add(fault.model_copy(update={"gpu": self.index}))

    def clear_faults(self) -> None:
        """Remove faults aimed at this GPU by index; faults for "*" stay."""
        self._faults.clear(self.index)

    def inject_ecc(self, corrected: int = 0, uncorrected: int = 0) -> None:
        """Add ECC errors now (on top of those scheduled by the config)."""
        with self._lock:
            c, u = self._ecc_injected
            self._ecc_injected = (c + corrected, u + uncorrected)

    def operating_point(self, profile: WorkloadProfile, cap_watts: float | None = None) -> OperatingPoint:
        """This GPU's steady busy state for ``profile`` under ``cap_watts`` (default: the enforced cap).

        Pure and noise-free: the ground truth a sweep's measurements should find.
        """
        if cap_watts is None:
            with self._lock:
                cap_watts = self._enforced_watts
        return compute_operating_point(
            self.model,
            profile,
            cap_watts,
            sm_clock_factor=self._sm_clock_factor,
            memory_bandwidth_factor=self._memory_bandwidth_factor,
            thermal_throttle=self._thermal_throttle,
        )

    def true_optimal_cap(
        self, profile: WorkloadProfile, caps: Sequence[float], max_slowdown: float = 0.10
    ) -> float:
        """The cap among ``caps`` a correct sweep picks: lowest energy per unit
        among caps whose throughput is within ``max_slowdown`` of that at the
        highest cap in ``caps`` (ties to the higher cap)."""
        return optimal_cap([(cap, self.operating_point(profile, cap)) for cap in caps], max_slowdown)

    def true_power_watts(self) -> float:
        """Power now without reading noise, watts (what the energy counter integrates)."""
        with self._lock:
            self._advance()
            return self._power_watts

    # -- internals (call with the lock held) -------------------------------------

    def _workload(self) -> WorkloadProfile | None:
        if self._load is not None:
            return self._load
        if self._foreign:
            return FOREIGN_PROFILE
        return None

    def _current_point(self) -> OperatingPoint | None:
        workload = self._workload()
        if workload is None:
            return None
        return compute_operating_point(
            self.model,
            workload,
            self._enforced_watts,
            sm_clock_factor=self._sm_clock_factor,
            memory_bandwidth_factor=self._memory_bandwidth_factor,
            thermal_throttle=self._thermal_throttle,
        )

    def _update_power(self) -> None:
        point = self._current_point()
        self._power_watts = self.model.idle_watts if point is None else point.power_watts

    def _target_temperature(self) -> float:
        return self.model.ambient_celsius + self._power_watts * self._thermal_resistance

    def _advance(self) -> float:
        """Integrate energy and relax temperature up to now; returns now.

        Power is constant since the last call (every change calls this first),
        so the integral is exact; temperature follows a first-order lag toward
        ambient + power * thermal resistance, also exact for constant power.
        """
        now = self._clock()
        elapsed = now - self._last_time
        if elapsed > 0:
            self._energy_joules += self._power_watts * elapsed
            target = self._target_temperature()
            decay = math.exp(-elapsed / self.model.thermal_time_constant_seconds)
            self._temperature = target + (self._temperature - target) * decay
            self._last_time = now
        return now

    def _check_faults(self, call: str) -> None:
        """Apply the faults in force for ``call``; every Device method calls this first.

        Runs without the GPU lock, so a slow or timing-out call does not block
        other calls to this GPU.
        """
        for fault in self._faults.active(self.index, call, self._clock()):
            if fault.kind == "slow":
                self._sleep(fault.delay_seconds)
                continue
            if fault.kind == "timeout":
                self._sleep(fault.delay_seconds)
                raise DeviceTimeout(
                    f"simulated timeout on GPU {self.index} ({call}) after {fault.delay_seconds} s"
                )
            raise _FAULT_ERRORS[fault.kind](f"simulated {fault.kind} fault on GPU {self.index} ({call})")

    def _noisy(self, value: float, sigma: float) -> float:
        return value + self._rng.gauss(0.0, sigma)

    # -- Device interface --------------------------------------------------------

    def info(self) -> GpuInfo:
        self._check_faults("info")
        return self._info

    def utilization(self) -> Utilization:
        """GPU ratio ~ the workload's activity, memory ratio ~ its memory-bound share; 0 when idle."""
        self._check_faults("utilization")
        with self._lock:
            workload = self._workload()
            if workload is None:
                return Utilization(gpu_ratio=0.0, memory_ratio=0.0)
            gpu = workload.activity
            if self._foreign:
                gpu = max(gpu, FOREIGN_PROFILE.activity)
            memory = 1.0 - workload.compute_fraction
            return Utilization(
                gpu_ratio=min(1.0, max(0.0, self._noisy(gpu, UTILIZATION_NOISE))),
                memory_ratio=min(1.0, max(0.0, self._noisy(memory, UTILIZATION_NOISE))),
            )

    def memory(self) -> MemoryUsage:
        """Used: the context base (when any process runs) plus each process's memory, bytes."""
        self._check_faults("memory")
        with self._lock:
            used = sum(self._foreign.values())
            if self._load is not None:
                used += self._load.memory_bytes
            if self._load is not None or self._foreign:
                used += BASE_MEMORY_BYTES
            total = self.model.memory_total_bytes
            used = min(used, total)
            return MemoryUsage(used_bytes=used, total_bytes=total, free_bytes=total - used)

    def temperature_celsius(self) -> float:
        self._check_faults("temperature_celsius")
        with self._lock:
            self._advance()
            return self._noisy(self._temperature, TEMPERATURE_NOISE_CELSIUS)

    def power_watts(self) -> float:
        """Current power plus small noise (never negative), watts."""
        self._check_faults("power_watts")
        with self._lock:
            self._advance()
            return max(0.0, self._noisy(self._power_watts, POWER_NOISE_RATIO * self._power_watts))

    def energy_joules(self) -> float:
        """Exact integral of the true power since the backend started, joules; monotonic."""
        self._check_faults("energy_joules")
        with self._lock:
            self._advance()
            return self._energy_joules

    def power_limits(self) -> PowerLimits:
        self._check_faults("power_limits")
        with self._lock:
            return PowerLimits(
                enforced_watts=self._enforced_watts,
                default_watts=self.model.default_power_watts,
                min_watts=self.model.min_power_watts,
                max_watts=self.model.max_power_watts,
            )

    def set_power_limit(self, watts: float) -> None:
        """Enforce ``watts`` from now on; InvalidArgument (limit unchanged) outside [min, max]."""
        self._check_faults("set_power_limit")
        low, high = self.model.min_power_watts, self.model.max_power_watts
        if not low <= watts <= high:  # also rejects NaN
            raise InvalidArgument(
                f"power limit {watts} W outside the allowed range [{low:g}, {high:g}] W on GPU {self.index}"
            )
        with self._lock:
            self._advance()
            self._enforced_watts = float(watts)
            self._update_power()
        if self._on_limit_change is not None:
            self._on_limit_change()

    def clocks(self) -> Clocks:
        self._check_faults("clocks")
        with self._lock:
            point = self._current_point()
            sm = self.model.sm_idle_hertz if point is None else point.sm_hertz
            memory_max = self.model.memory_hertz * self._memory_bandwidth_factor
            return Clocks(
                sm_hertz=sm,
                memory_hertz=memory_max,
                graphics_hertz=sm,
                sm_max_hertz=self.model.sm_max_hertz * self._sm_clock_factor,
                memory_max_hertz=memory_max,
            )

    def clock_events(self) -> ClockEvents:
        """gpu_idle when idle; sw_power_cap when the cap binds; thermal ones when throttled and busy."""
        self._check_faults("clock_events")
        with self._lock:
            point = self._current_point()
            return ClockEvents(frozenset({"gpu_idle"}) if point is None else point.clock_events)

    def pcie_throughput(self) -> PcieThroughput:
        """A trickle when idle; about 1.2 GB/s in and 0.3 GB/s out at full activity, bytes/s."""
        self._check_faults("pcie_throughput")
        with self._lock:
            workload = self._workload()
            activity = 0.0 if workload is None else workload.activity
            rx = 5e5 + 1.2e9 * activity
            tx = 2e5 + 0.3e9 * activity
            return PcieThroughput(
                tx_bytes_per_second=max(0.0, self._noisy(tx, 0.05 * tx)),
                rx_bytes_per_second=max(0.0, self._noisy(rx, 0.05 * rx)),
            )

    def ecc_errors(self) -> EccErrors:
        """Scheduled injections that are due, plus those injected at runtime; monotonic."""
        self._check_faults("ecc_errors")
        elapsed = self._clock() - self._faults.start
        corrected = uncorrected = 0
        for after, c, u in self._ecc_schedule:
            if elapsed >= after:
                corrected += c
                uncorrected += u
        with self._lock:
            extra_c, extra_u = self._ecc_injected
        return EccErrors(corrected_total=corrected + extra_c, uncorrected_total=uncorrected + extra_u)

    def compute_processes(self) -> list[ComputeProcess]:
        self._check_faults("compute_processes")
        with self._lock:
            processes = []
            if self._load is not None and self._load_pid is not None:
                processes.append(ComputeProcess(self._load_pid, self._load.memory_bytes))
            processes.extend(ComputeProcess(pid, memory) for pid, memory in self._foreign.items())
            return processes

    def mig_uuids(self) -> list[str]:
        self._check_faults("mig_uuids")
        with self._lock:
            if self._mig_uuids is None:
                raise NotSupported(f"GPU {self.index}: MIG is not supported")
            return list(self._mig_uuids)


class SimulatedBackend(Backend):
    """A set of simulated GPUs configured by :class:`~gpuperfd.config.SimulationConfig`.

    ``clock`` (seconds, monotonic) and ``sleep`` are injectable so tests drive
    time by hand. Schedules in the config (faults, XID events, ECC errors) count
    from the backend's creation on that clock.
    """

    name = "simulated"

    def __init__(
        self,
        config: SimulationConfig,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._faults = _FaultSchedule(config.faults, self._start)
        model = GPU_MODELS[config.model]
        degrade = {item.gpu: item for item in config.degrade}
        self._gpus = [
            SimulatedGpu(
                index,
                model,
                faults=self._faults,
                clock=clock,
                sleep=sleep,
                rng=random.Random(None if config.seed is None else config.seed + index),
                degrade=degrade.get(index),
                ecc_schedule=[
                    (item.after_seconds, item.corrected, item.uncorrected)
                    for item in config.ecc_errors
                    if item.gpu == index
                ],
                node=config.node,
            )
            for index in range(config.gpus)
        ]
        self._load_limits()
        for gpu in self._gpus:
            gpu._on_limit_change = self._save_limits
        #: XID events not yet returned, as (due time on the clock, gpu index, xid).
        self._pending_xids: list[tuple[float, int, int]] = []
        for item in config.xid_events:
            due = self._start + item.after_seconds
            self._pending_xids.extend((due, item.gpu, item.xid) for _ in range(item.repeat))

    def _load_limits(self) -> None:
        """Start from the configured or persisted limits (the persisted file wins)."""
        limits = {int(k): float(v) for k, v in self.config.initial_power_limits.items()}
        path = self.config.state_file
        if path is not None and Path(path).exists():
            try:
                limits.update({int(k): float(v) for k, v in json.loads(Path(path).read_text()).items()})
            except (OSError, ValueError) as exc:
                raise UnknownDeviceError(f"simulated GPU state file {path} is unreadable: {exc}") from None
        for index, watts in limits.items():
            if 0 <= index < len(self._gpus):
                gpu = self._gpus[index]
                gpu._enforced_watts = min(gpu.model.max_power_watts, max(gpu.model.min_power_watts, watts))
                gpu._update_power()

    def _save_limits(self) -> None:
        path = self.config.state_file
        if path is None:
            return
        with self._lock:
            data = {str(g.index): g._enforced_watts for g in self._gpus}
            tmp = Path(path).with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)

    def devices(self) -> list[SimulatedGpu]:  # type: ignore[override]
        return list(self._gpus)

    def driver_version(self) -> str:
        return SIMULATED_DRIVER_VERSION

    def inject(self, fault: FaultConfig) -> None:
        """Add a fault; its window counts from the backend's start, like configured ones."""
        self._faults.add(fault)

    def clear_faults(self) -> None:
        """Remove every fault, configured ones included."""
        self._faults.clear()

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Queue an XID event on GPU ``gpu``, due now."""
        now = self._clock()
        with self._lock:
            self._pending_xids.append((now, gpu, xid))

    def _take_due_xids(self) -> tuple[list[XidEvent], float | None]:
        """Remove and return the due events, and the due time of the next one (None: none left).

        Timestamps are wall-clock seconds (time.time()) of when each event fell
        due, as the NVML backend reports them.
        """
        now = self._clock()
        wall_now = time.time()
        with self._lock:
            due = [
                XidEvent(gpu_index=gpu, xid=xid, timestamp=wall_now - (now - when))
                for when, gpu, xid in self._pending_xids
                if when <= now
            ]
            self._pending_xids = [item for item in self._pending_xids if item[0] > now]
            upcoming = min((item[0] for item in self._pending_xids), default=None)
        return due, upcoming

    def wait_xid_events(self, timeout_seconds: float) -> list[XidEvent]:
        """Return due XID events (each once); else sleep up to ``timeout_seconds`` for one.

        Sleeps in steps of at most XID_POLL_STEP_SECONDS, shortened to wake when
        the next event falls due. The wait is bounded by the time slept, not by
        the clock, so it ends even under a fake clock that sleep does not move.
        """
        remaining = max(0.0, timeout_seconds)
        while True:
            due, upcoming = self._take_due_xids()
            if due or remaining <= 0:
                return due
            step = min(XID_POLL_STEP_SECONDS, remaining)
            if upcoming is not None:
                step = min(step, max(upcoming - self._clock(), 1e-3))
            self._sleep(step)
            remaining -= step

    def close(self) -> None:
        """Nothing to release; safe to call twice."""
