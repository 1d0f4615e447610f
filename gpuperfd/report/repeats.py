"""The summary of studies without a power-cap sweep: each metric's mean, spread and CV over repeats.

Seed 000 runs one workload ten times and asks for the averages; a cap grid or a parameter chart
has nothing to say there. For every series measured at one cap (or none), the repeats are its
measured windows when the input keeps them (JSON lines), else its runs (CSV keeps one row per
run). :func:`repeat_rows` gives the table, :func:`repeat_series` what the per-repeat chart draws.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuperfd.report.aggregate import CapPoint, Report, Series
from gpuperfd.report.records import LATENCY_TITLES

#: (key in a window or run, label, unit, scale to the unit shown)
METRICS: tuple[tuple[str, str, str, float], ...] = (
    ("rate", "throughput", "{unit}s/s", 1.0),
    ("power", "average power", "W", 1.0),
    ("energy_per_unit", "energy per unit", "J/{unit}", 1.0),
    ("utilization", "GPU utilization", "%", 100.0),
    ("memory_utilization", "memory utilization", "%", 100.0),
    ("temperature", "GPU temperature", "\u00b0C", 1.0),
    ("peak_memory_bytes", "peak memory", "MiB", 1.0 / 2**20),
    ("allocated_memory_bytes", "allocated memory", "MiB", 1.0 / 2**20),
)


@dataclass
class RepeatRow:
    """One metric of one series over its repeats."""

    series: Series
    metric: str
    label: str
    unit: str
    over: str  # "windows" or "runs"
    values: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def stdev(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    @property
    def cv(self) -> float | None:
        sd = self.stdev
        return sd / abs(self.mean) if sd is not None and self.mean else None


def uncapped_series(report: Report) -> list[Series]:
    """Series with no cap curve (one cap or none): the ones a repeats summary describes."""
    return [s for s in report.series if len(s.capped) < 2]


def _values(point: CapPoint, key: str) -> tuple[str, list[float]]:
    windows = [w.get(key) for w in point.windows]
    windows = [v for v in windows if v is not None]
    if len(windows) > 1:
        return "windows", windows
    runs = [r.get(key) for r in point.run_values]
    return "runs", [v for v in runs if v is not None]


def repeat_rows(report: Report) -> list[RepeatRow]:
    """Each metric with a value, per uncapped series: mean, stdev and CV over windows (or runs)."""
    rows = []
    for s in uncapped_series(report):
        point = s.points[-1]
        for key, label, unit, scale in METRICS:
            over, values = _values(point, key)
            if not values:
                continue
            rows.append(RepeatRow(s, key, label, unit.format(unit=s.work_unit), over, [v * scale for v in values]))
        for name in dict.fromkeys([s.latency_name, *point.latencies]):
            for stat in ("mean", "p50", "p99"):
                value = point.latency(name, stat)
                if value is not None:
                    # Latency pools the samples of every window: one figure, no spread across repeats.
                    title = LATENCY_TITLES.get(name, name)
                    rows.append(RepeatRow(s, f"{name}:{stat}", f"{title} {stat}", "ms", "pooled samples",
                                          [1000 * value]))
    return rows


def repeat_series(report: Report) -> list[tuple[Series, list[RepeatRow]]]:
    """Per uncapped series with two repeats or more, the rows a per-repeat chart draws."""
    out = []
    for s in uncapped_series(report):
        rows = [r for r in repeat_rows(report) if r.series is s and len(r.values) > 1]
        if rows:
            out.append((s, rows))
    return out
