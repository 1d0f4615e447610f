"""Matplotlib figures of a :class:`~gpuperfd.report.aggregate.Report` (Agg backend, no display).

* :func:`cap_figure`: throughput, energy per unit, average power and latency
  (p50 line, band to p99) against the power cap; one column per workload
  (probe, preset), inference on the left and training on the right; one line per
  GPU (colour) and batch size (line style); the recommended cap is a star.
* :func:`axes_figure`: throughput, latency (TTFT and TPOT for llm) and peak memory
  against each parameter that varies (model size, batch size, sequence length,
  n_groups, ...), one line per combination of the other factors (seed 002).
* :func:`bar_figure`: grouped bars comparing variants, GPUs or hosts (seed 004).
* :func:`overview_figure`: the one-page PNG: header, both grids, recommendations.
"""

from __future__ import annotations

import io
from datetime import datetime, timezone
from contextvars import ContextVar
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import EngFormatter, FixedLocator, NullLocator  # noqa: E402

from gpuperfd.probe_data.kinds import KINDS  # noqa: E402
from gpuperfd.report.aggregate import Report, Series  # noqa: E402
from gpuperfd.report.records import LATENCY_TITLES, kind_of  # noqa: E402
from gpuperfd.report.repeats import repeat_rows, repeat_series  # noqa: E402
from gpuperfd.report.scales import panel_ranges, shared_range, tag  # noqa: E402

COLUMN_INCHES = 4.0
ROW_INCHES = 2.35
DPI = 110
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
STAR = dict(marker="*", markersize=15, markeredgecolor="black", markeredgewidth=0.8, zorder=5, linestyle="none")

CAP_ROWS = ("rate", "energy", "power", "latency", "temperature", "utilization", "loss")


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
        order = self.batches[s.workload].index(s.batch_size or 0) if s.workload in self.batches else 0
        return {"color": self.colors[s.gpu.key], "linestyle": STYLES[order % len(STYLES)],
                "marker": MARKERS[order % len(MARKERS)]}

    def label(self, s: Series) -> str:
        text = f"{s.label} \u00b7 {s.probe}/{s.variant}" if s.variant else f"{s.label} \u00b7 {s.probe}"
        if len(self.batches.get(s.workload, [])) > 1 and s.batch_size is not None:
            text += f" b={s.batch_size}"
        if s.labels:
            text += " " + " ".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        return text


def _energy_scale(values: list[float]) -> tuple[float, str]:
    top = max(values, default=1.0)
    return (1000.0, "mJ") if top < 1 else (1.0, "J")


def _workload_title(workload: tuple[str, str]) -> str:
    return f"{workload[0]} \u00b7 {workload[1]}"


def cap_series(report: Report, workload: tuple[str, str]) -> list[Series]:
    """The series of a workload that ran at two caps or more (the rest have no cap curve)."""
    return [s for s in report.series_of(workload) if len(s.capped) > 1]


def cap_workloads(report: Report) -> list[tuple[str, str]]:
    return [w for w in report.workloads if cap_series(report, w)]


_EMPTY_WHY = {
    "temperature": "no GPU temperature in the input\n(CPU run, older simulated run or no NVML)",
    "utilization": "no GPU utilization in the input\n(CPU run, older simulated run or no NVML)",
    "loss": "no loss: only the train\nprobe reports one",
    "latency": "no latency samples\n(Prometheus input)",
    "energy": "no energy readings\n(CPU run: no energy counter)",
    "power": "no power readings\n(CPU run: no energy counter)",
}


def _empty(ax: Any, why: str) -> None:
    ax.gpuperfd_empty = why  # read back by empty_panels()
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey")


def empty_panels(fig: Figure | None) -> list[str]:
    """Why each panel of ``fig`` that shows no data is empty (none: every panel has data)."""
    if fig is None:
        return []
    return [getattr(ax, "gpuperfd_empty") for ax in fig.get_axes() if getattr(ax, "gpuperfd_empty", None)]


def cap_rows(report: Report, workloads: list[tuple[str, str]]) -> tuple[str, ...]:
    """The rows of the cap grid that have data for at least one workload (throughput always): a row
    empty everywhere (no loss in any run, no temperature on a CPU) is left out, not drawn as blanks."""
    points = [p for w in workloads for s in cap_series(report, w) for p in s.capped]
    has = {
        "rate": True,
        "energy": any(p.energy_per_unit is not None for p in points),
        "power": any(p.power is not None for p in points),
        "latency": any(p.latencies for p in points),
        "temperature": any(p.temperature is not None for p in points),
        "utilization": any(p.utilization is not None for p in points),
        "loss": any(p.loss is not None for p in points),
    }
    return tuple(row for row in CAP_ROWS if has[row])


def _draw_cap_column(axes: list, report: Report, workload: tuple[str, str], style: _Style,
                     rows: tuple[str, ...] = CAP_ROWS) -> None:
    series = cap_series(report, workload)
    unit = series[0].work_unit
    latency_name = series[0].latency_name
    scale, energy_unit = _energy_scale([p.energy_per_unit for s in series for p in s.points if p.energy_per_unit])
    nan = float("nan")
    for s in series:
        look = style.of(s)
        points = s.capped
        caps = [p.cap_watts for p in points]
        rec = s.recommended
        values = {
            "rate": [p.rate for p in points],
            "energy": [p.energy_per_unit * scale if p.energy_per_unit is not None else nan for p in points],
            "power": [p.power if p.power is not None else nan for p in points],
            "temperature": [p.temperature if p.temperature is not None else nan for p in points],
            "utilization": [100 * p.utilization if p.utilization is not None else nan for p in points],
            "loss": [p.loss if p.loss is not None else nan for p in points],
        }
        for row, ax in zip(rows, axes):
            if row == "latency":
                p50 = [_ms(p.latency(latency_name, 50)) for p in points]
                p99 = [_ms(p.latency(latency_name, 99)) for p in points]
                ax.plot(caps, p50, color=look["color"], linestyle=look["linestyle"], marker=look["marker"], markersize=3.5)
                ax.fill_between(caps, p50, p99, color=look["color"], alpha=0.15, linewidth=0)
                if rec is not None and rec.latency(latency_name, 50) is not None:
                    ax.plot([rec.cap_watts], [_ms(rec.latency(latency_name, 50))], color=look["color"], **STAR)
                continue
            ax.plot(caps, values[row], label=style.label(s) if row == "rate" else None, markersize=3.5, **look)
            if rec is not None and rec in points:
                index = points.index(rec)
                ax.plot([rec.cap_watts], [values[row][index]], color=look["color"], **STAR)
    labels = {
        "rate": f"{unit}s/s",
        "energy": f"{energy_unit} per {unit}",
        "power": "average power (W)",
        "latency": f"{LATENCY_TITLES.get(latency_name, latency_name)} (ms)\nline p50, band to p99",
        "temperature": "GPU temperature (\u00b0C)",
        "utilization": "GPU utilization (%)",
        "loss": "training loss",
    }
    for row, ax in zip(rows, axes):
        _tidy(ax)
        tag(ax, (workload, row), scale if row == "energy" else 1.0)
        _share_y(ax)
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
        has = any(y == y for line in ax.get_lines() for y in line.get_ydata())
        if not has and row == "loss" and kind_of(workload[0]) != "training":
            # Not missing data: an inference workload has no loss (the row is there for training's).
            ax.set_yticks([])
            ax.text(0.5, 0.5, "inference: no training loss", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8, color="grey")
        elif not has and row in _EMPTY_WHY:
            _empty(ax, _EMPTY_WHY[row])
        if row == rows[-1]:
            ax.set_xlabel("power cap (W)", fontsize=8)


#: Log y axis: True (``--log-y``), False (``--linear-y``), None: automatic (values span > 2 decades).
_LOG_Y: ContextVar[bool | None] = ContextVar("gpuperfd_log_y", default=None)
#: A panel's values spanning more than this ratio get a log y axis when the choice is automatic.
LOG_SPAN = 100.0


def wants_log(values: list[float], log_y: bool | None) -> bool:
    """Whether a panel with ``values`` gets a log y axis (only positive values can)."""
    positive = [v for v in values if v == v and v > 0]
    if not positive or len(positive) < len([v for v in values if v == v]):
        return False
    if log_y is not None:
        return log_y
    return max(positive) / min(positive) > LOG_SPAN


def panel_outliers(values: list[float]) -> list[int]:
    """Indices of values far from the panel's others: more than 3 scaled MADs *and* 10x off the median
    (in log space), so one disturbed run is marked even where every group has a single run."""
    import math
    import statistics

    logs = [(i, math.log10(v)) for i, v in enumerate(values) if v == v and v > 0]
    if len(logs) < 4:
        return []
    centre = statistics.median(x for _, x in logs)
    mad = statistics.median(abs(x - centre) for _, x in logs)
    bound = max(3 * 1.4826 * mad, 1.0)
    return [i for i, x in logs if abs(x - centre) > bound]


def _tidy(ax: Any) -> None:
    """No offset notation, and no y range narrower than +-4% of its middle (noise would look like a trend).

    A panel whose values span more than two decades (or any, with ``--log-y``) gets a log y axis, and
    points far from the rest are ringed in red, so one noisy point never flattens the others.
    """
    from matplotlib.ticker import ScalarFormatter

    if isinstance(ax.yaxis.get_major_formatter(), ScalarFormatter):
        ax.yaxis.get_major_formatter().set_useOffset(False)
    points = [(x, y) for line in ax.get_lines() if line.get_marker() not in (None, "None", "")
              for x, y in zip(line.get_xdata(), line.get_ydata()) if y == y]
    values = [y for line in ax.get_lines() for y in line.get_ydata() if y == y]  # skips NaN
    values += [y for collection in ax.collections for path in collection.get_paths()
               for y in path.vertices[:, 1] if y == y]  # the p50-p99 bands
    if not values:
        return
    _mark_outliers(ax, points)
    if wants_log(values, _LOG_Y.get()):
        ax.set_yscale("log")
        return
    lo, hi = min(values), max(values)
    middle = (lo + hi) / 2
    if middle and hi - lo < 0.08 * abs(middle):
        ax.set_ylim(middle - 0.04 * abs(middle), middle + 0.04 * abs(middle))


def _share_y(ax: Any) -> None:
    """The y range every facet's same panel shares (:mod:`gpuperfd.report.scales`), if one is in force;
    log when that range spans more than two decades (or with ``--log-y``), padded 5 %."""
    span = shared_range(ax)
    if span is None:
        return
    lo, hi = span
    if wants_log([lo, hi], _LOG_Y.get()):
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.15, hi * 1.15)
        return
    ax.set_yscale("linear")
    middle = (lo + hi) / 2
    width = max(hi - lo, 0.08 * abs(middle)) or 1.0
    ax.set_ylim(middle - 0.55 * width, middle + 0.55 * width)


def cap_panel_ranges(report: Report) -> dict[Any, tuple[float, float]]:
    """Each power-cap panel's data range (base units), measured on a figure that is never saved."""
    return panel_ranges(cap_figure(report))


def _with_report_scale(draw: Any) -> Any:
    """Run a figure builder with the report's ``log_y`` choice in effect for every panel."""
    import functools

    @functools.wraps(draw)
    def wrapper(report: Report, *args: Any, **kwargs: Any) -> Any:
        token = _LOG_Y.set(getattr(report, "log_y", None))
        try:
            return draw(report, *args, **kwargs)
        finally:
            _LOG_Y.reset(token)

    return wrapper


def _mark_outliers(ax: Any, points: list[tuple[float, float]]) -> None:
    flagged = sorted(set(panel_outliers([y for _, y in points])))
    ax.gpuperfd_outliers = len(flagged)
    if not flagged:
        return
    ax.scatter([points[i][0] for i in flagged], [points[i][1] for i in flagged], s=90, facecolors="none",
               edgecolors="red", linewidths=1.2, zorder=5)
    ax.text(0.99, 0.02, f"{len(flagged)} point(s) >10x off the rest (ringed)", transform=ax.transAxes,
            ha="right", va="bottom", fontsize=6.5, color="red")


def _ms(seconds: float | None) -> float:
    return seconds * 1000 if seconds is not None else float("nan")


# --- against the parameters that vary (seed 002) and grouped bars (seed 004) ---------------

#: Candidate x axes, in the order their rows appear: (factor, axis title).
AXES: tuple[tuple[str, str], ...] = (
    ("model", "model size (smallest to largest)"),
    ("batch_size", "batch size"),
    ("prompt_tokens", "prompt length (tokens)"),
    ("seq_len", "sequence length (tokens)"),
    ("image_size", "image size (px)"),
    ("output_tokens", "output tokens per request"),
    ("n_groups", "query heads per KV head (n_groups)"),
)
_SHORT = {"batch_size": "b=", "prompt_tokens": "in=", "output_tokens": "out=", "seq_len": "s=", "image_size": "px=",
          "n_groups": "g=", "heads": "h=", "head_dim": "d=", "dtype": "", "variant": "", "gpu": "", "model": "",
          "causal": "causal="}


def _base_point(s: Series) -> Any:
    """The point a parameter chart uses: the highest cap tested, or the only (uncapped) point."""
    return s.baseline if s.baseline is not None else s.points[-1]


def _factors(s: Series) -> dict[str, Any]:
    return {**s.labels, "model": s.preset, "variant": s.variant, "gpu": s.label, **s.params}


def _varying(series: list[Series]) -> dict[str, list[Any]]:
    values: dict[str, list[Any]] = {}
    for s in series:
        for key, value in _factors(s).items():
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    return {k: v for k, v in values.items() if len(v) > 1}


def _metrics(probe: str, unit: str) -> list[tuple[str, str]]:
    """(metric key, y label) columns of the parameter and bar charts for one probe."""
    from gpuperfd.report.records import PRIMARY_LATENCY

    kind = KINDS.get(probe)
    names = (kind.chart_latencies if kind else ()) or (PRIMARY_LATENCY.get(probe, ""),)
    cols = [("rate", f"throughput ({unit}s/s)")]
    cols += [(f"lat:{name}", f"{LATENCY_TITLES.get(name, name)},\nmean (ms)") for name in names]
    cols.append(("memory", "peak memory (MiB)"))
    return cols


def _value(point: Any, metric: str) -> float:
    if metric == "rate":
        return point.rate
    if metric == "memory":
        return point.peak_memory_bytes / 2**20 if point.peak_memory_bytes else float("nan")
    name = metric.split(":", 1)[1]
    value = point.latency(name, "mean")
    if value is None:
        value = point.latency(name, 50)
    return _ms(value)


def _line_name(factors: dict[str, Any], keys: list[str]) -> str:
    parts = []
    for key in keys:
        value = factors.get(key)
        if value is None:
            continue
        prefix = _SHORT.get(key, f"{key}=")
        parts.append(f"{prefix}{value}")
    return " ".join(parts) or "all runs"


def _model_order(probe: str, models: list[str]) -> list[str]:
    from gpuperfd.probe_data.spec import PRESETS

    known = list(PRESETS.get(probe, {}))
    return sorted(models, key=lambda m: (known.index(m) if m in known else len(known), m))


def axis_rows(report: Report) -> list[tuple[str, str, str, list[Series]]]:
    """(probe, factor, axis title, series) for every parameter that varies within a probe's runs."""
    rows = []
    for probe in dict.fromkeys(s.probe for s in report.series):
        series = [s for s in report.series if s.probe == probe]
        varying = _varying(series)
        for factor, title in AXES:
            if factor in varying:
                rows.append((probe, factor, title, series))
        for key in dict.fromkeys(k for s in series for k in s.labels):
            if key in varying and key not in dict(AXES):
                rows.append((probe, key, f"label {key}", series))  # a label is a categorical axis too
    return rows


def _draw_axis_row(axes: list, probe: str, factor: str, title: str, series: list[Series]) -> None:
    varying = _varying(series)
    others = [k for k in varying if k != factor]
    metrics = _metrics(probe, series[0].work_unit)
    xs_all = [_factors(s).get(factor) for s in series]
    labelled = any(factor in s.labels for s in series)
    categorical = factor == "model" or labelled
    values = [x for x in dict.fromkeys(xs_all) if x is not None]
    order = (sorted(values, key=str) if labelled else _model_order(probe, values)) if categorical else []
    lines: dict[str, list[tuple[Any, Series]]] = {}
    for s in series:
        f = _factors(s)
        if f.get(factor) is not None:
            lines.setdefault(_line_name(f, others), []).append((f[factor], s))
    for index, (name, members) in enumerate(sorted(lines.items())):
        members.sort(key=lambda m: order.index(m[0]) if categorical else m[0])
        xs = [order.index(x) if categorical else x for x, _ in members]
        look = {"color": COLORS[index % len(COLORS)], "marker": MARKERS[index % len(MARKERS)],
                "linestyle": STYLES[(index // len(COLORS)) % len(STYLES)], "markersize": 4}
        for ax, (metric, _label) in zip(axes, metrics):
            ax.plot(xs, [_value(_base_point(s), metric) for _, s in members], label=name, **look)
    capped = {round(_base_point(s).cap_watts) for s in series if _base_point(s).cap_watts is not None}
    at = f" at {min(capped)} W" if len(capped) == 1 else (" at each line's highest cap" if capped else "")
    for col, (ax, (metric, label)) in enumerate(zip(axes, metrics)):
        if not any(y == y for line in ax.get_lines() for y in line.get_ydata()):
            _empty(ax, "no peak memory in the input\n(Prometheus input has none)" if metric == "memory"
                   else "no latency samples in the input")
        _tidy(ax)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xlabel(title, fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
        if categorical:
            ax.xaxis.set_major_locator(FixedLocator(list(range(len(order)))))
            ax.set_xticklabels(order)
            ax.set_xlim(-0.3, len(order) - 0.7)
        else:
            values = sorted({x for x in xs_all if x is not None})
            if values and min(values) > 0 and max(values) / min(values) >= 8:
                ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(values))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(v) for v in values])
        if metric == "rate":
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
        if col == 0:
            ax.set_title(f"{probe}: against {title}{at}", fontsize=9, fontweight="bold", loc="left")
            if ax.get_lines():
                ax.legend(fontsize=6.5, framealpha=0.8, title=", ".join(others) or None, title_fontsize=6.5)


def _draw_rows(container: Any, rows: list, draw: Any) -> None:
    width = max(len(_metrics(row[0], "unit")) for row in rows)
    grid = container.subplots(len(rows), width, squeeze=False)
    for r, row in enumerate(rows):
        n = len(_metrics(row[0], "unit"))
        draw(list(grid[r][:n]), *row)
        for ax in grid[r][n:]:
            ax.axis("off")


def _rows_size(rows: list) -> tuple[float, float]:
    return 4 * COLUMN_INCHES, ROW_INCHES * 1.3 * len(rows) + 0.4


def _rows_figure(rows: list, draw: Any) -> Figure | None:
    """A figure of its own for ``rows``, one drawn by ``draw`` under the other (None when there are none):
    the axes and bar figures alike, which the combined figure draws as parts of one."""
    if not rows:
        return None
    fig = Figure(figsize=_rows_size(rows), dpi=DPI, layout="constrained")
    _draw_rows(fig, rows, draw)
    return fig


@_with_report_scale
def axes_figure(report: Report) -> Figure | None:
    """Throughput, latency and peak memory against each parameter that varies (None if none varies)."""
    return _rows_figure(axis_rows(report), _draw_axis_row)


def bar_groups(report: Report) -> list[tuple[str, list[str], list[str], list[Series]]]:
    """(probe, what the bars compare, what the groups are, series) where variants, GPUs or hosts differ."""
    out = []
    for probe in dict.fromkeys(s.probe for s in report.series):
        series = [s for s in report.series if s.probe == probe]
        varying = _varying(series)
        labels = list(dict.fromkeys(k for s in series for k in s.labels))
        compare = [k for k in ("variant", "gpu", *labels) if k in varying]
        if compare:
            out.append((probe, compare, [k for k in varying if k not in compare], series))
    return out


def _draw_bar_row(axes: list, probe: str, compare: list[str], groups: list[str], series: list[Series]) -> None:
    metrics = _metrics(probe, series[0].work_unit)

    def key(s: Series, keys: list[str]) -> str:
        return _line_name(_factors(s), keys)

    bars = sorted({key(s, compare) for s in series})
    categories = sorted({key(s, groups) for s in series}, key=lambda c: (len(c), c))
    width = 0.8 / len(bars)
    for ax, (metric, label) in zip(axes, metrics):
        for b, bar in enumerate(bars):
            xs, ys = [], []
            for c, category in enumerate(categories):
                match = [s for s in series if key(s, compare) == bar and key(s, groups) == category]
                if match:
                    xs.append(c - 0.4 + width * (b + 0.5))
                    ys.append(_value(_base_point(match[0]), metric))
            ax.bar(xs, ys, width=width * 0.95, color=COLORS[b % len(COLORS)], label=bar)
        heights = [p.get_height() for p in ax.patches if p.get_height() == p.get_height()]
        if not heights:
            _empty(ax, "no values in the input")
        elif wants_log(heights, _LOG_Y.get()):
            ax.set_yscale("log")
        ax.set_xticks(list(range(len(categories))))
        ax.set_xticklabels(categories, fontsize=7, rotation=20 if len(categories) > 3 else 0)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.tick_params(labelsize=7)
        if metric == "rate":
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    what = " and ".join({"gpu": "GPUs/hosts", "variant": "variants"}.get(c, c) for c in compare)
    axes[0].set_title(f"{probe}: {what} compared", fontsize=9, fontweight="bold", loc="left")
    axes[0].legend(fontsize=6.5, framealpha=0.8)


@_with_report_scale
def bar_figure(report: Report) -> Figure | None:
    """Grouped bars comparing variants, GPUs or hosts per configuration (None when nothing to compare)."""
    return _rows_figure(bar_groups(report), _draw_bar_row)


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
            _draw_cap_column([axes[r][column] for r in range(len(rows))], report, workload, style, rows)


def _grid_size(workloads: list[tuple[str, str]], rows: int) -> tuple[float, float]:
    columns = sum(max(len(ws), 0.6) for _, ws in _kind_columns(workloads))
    return max(9.0, COLUMN_INCHES * columns), ROW_INCHES * rows + 0.5


@_with_report_scale
def cap_figure(report: Report) -> Figure | None:
    """The power-cap grid (None when no workload ran at two caps or more)."""
    workloads = cap_workloads(report)
    if not workloads:
        return None
    rows = cap_rows(report, workloads)
    width, height = _grid_size(workloads, len(rows))
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    _draw_grid(fig, report, workloads, rows, "power-cap sweep")
    return fig


def header_lines(report: Report) -> list[str]:
    gpus = []
    for g in report.gpus[:8]:
        if g.gpu.uuid == "cpu":
            gpus.append(f"cpu @ {g.gpu.node} (no GPU: tensors ran on the CPU)")
            continue
        gpus.append(f"{g.gpu.name} (gpu{g.gpu.index} @ {g.gpu.node}, driver {', '.join(g.drivers)}, "
                    f"CC {g.gpu.compute_capability}, {g.gpu.backend})")
    if len(report.gpus) > 8:
        gpus.append(f"... and {len(report.gpus) - 8} more")
    lines = [
        f"Generated {utc(report.generated_at)} \u00b7 data {utc(report.first_time)} to {utc(report.last_time)}",
        report.rule_text,
        f"Nodes: {', '.join(report.nodes)} \u00b7 drivers: {', '.join(report.drivers)}",
        *[("GPUs: " if i == 0 else "      ") + text for i, text in enumerate(gpus)],
        f"Runs: {report.runs_total} ({report.runs_text}) \u00b7 "
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
        if len(s.capped) < 2:
            continue  # no sweep: nothing to recommend (the parameter charts show these)
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


@_with_report_scale
def overview_figure(report: Report) -> Figure:
    """The one-page report: header, the cap grid, the parameter charts, the bar charts, the recommendations."""
    cap_ws = cap_workloads(report)
    axis = axis_rows(report)
    bars = bar_groups(report)
    header_h = 0.55 + 0.19 * len(header_lines(report))
    head, rows = summary_table(report)
    summary_h = 0.6 + 0.2 * (len(rows) + 1)
    parts_spec: list[tuple[str, float, float]] = [("header", 14.0, header_h)]
    if cap_ws:
        w, h = _grid_size(cap_ws, len(cap_rows(report, cap_ws)))
        parts_spec.append(("cap", w, h))
    if axis:
        w, h = _rows_size(axis)
        parts_spec.append(("axes", w, h + 0.3))
    if bars:
        w, h = _rows_size(bars)
        parts_spec.append(("bars", w, h + 0.3))
    tokens = token_series(report)
    if tokens:
        parts_spec.append(("tokens", 14.0, ROW_INCHES * 1.3 + 0.7))
    repeated = repeat_series(report) if not (cap_ws or axis or bars) else []
    if repeated:
        parts_spec.append(("repeats", 14.0, ROW_INCHES * 1.3 * len(repeated) + 0.4))
    elif not (cap_ws or axis or bars):
        parts_spec.append(("none", 14.0, 1.0))
    if rows:
        parts_spec.append(("summary", 14.0, summary_h))
    elif not (cap_ws or axis or bars):
        table = repeat_table(report)
        if table[1]:
            parts_spec.append(("repeat-table", 14.0, 0.6 + 0.2 * (len(table[1]) + 1)))
    width = max(w for _, w, _ in parts_spec)
    heights = [h for _, _, h in parts_spec]
    fig = Figure(figsize=(width, sum(heights)), dpi=DPI, layout="constrained")
    parts = fig.subfigures(len(heights), 1, height_ratios=heights, hspace=0.01)
    for (name, _w, _h), part in zip(parts_spec, parts):
        if name == "header":
            part.set_facecolor("#f3f5f8")
            part.text(0.01, 0.93, "gpuperfd report: throughput, latency, memory, power and energy", fontsize=15,
                      fontweight="bold", va="top")
            part.text(0.01, 0.93 - 0.42 / header_h, "\n".join(header_lines(report)), fontsize=9, va="top",
                      family="monospace", linespacing=1.35)
            if any(g.gpu.backend == "simulated" for g in report.gpus):
                part.text(0.99, 0.93, "SIMULATED GPUs: numbers from the simulator, not hardware", fontsize=9,
                          color="#b00", ha="right", va="top", fontweight="bold")
        elif name == "cap":
            part.suptitle("Against power cap", fontsize=13, x=0.01, ha="left")
            _draw_grid(part, report, cap_ws, cap_rows(report, cap_ws), "power-cap sweep")
        elif name == "axes":
            part.suptitle("Against the parameters that vary (one line per combination of the others)", fontsize=13,
                          x=0.01, ha="left")
            _draw_rows(part, axis, _draw_axis_row)
        elif name == "bars":
            part.suptitle("Variants, GPUs, hosts and labels compared", fontsize=13, x=0.01, ha="left")
            _draw_rows(part, bars, _draw_bar_row)
        elif name == "tokens":
            part.suptitle("Per-token latency over the output position", fontsize=13, x=0.01, ha="left")
            _draw_tokens(part.subplots(1, 2, width_ratios=[3, 1])[0], tokens)
            part.get_axes()[1].axis("off")
        elif name == "repeats":
            part.suptitle("Each repeat (measured window, or run where the input keeps no windows)", fontsize=13,
                          x=0.01, ha="left")
            _draw_repeats(part, repeated)
        elif name == "repeat-table":
            _draw_summary(part, *repeat_table(report), title="Summary across repeats")
        elif name == "none":
            ax = part.add_subplot()
            ax.axis("off")
            _empty(ax, "nothing to plot: no workload ran at two power caps, no parameter varied, and no variants, "
                       "GPUs or hosts differ (see the tables)")
        else:
            _draw_summary(part, head, rows)
    return fig


def repeat_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The summary across repeats as text cells: metric, mean, stdev, CV, min, max, n."""
    head = ["GPU", "probe", "preset", "parameters", "metric", "mean", "stdev", "CV", "min", "max", "n", "over"]
    rows = []
    for r in repeat_rows(report):
        s = r.series
        params = " ".join(filter(None, [_line_name(_factors(s), ["variant", *s.params]), *(
            f"{k}={v}" for k, v in sorted(s.labels.items()))]))
        rows.append([s.label, s.probe, s.preset, params, f"{r.label} ({r.unit})", f"{r.mean:.4g}",
                     f"{r.stdev:.3g}" if r.stdev is not None else "-", percent(r.cv) if r.cv is not None else "-",
                     f"{min(r.values):.4g}", f"{max(r.values):.4g}", str(len(r.values)), r.over])
    return head, rows


def token_series(report: Report) -> list[Series]:
    """Series timed per output token (llm) whose runs traced every output token (JSON input): the
    per-position curve."""
    return [s for s in report.series if s.probe in KINDS and KINDS[s.probe].main_latency == "tpot_seconds"
            and len(_base_point(s).token_curve) > 1]


def _draw_tokens(ax: Any, series: list[Series]) -> None:
    varying = list(_varying(series))
    for index, s in enumerate(series):
        curve = _base_point(s).token_curve
        xs = list(range(2, len(curve) + 1))
        look = {"color": COLORS[index % len(COLORS)], "linestyle": STYLES[(index // len(COLORS)) % len(STYLES)]}
        ax.plot(xs, [1000 * v for v in curve[1:]], marker="o" if len(xs) <= 40 else None, markersize=3,
                label=_line_name(_factors(s), varying) if varying else s.preset, **look)
    _tidy(ax)
    ax.set_xlabel("output token position (token 1 is the time to first token, charted elsewhere)", fontsize=8)
    ax.set_ylabel("time to this token (ms)", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.set_title("llm: per-token latency over the output position (mean over traced requests)", fontsize=9,
                 fontweight="bold", loc="left")
    ax.legend(fontsize=6.5, framealpha=0.8, title=", ".join(varying) or None, title_fontsize=6.5)


@_with_report_scale
def token_figure(report: Report) -> Figure | None:
    """Per-token latency over the output position, one line per llm series (None without traces)."""
    series = token_series(report)
    if not series:
        return None
    fig = Figure(figsize=(2 * COLUMN_INCHES, ROW_INCHES * 1.3 + 0.4), dpi=DPI, layout="constrained")
    _draw_tokens(fig.add_subplot(), series)
    return fig


@_with_report_scale
def repeats_figure(report: Report) -> Figure | None:
    """Each metric per repeat, for a study with no cap sweep and nothing varied (None otherwise)."""
    if cap_workloads(report) or axis_rows(report) or bar_groups(report):
        return None
    repeated = repeat_series(report)
    if not repeated:
        return None
    fig = Figure(figsize=(4 * COLUMN_INCHES, ROW_INCHES * 1.3 * len(repeated) + 0.4), dpi=DPI, layout="constrained")
    _draw_repeats(fig, repeated)
    return fig


def _draw_repeats(part: Any, repeated: list) -> None:
    width = max(min(len(rows), 6) for _, rows in repeated)
    grid = part.subplots(len(repeated), width, squeeze=False)
    for r, (s, rows) in enumerate(repeated):
        for c in range(width):
            ax = grid[r][c]
            if c >= min(len(rows), 6):
                ax.axis("off")
                continue
            row = rows[c]
            xs = list(range(1, len(row.values) + 1))
            ax.plot(xs, row.values, marker="o", markersize=3.5, color=COLORS[0])
            ax.axhline(row.mean, color="grey", linestyle="--", linewidth=1)
            if row.stdev:
                ax.axhspan(row.mean - row.stdev, row.mean + row.stdev, color="grey", alpha=0.12, linewidth=0)
            _tidy(ax)
            ax.set_ylabel(f"{row.label} ({row.unit})", fontsize=8)
            ax.set_xlabel(f"repeat ({row.over[:-1]})", fontsize=8)
            ax.xaxis.set_major_locator(FixedLocator(xs if len(xs) <= 12 else xs[::max(len(xs) // 10, 1)]))
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=7)
            cv = f", CV {percent(row.cv)}" if row.cv is not None else ""
            title = f"{s.label} · {s.probe}/{s.preset}" if c == 0 else ""
            ax.set_title(f"{title}\nmean {row.mean:.4g}{cv}" if title else f"mean {row.mean:.4g}{cv}",
                         fontsize=8, loc="left")


def _draw_summary(part: Any, head: list[str], rows: list[list[str]], title: str = "Recommended power caps") -> None:
    part.suptitle(title, fontsize=13, x=0.01, ha="left")
    ax = part.add_subplot()
    ax.axis("off")
    if not rows:
        _empty(ax, "no workload ran at two power caps or more: no cap to recommend")
        return
    table = ax.table(cellText=rows, colLabels=head, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(list(range(len(head))))
    for (row, _col), cell in table.get_celld().items():
        cell.set_linewidth(0.3)
        if row == 0:
            cell.set_facecolor("#e4e8ee")
            cell.set_text_props(fontweight="bold")


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
