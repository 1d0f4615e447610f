"""A physics-like simulated GPU: the second implementation of the device interface.

Tests, the demo and CI run the whole daemon (collectors, sampler, power-cap
sweeps) against this module instead of NVML, so its curves decide what the
project believes about power caps. It is a model, not a mock: a GPU here has an
operating point (SM clock, power, throughput, GPM activity) that follows from
the workload it runs and the power cap it is given, an energy counter that is
the exact integral of its power, a temperature that follows power with a lag,
and faults, XID events and ECC errors that appear on a schedule (from
:class:`~gpuperfd.config.SimulationConfig`) or when a test injects them.

**Calibrated at the default cap.** Each workload profile is one probe and
preset (``"vit/vit-b16"``), derived from what that probe measured on a real
H100 and H200 at their default 700 W limit
(:mod:`gpuperfd.device.reference_figures`, one table with its sources). At
700 W the simulated part reproduces each row: the same throughput and SM clock,
the measured power where the cap does not bind, and the cap (with
``sw_power_cap``) where it binds on the card (H100 and H200: ViT and attention
bind; batch decode and training do not). Models without figures (A100) scale
an H100's calibration by their compute and memory speed.

**Below 700 W the shape is fitted to published power-cap measurements**
(:mod:`gpuperfd.device.calibration`, docs/simulator.md: MLPerf Inference MaxQ
against MaxP on the H100 for compute-bound work, a decode sweep's shape for
memory-bound decode; what stays assumed is listed there). The model (with
``x = f_sm / f_sm_max``, the SM clock ratio):

* power ``P(x) = P_idle + P_static + D * x * v(x)**2`` with
  ``v(x) = V0 + (1 - V0) * x``: dynamic power goes with f*V**2 and, over the
  DVFS range, the voltage rises roughly linearly with the clock (published V/F
  curves of the parts), from about 0.3 of its top value extrapolated to zero
  clock (:data:`VOLTAGE_INTERCEPT_RATIO`). The dynamic part therefore falls
  between x**2 and x**3, above a static floor (idle plus clock-independent
  busy power: HBM, fabric, leakage) per model. ``D`` is the profile's dynamic
  power at full clock, solved from the measured row: the measured power at full
  clock, or the cap at the measured (capped) clock, which puts the unreachable
  full-clock power of ViT and attention above 700 W;
* a power cap lowers ``x`` until ``P(x) <= cap`` (bisection; never below the
  model's minimum clock, where power may stay above an unreachable cap);
* throughput ``T(x) = U / ((c / x)**p + ((1 - c) / b)**p)**(1 / p)``
  (normalized to U at full clock): a share ``c`` of each unit's time (at full
  clock) runs in clock-bound kernels and stretches as the clock drops, the
  rest is bandwidth-bound and scales with memory bandwidth ``b`` (1 on a
  healthy part). Compute-bound work (``p`` 1: the times add) loses throughput
  roughly with the clock once the cap binds; memory-bound batch decode
  (``c`` 0.35, ``p`` 3: compute hides under the memory stream) barely slows
  until the clock falls far. ``U`` follows from the row's throughput at its clock;
* energy per unit ``E = P / T``;
* GPM activity (:class:`GpmActivity`): a profile is a time mix of tensor-bound
  kernels (as the measured bf16 matmul), bandwidth-bound ones (as the measured
  device copy) and other clock-bound kernels (assumed); the mix shifts with the
  clock the cap allows (clock-bound kernels take longer), times the GPU-busy
  ratio.

With these, for every profile on H100 and H200 the cap with the lowest energy
per unit among caps that keep throughput within 10% of the full-cap throughput
lies strictly between the minimum and maximum cap: the power-cap sweep has a
non-trivial answer to find (:meth:`SimulatedGpu.true_optimal_cap` gives it, for
tests of the sweep). docs/fleet-simulation.md compares the simulator with the
cards.

Units are SI, as everywhere behind the device interface: watts, joules,
seconds, bytes, hertz, celsius, ratios in [0, 1]. Time comes from an injectable
clock and every wait goes through an injectable sleep, so tests run on a fake
clock without real waiting.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from gpuperfd.config import DegradeConfig, FaultConfig, SimulationConfig
from gpuperfd.device.base import (
    NVLINK_ERROR_TYPES,
    Backend,
    ClockEvents,
    Clocks,
    CodecUtilization,
    ComputeProcess,
    Device,
    FabricState,
    EccErrors,
    GpmActivity,
    GpmMetrics,
    GpuInfo,
    MemoryUsage,
    MigInstance,
    NvLinkStatus,
    PeerLink,
    PcieLink,
    PcieThroughput,
    PowerLimits,
    RemappedRows,
    RetiredPages,
    Utilization,
    XidEvent,
)
from gpuperfd.device.serial import CallGate, EntryCounter
from gpuperfd.device.simulated_topology import SimulatedTopology, board_for
from gpuperfd.device.errors import (
    DeviceError,
    DeviceTimeout,
    GpuLost,
    InvalidArgument,
    NoPermission,
    NotSupported,
    UnknownDeviceError,
)
from gpuperfd.device.reference_figures import (
    MEASURED_POWER_LIMIT_WATTS,
    REAL_GPM_FIGURES,
    REAL_PROBE_FIGURES,
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

T = TypeVar("T")

#: Longest single sleep in :meth:`SimulatedBackend.wait_xid_events`, seconds: it
#: returns at most this late after an event becomes due.
XID_POLL_STEP_SECONDS = 0.1

#: HBM temperature relative to the die: it sits this share of the die's rise above
#: ambient, plus an offset (the reference H200 read 41 C on HBM at idle).
MEMORY_TEMPERATURE_RISE_RATIO = 0.8
MEMORY_TEMPERATURE_OFFSET_CELSIUS = 5.0
#: Nominal interval of the first GPM read (two samples taken back to back), seconds.
GPM_FIRST_INTERVAL_SECONDS = 0.1

#: Relative standard deviation of the noise on power readings.
POWER_NOISE_RATIO = 0.005
#: Standard deviation of the noise on temperature readings, celsius.
TEMPERATURE_NOISE_CELSIUS = 0.2
#: Standard deviation of the noise on busy utilization readings (ratio).
UTILIZATION_NOISE = 0.01

#: Core voltage extrapolated to zero clock along the DVFS line, relative to the
#: voltage at maximum clock (V = V0 + (1 - V0) * x); it makes dynamic power go
#: between x**2 and x**3. Fitted (issue 35), with the H100's static busy power, to
#: the published compute-bound losses under a cap (:mod:`gpuperfd.device.calibration`):
#: 0.3 with 100 W static lost 45 % at 300 W where MLPerf's H100 ResNet-50 lost 33 %.
VOLTAGE_INTERCEPT_RATIO = 0.2


def dynamic_power_shape(ratio: float) -> float:
    """Dynamic power at SM clock ratio ``ratio`` relative to full clock: f * V(f)**2, 1 at ratio 1."""
    voltage = VOLTAGE_INTERCEPT_RATIO + (1.0 - VOLTAGE_INTERCEPT_RATIO) * ratio
    return ratio * voltage * voltage


@dataclass(frozen=True)
class GpuModel:
    """Static facts and physics constants of one GPU model.

    Powers in watts, clocks in hertz, memory in bytes, thermal resistance in
    kelvin per watt, the thermal time constant in seconds. ``static_busy_watts``
    is the clock-independent power a busy part draws above idle (HBM, fabric,
    leakage). ``dynamic_watts``, ``compute_scale`` and ``memory_scale`` only
    matter for a model without measured figures: they scale an H100's profile
    calibration (dynamic power at full clock, compute rate and memory
    bandwidth relative to an H100 SXM).
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
    nvlink_links: int = 18
    #: GPM (GPU performance monitoring) exists on Hopper and newer only.
    has_gpm: bool = True
    ambient_celsius: float = 30.0
    thermal_resistance_kelvin_per_watt: float = 0.06
    thermal_time_constant_seconds: float = 20.0
    pci_bus_base: int = 0x18

    @property
    def sm_min_ratio(self) -> float:
        """Lowest SM clock ratio a power cap can push the GPU to."""
        return self.sm_min_hertz / self.sm_max_hertz

    def busy_power_watts(self, dynamic_watts: float, ratio: float) -> float:
        """Power at SM clock ratio ``ratio`` running work of ``dynamic_watts`` at full clock, watts."""
        return self.idle_watts + self.static_busy_watts + dynamic_watts * dynamic_power_shape(ratio)


#: Model presets by the key SimulationConfig.model uses. The static floor is
#: kept low enough (178 W on H100) that every model holds its minimum cap at its
#: minimum clock with every profile, so an enforced cap is always met.
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
    static_busy_watts=20.0,  # fitted with VOLTAGE_INTERCEPT_RATIO (issue 35); was 100 W, assumed
    dynamic_watts=500.0,
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
        idle_watts=80.0,  # the reference H200 read 79 W idle
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
        static_busy_watts=25.0,
        dynamic_watts=300.0,
        compute_scale=312 / 989,  # dense bf16 TFLOP/s vs H100 SXM
        memory_scale=2.04 / 3.35,
        nvlink_links=12,
        has_gpm=False,
    ),
}


#: GPM of the three kernel classes a profile mixes. Tensor-bound and bandwidth-bound
#: kernels are the measured H100 loads (bf16 matmul, device copy); their DRAM share is
#: taken as clock-independent (the clock of that measurement was not recorded).
TENSOR_KERNELS = GpmActivity(**REAL_GPM_FIGURES["bf16 matmul"])
MEMORY_KERNELS = GpmActivity(**REAL_GPM_FIGURES["device copy"])
#: Other clock-bound kernels (layer norms, softmax, GELU fused in registers, small launches):
#: not measured; an assumption (CUDA-core work, some DRAM traffic, moderate occupancy).
OTHER_KERNELS = GpmActivity(
    sm_active=0.95, sm_occupancy=0.35, tensor_active=0.0, dram_active=0.15,
    fp16_active=0.05, fp32_active=0.35, fp64_active=0.0,
)
IDLE_GPM = GpmActivity(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Calibration:
    """A profile on one GPU model: throughput (units/s) and dynamic power (W) at full clock, no cap."""

    model: str
    units_per_second_at_max: float
    dynamic_watts: float


@dataclass(frozen=True)
class WorkloadProfile:
    """What a job does to a GPU, for the physics above.

    ``compute_fraction`` (c): share (0..1) of one unit's time at full clock
    spent in clock-bound kernels; the rest is bandwidth-bound.
    ``tensor_fraction``: the part of c in tensor-bound kernels (the rest of c:
    other clock-bound kernels); it only shapes GPM activity.
    ``overlap`` (p >= 1): how the two kinds of time combine into one unit's
    time, ``((c / x)**p + ((1 - c) / b)**p)**(1 / p)``. 1 adds them (kernels
    run one after another: throughput follows the clock in proportion to c);
    a larger p overlaps them, towards a roofline ``max(c / x, (1 - c) / b)``:
    memory-bound decode then barely slows until the clock falls far enough
    for the compute part to reach the memory time (docs/simulator.md).
    ``activity``: GPU-busy ratio (0..1), the reported GPU utilization.
    ``memory_bytes``: device memory it occupies. ``calibrations``: per GPU
    model, throughput and dynamic power at full clock (:func:`derive_calibration`).
    """

    name: str
    unit: str
    compute_fraction: float
    tensor_fraction: float
    activity: float
    memory_bytes: int
    calibrations: tuple[Calibration, ...]
    overlap: float = 1.0

    def __post_init__(self) -> None:
        if not self.overlap >= 1.0:
            raise ValueError(f"overlap {self.overlap} must be >= 1")
        if not 0.0 <= self.compute_fraction <= 1.0:
            raise ValueError(f"compute_fraction {self.compute_fraction} outside [0, 1]")
        if not 0.0 <= self.tensor_fraction <= self.compute_fraction:
            raise ValueError(f"tensor_fraction {self.tensor_fraction} outside [0, compute_fraction]")
        if not 0.0 <= self.activity <= 1.0:
            raise ValueError(f"activity {self.activity} outside [0, 1]")
        if self.memory_bytes < 0:
            raise ValueError(f"memory_bytes {self.memory_bytes} must be >= 0")
        if not self.calibrations:
            raise ValueError(f"profile {self.name} has no calibration")
        for item in self.calibrations:
            if item.units_per_second_at_max <= 0 or item.dynamic_watts <= 0:
                raise ValueError(f"profile {self.name} on {item.model}: throughput and dynamic power must be > 0")

    def calibration(self, model: GpuModel) -> Calibration:
        """This profile on ``model``: its own calibration, else the first one scaled by speed and power."""
        for item in self.calibrations:
            if item.model == model.key:
                return item
        source = self.calibrations[0]
        base = GPU_MODELS[source.model]
        return Calibration(
            model=model.key,
            units_per_second_at_max=source.units_per_second_at_max * self._speed(model) / self._speed(base),
            dynamic_watts=source.dynamic_watts * model.dynamic_watts / base.dynamic_watts,
        )

    def _speed(self, model: GpuModel) -> float:
        return 1.0 / self.seconds_per_unit(model.compute_scale, model.memory_scale)

    def seconds_per_unit(self, ratio: float, bandwidth: float = 1.0) -> float:
        """Time of one unit at SM clock ratio ``ratio`` and bandwidth factor ``bandwidth``, relative.

        1 at full clock and full bandwidth; see ``overlap`` for the shape.
        """
        compute = self.compute_fraction / ratio
        memory = (1.0 - self.compute_fraction) / bandwidth
        p = self.overlap
        if p == 1.0:
            return compute + memory
        return float((compute**p + memory**p) ** (1.0 / p) / (self.compute_fraction**p + (1.0 - self.compute_fraction) ** p) ** (1.0 / p))

    def gpm(self, ratio: float, bandwidth: float = 1.0) -> GpmActivity:
        """GPM activity at SM clock ratio ``ratio`` and memory bandwidth factor ``bandwidth``.

        Time shares of the kernel classes at that clock: clock-bound kernels take
        ``1 / ratio`` times longer, bandwidth-bound ones ``1 / bandwidth``; a slower
        memory shows as less DRAM bandwidth used. All of it times the busy ratio.
        """
        tensor = self.tensor_fraction / ratio
        other = (self.compute_fraction - self.tensor_fraction) / ratio
        memory = (1.0 - self.compute_fraction) / bandwidth
        total = tensor + other + memory
        slow_memory = dataclasses.replace(MEMORY_KERNELS, dram_active=MEMORY_KERNELS.dram_active * bandwidth)
        mixed = GpmActivity.mix(
            [(tensor / total, TENSOR_KERNELS), (other / total, OTHER_KERNELS), (memory / total, slow_memory)]
        )
        return GpmActivity.mix([(self.activity, mixed)])


def derive_calibration(model: GpuModel, figure: dict[str, object], shape: WorkloadProfile) -> Calibration:
    """Throughput and dynamic power at full clock that reproduce one measured row at its limit.

    The row's clock ratio ``x`` gives ``U = T * seconds_per_unit(x)`` (``shape``
    supplies c and the overlap; its own calibrations are not used). Its power is
    the measured one where the cap did not bind; where it did, the part sat at
    the cap (the simulator enforces the cap exactly, so that is the power it
    must reach at clock ``x``): ``D = (P - P_idle - P_static) / shape(x)``.
    """
    ratio = float(figure["sm_clock_mhz"]) * MHZ / model.sm_max_hertz  # type: ignore[arg-type]
    rate = float(figure["units_per_second"])  # type: ignore[arg-type]
    capped = "sw_power_cap" in figure["clock_events"]  # type: ignore[operator]
    power = MEASURED_POWER_LIMIT_WATTS if capped else float(figure["average_power_watts"])  # type: ignore[arg-type]
    return Calibration(
        model=model.key,
        units_per_second_at_max=rate * shape.seconds_per_unit(ratio),
        dynamic_watts=(power - model.idle_watts - model.static_busy_watts) / dynamic_power_shape(ratio),
    )


def _measured_profile(
    name: str, compute_fraction: float, tensor_fraction: float, overlap: float = 1.0
) -> WorkloadProfile:
    """A probe/preset profile calibrated from every model's row of REAL_PROBE_FIGURES."""
    rows = {key: rows[name] for key, rows in REAL_PROBE_FIGURES.items() if name in rows}
    first = next(iter(rows.values()))
    shape = WorkloadProfile(
        name=name,
        unit=str(first["unit"]),
        compute_fraction=compute_fraction,
        tensor_fraction=tensor_fraction,
        activity=float(first["gpu_busy_ratio"]),  # type: ignore[arg-type]
        memory_bytes=int(first["peak_memory_bytes"]),  # type: ignore[call-overload]
        calibrations=(Calibration("H100", 1.0, 1.0),),
        overlap=overlap,
    )
    return dataclasses.replace(
        shape, calibrations=tuple(derive_calibration(GPU_MODELS[key], row, shape) for key, row in rows.items())
    )


#: Workload profiles per probe and preset ("probe/preset"), calibrated from the
#: real figures at 700 W; (compute fraction, tensor fraction, overlap) set the
#: response below 700 W and are fitted to published measurements where there are
#: some (docs/simulator.md, :mod:`gpuperfd.device.calibration`), estimates otherwise:
#:
#: * llm/gpt2 (batch-128 decode, CUDA graph): DRAM-bound; weights and KV cache
#:   stream every step and little of the step is tensor work (~26 TFLOP/s of ~790).
#:   Overlap 3 (the SMs' work hides under the memory stream): decode barely slows
#:   until the clock falls to about 0.6 of its maximum (issue 35; was 0.45 additive,
#:   which lost throughput with the first watt of cap).
#: * vit/vit-b16 (batch 128, compiled): tensor-bound; 56 % of the matmul's FLOP/s.
#: * attention/default (fused SDPA): tensor-bound; 77 % of the matmul's FLOP/s.
#: * train/gpt2 (eager, batch 16 x 1024): tensor work leads (17 % of the matmul's
#:   FLOP/s in small GEMMs), with many eager element-wise kernels (DRAM-bound).
WORKLOAD_PROFILES: dict[str, WorkloadProfile] = {
    profile.name: profile
    for profile in (
        _measured_profile("llm/gpt2", 0.35, 0.10, overlap=3.0),
        _measured_profile("vit/vit-b16", 0.85, 0.55),
        _measured_profile("attention/default", 0.95, 0.78),
        _measured_profile("train/gpt2", 0.80, 0.40),
    )
}

#: Prompt prefill rate over decode rate of the llm probe (the H200 row; prefill is one
#: large batched forward pass): the simulated executor's time to first token uses it.
LLM_PREFILL_SPEEDUP = float(REAL_PROBE_FIGURES["H200"]["llm/gpt2"]["prompt_tokens_per_second"]) / float(  # type: ignore[arg-type]
    REAL_PROBE_FIGURES["H200"]["llm/gpt2"]["units_per_second"]  # type: ignore[arg-type]
)

#: What another user's job (add_foreign_process) does to the GPU when gpuperfd
#: runs nothing on it itself: a heavy training-like job (about 580 W at full clock on an H100).
FOREIGN_PROFILE = WorkloadProfile(
    name="foreign",
    unit="units",
    compute_fraction=0.8,
    tensor_fraction=0.4,
    activity=0.95,
    memory_bytes=0,
    calibrations=(Calibration("H100", 1.0, 400.0),),
)


@dataclass(frozen=True)
class OperatingPoint:
    """Steady state of a GPU running one workload under one cap (no noise).

    ``clock_events`` are the reasons the clock is below the part's maximum
    (``sw_power_cap``, the thermal ones), as names from CLOCK_EVENT_REASONS.
    ``gpm`` is the GPM activity at that clock.
    """

    sm_hertz: float
    power_watts: float
    units_per_second: float
    energy_per_unit_joules: float
    clock_events: frozenset[str]
    gpm: GpmActivity


@functools.lru_cache(maxsize=4096)
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

    Pure (and cached: samplers ask for it on every read). The clock ratio starts
    at the part's maximum (``sm_clock_factor``, times
    THERMAL_THROTTLE_CLOCK_FACTOR when throttled) and is lowered, by bisection
    on the monotonic power curve, until power meets the cap; it never goes below
    the model's minimum clock, where power may stay above an unreachable cap.
    """
    if not cap_watts > 0:
        raise ValueError(f"cap_watts must be > 0, got {cap_watts}")
    calibration = profile.calibration(model)
    dynamic = calibration.dynamic_watts
    events: set[str] = set()
    ratio = sm_clock_factor
    if thermal_throttle:
        ratio *= THERMAL_THROTTLE_CLOCK_FACTOR
        events.update(("hw_thermal_slowdown", "sw_thermal_slowdown"))
    power = model.busy_power_watts(dynamic, ratio)
    if power > cap_watts:
        events.add("sw_power_cap")
        low, high = model.sm_min_ratio, ratio
        if model.busy_power_watts(dynamic, low) >= cap_watts:
            ratio, power = low, model.busy_power_watts(dynamic, low)
        else:
            for _ in range(60):  # the power curve is increasing; 2**-60 of the range is exact enough
                middle = 0.5 * (low + high)
                if model.busy_power_watts(dynamic, middle) > cap_watts:
                    high = middle
                else:
                    low = middle
            ratio, power = low, cap_watts
    units_per_second = calibration.units_per_second_at_max / profile.seconds_per_unit(ratio, memory_bandwidth_factor)
    return OperatingPoint(
        sm_hertz=ratio * model.sm_max_hertz,
        power_watts=power,
        units_per_second=units_per_second,
        energy_per_unit_joules=power / units_per_second,
        clock_events=frozenset(events),
        gpm=profile.gpm(ratio, memory_bandwidth_factor),
    )


def optimal_cap(
    points: Sequence[tuple[float, OperatingPoint]], max_slowdown: float = 0.10
) -> float:
    """The cap with the lowest energy per unit whose throughput is within ``max_slowdown``.

    ``points`` are (cap watts, operating point) pairs. Throughput is compared
    with that at the highest cap, as a sweep measures it. Ties go to the lower
    cap, as in ``probe_data.recommend.recommend`` and the recording rules.
    """
    if not points:
        raise ValueError("no caps to choose from")
    if not 0.0 <= max_slowdown < 1.0:
        raise ValueError(f"max_slowdown {max_slowdown} outside [0, 1)")
    reference = max(points, key=lambda item: item[0])[1].units_per_second
    floor = (1.0 - max_slowdown) * reference
    eligible = [(cap, point) for cap, point in points if point.units_per_second >= floor]
    return min(eligible, key=lambda item: (item[1].energy_per_unit_joules, item[0]))[0]


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


def simulated_mig_uuid(gpu_uuid: str, slot: int) -> str:
    """The UUID of MIG device ``slot`` of the simulated GPU ``gpu_uuid`` (what a device plugin hands out)."""
    return f"MIG-{gpu_uuid.removeprefix('GPU-')[:-2]}{slot:02x}"


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


class SimulatedLibrary:
    """What stands for libnvidia-ml behind a simulated node: one gate, one entry counter.

    Every Device call of the node's GPUs goes through ``gate`` as NVML calls do (one caller at a
    time, hung calls set aside after ``gate.hang_seconds``), so a slow simulated call holds up the
    other GPUs exactly as a slow NVML call does. ``entries`` counts threads inside at once: the
    real library crashed on that, so tests of code above the device assert it stays 0.
    """

    def __init__(self, hang_seconds: float = 5.0) -> None:
        self.gate = CallGate("simulated GPU library", hang_seconds)
        self.entries = EntryCounter()

    def call(self, gpu: int, name: str, fn: Callable[..., T], *args: object) -> T:
        """One library call about GPU ``gpu``; a call nested in another of the same thread goes straight in."""
        if self.entries.inside_now():
            return fn(*args)
        return self.gate.call(gpu, name, self.entries.run, fn, *args)


def _through_library(method: Callable[..., T]) -> Callable[..., T]:
    """A Device method of SimulatedGpu, entered through its library (see SimulatedLibrary)."""

    @functools.wraps(method)
    def call(self: SimulatedGpu, *args: object) -> T:
        return self.library.call(self.index, method.__name__, method, self, *args)

    return call


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
        nvlink_links: int | None = None,
        mig_instances: int = 0,
        library: SimulatedLibrary | None = None,
    ) -> None:
        self.index = index
        self.model = model
        #: The simulated library this GPU answers through (shared by the backend's GPUs).
        self.library = library or SimulatedLibrary()
        self._faults = faults
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._lock = threading.Lock()
        self._sm_clock_factor = degrade.sm_clock_factor if degrade else 1.0
        self._memory_bandwidth_factor = degrade.memory_bandwidth_factor if degrade else 1.0
        self._thermal_throttle = bool(degrade and degrade.thermal_throttle)
        #: Silent data corruption (simulation.degrade wrong_results): the simulated executor's answer
        #: checks fail on this GPU; no telemetry shows it, as on a real part.
        self.wrong_results = bool(degrade and degrade.wrong_results)
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
        #: Called with the new limit before it takes effect (the backend persists limits through it).
        self._on_limit_change: Callable[[float], None] | None = None
        #: The board's limit as every process sees it now (the backend's shared state file), or None;
        #: read on every limit read, so a cap another process or an operator set is seen, as on a real board.
        self._limit_source: Callable[[], float | None] | None = None
        #: Orders a persisted limit write and a re-read of it (never held with ``_lock`` waiting on it).
        self._limit_lock = threading.Lock()
        self._load: WorkloadProfile | None = None
        self._load_pid: int | None = None
        self._foreign: dict[int, int] = {}
        #: None: MIG not supported. A GPU put in MIG mode by the config lists one device per instance,
        #: so a kubelet's MIG allocations find their GPU (set_mig_devices changes the identities only).
        self._mig_uuids: list[str] | None = (
            [simulated_mig_uuid(self._info.uuid, slot) for slot in range(mig_instances)] if mig_instances else None
        )
        self._energy_joules = 0.0
        self._last_time = clock()
        self._power_watts = model.idle_watts
        self._temperature = self._target_temperature()
        #: Seconds the clock was held back, by violation reason (integrated like energy).
        self._violation: dict[str, float] = {"power": 0.0, "thermal": 0.0, "sync_boost": 0.0, "board_limit": 0.0,
                                             "low_utilization": 0.0, "reliability": 0.0}
        self._pcie_replays = 0
        self._remapped = RemappedRows(0, 0, False, False)
        self._memory_heat_celsius = 0.0
        self._nvlink_links = model.nvlink_links if nvlink_links is None else nvlink_links
        self._nvlink_down: set[int] = set()
        self._nvlink_errors = dict.fromkeys(NVLINK_ERROR_TYPES, 0)
        self._mig_instances = mig_instances
        self._gpm_last_time: float | None = None

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
        uuid = self.info().uuid
        with self._lock:
            self._mig_uuids = None if count is None else [simulated_mig_uuid(uuid, slot) for slot in range(count)]
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

    def inject_remapped_rows(
        self, correctable: int = 0, uncorrectable: int = 0, pending: bool = False, failure: bool = False
    ) -> None:
        """Add remapped rows; set the pending (reset needed) and failure flags."""
        with self._lock:
            r = self._remapped
            self._remapped = RemappedRows(
                r.correctable + correctable, r.uncorrectable + uncorrectable, r.pending or pending, r.failure or failure
            )

    def inject_pcie_replays(self, count: int) -> None:
        """Add PCIe replays (a marginal link retransmitting)."""
        with self._lock:
            self._pcie_replays += count

    def inject_memory_heat(self, celsius: float) -> None:
        """Raise the HBM temperature by ``celsius`` above the model (a failing fan or cold plate)."""
        with self._lock:
            self._memory_heat_celsius = celsius

    def inject_nvlink(self, down: Sequence[int] = (), errors: dict[str, int] | None = None) -> None:
        """Take links down and add NVLink errors by type (NVLINK_ERROR_TYPES)."""
        with self._lock:
            self._nvlink_down.update(down)
            for kind, count in (errors or {}).items():
                self._nvlink_errors[kind] += count

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
        highest cap in ``caps`` (ties to the lower cap)."""
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

    def _pcie_rates(self) -> tuple[float, float]:
        """(tx, rx) bytes/s with noise: a trickle when idle, ~0.3 / 1.2 GB/s at full activity."""
        workload = self._workload()
        activity = 0.0 if workload is None else workload.activity
        rx = 5e5 + 1.2e9 * activity
        tx = 2e5 + 0.3e9 * activity
        return max(0.0, self._noisy(tx, 0.05 * tx)), max(0.0, self._noisy(rx, 0.05 * rx))

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
            point = self._current_point()
            if point is not None:
                if "sw_power_cap" in point.clock_events:
                    self._violation["power"] += elapsed
                if "hw_thermal_slowdown" in point.clock_events:
                    self._violation["thermal"] += elapsed
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
        """GPU ratio ~ the workload's busy ratio, memory ratio ~ its DRAM activity at this clock; 0 when idle."""
        self._check_faults("utilization")
        with self._lock:
            point = self._current_point()
            workload = self._workload()
            if point is None or workload is None:
                return Utilization(gpu_ratio=0.0, memory_ratio=0.0)
            gpu = workload.activity
            if self._foreign:
                gpu = max(gpu, FOREIGN_PROFILE.activity)
            memory = point.gpm.dram_active
            return Utilization(
                gpu_ratio=min(1.0, max(0.0, self._noisy(gpu, UTILIZATION_NOISE))),
                memory_ratio=min(1.0, max(0.0, self._noisy(memory, UTILIZATION_NOISE))),
            )

    def gpm_activity(self) -> GpmActivity:
        """GPM activity now (ratios with small noise): the load's kernel mix at the clock the cap allows.

        All zero when idle. Not part of the Device interface yet (the telemetry
        issue wires GPM metrics through it); faults for call "gpm_activity" apply.
        """
        self._check_faults("gpm_activity")
        with self._lock:
            return self._gpm_now()

    def _gpm_now(self) -> GpmActivity:
        """GPM activity with noise (call with the lock held)."""
        point = self._current_point()
        if point is None:
            return IDLE_GPM
        values = dataclasses.asdict(point.gpm)
        return GpmActivity(**{k: min(1.0, max(0.0, self._noisy(v, UTILIZATION_NOISE * v))) for k, v in values.items()})

    def gpm_metrics(self) -> GpmMetrics:
        """GPM over the interval since the previous call: the activity of the load now (the
        operating point is constant between load and cap changes), tensor work all HMMA (bf16),
        PCIe as :meth:`pcie_throughput` models it, no NVLink traffic. NotSupported before Hopper."""
        self._check_faults("gpm_metrics")
        if not self.model.has_gpm:
            raise NotSupported(f"GPU {self.index}: {self.model.name} has no GPM (Hopper and newer)")
        with self._lock:
            now = self._clock()
            last, self._gpm_last_time = self._gpm_last_time, now
            activity = self._gpm_now()
            tx, rx = self._pcie_rates()
        interval = GPM_FIRST_INTERVAL_SECONDS if last is None or now <= last else now - last
        values = {
            "sm_active": activity.sm_active,
            "sm_occupancy": activity.sm_occupancy,
            "tensor_any": activity.tensor_active,
            "tensor_hmma": activity.tensor_active,
            "tensor_imma": 0.0,
            "tensor_dfma": 0.0,
            "dram_active": activity.dram_active,
            "fp16": activity.fp16_active,
            "fp32": activity.fp32_active,
            "fp64": activity.fp64_active,
            "pcie_tx_bytes_per_second": tx,
            "pcie_rx_bytes_per_second": rx,
        }
        if self._nvlink_links:
            values.update(nvlink_tx_bytes_per_second=0.0, nvlink_rx_bytes_per_second=0.0)
        return GpmMetrics(values=values, interval_seconds=interval)

    def memory_temperature_celsius(self) -> float:
        """HBM temperature: MEMORY_TEMPERATURE_RISE_RATIO of the die's rise over ambient, plus an offset."""
        self._check_faults("memory_temperature_celsius")
        with self._lock:
            self._advance()
            ambient = self.model.ambient_celsius
            value = ambient + MEMORY_TEMPERATURE_OFFSET_CELSIUS + MEMORY_TEMPERATURE_RISE_RATIO * (
                self._temperature - ambient
            )
            return self._noisy(value + self._memory_heat_celsius, TEMPERATURE_NOISE_CELSIUS)

    def remapped_rows(self) -> RemappedRows:
        """None remapped on a healthy part; what inject_remapped_rows added."""
        self._check_faults("remapped_rows")
        with self._lock:
            return self._remapped

    def retired_pages(self) -> RetiredPages:
        """NotSupported: the simulated parts (A100, H100, H200) remap rows instead of retiring pages."""
        self._check_faults("retired_pages")
        raise NotSupported(f"GPU {self.index}: {self.model.name} remaps rows; page retirement is not supported")

    def violation_seconds(self) -> dict[str, float]:
        """Power violation time accrues while the cap binds, thermal while thermally throttled."""
        self._check_faults("violation_seconds")
        with self._lock:
            self._advance()
            return dict(self._violation)

    def pcie_replays(self) -> int:
        self._check_faults("pcie_replays")
        with self._lock:
            return self._pcie_replays

    def codec_utilization(self) -> CodecUtilization:
        """No video work is simulated: encoder and decoder idle."""
        self._check_faults("codec_utilization")
        return CodecUtilization(encoder_ratio=0.0, decoder_ratio=0.0)

    def nvlink(self) -> NvLinkStatus:
        """Every link up unless taken down; errors as injected; no traffic (probes use one GPU)."""
        self._check_faults("nvlink")
        if not self._nvlink_links:
            raise NotSupported(f"GPU {self.index}: no NVLink")
        with self._lock:
            links = tuple((link, link not in self._nvlink_down) for link in range(self._nvlink_links))
            return NvLinkStatus(links=links, errors=dict(self._nvlink_errors), tx_bytes_total=0.0, rx_bytes_total=0.0)

    def nvlink_states(self) -> tuple[tuple[int, bool], ...]:
        """(link, up) of every NVLink, without faults or the library (the simulated topology's view)."""
        with self._lock:
            return tuple((link, link not in self._nvlink_down) for link in range(self._nvlink_links))

    #: The node's interconnect (set by the backend); None: a GPU built alone has no fabric.
    _topology: SimulatedTopology | None = None

    def fabric_state(self) -> FabricState:
        """The simulated fabric's state: NotSupported on a board without NVSwitch (issue 44)."""
        self._check_faults("fabric_state")
        if self._topology is None:
            raise NotSupported(f"GPU {self.index}: no GPU fabric")
        return self._topology.fabric_state(self.index)

    def mig_enabled(self) -> bool:
        self._check_faults("mig_enabled")
        return self._mig_instances > 0

    def mig_instances(self) -> list[MigInstance]:
        """Equal GPU instances (ids 1..n, compute instance 0), each with an equal share of memory
        and of the GPU's load (its activity, memory used split evenly)."""
        self._check_faults("mig_instances")
        if not self._mig_instances:
            return []
        n = self._mig_instances
        with self._lock:
            activity = self._gpm_now()
            used = self._used_bytes() // n
        total = self.model.memory_total_bytes // n
        gpm = GpmMetrics(
            values={"sm_active": activity.sm_active, "tensor_any": activity.tensor_active,
                    "dram_active": activity.dram_active},
            interval_seconds=GPM_FIRST_INTERVAL_SECONDS,
        )
        return [
            MigInstance(gpu_instance=i + 1, compute_instance=0, memory_used_bytes=used, memory_total_bytes=total,
                        gpm=gpm if self.model.has_gpm else None)
            for i in range(n)
        ]

    def memory(self) -> MemoryUsage:
        """Used: the context base (when any process runs) plus each process's memory, bytes."""
        self._check_faults("memory")
        with self._lock:
            used = self._used_bytes()
            total = self.model.memory_total_bytes
            return MemoryUsage(used_bytes=used, total_bytes=total, free_bytes=total - used)

    def _used_bytes(self) -> int:
        """Device memory in use (call with the lock held)."""
        used = sum(self._foreign.values())
        if self._load is not None:
            used += self._load.memory_bytes
        if self._load is not None or self._foreign:
            used += BASE_MEMORY_BYTES
        return min(used, self.model.memory_total_bytes)

    def temperature_celsius(self) -> float:
        self._check_faults("temperature_celsius")
        with self._lock:
            self._advance()
            return self._noisy(self._temperature, TEMPERATURE_NOISE_CELSIUS)

    def power_watts(self) -> float:
        """Current power plus small noise (never negative), watts."""
        self._check_faults("power_watts")
        self._sync_limit()
        with self._lock:
            self._advance()
            return max(0.0, self._noisy(self._power_watts, POWER_NOISE_RATIO * self._power_watts))

    def energy_joules(self) -> float:
        """Exact integral of the true power since the backend started, joules; monotonic."""
        self._check_faults("energy_joules")
        with self._lock:
            self._advance()
            return self._energy_joules

    def _sync_limit(self) -> None:
        """Take the limit the shared board holds now (another process's or an operator's change)."""
        if self._limit_source is None:
            return
        with self._limit_lock:
            watts = self._limit_source()
            if watts is None:
                return
            watts = min(self.model.max_power_watts, max(self.model.min_power_watts, watts))
            with self._lock:
                if watts != self._enforced_watts:
                    self._advance()
                    self._enforced_watts = watts
                    self._update_power()

    def power_limits(self) -> PowerLimits:
        self._check_faults("power_limits")
        self._sync_limit()
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
        with self._limit_lock:
            if self._on_limit_change is not None:  # the shared board first: every reader sees it from now
                self._on_limit_change(float(watts))
            with self._lock:
                self._advance()
                self._enforced_watts = float(watts)
                self._update_power()

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
            tx, rx = self._pcie_rates()
            return PcieThroughput(tx_bytes_per_second=tx, rx_bytes_per_second=rx)

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
        base_c, base_u = self._ecc_reset_base
        return EccErrors(corrected_total=corrected + extra_c - base_c, uncorrected_total=uncorrected + extra_u - base_u)

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

    # -- health faults: PCIe link state, recovery action, GPU reset (issue 30) --------------
    #: (generation, width) the link trained at instead of the maximum; None: at the maximum.
    _link_degraded: tuple[int, int] | None = None
    _recovery_action: int = 0
    _ecc_reset_base: tuple[int, int] = (0, 0)

    def _pcie_max(self) -> tuple[int, int]:
        return (4, 16) if self.model.compute_capability.startswith("8.") else (5, 16)

    def pcie_max_generation(self) -> int:
        """The link's best generation (simulation control: no faults, no library)."""
        return self._pcie_max()[0]

    def inject_pcie_link(self, generation: int | None = None, width: int | None = None) -> None:
        """Make the link train below its maximum (a bad riser, a dirty connector)."""
        max_gen, max_width = self._pcie_max()
        with self._lock:
            self._link_degraded = (generation or max_gen, width or max_width)

    def inject_recovery_action(self, action: int) -> None:
        """Set the driver's GPU recovery action (NVML field 230's value)."""
        with self._lock:
            self._recovery_action = action

    def pcie_link(self) -> PcieLink:
        """Trained at the maximum, except while busy with an injected link fault; at idle the link
        trains down to gen 1, as real boards do to save power. Busy is any work on the GPU, a user's
        job (``add_foreign_process``) as much as a probe's load: a real card under load trains its
        link up whoever runs the work (a job once left it at gen 1 and the verdict degraded)."""
        self._check_faults("pcie_link")
        max_gen, max_width = self._pcie_max()
        with self._lock:
            busy = self._workload() is not None
            degraded = self._link_degraded
        gen, width = degraded if degraded is not None else (max_gen, max_width)
        if not busy:
            gen = 1
        return PcieLink(gen, width, max_gen, max_width)

    def gpu_recovery_action(self) -> int:
        self._check_faults("gpu_recovery_action")
        with self._lock:
            return self._recovery_action

    def reset(self) -> None:
        """A GPU reset (``nvidia-smi -r``): volatile counters start again from 0, a pending row remap
        takes effect, links retrain, the recovery action clears. Injected link faults stay (hardware)."""
        ecc = self.ecc_errors()
        with self._lock:
            self._advance()
            self._energy_joules = 0.0
            self._pcie_replays = 0
            base = self._ecc_reset_base
            self._ecc_reset_base = (base[0] + ecc.corrected_total, base[1] + ecc.uncorrected_total)
            rows = self._remapped
            self._remapped = RemappedRows(rows.correctable, rows.uncorrectable, False, rows.failure)
            self._nvlink_down = set()
            self._recovery_action = 0


#: The Device interface's calls: each enters a SimulatedGpu through its library, as NVML's do.
LIBRARY_CALLS: tuple[str, ...] = tuple(
    name for name, value in vars(Device).items() if callable(value) and not name.startswith("_"))
for _name in LIBRARY_CALLS:
    setattr(SimulatedGpu, _name, _through_library(getattr(SimulatedGpu, _name)))


class SimulatedBackend(Backend):
    """A set of simulated GPUs configured by :class:`~gpuperfd.config.SimulationConfig`.

    ``clock`` (seconds, monotonic) and ``sleep`` are injectable so tests drive
    time by hand. Schedules in the config (faults, XID events, ECC errors) count
    from the backend's creation on that clock.
    """

    name = "simulated"
    #: The node's interconnect (board kind, links per pair, fabric state, interconnect faults): what the
    #: simulated node probe (:mod:`gpuperfd.probing.interconnect.simulated`) measures.
    interconnect: SimulatedTopology

    def __init__(
        self,
        config: SimulationConfig,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        call_timeout_seconds: float = 5.0,
    ) -> None:
        self.config = config
        #: This node's library: every GPU's calls pass its one gate (``call_timeout_seconds``: hung).
        self.library = SimulatedLibrary(call_timeout_seconds)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._faults = _FaultSchedule(config.faults, self._start)
        model = GPU_MODELS[config.model]
        nvlink_links = config.nvlink_links
        if config.topology == "pcie" and nvlink_links is None:
            nvlink_links = 0
        board = board_for(config.topology, config.gpus, model.nvlink_links if nvlink_links is None else nvlink_links)
        degrade = {item.gpu: item for item in config.degrade}
        mig = {item.gpu: item.instances for item in config.mig}
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
                nvlink_links=nvlink_links,
                mig_instances=mig.get(index, 0),
                library=self.library,
            )
            for index in range(config.gpus)
        ]
        for item in config.degrade:
            if item.gpu < len(self._gpus) and (item.pcie_generation or item.pcie_width):
                self._gpus[item.gpu].inject_pcie_link(item.pcie_generation, item.pcie_width)
        self.interconnect = SimulatedTopology(board, self._gpus)
        for gpu in self._gpus:
            gpu._topology = self.interconnect
        for fault in config.interconnect_faults:
            self.interconnect.inject(fault)
        self._load_limits()
        for gpu in self._gpus:
            gpu._on_limit_change = lambda watts, index=gpu.index: self._save_limits(index, watts)
            if config.state_file is not None:
                gpu._limit_source = lambda index=gpu.index: self._read_limit(index)
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

    def _read_limit(self, index: int) -> float | None:
        """GPU ``index``'s limit in the shared state file now (None: not there yet or unreadable).

        Every limit read comes here, as every NVML client reads the one real board: a daemon sees the
        cap a CLI sweep, a second daemon or an operator (editing the file) set since it started."""
        path = self.config.state_file
        if path is None:
            return None
        try:
            value = json.loads(Path(path).read_text()).get(str(index))
            return None if value is None else float(value)
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def _save_limits(self, index: int, watts: float | None = None) -> None:
        """Persist GPU ``index``'s limit (``watts``, or the one it holds), leaving the others as the file
        has them: like a real board, each GPU's limit is its own, and several processes (a daemon, a CLI
        sweep) share the file."""
        import fcntl

        path = self.config.state_file
        if path is None:
            return
        with self._lock, open(f"{path}.lock", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                data = json.loads(Path(path).read_text())
                if not isinstance(data, dict):
                    data = {}
            except (OSError, ValueError):
                data = {}
            data.update({str(g.index): g._enforced_watts for g in self._gpus if str(g.index) not in data})
            data[str(index)] = self._gpus[index]._enforced_watts if watts is None else watts
            tmp = Path(f"{path}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)

    def devices(self) -> list[SimulatedGpu]:  # type: ignore[override]
        return list(self._gpus)

    def driver_version(self) -> str:
        return SIMULATED_DRIVER_VERSION

    def topology(self) -> list[PeerLink]:
        """Every pair once, as the simulated board links them now (links down and all)."""
        return self.interconnect.pairs()

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
