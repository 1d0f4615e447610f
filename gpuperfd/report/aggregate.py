"""From runs to the report's numbers: per-cap means, latency percentiles, recommendations.

After the outlier rule, the ok runs of each (GPU, probe, preset, batch size, cap)
group become one :class:`CapPoint` (means of throughput, energy per unit and
power; latency percentiles over the pooled samples of the kept runs). The caps of
one (GPU, probe, preset, batch size) form a :class:`Series`, whose recommended
cap comes from :func:`gpuperfd.probe_data.recommend.recommend_latest`: the same rule, on the same
input (the latest point at each cap, no sweep that was cut short), as the landing page, ``top``,
apply mode and the Prometheus recording rules; the per-cap means beside it show the history.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.probe_data.record import labels_text
from gpuperfd.probe_data.recommend import Recommendation, SweepPoint, recommend_latest, watts_saved_while_busy
from gpuperfd.probe_data.result import ProbeResult, percentile
from gpuperfd.probe_data.spec import params_text
from gpuperfd.report.outliers import Dropped, split_outliers
from gpuperfd.report.realized import RealizedRow, realized_rows
from gpuperfd.report.records import (
    PRIMARY_LATENCY,
    PROBE_ORDER,
    GpuId,
    Loaded,
    ReportError,
    Run,
    kind_of,
)

PERCENTILES = (50, 95, 99)


@dataclass
class CapPoint:
    """The kept runs of one group, summarised (``cap_watts`` None: no cap known, e.g. a CPU run)."""

    cap_watts: float | None
    runs: int
    dropped: int
    rate: float
    rate_stdev: float
    energy_per_unit: float | None
    power: float | None
    #: {latency name: {"p50", "p95", "p99", "n"}} over the pooled samples, seconds.
    latencies: dict[str, dict[str, float]] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    gpu_busy_ratio: float | None = None
    temperature: float | None = None
    utilization: float | None = None
    memory_utilization: float | None = None
    loss: float | None = None
    #: Means of the other rates (requests/s, prompt tokens/s, ...).
    throughput: dict[str, float] = field(default_factory=dict)
    gpm_tensor_active_ratio: float | None = None
    gpm_dram_active_ratio: float | None = None
    allocated_memory_bytes: int | None = None
    #: The kept runs' measured windows in order (see ``Run.windows``), and each run's own means.
    windows: list[dict[str, float | None]] = field(default_factory=list)
    run_values: list[dict[str, float | None]] = field(default_factory=list)
    #: llm: mean seconds to each output token over the kept runs ([TTFT, token 2, ...]).
    token_curve: list[float] = field(default_factory=list)
    #: llm on a Llama model: the latest kept run's roofline and speculative figures (see ``Run.llm_figures``).
    llm_figures: dict[str, Any] = field(default_factory=dict)

    def latency(self, name: str, q: int | str) -> float | None:
        """p50/p95/p99 (q = 50, 95, 99) or the mean (q = "mean") of one latency, seconds."""
        key = q if isinstance(q, str) else f"p{q}"
        return self.latencies.get(name, {}).get(key)


@dataclass
class Series:
    """One (GPU, probe, preset, variant, parameters) over the caps it ran at, lowest cap first."""

    gpu: GpuId
    probe: str
    preset: str
    batch_size: int | None
    work_unit: str
    points: list[CapPoint]
    recommendation: Recommendation | None = None
    label: str = ""
    variant: str = ""
    #: The workload parameters (batch_size, prompt_tokens, seq_len, n_groups, dtype, ...).
    params: dict[str, Any] = field(default_factory=dict)
    #: The runs' ``--label`` values (dataset, framework, ...): part of what tells series apart.
    labels: dict[str, str] = field(default_factory=dict)
    #: :func:`~gpuperfd.probe_data.recommend.watts_saved_while_busy` of the recommendation's points.
    saved_watts: float | None = None

    @property
    def capped(self) -> list[CapPoint]:
        """The points measured at a known cap."""
        return [p for p in self.points if p.cap_watts is not None]

    @property
    def kind(self) -> str:
        return kind_of(self.probe)

    @property
    def workload(self) -> tuple[str, str]:
        return (self.probe, self.preset)

    @property
    def latency_name(self) -> str:
        return PRIMARY_LATENCY.get(self.probe, "")

    def at(self, cap_watts: float | None) -> CapPoint | None:
        if cap_watts is None:
            return None
        return next((p for p in self.capped if round(p.cap_watts) == round(cap_watts)), None)

    @property
    def baseline(self) -> CapPoint | None:
        return self.at(self.recommendation.baseline_cap_watts) if self.recommendation else (
            self.points[-1] if self.points else None)

    @property
    def recommended(self) -> CapPoint | None:
        return self.at(self.recommendation.cap_watts) if self.recommendation else None

    @property
    def power_saving_watts(self) -> float | None:
        """Watts the recommended cap saves against the baseline cap while the GPU runs this work (the
        probe's power at the two caps, from the points the recommendation used, as the landing page
        says it; never negative); None without powers (issue 35)."""
        return None if self.recommendation is None else self.saved_watts


@dataclass
class GpuSummary:
    gpu: GpuId
    label: str
    drivers: list[str]
    runs: int


@dataclass
class Report:
    generated_at: float
    sources: list[str]
    max_slowdown: float
    gpus: list[GpuSummary]
    series: list[Series]
    runs_total: int
    runs_kept: int
    dropped: list[Dropped]
    failed: list[Run]
    first_time: float | None
    last_time: float | None
    notes: list[str] = field(default_factory=list)
    outliers_removed: bool = True
    #: "within-slowdown" (lowest energy within max_slowdown of the highest cap) or "min-energy".
    rule: str = "within-slowdown"
    #: Log y axes: True (``--log-y``), False (``--linear-y``), None: where a panel spans > 2 decades.
    log_y: bool | None = None
    #: Runs not made on purpose (status ``skipped``: a sweep's early stop, a run that gave way to a
    #: user's job): counted apart from the failed ones, which they are not.
    skipped: list[Run] = field(default_factory=list)
    #: Apply mode's realized savings, per GPU and workload (report/realized.py; empty without apply).
    realized: list[RealizedRow] = field(default_factory=list)

    @property
    def runs_text(self) -> str:
        """``3 kept, 0 outliers removed, 2 skipped (early stop), 1 failed``: the header's run counts."""
        reasons: dict[str, int] = {}
        for run in self.skipped:
            reasons[run.failure_reason or "no reason"] = reasons.get(run.failure_reason or "no reason", 0) + 1
        why = ", ".join(reason.replace("_", " ") if len(reasons) == 1 else f"{n} {reason.replace('_', ' ')}"
                        for reason, n in sorted(reasons.items()))
        skipped = f"{len(self.skipped)} skipped ({why})" if self.skipped else "0 skipped"
        return (f"{self.runs_kept} kept, {len(self.dropped)} outliers removed, {skipped}, "
                f"{len(self.failed)} failed")

    @property
    def rule_text(self) -> str:
        """The recommendation rule in words, as the header prints it."""
        if self.rule == "min-energy":
            return "recommended cap: lowest energy per unit of work of all caps tested (any slowdown)"
        return (f"recommended cap: lowest energy per unit of work among caps at most {self.max_slowdown:.0%} "
                "slower than the highest cap tested, from the latest point at each cap (as the daemon, top and "
                "the recording rules; none while the latest sweep was cut short)")

    @property
    def nodes(self) -> list[str]:
        return sorted({g.gpu.node for g in self.gpus})

    @property
    def workloads(self) -> list[tuple[str, str]]:
        """(probe, preset) pairs, inference probes first, then training."""
        pairs = {s.workload for s in self.series}
        return sorted(pairs, key=lambda w: (PROBE_ORDER.index(w[0]) if w[0] in PROBE_ORDER else 99, w))

    def series_of(self, workload: tuple[str, str]) -> list[Series]:
        return [s for s in self.series if s.workload == workload]

    @property
    def drivers(self) -> list[str]:
        return sorted({d for g in self.gpus for d in g.drivers})


def gpu_labels(gpus: Iterable[GpuId]) -> dict[tuple[str, str], str]:
    """Labels by GPU model, with index and node added only where needed to tell GPUs apart."""
    gpus = list(gpus)
    by_model: dict[str, list[GpuId]] = defaultdict(list)
    for gpu in gpus:
        by_model[gpu.model].append(gpu)
    labels = {}
    for model, members in by_model.items():
        nodes = {g.node for g in members}
        for gpu in members:
            if len(members) == 1:
                labels[gpu.key] = model
            elif len(nodes) == 1:
                labels[gpu.key] = f"{model} gpu{gpu.index}"
            else:
                labels[gpu.key] = f"{model} gpu{gpu.index}@{gpu.node}"
    return labels


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize_group(runs: list[Run], dropped: int) -> CapPoint:
    rates = [r.rate for r in runs if r.rate is not None]
    latencies: dict[str, dict[str, float]] = {}
    names = sorted({name for r in runs for name in r.latencies} | {name for r in runs for name in r.latency_stats})
    for name in names:
        pooled = [v for r in runs for v in r.latencies.get(name, [])]
        if pooled:
            latencies[name] = {f"p{q}": percentile(pooled, q) for q in PERCENTILES}
            latencies[name]["mean"] = statistics.fmean(pooled)
            latencies[name]["n"] = len(pooled)
            continue
        # CSV input keeps statistics, not samples: average them over the runs.
        stats = [r.latency_stats[name] for r in runs if name in r.latency_stats]
        merged = {key: _mean([s[key] for s in stats if s.get(key) is not None]) for key in ("p50", "p95", "p99", "mean")}
        latencies[name] = {k: v for k, v in merged.items() if v is not None}
    memory = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
    rate_names = sorted({k for r in runs for k in r.throughput})
    return CapPoint(
        cap_watts=runs[0].cap_watts,
        runs=len(runs),
        dropped=dropped,
        rate=statistics.fmean(rates),
        rate_stdev=statistics.stdev(rates) if len(rates) > 1 else 0.0,
        energy_per_unit=_mean([r.energy_per_unit for r in runs if r.energy_per_unit is not None]),
        power=_mean([r.power for r in runs if r.power is not None]),
        latencies=latencies,
        peak_memory_bytes=max(memory) if memory else None,
        gpu_busy_ratio=_mean([r.gpu_busy_ratio for r in runs if r.gpu_busy_ratio is not None]),
        temperature=_mean([r.temperature for r in runs if r.temperature is not None]),
        utilization=_mean([r.utilization for r in runs if r.utilization is not None]),
        memory_utilization=_mean([r.memory_utilization for r in runs if r.memory_utilization is not None]),
        loss=_mean([r.loss for r in runs if r.loss is not None]),
        throughput={k: v for k in rate_names
                    if (v := _mean([r.throughput[k] for r in runs if k in r.throughput])) is not None},
        gpm_tensor_active_ratio=_mean([r.gpm_tensor_active_ratio for r in runs if r.gpm_tensor_active_ratio is not None]),
        gpm_dram_active_ratio=_mean([r.gpm_dram_active_ratio for r in runs if r.gpm_dram_active_ratio is not None]),
        allocated_memory_bytes=max(allocated) if (allocated := [r.allocated_memory_bytes for r in runs
                                                               if r.allocated_memory_bytes is not None]) else None,
        windows=[w for r in sorted(runs, key=lambda r: r.time) for w in r.windows],
        run_values=[_run_values(r) for r in sorted(runs, key=lambda r: r.time)],
        token_curve=_mean_curve([r.token_curve for r in runs if r.token_curve]),
        llm_figures=next((r.llm_figures for r in sorted(runs, key=lambda r: r.time, reverse=True) if r.llm_figures),
                         {}),
    )


def _mean_curve(curves: list[list[float]]) -> list[float]:
    if not curves:
        return []
    length = min(len(c) for c in curves)
    return [statistics.fmean(c[i] for c in curves) for i in range(length)]


def _run_values(run: Run) -> dict[str, float | None]:
    """One run's means, the per-run view of the repeats summary."""
    return {"rate": run.rate, "power": run.power, "temperature": run.temperature, "utilization": run.utilization,
            "memory_utilization": run.memory_utilization, "energy_per_unit": run.energy_per_unit,
            "peak_memory_bytes": float(run.peak_memory_bytes) if run.peak_memory_bytes is not None else None,
            "allocated_memory_bytes": float(run.allocated_memory_bytes) if run.allocated_memory_bytes is not None
            else None}


RULES = ("within-slowdown", "min-energy")


def _stopped_between_points(runs: list[Run]) -> set[str]:
    """Sweeps that measured fewer points than they were to (their records say how many): a stop between
    two points leaves no aborted record. Skipped points (early stop) count as measured, preempted or
    aborted ones do not, as :func:`~gpuperfd.probe_data.recommend.cut_short` counts them."""
    done: dict[str, int] = defaultdict(int)
    plan: dict[str, int] = {}
    for run in runs:
        if run.sweep_id and run.sweep_points:
            plan[run.sweep_id] = run.sweep_points
            if run.status != "aborted" and run.failure_reason != "preempted":
                done[run.sweep_id] += 1
    return {sweep for sweep, planned in plan.items() if done[sweep] < planned}


def _as_point(run: Run, cut: set[str] = frozenset()) -> SweepPoint | None:  # type: ignore[assignment]
    """A run as the daemon holds a point (its status, rate, energy, power, time and sweep); None without a cap."""
    if run.cap_watts is None:
        return None
    measured = run.status == "ok" and run.rate is not None
    result = ProbeResult(probe=run.probe, variant=run.variant or "report", preset=run.preset, status=run.status,
                         failure_reason=run.failure_reason, started_at=run.time,
                         measured_seconds=1.0 if measured else None, units_of_work=run.rate if measured else None,
                         energy_per_unit_joules=run.energy_per_unit, average_power_watts=run.power)
    return SweepPoint(run.cap_watts, result, sweep_id=run.sweep_id or None, sweep_cut_short=run.sweep_id in cut)


def recommend_runs(runs: list[Run], max_slowdown: float,
                   rule: str = "within-slowdown") -> tuple[Recommendation | None, float | None]:
    """The one rule (:func:`~gpuperfd.probe_data.recommend.recommend_latest`) on a series' runs, failed ones
    included (a failed point withdraws its cap, an aborted or preempted one marks its sweep cut short),
    and the watts it saves while busy; min-energy allows any slowdown."""
    cut = _stopped_between_points(runs)
    points = [p for p in (_as_point(run, cut) for run in runs) if p is not None]
    best = recommend_latest(points, 1.0 if rule == "min-energy" else max_slowdown)
    return best, None if best is None else watts_saved_while_busy(points, best)


def _split_runs(loaded: Loaded, remove_outliers: bool) -> tuple[list[Run], list[Run], list[Dropped]]:
    """The input's runs that did not measure (failed or skipped), the successful ones kept, and the outliers
    dropped; ReportError when none is usable."""
    runs = loaded.runs
    if not runs:
        where = ", ".join(loaded.sources) or "the input"
        raise ReportError(f"no probe runs in {where}" + (f" ({'; '.join(loaded.notes)})" if loaded.notes else
                                                         " (empty, or only headers)"))
    failed = [r for r in runs if r.status != "ok" or r.rate is None]
    ok = [r for r in runs if r.status == "ok" and r.rate is not None]
    if remove_outliers:
        kept, dropped = split_outliers(ok)
    else:
        kept, dropped = ok, []
    if not kept:
        raise ReportError(f"no successful probe runs in the input ({len(failed)} failed)")
    return failed, kept, dropped


def _gpu_tallies(runs: list[Run]) -> tuple[dict[tuple[str, str], GpuId], dict[tuple[str, str], set[str]],
                                          dict[tuple[str, str], int]]:
    """Per GPU: its latest description, every driver version seen, and its run count."""
    identities: dict[tuple[str, str], GpuId] = {}
    drivers: dict[tuple[str, str], set[str]] = defaultdict(set)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for run in sorted(runs, key=lambda r: r.time):
        identities[run.gpu.key] = run.gpu  # the latest description wins
        drivers[run.gpu.key].add(run.gpu.driver_version)
        counts[run.gpu.key] += 1
    return identities, drivers, counts


def _series(
    kept: list[Run], dropped: list[Dropped], identities: dict[tuple[str, str], GpuId], labels: dict[tuple[str, str], str],
    order: dict[tuple[str, str], int], max_slowdown: float, rule: str, all_runs: list[Run] | None = None,
) -> list[Series]:
    """One series per GPU, probe, preset, batch, variant, params and labels: a point per cap, in display order."""
    dropped_per_group: dict[tuple, int] = defaultdict(int)
    for item in dropped:
        dropped_per_group[item.run.group] += 1
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in kept:
        groups[run.group].append(run)
    by_series: dict[tuple, list[CapPoint]] = defaultdict(list)
    units: dict[tuple, str] = {}
    params: dict[tuple, dict[str, Any]] = {}
    for group, members in groups.items():
        gpu_key, probe, preset, batch, _cap, variant, params_key, labels_key = group
        key = (gpu_key, probe, preset, batch, variant, params_key, labels_key)
        by_series[key].append(summarize_group(members, dropped_per_group.get(group, 0)))
        units.setdefault(key, members[0].work_unit or "unit")
        params.setdefault(key, dict(members[0].params))
    # A group whose every run was dropped cannot be: the median run is always kept.

    every: dict[tuple, list[Run]] = defaultdict(list)  # the series' runs, failed ones too: the rule's input
    for run in kept if all_runs is None else all_runs:
        gpu_key, probe, preset, batch, _cap, variant, params_key, labels_key = run.group
        every[(gpu_key, probe, preset, batch, variant, params_key, labels_key)].append(run)
    series = []
    for key, points in by_series.items():
        gpu_key, probe, preset, batch, variant, _params, labels_key = key
        points.sort(key=lambda p: (p.cap_watts is not None, p.cap_watts or 0.0))
        best, saved = recommend_runs(every[key], max_slowdown, rule)
        series.append(Series(
            gpu=identities[gpu_key], probe=probe, preset=preset, batch_size=batch, work_unit=units[key],
            points=points, recommendation=best, saved_watts=saved,
            label=labels[gpu_key], variant=variant, params=params[key], labels=dict(labels_key),
        ))
    series.sort(key=lambda s: (PROBE_ORDER.index(s.probe) if s.probe in PROBE_ORDER else 99, s.preset,
                               order[s.gpu.key], s.variant, sorted((k, str(v)) for k, v in s.params.items()),
                               sorted(s.labels.items())))
    return series


def build_report(
    loaded: Loaded, max_slowdown: float = 0.10, remove_outliers: bool = True, now: float | None = None,
    rule: str = "within-slowdown",
    log_y: bool | None = None,
) -> Report:
    """Everything the figures, HTML and CSV show. ReportError when no run is usable."""
    if not 0 <= max_slowdown < 1:
        raise ReportError(f"max slowdown must be in [0, 1), got {max_slowdown}")
    if rule not in RULES:
        raise ReportError(f"rule: {rule!r} is not one of {', '.join(RULES)}")
    runs = loaded.runs
    failed, kept, dropped = _split_runs(loaded, remove_outliers)
    identities, drivers, counts = _gpu_tallies(runs)
    labels = gpu_labels(identities.values())
    order = {gpu_key: i for i, gpu_key in enumerate(sorted(identities, key=lambda k: (identities[k].model, k)))}
    series = _series(kept, dropped, identities, labels, order, max_slowdown, rule, runs)
    gpus = [GpuSummary(identities[k], labels[k], sorted(drivers[k]), counts[k]) for k in sorted(identities, key=order.get)]
    times = [r.time for r in runs if r.time]
    return Report(
        generated_at=time.time() if now is None else now,
        sources=list(loaded.sources),
        max_slowdown=max_slowdown,
        gpus=gpus,
        series=series,
        runs_total=len(runs),
        runs_kept=len(kept),
        dropped=dropped,
        failed=[r for r in failed if r.status != "skipped"],
        first_time=min(times) if times else None,
        last_time=max(times) if times else None,
        notes=list(loaded.notes),
        outliers_removed=remove_outliers,
        rule=rule,
        log_y=log_y,
        skipped=[r for r in failed if r.status == "skipped"],
        realized=realized_rows(runs),
    )


def summary_rows(report: Report) -> list[dict[str, Any]]:
    """One row per series: the recommendation (summary.csv)."""
    rows = []
    for s in report.series:
        rec, base, best = s.recommendation, s.baseline, s.recommended
        rows.append({
            "node": s.gpu.node,
            "gpu_index": s.gpu.index,
            "gpu_uuid": s.gpu.uuid,
            "gpu_name": s.gpu.name,
            "driver_version": s.gpu.driver_version,
            "kind": s.kind,
            "probe": s.probe,
            "preset": s.preset,
            "batch_size": s.batch_size if s.batch_size is not None else "",
            "work_unit": s.work_unit,
            "variant": s.variant,
            "params": params_text(s.params, model=False),
            "labels": labels_text(s.labels) or "",
            "caps_tested_watts": " ".join(f"{p.cap_watts:g}" for p in s.capped),
            "baseline_cap_watts": rec.baseline_cap_watts if rec else "",
            "baseline_units_per_second": base.rate if rec and base else "",
            "baseline_energy_per_unit_joules": base.energy_per_unit if rec and base else "",
            "recommended_cap_watts": rec.cap_watts if rec else "",
            "recommended_units_per_second": best.rate if best else "",
            "recommended_energy_per_unit_joules": best.energy_per_unit if best else "",
            "energy_saving_ratio": rec.energy_saving_ratio if rec else "",
            "slowdown_ratio": rec.slowdown_ratio if rec else "",
            "power_saving_watts": s.power_saving_watts if s.power_saving_watts is not None else "",
            "max_slowdown": report.max_slowdown,
            "rule": report.rule,
        })
    return rows


def point_rows(report: Report) -> list[dict[str, Any]]:
    """One row per (series, cap): the measured means (points.csv)."""
    rows = []
    for s in report.series:
        for p in s.points:
            name = s.latency_name
            rows.append({
                "node": s.gpu.node,
                "gpu_index": s.gpu.index,
                "gpu_uuid": s.gpu.uuid,
                "gpu_name": s.gpu.name,
                "kind": s.kind,
                "probe": s.probe,
                "preset": s.preset,
                "batch_size": s.batch_size if s.batch_size is not None else "",
                "variant": s.variant,
                "params": params_text(s.params, model=False),
                "labels": labels_text(s.labels) or "",
                "cap_watts": _blank(p.cap_watts),
                "runs": p.runs,
                "outliers_dropped": p.dropped,
                "work_unit": s.work_unit,
                "units_per_second": p.rate,
                "units_per_second_stdev": p.rate_stdev,
                "energy_per_unit_joules": _blank(p.energy_per_unit),
                "average_power_watts": _blank(p.power),
                "latency": name,
                "latency_p50_seconds": _blank(p.latency(name, 50)),
                "latency_p95_seconds": _blank(p.latency(name, 95)),
                "latency_p99_seconds": _blank(p.latency(name, 99)),
                "ttft_p50_seconds": _blank(p.latency("ttft_seconds", 50)),
                "ttft_p99_seconds": _blank(p.latency("ttft_seconds", 99)),
                "latency_mean_seconds": _blank(p.latency(name, "mean")),
                "requests_per_second": _blank(p.throughput.get("requests_per_second")),
                "peak_memory_bytes": _blank(p.peak_memory_bytes),
                "allocated_memory_bytes": _blank(p.allocated_memory_bytes),
                "gpu_busy_ratio": _blank(p.gpu_busy_ratio),
                "gpm_tensor_active_ratio": _blank(p.gpm_tensor_active_ratio),
                "gpm_dram_active_ratio": _blank(p.gpm_dram_active_ratio),
                "temperature_celsius": _blank(p.temperature),
                "gpu_utilization_ratio": _blank(p.utilization),
                "memory_utilization_ratio": _blank(p.memory_utilization),
                "loss": _blank(p.loss),
                "recommended": int(bool(s.recommendation and p is s.recommended)),
                "baseline": int(bool(s.recommendation and p is s.baseline)),
            })
    return rows


def _blank(value: Any) -> Any:
    return "" if value is None else value
