"""Matplotlib figures of a :class:`~gpuperfd.report.aggregate.Report` (Agg backend, no display).

* :func:`cap_figure`: throughput, energy per unit, average power and latency
  (p50 line, band to p99) against the power cap; one column per workload
  (probe, preset), inference on the left and training on the right; one line per
  GPU (colour) and batch size (line style); the recommended cap is a star.
* :func:`batch_figure`: throughput, latency and energy per unit against batch
  size, for workloads run at two batch sizes or more.
* :func:`overview_figure`: the one-page PNG: header, both grids, recommendations.
"""

from __future__ import annotations

import io
from datetime import datetime, timezone
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import EngFormatter, FixedLocator, NullLocator  # noqa: E402

from gpuperfd.report.aggregate import Report, Series  # noqa: E402
from gpuperfd.report.records import LATENCY_TITLES, kind_of  # noqa: E402

COLUMN_INCHES = 4.0
ROW_INCHES = 2.35
DPI = 110
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
STAR = dict(marker="*", markersize=15, markeredgecolor="black", markeredgewidth=0.8, zorder=5, linestyle="none")

CAP_ROWS = ("rate", "energy", "power", "latency")
BATCH_ROWS = ("rate", "latency", "energy")


def utc(stamp: float | None, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).strftime(fmt) if stamp else "-"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


class _Style:
    """Colour per GPU, line style per batch size within a workload."""

    def __init__(self, report: Report) -> None:
        self.colors = {g.gpu.key: COLORS[i % len(COLORS)] for i, g in enumerate(report.gpus)}
        self.batches = {
            w: sorted({s.batch_size or 0 for s in report.series_of(w)}) for w in report.workloads
        }

    def of(self, s: Series) -> dict[str, Any]:
        order = self.batches[s.workload].index(s.batch_size or 0)
        return {"color": self.colors[s.gpu.key], "linestyle": STYLES[order % len(STYLES)],
                "marker": MARKERS[order % len(MARKERS)]}

    def label(self, s: Series) -> str:
        text = f"{s.label} \u00b7 {s.probe}"
        if len(self.batches[s.workload]) > 1 and s.batch_size is not None:
            text += f" b={s.batch_size}"
        return text


def _energy_scale(values: list[float]) -> tuple[float, str]:
    top = max(values, default=1.0)
    return (1000.0, "mJ") if top < 1 else (1.0, "J")


def _workload_title(workload: tuple[str, str]) -> str:
    return f"{workload[0]} \u00b7 {workload[1]}"


def _draw_cap_column(axes: list, report: Report, workload: tuple[str, str], style: _Style) -> None:
    series = report.series_of(workload)
    unit = series[0].work_unit
    latency_name = series[0].latency_name
    scale, energy_unit = _energy_scale([p.energy_per_unit for s in series for p in s.points if p.energy_per_unit])
    for s in series:
        look = style.of(s)
        caps = [p.cap_watts for p in s.points]
        rec = s.recommended
        values = {
            "rate": [p.rate for p in s.points],
            "energy": [p.energy_per_unit * scale if p.energy_per_unit is not None else float("nan") for p in s.points],
            "power": [p.power if p.power is not None else float("nan") for p in s.points],
        }
        for row, ax in zip(CAP_ROWS, axes):
            if row == "latency":
                p50 = [_ms(p.latency(latency_name, 50)) for p in s.points]
                p99 = [_ms(p.latency(latency_name, 99)) for p in s.points]
                ax.plot(caps, p50, color=look["color"], linestyle=look["linestyle"], marker=look["marker"], markersize=3.5)
                ax.fill_between(caps, p50, p99, color=look["color"], alpha=0.15, linewidth=0)
                if rec is not None and rec.latency(latency_name, 50) is not None:
                    ax.plot([rec.cap_watts], [_ms(rec.latency(latency_name, 50))], color=look["color"], **STAR)
                continue
            ax.plot(caps, values[row], label=style.label(s) if row == "rate" else None, markersize=3.5, **look)
            if rec is not None:
                index = s.points.index(rec)
                ax.plot([rec.cap_watts], [values[row][index]], color=look["color"], **STAR)
    labels = {
        "rate": f"{unit}s/s",
        "energy": f"{energy_unit} per {unit}",
        "power": "average power (W)",
        "latency": f"{LATENCY_TITLES.get(latency_name, latency_name)} (ms)\nline p50, band to p99",
    }
    for row, ax in zip(CAP_ROWS, axes):
        _tidy(ax)
        ax.set_ylabel(labels[row], fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
        if row == "rate":
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
            ax.set_title(_workload_title(workload), fontsize=10, fontweight="bold")
            handles, names = ax.get_legend_handles_labels()
            handles.append(Line2D([], [], color="grey", **STAR))
            names.append("recommended cap")
            ax.legend(handles, names, fontsize=6.5, loc="lower right", framealpha=0.8)
        if row == "latency":
            has_latency = any(p.latency(latency_name, 50) is not None for s in series for p in s.points)
            if not has_latency:
                ax.text(0.5, 0.5, "no latency samples\n(Prometheus input)", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="grey")
            ax.set_xlabel("power cap (W)", fontsize=8)


def _tidy(ax: Any) -> None:
    """No offset notation, and no y range narrower than +-4% of its middle (noise would look like a trend)."""
    from matplotlib.ticker import ScalarFormatter

    if isinstance(ax.yaxis.get_major_formatter(), ScalarFormatter):
        ax.yaxis.get_major_formatter().set_useOffset(False)
    values = [y for line in ax.get_lines() for y in line.get_ydata() if y == y]  # skips NaN
    values += [y for collection in ax.collections for path in collection.get_paths()
               for y in path.vertices[:, 1] if y == y]  # the p50-p99 bands
    if not values:
        return
    lo, hi = min(values), max(values)
    middle = (lo + hi) / 2
    if middle and hi - lo < 0.08 * abs(middle):
        ax.set_ylim(middle - 0.04 * abs(middle), middle + 0.04 * abs(middle))


def _ms(seconds: float | None) -> float:
    return seconds * 1000 if seconds is not None else float("nan")


def _draw_batch_column(axes: list, report: Report, workload: tuple[str, str], style: _Style) -> None:
    series = report.series_of(workload)
    unit = series[0].work_unit
    latency_name = series[0].latency_name
    scale, energy_unit = _energy_scale([p.energy_per_unit for s in series for p in s.points if p.energy_per_unit])
    by_gpu: dict[tuple[str, str], list[Series]] = {}
    for s in series:
        if s.batch_size is not None and s.baseline is not None:
            by_gpu.setdefault(s.gpu.key, []).append(s)
    batches = sorted({s.batch_size for group in by_gpu.values() for s in group})
    for members in by_gpu.values():
        members.sort(key=lambda s: s.batch_size)
        color = style.colors[members[0].gpu.key]
        name = f"{members[0].label} \u00b7 {members[0].probe}"
        xs = [s.batch_size for s in members]
        base = [s.baseline for s in members]
        caps = sorted({round(b.cap_watts) for b in base})
        cap_text = f"{caps[0]} W" if len(caps) == 1 else "highest cap"
        axes[0].plot(xs, [b.rate for b in base], color=color, marker="o", markersize=3.5, label=f"{name} at {cap_text}")
        axes[1].plot(xs, [_ms(b.latency(latency_name, 50)) for b in base], color=color, marker="o", markersize=3.5,
                     label=f"{name} p50")
        axes[1].plot(xs, [_ms(b.latency(latency_name, 99)) for b in base], color=color, marker="v", markersize=3.5,
                     linestyle=":", label=f"{name} p99")
        axes[2].plot(xs, [b.energy_per_unit * scale if b.energy_per_unit else float("nan") for b in base],
                     color=color, marker="o", markersize=3.5, label=f"{name} at {cap_text}")
        rec = [(s.batch_size, s.recommended) for s in members if s.recommended is not None]
        if rec:
            axes[2].plot([b for b, _ in rec], [p.energy_per_unit * scale if p.energy_per_unit else float("nan") for _, p in rec],
                         color=color, marker="*", markersize=8, linestyle="--", label=f"{name} at recommended cap")
    labels = (f"{unit}s/s", f"{LATENCY_TITLES.get(latency_name, latency_name)} (ms)", f"{energy_unit} per {unit}")
    for ax, label in zip(axes, labels):
        _tidy(ax)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_ylabel(label, fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6.5, framealpha=0.8)
    axes[0].yaxis.set_major_formatter(EngFormatter(sep=""))
    axes[0].set_title(_workload_title(workload), fontsize=10, fontweight="bold")
    axes[-1].set_xlabel("batch size", fontsize=8)


def batch_workloads(report: Report) -> list[tuple[str, str]]:
    return [w for w in report.workloads if len({s.batch_size for s in report.series_of(w) if s.batch_size}) > 1]


def _kind_columns(workloads: list[tuple[str, str]]) -> list[tuple[str, list[tuple[str, str]]]]:
    return [("Inference", [w for w in workloads if kind_of(w[0]) == "inference"]),
            ("Training", [w for w in workloads if kind_of(w[0]) == "training"])]


def _draw_grid(container: Any, report: Report, workloads: list[tuple[str, str]], rows: tuple[str, ...], what: str) -> None:
    style = _Style(report)
    columns = _kind_columns(workloads)
    widths = [max(len(ws), 0.6) for _, ws in columns]
    halves = container.subfigures(1, 2, width_ratios=widths, wspace=0.01)
    for half, (title, ws) in zip(halves, columns):
        half.suptitle(title, fontsize=12, fontweight="bold")
        if not ws:
            ax = half.add_subplot()
            ax.axis("off")
            ax.text(0.5, 0.5, f"no {title.lower()} probe\n{what} in this data", ha="center", va="center",
                    fontsize=9, color="grey", transform=ax.transAxes)
            continue
        axes = half.subplots(len(rows), len(ws), squeeze=False, sharex="col")
        for column, workload in enumerate(ws):
            column_axes = [axes[r][column] for r in range(len(rows))]
            if rows is CAP_ROWS:
                _draw_cap_column(column_axes, report, workload, style)
            else:
                _draw_batch_column(column_axes, report, workload, style)


def _grid_size(workloads: list[tuple[str, str]], rows: int) -> tuple[float, float]:
    columns = sum(max(len(ws), 0.6) for _, ws in _kind_columns(workloads))
    return max(9.0, COLUMN_INCHES * columns), ROW_INCHES * rows + 0.5


def cap_figure(report: Report) -> Figure:
    width, height = _grid_size(report.workloads, len(CAP_ROWS))
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    _draw_grid(fig, report, report.workloads, CAP_ROWS, "runs")
    return fig


def batch_figure(report: Report) -> Figure | None:
    workloads = batch_workloads(report)
    if not workloads:
        return None
    width, height = _grid_size(workloads, len(BATCH_ROWS))
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    _draw_grid(fig, report, workloads, BATCH_ROWS, "batch-size sweep")
    return fig


def header_lines(report: Report) -> list[str]:
    gpus = []
    for g in report.gpus[:8]:
        gpus.append(f"{g.gpu.name} (gpu{g.gpu.index} @ {g.gpu.node}, driver {', '.join(g.drivers)}, "
                    f"CC {g.gpu.compute_capability}, {g.gpu.backend})")
    if len(report.gpus) > 8:
        gpus.append(f"... and {len(report.gpus) - 8} more")
    lines = [
        f"Generated {utc(report.generated_at)} \u00b7 data {utc(report.first_time)} to {utc(report.last_time)} \u00b7 "
        f"recommended cap: lowest energy per unit within {report.max_slowdown:.0%} of the highest cap's throughput",
        f"Nodes: {', '.join(report.nodes)} \u00b7 drivers: {', '.join(report.drivers)}",
        *[("GPUs: " if i == 0 else "      ") + text for i, text in enumerate(gpus)],
        f"Runs: {report.runs_total} ({report.runs_kept} kept, {len(report.dropped)} outliers removed, "
        f"{len(report.failed)} failed) \u00b7 "
        + ("outliers: outside median \u00b1 max(3\u00b71.4826\u00b7MAD, 5%) per (GPU, probe, preset, batch, cap)"
           if report.outliers_removed else "outlier removal off"),
    ]
    return lines


def summary_table(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["GPU", "probe", "preset", "batch", "recommended cap", "baseline cap", "energy saving", "slowdown",
            "energy/unit rec. / base", "throughput rec. / base"]
    rows = []
    for s in report.series:
        rec, best, base = s.recommendation, s.recommended, s.baseline
        if rec is None or best is None or base is None:
            rows.append([s.label, s.probe, s.preset, str(s.batch_size or "-"), "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([
            s.label, s.probe, s.preset, str(s.batch_size or "-"), f"{rec.cap_watts:.0f} W", f"{rec.baseline_cap_watts:.0f} W",
            percent(rec.energy_saving_ratio), percent(rec.slowdown_ratio),
            f"{energy_text(best.energy_per_unit)} / {energy_text(base.energy_per_unit)} per {s.work_unit}",
            f"{_short(best.rate)} / {_short(base.rate)} {s.work_unit}s/s",
        ])
    return head, rows


def energy_text(joules: float | None) -> str:
    if joules is None:
        return "-"
    return f"{joules * 1000:.2f} mJ" if abs(joules) < 1 else f"{joules:.3f} J"


def _short(value: float | None) -> str:
    if value is None:
        return "-"
    return EngFormatter(places=3 if abs(value) < 1 else 1, sep="")(value)


def overview_figure(report: Report) -> Figure:
    """The one-page report: header, the cap grid, the batch grid (if any), the recommendations."""
    cap_w, cap_h = _grid_size(report.workloads, len(CAP_ROWS))
    batch_ws = batch_workloads(report)
    batch_w, batch_h = _grid_size(batch_ws, len(BATCH_ROWS)) if batch_ws else (0.0, 0.0)
    header_h = 0.55 + 0.19 * len(header_lines(report))
    head, rows = summary_table(report)
    summary_h = 0.6 + 0.2 * (len(rows) + 1)
    width = max(cap_w, batch_w, 14.0)
    heights = [header_h, cap_h, batch_h, summary_h] if batch_ws else [header_h, cap_h, summary_h]
    fig = Figure(figsize=(width, sum(heights)), dpi=DPI, layout="constrained")
    parts = fig.subfigures(len(heights), 1, height_ratios=heights, hspace=0.01)
    header = parts[0]
    header.set_facecolor("#f3f5f8")
    header.text(0.01, 0.93, "gpuperfd report: power caps, throughput, latency and energy", fontsize=15,
                fontweight="bold", va="top")
    header.text(0.01, 0.93 - 0.42 / header_h, "\n".join(header_lines(report)), fontsize=9, va="top", family="monospace",
                linespacing=1.35)
    if any(g.gpu.backend == "simulated" for g in report.gpus):
        header.text(0.99, 0.93, "SIMULATED GPUs: numbers from the simulator, not hardware", fontsize=9, color="#b00",
                    ha="right", va="top", fontweight="bold")
    parts[1].suptitle("Against power cap", fontsize=13, x=0.01, ha="left")
    _draw_grid(parts[1], report, report.workloads, CAP_ROWS, "runs")
    if batch_ws:
        parts[2].suptitle("Against batch size (at the highest cap; energy also at each batch's recommended cap)",
                          fontsize=13, x=0.01, ha="left")
        _draw_grid(parts[2], report, batch_ws, BATCH_ROWS, "batch-size sweep")
    summary = parts[-1]
    summary.suptitle("Recommended power caps", fontsize=13, x=0.01, ha="left")
    ax = summary.add_subplot()
    ax.axis("off")
    if rows:
        table = ax.table(cellText=rows, colLabels=head, loc="upper center", cellLoc="left", colLoc="left")
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.auto_set_column_width(list(range(len(head))))
        for (row, _col), cell in table.get_celld().items():
            cell.set_linewidth(0.3)
            if row == 0:
                cell.set_facecolor("#e4e8ee")
                cell.set_text_props(fontweight="bold")
    return fig


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
