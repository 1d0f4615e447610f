"""The simulated cards' roofline: one table per card, and the time and load of one step on it.

Why: a simulated probe's figures must follow the work it does (issue 43). A step's time at full
clock is ``max(FLOPs / compute, bytes / bandwidth) + kernels * launch``: the bound unit of the
roofline plus a fixed cost per kernel (launch and tail, which dominates small batches). How busy
each unit is over that time drives the step's dynamic power. The simulated executor
(``probing/simulated/workload.py``) compares a request's step with its probe's default preset's
on the same card and scales the calibrated profile by the ratio, so the default presets keep the
real cards' figures (``reference_figures.py``) exactly and the cap physics of ``simulated.py``
applies on top.

To recalibrate a card from measured points, edit its row of :data:`CARDS`: peak FLOP/s per dtype,
memory bandwidth, the efficiencies reached in practice and the per-kernel cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CardRoofline:
    """One card's roofline at full clock.

    ``peak_flops``: dense FLOP/s per canonical dtype (fp16/bf16 on the tensor cores; fp32 on the CUDA
    cores, as torch runs fp32 matmuls without TF32 by default). ``memory_bytes_per_second``: HBM
    bandwidth. ``compute_efficiency`` and ``memory_efficiency``: the share of those peaks real
    kernels reach. ``kernel_seconds``: the fixed cost of one kernel in a step (launch, ramp, tail).
    """

    peak_flops: dict[str, float]
    memory_bytes_per_second: float
    compute_efficiency: float = 0.75
    memory_efficiency: float = 0.85
    kernel_seconds: float = 4e-6


_H100_FLOPS = {"bfloat16": 989.4e12, "float16": 989.4e12, "float32": 66.9e12}

#: One row per simulated GPU model (device/simulated.py GPU_MODELS keys); datasheet peaks (SXM parts).
#: The H100's per-kernel cost is fitted to real points (4x H100 SXM, driver 580.159.04, 2026-11-27,
#: benchmarks/simulator_shape_points.sh): gpt2 and gpt2-xl at batch 1 and 32, ViT-B/16 at 1 and 128 land
#: within 7 % of the measured rates relative to the default presets (tests/probing/simulated/test_simulated_workload_fit.py);
#: 4 us made batch-1 points 14-53 % slow. The H200 shares the H100's SMs, so its kernel cost too.
CARDS: dict[str, CardRoofline] = {
    "H100": CardRoofline(peak_flops=_H100_FLOPS, memory_bytes_per_second=3.35e12, kernel_seconds=2.5e-6),
    "H200": CardRoofline(peak_flops=_H100_FLOPS, memory_bytes_per_second=4.8e12, kernel_seconds=2.5e-6),
    "A100": CardRoofline(peak_flops={"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
                         memory_bytes_per_second=2.039e12),
}

#: Dynamic power of a fully busy unit relative to the tensor cores' (1): streaming HBM draws less than
#: a tensor-bound kernel, a launch-bound step (small kernels, idle gaps) least. Assumed (docs/simulator.md).
MEMORY_POWER_WEIGHT = 0.6
LAUNCH_POWER_WEIGHT = 0.15


@dataclass(frozen=True)
class StepTime:
    """One step's time at full clock, seconds, by part: compute, memory, kernel launches."""

    compute: float
    memory: float
    launch: float

    @property
    def total(self) -> float:
        return max(self.compute, self.memory) + self.launch

    @property
    def compute_share(self) -> float:
        """Share of the step's work the SM clock governs: the compute part and half the kernels' fixed
        cost (their ramp and tail run on the SMs, their launch does not); how much of it hides under
        the memory stream is the profile's overlap, not this."""
        return (self.compute + 0.5 * self.launch) / (self.compute + self.memory + self.launch)

    @property
    def activity(self) -> float:
        """Load on the card, for dynamic power: each unit's busy share weighted by its power."""
        total = self.total
        return (self.compute / total + MEMORY_POWER_WEIGHT * self.memory / total
                + LAUNCH_POWER_WEIGHT * self.launch / total)


def step_time(card: str, dtype: str, flops: float, bytes_moved: float, kernels: int) -> StepTime:
    """The time of one step of ``flops`` and ``bytes_moved`` in ``kernels`` kernels on ``card``.

    KeyError names an unknown card or dtype.
    """
    if card not in CARDS:
        raise KeyError(f"card: no roofline for {card!r}; known: {', '.join(CARDS)}")
    row = CARDS[card]
    if dtype not in row.peak_flops:
        raise KeyError(f"dtype: no peak for {dtype!r} on {card}")
    return StepTime(compute=flops / (row.peak_flops[dtype] * row.compute_efficiency),
                    memory=bytes_moved / (row.memory_bytes_per_second * row.memory_efficiency),
                    launch=kernels * row.kernel_seconds)


#: Datasheet HBM bandwidth by the name the driver reports, most specific first (the PCIe and NVL H100
#: parts differ from the SXM part the simulator's "H100" row models; a GH200's memory depends on its
#: variant, so it is not guessed).
HBM_BANDWIDTH_BY_NAME: tuple[tuple[str, float | None], ...] = (
    ("GH200", None), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12),
    ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12),
)


def hbm_bandwidth(gpu_name: str | None) -> float | None:
    """The datasheet memory bandwidth (bytes/s) of a card by its driver name, or None when unknown.

    What a memory-bound probe (batch-1 decode reads every weight once per token) publishes its
    achieved share against: tokens/s <= bandwidth / bytes read per token."""
    if not gpu_name:
        return None
    for key, bandwidth in HBM_BANDWIDTH_BY_NAME:
        if key in gpu_name:
            return bandwidth
    return None
