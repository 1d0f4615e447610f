"""A probe request as the simulated GPU runs it: its probe's calibrated profile, scaled by its work.

Why (issue 43): the simulator's profiles are calibrated on each probe's default preset from the real
cards (``device/reference_figures.py``); every other point used to run that same profile, so model
size, batch, lengths, head groups and dtype drew flat lines. Here a request's step is costed
(``probe_data/workload_cost.py``: FLOPs, bytes, kernels, memory), timed on the card's roofline
(``device/roofline.py``) beside the default preset's step, and the default profile is scaled by the
ratio: throughput by the ratio of units per second, dynamic power by the ratio of load, the clock-bound
share (the cap response) by the ratio of compute shares, peak memory from the request's bytes with
the default's framework overhead. The default presets get their profile unchanged, so they keep the
real figures exactly, and the power-cap physics of ``device/simulated.py`` applies to every point.

Options the simulator does not model (the variant, local weights or data) are named in
:attr:`SimulatedWorkload.not_modelled`, and the result says so, instead of drawing a flat line.

Runs in the daemon: no torch, and ``device.simulated`` is imported only when a point is simulated.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuperfd.device.roofline import StepTime, step_time
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PRESETS
from gpuperfd.probe_data.kinds import KINDS, probe_kind, workload_cost
from gpuperfd.probe_data.workload_cost import Phase, WorkCost

if TYPE_CHECKING:
    from gpuperfd.device.simulated import WorkloadProfile

#: Options that change a real run but not the simulated one: named when they differ from the
#: default preset's (the simulated figures are the default variant's, on synthetic data).
UNMODELLED_OPTIONS: tuple[str, ...] = ("variant", "weights_path", "dataset_path")
#: Most a point's dynamic power may exceed its default preset's (the default presets are already
#: near full load; a bigger model cannot draw much more).
MAX_LOAD_RATIO = 1.3
#: Clock-bound share of a scaled profile is kept inside this range.
COMPUTE_FRACTION_RANGE = (0.02, 0.98)


@dataclass(frozen=True)
class SimulatedWorkload:
    """What the simulated executor runs for one request: the profile (throughput, power, memory and cap
    response), the llm probe's time to first token per output-token time, and the options not modelled."""

    profile: WorkloadProfile
    ttft_per_tpot: float | None = None
    not_modelled: tuple[str, ...] = ()


def merged_options(probe: str, preset: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The preset's values with the request's own on top."""
    return {**PRESETS[probe][preset or DEFAULT_PRESET[probe]], **options}


def not_modelled(probe: str, options: Mapping[str, Any]) -> tuple[str, ...]:
    """The options in ``options`` (merged) the simulator ignores and that differ from the default preset's."""
    default = PRESETS[probe][DEFAULT_PRESET[probe]]
    return tuple(key for key in UNMODELLED_OPTIONS if options.get(key) not in (None, default.get(key)))


def simulated_workload(probe: str, preset: str | None, options: Mapping[str, Any]) -> SimulatedWorkload:
    """The simulated workload of ``probe`` at ``preset`` with ``options`` (see the module docstring).

    KeyError or ValueError name a missing or bad option.
    """
    merged = merged_options(probe, preset, options)
    # the options its cost follows: the kind's workload fields (probe_data/kind_work.py)
    key = tuple(sorted((name, merged.get(name)) for name in probe_kind(probe).params))
    scaled = _scaled(probe, key)
    return dataclasses.replace(scaled, not_modelled=not_modelled(probe, merged))


@functools.lru_cache(maxsize=1024)
def _scaled(probe: str, key: tuple[tuple[str, Any], ...]) -> SimulatedWorkload:
    from gpuperfd.device.simulated import WORKLOAD_PROFILES

    base = WORKLOAD_PROFILES[f"{probe}/{DEFAULT_PRESET[probe]}"]
    reference = workload_cost(probe, PRESETS[probe][DEFAULT_PRESET[probe]])
    cost = workload_cost(probe, dict(key))
    profile = base if cost == reference else _scale_profile(base, reference, cost, probe, dict(key))
    ttft = None
    if cost.prefill is not None and reference.prefill is not None:
        ttft = _ttft_per_tpot(probe, base.calibrations[0].model, reference, cost)
    return SimulatedWorkload(profile, ttft)


def _time(card: str, cost: WorkCost, phase: Phase | None = None) -> StepTime:
    phase = phase or cost.step
    return step_time(card, cost.dtype, phase.flops, phase.bytes_moved, phase.kernels)


def _scale_profile(base: WorkloadProfile, reference: WorkCost, cost: WorkCost, probe: str,
                   options: Mapping[str, Any]) -> WorkloadProfile:
    """``base`` (calibrated on ``reference``) scaled to ``cost`` on each card it is calibrated for."""
    from gpuperfd.device.simulated import Calibration

    calibrations = []
    for item in base.calibrations:
        before, after = _time(item.model, reference), _time(item.model, cost)
        speed = (cost.units_per_step / after.total) / (reference.units_per_step / before.total)
        load = min(after.activity / before.activity, MAX_LOAD_RATIO)
        calibrations.append(Calibration(item.model, item.units_per_second_at_max * speed,
                                        item.dynamic_watts * load))
    card = base.calibrations[0].model
    low, high = COMPUTE_FRACTION_RANGE
    share = _time(card, cost).compute_share / _time(card, reference).compute_share
    compute = min(max(base.compute_fraction * share, low), high)
    return dataclasses.replace(
        base, name=f"{base.name}@" + ",".join(f"{k}={v}" for k, v in sorted(options.items())),
        compute_fraction=compute, tensor_fraction=base.tensor_fraction * compute / base.compute_fraction,
        memory_bytes=peak_memory_bytes(base.memory_bytes, reference, cost, probe), calibrations=tuple(calibrations))


def peak_memory_bytes(reference_bytes: int, reference: WorkCost, cost: WorkCost, probe: str | None = None) -> int:
    """Peak memory of ``cost``: its weights (and optimizer state) as modelled, the probe's framework floor
    (its row's ``framework_floor_bytes``), and its batch-dependent bytes (activations, KV cache) scaled so the
    default preset's real peak (``reference_bytes``) comes out exactly. Where that leaves no room (the
    modelled bytes exceed the real peak), every modelled byte is scaled down by that ratio instead."""
    floor = KINDS[probe].framework_floor_bytes if probe in KINDS else 0
    fixed = reference.memory.weights + reference.memory.optimizer + floor
    dynamic = reference.memory.activations + reference.memory.kv_cache
    if dynamic > 0 and reference_bytes > fixed:
        scale = (reference_bytes - fixed) / dynamic
        return int(cost.memory.weights + cost.memory.optimizer + floor
                   + scale * (cost.memory.activations + cost.memory.kv_cache))
    modelled = reference.memory.total
    if modelled <= reference_bytes:
        return int(cost.memory.total + (reference_bytes - modelled))
    return int(cost.memory.total * reference_bytes / modelled)


def _ttft_per_tpot(probe: str, card: str, reference: WorkCost, cost: WorkCost) -> float:
    """Time to first token over the time of one decode step, calibrated so the default preset keeps
    the measured prefill rate (``LLM_PREFILL_SPEEDUP``: prompt tokens/s over output tokens/s)."""
    from gpuperfd.device.simulated import LLM_PREFILL_SPEEDUP

    assert reference.prefill is not None and cost.prefill is not None
    prompt = int(PRESETS[probe][DEFAULT_PRESET[probe]]["prompt_tokens"])
    measured = prompt / LLM_PREFILL_SPEEDUP  # the default preset's TTFT per decode step
    modelled = _time(card, reference, reference.prefill).total / _time(card, reference).total
    return measured / modelled * _time(card, cost, cost.prefill).total / _time(card, cost).total
