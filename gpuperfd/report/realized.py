"""What apply mode really saved, from history records (docs/apply.md, "Realized savings").

A sweep that ran while apply mode held a cap marks its points (``applied_cap_watts``); within one such
sweep, the run at the applied cap against the run at the operator's cap (``original_cap_watts``) is one
measurement of the saving. Per GPU and workload the measurements are averaged; per model and for all
GPUs the watts are summed. Watts are while the workload runs (the probe's own power): a year of them is
an upper bound for a GPU that is not busy all the time (the recording rules weight by busy share).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuperfd.report.records import Run

#: Hours in a year of 365.25 days.
HOURS_PER_YEAR = 8766.0


@dataclass(frozen=True)
class RealizedRow:
    """One GPU's realized saving for one workload (``gpu`` is ``node/index``)."""

    gpu: str
    model: str
    probe: str
    preset: str
    applied_cap_watts: float
    operator_cap_watts: float
    sweeps: int
    power_saved_watts: float
    energy_saving_ratio: float
    throughput_loss_ratio: float

    @property
    def mwh_per_year(self) -> float:
        return self.power_saved_watts * HOURS_PER_YEAR / 1e6


def _pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """(run at the applied cap, run at the operator's cap) of each sweep that has both, ok."""
    by_sweep: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.sweep_id and run.applied_cap_watts is not None and run.status == "ok":
            by_sweep[run.sweep_id].append(run)
    pairs = []
    for members in by_sweep.values():
        applied = members[0].applied_cap_watts
        operator = members[0].operator_cap_watts
        here = next((r for r in members if r.cap_watts is not None and round(r.cap_watts) == round(applied or 0)), None)
        there = next((r for r in members if r.cap_watts is not None and operator is not None
                      and round(r.cap_watts) == round(operator)), None)
        if here is not None and there is not None and all(
                v is not None for v in (here.power, there.power, here.rate, there.rate, here.energy_per_unit,
                                        there.energy_per_unit)):
            pairs.append((here, there))
    return pairs


def realized_rows(runs: Iterable[Run]) -> list[RealizedRow]:
    """Per GPU and workload: the mean realized saving over the sweeps that measured it."""
    groups: dict[tuple[str, str, str, str], list[Run]] = defaultdict(list)
    for run in runs:
        if run.applied_cap_watts is not None:
            groups[(run.gpu.node, run.gpu.uuid, run.probe, run.preset)].append(run)
    rows = []
    for (_, _, probe, preset), members in sorted(groups.items()):
        pairs = _pairs(members)
        if not pairs:
            continue
        n = len(pairs)
        here0, there0 = pairs[-1]
        rows.append(RealizedRow(
            gpu=f"{here0.gpu.node}/{here0.gpu.index}", model=here0.gpu.model, probe=probe, preset=preset,
            applied_cap_watts=float(here0.cap_watts or 0), operator_cap_watts=float(there0.cap_watts or 0), sweeps=n,
            power_saved_watts=sum(t.power - h.power for h, t in pairs) / n,  # type: ignore[operator]
            energy_saving_ratio=sum(1 - h.energy_per_unit / t.energy_per_unit for h, t in pairs) / n,  # type: ignore[operator]
            throughput_loss_ratio=sum(1 - h.rate / t.rate for h, t in pairs) / n,  # type: ignore[operator]
        ))
    return rows


def realized_lines(rows: Sequence[RealizedRow]) -> list[str]:
    """The realized savings in words: one line per GPU, then per model and in all, per workload."""
    if not rows:
        return []
    lines = ["realized savings of apply mode (the probe at the applied cap vs at the operator's cap, while busy):"]
    for r in rows:
        lines.append(f"  {r.gpu} {r.probe}/{r.preset}: {r.applied_cap_watts:.0f} W instead of {r.operator_cap_watts:.0f} W: "
                     f"{r.power_saved_watts:.0f} W less ({r.mwh_per_year:.2f} MWh a year if always busy), "
                     f"{100 * r.energy_saving_ratio:.1f}% less energy per unit, {100 * r.throughput_loss_ratio:.1f}% "
                     f"throughput given up ({r.sweeps} sweep(s))")
    totals: dict[tuple[str, str, str], list[RealizedRow]] = defaultdict(list)
    for r in rows:
        totals[(r.model, r.probe, r.preset)].append(r)
        totals[("all GPUs", r.probe, r.preset)].append(r)
    for (model, probe, preset), members in sorted(totals.items()):
        watts = sum(r.power_saved_watts for r in members)
        loss = sum(r.throughput_loss_ratio for r in members) / len(members)
        lines.append(f"  {model} {probe}/{preset}: {len(members)} GPU(s), {watts:.0f} W less, "
                     f"{watts * HOURS_PER_YEAR / 1e6:.2f} MWh a year if always busy, {100 * loss:.1f}% throughput given up")
    return lines
