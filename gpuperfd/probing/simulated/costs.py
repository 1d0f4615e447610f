"""What a real probe costs besides its measured windows, as the simulator charges it (issue 60).

A real probe's time from its GPU's qualifying moment to the result went mostly to things the old
simulator charged nothing for: the child's spawn and imports (CPU only, before any CUDA call), the
build (CUDA context, model, compile, CUDA graphs: on the GPU) and each point's own overheads (warm-up,
answer checks, the GPU-busy pass: on the GPU). A simulated fleet that skips them reaches gaps a real
one cannot. So each probe's costs are kept here as data, with the measurement they come from, and
the simulated executor charges them (scaled with the test's time, ``scale``): the imports in the
session's preparation or in a standby child (which saves them, as the real one does), the build on
the GPU at the first point, the overheads on the GPU at every point. The settle is the simulator's
physics (power and clocks ramp under the load) and the window is ``probes.simulated_measure_seconds``.

Source of every row: a lent NVIDIA H200 (driver 580.159.04, torch 2.11.0+cu130), the probes' default
presets and windows, read-only. ``imports``: the child's spawn and imports with no standby child
(benchmarks/results/i50/h200x2/q2r.json, 2026-11-28, the median of two runs: llm 13.4 s, vit 15.4 s
with the compile cache warm, attention 3.7 s, train 12.3 s; vit's 19.1 adds the 3.7 s of Dynamo and
Inductor a compiled variant's child now imports before its build, benchmarks/results/i60/h200-child-costs).
``build`` and ``overhead``: the same probes run in a ready standby child, the compile cache warm, the
settle judged from the windows and the busy pass counted from them (llm, attention, train:
benchmarks/results/i60/h200-busy-pass/q2r.json, 2026-11-29, the median of two runs; vit, its encoder
layer compiled once for all layers: benchmarks/results/i60/h200x2-regional/q2r_vit.json, 2026-11-29, the
mean of its two warm runs, build 1.97 and 2.01 s, overhead 0.63 and 0.65 s): build = the child's setup
(context, model, compile); overhead = the point's wall less build, settle and windows (warm-up, answer
checks, busy pass, hand-offs). The imports are still the runs' before the child marked scikit-learn,
pandas, pyarrow, scipy and torchvision absent (issue 60: 0.6-3.7 s less on the 2x H200 node,
benchmarks/results/i60/h200x2-regional/imports.txt, not yet measured as a spawn-to-ready figure): the
simulator charges a little more than a child now costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuperfd.probe_data.kinds import spec_kinds

__all__ = ["ChildCosts", "MEASURED_COSTS", "COSTS_SOURCE", "REAL_WINDOW_SECONDS", "costs_for", "cost_scale_for",
           "NO_COSTS"]

COSTS_SOURCE = ("lent NVIDIA H200, driver 580.159.04, torch 2.11.0+cu130: benchmarks/results/i50/h200x2/q2r.json "
                "(imports) and benchmarks/results/i60/h200-busy-pass/q2r.json, h200x2-regional/q2r_vit.json (vit) "
                "(build, overhead)")

#: The measured windows of a real point at the probes' defaults on that H200 (2.0-2.7 s): the simulated
#: window (``probes.simulated_measure_seconds``, 3 s by default) compressed below this compresses the
#: costs alike (:func:`cost_scale_for`).
REAL_WINDOW_SECONDS = 3.0


@dataclass(frozen=True)
class ChildCosts:
    """Seconds a real probe spends outside its windows and settle."""

    #: The child's spawn and imports of torch and the model code: CPU only, nothing on the GPU.
    imports: float
    #: The build at the first point: CUDA context, model, compile (cache warm), CUDA graphs. On the GPU.
    build: float
    #: Each point's own time on the GPU besides settle and windows: warm-up, answer checks, busy pass.
    overhead: float

    def scaled(self, scale: float) -> ChildCosts:
        return ChildCosts(self.imports * scale, self.build * scale, self.overhead * scale)


NO_COSTS = ChildCosts(0.0, 0.0, 0.0)

#: Per probe (default preset, the registry row's ``child_costs``); a preset is charged its probe's.
MEASURED_COSTS: dict[str, ChildCosts] = {kind.name: ChildCosts(*kind.child_costs) for kind in spec_kinds()}


def costs_for(probe: str, scale: float) -> ChildCosts:
    """``probe``'s measured costs at ``scale`` (0: none; a probe with no row costs nothing)."""
    if scale <= 0:
        return NO_COSTS
    return MEASURED_COSTS.get(probe, NO_COSTS).scaled(scale)


def cost_scale_for(cost_scale: float | None, simulated_measure_seconds: float) -> float:
    """The share of the real costs a simulated probe charges: ``simulation.cost_scale`` when set, else as
    much as ``probes.simulated_measure_seconds`` compresses the real windows."""
    if cost_scale is not None:
        return cost_scale
    return min(1.0, simulated_measure_seconds / REAL_WINDOW_SECONDS)
