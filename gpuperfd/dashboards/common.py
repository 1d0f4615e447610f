"""Building blocks shared by the four Grafana dashboards (grafanalib).

Every panel queries the Prometheus datasource chosen in the ``datasource``
variable, so the same JSON works with any Prometheus that scrapes gpuperfd and
loads ``deploy/prometheus/rules/`` (several panels read its ``gpuperf:*``
recording rules). Label filters from template variables always use ``=~``:
multi-value and "All" selections are regexes, and the query check in
:mod:`gpuperfd.dashboards.queries` substitutes ``.+`` for them.

:class:`Layout` places panels left to right on Grafana's 24-column grid and
starts a new line when a panel does not fit, so the dashboard modules list
panels in reading order without hand-computed coordinates.

A dashboard is data: rows (:class:`Row`) of panel specs (:class:`Panel`: title,
queries, unit, kind, size, options), turned into grafanalib panels by one loop
(:func:`build_panel`, :func:`layout`). The kind decides the panel type and how
its queries run (tables and bar gauges: instant; heatmaps: heatmap format).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import attr
from grafanalib import core as g

from gpuperfd.health.verdict import ACTIONS, STATES

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAG = "gpuperfd"
#: Colour of each health verdict state and action (docs/health.md); a state or action without one fails at import.
STATE_COLORS = {"healthy": "green", "unknown": "text", "degraded": "orange", "unhealthy": "red"}
ACTION_COLORS = {
    "none": "green", "restart_app": "yellow", "update_software": "yellow",
    "restart_fabric_manager": "orange", "reset_gpu": "orange",
    "reboot_node": "orange", "check_hardware": "red", "contact_support": "red",
}
#: (name, colour) in the verdict's order, least severe first: the value-mapping codes 0, 1, 2, ...
HEALTH_STATES: tuple[tuple[str, str], ...] = tuple((name, STATE_COLORS[name]) for name in STATES)
HEALTH_ACTIONS: tuple[tuple[str, str], ...] = tuple((name, ACTION_COLORS[name]) for name in ACTIONS)
#: Legends of a probe run's series (probes and power-cap dashboards), and of one at its cap.
RUN = "{{instance}} GPU {{gpu}} {{probe}}/{{preset}}"
AT_CAP = RUN + " @ {{power_cap}} W"
#: Dashboard JSON schema the panels below are written for (Grafana 9+).
SCHEMA_VERSION = 37


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> g.Target:
    """One PromQL query of a panel."""
    return g.Target(
        expr=expr, legendFormat=legend, refId=ref, instant=instant, format=fmt, datasource=DATASOURCE, intervalFactor=1
    )


def targets(*queries: tuple[str, str], instant: bool = False, fmt: str = "time_series") -> list[g.Target]:
    """Several (expr, legend) queries with refIds A, B, C, ..."""
    return [
        target(expr, legend, ref=chr(ord("A") + i), instant=instant, fmt=fmt) for i, (expr, legend) in enumerate(queries)
    ]


def datasource_variable() -> g.Template:
    return g.Template(name="datasource", label="Data source", query="prometheus", type="datasource")


def query_variable(name: str, label: str, metric: str, label_name: str, multi: bool = True) -> g.Template:
    """A variable from ``label_values(metric, label_name)``; "All" matches every value."""
    return g.Template(
        name=name,
        label=label,
        query=f"label_values({metric}, {label_name})",
        dataSource=DATASOURCE,
        multi=multi,
        includeAll=multi,
        allValue=".+" if multi else None,
        refresh=2,  # on time-range change: new GPUs appear without a reload
        sort=1,
    )


def probe_variables(metric: str) -> list[g.Template]:
    """The probe, then the preset of the probes chosen: both from ``metric``'s labels (a series every probe
    publishes), so a preset list names only presets of the chosen probes."""
    return [
        query_variable("probe", "Probe", metric, "probe"),
        query_variable("preset", "Preset", f'{metric}{{probe=~"$probe"}}', "preset"),
    ]


def interval_variable(name: str, label: str, options: str, default: str) -> g.Template:
    return g.Template(name=name, label=label, query=options, type="interval", default=default)


def _panel_basics(title: str, queries: list[g.Target], description: str) -> dict[str, Any]:
    """What every panel carries, whatever its kind: its title, its description (none when empty), the one
    data source and its queries."""
    return {"title": title, "description": description or None, "dataSource": DATASOURCE, "targets": queries}


def timeseries(title: str, queries: list[g.Target], unit: str = "", description: str = "", **kwargs) -> g.TimeSeries:
    return g.TimeSeries(
        **_panel_basics(title, queries, description),
        unit=unit,
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        tooltipSort="desc",
        **kwargs,
    )


def stat(title: str, queries: list[g.Target], unit: str = "none", description: str = "", **kwargs) -> g.Stat:
    kwargs.setdefault("reduceCalc", "lastNotNull")
    kwargs.setdefault("graphMode", "none")
    return g.Stat(**_panel_basics(title, queries, description), format=unit, **kwargs)


def table(
    title: str, queries: list[g.Target], unit: str = "", description: str = "", hide: tuple[str, ...] = (), **kwargs
) -> g.Table:
    """An instant-query table: the queries' results merged on their labels, `hide` columns dropped."""
    exclude = {name: True for name in ("Time", "__name__", "job", *hide)}
    transformations = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": exclude, "renameByName": {}}},
    ]
    return g.Table(
        **_panel_basics(title, queries, description),
        unit=unit,
        transformations=transformations,
        filterable=True,
        **kwargs,
    )


def column(ref: str, header: str, unit: str) -> dict:
    """Table override: name and unit of the value column of query `ref` ("Value #A", ...)."""
    return {
        "matcher": {"id": "byName", "options": f"Value #{ref}"},
        "properties": [{"id": "displayName", "value": header}, {"id": "unit", "value": unit}],
    }


def bar_gauge(title: str, queries: list[g.Target], unit: str = "", description: str = "") -> g.BarGauge:
    """Horizontal bars, one per series (instant queries); written in the Grafana 8+ options format."""
    return g.BarGauge(
        **_panel_basics(title, queries, description),
        format=unit,
        displayMode="gradient",
        thresholds=[g.Threshold("blue", 0, 0.0)],
        extraJson={
            "options": {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "showUnfilled": True,
            },
            "fieldConfig": {"defaults": {"unit": unit, "min": 0}},
        },
    )


def heatmap_query(bucket_metric: str, selector: str) -> tuple[str, str]:
    """A histogram's observations per bucket and time slot, for :func:`heatmap`."""
    return f"sum by (le) (increase({bucket_metric}{{{selector}}}[$__interval]))", "{{le}}"


def heatmap(title: str, queries: list[g.Target], unit: str = "s", description: str = "") -> g.Heatmap:
    """The histogram's observations per bucket and time slot (buckets de-cumulated by Grafana)."""
    return g.Heatmap(
        **_panel_basics(title, queries, description),
        dataFormat="tsbuckets",
        yBucketBound="upper",
        hideZeroBuckets=True,
        yAxis=g.YAxis(format=unit),
        maxDataPoints=60,
        extraJson={"options": {"calculate": False, "yAxis": {"unit": unit}, "cellGap": 1}},
    )


def state_timeline(title: str, queries: list[g.Target], unit: str = "", description: str = "", **kwargs) -> g.StateTimeline:
    """One lane per series, coloured by value (value mappings name the states)."""
    return g.StateTimeline(
        **_panel_basics(title, queries, description),
        extraJson={"fieldConfig": {"defaults": {"unit": unit}}} if unit else None,
        **kwargs,
    )


def value_mappings(names: tuple[tuple[str, str], ...]) -> list[dict]:
    """Grafana value mappings 0, 1, 2, ... -> (text, colour) of ``names``, in order."""
    options = {str(i): {"text": text, "color": color, "index": i} for i, (text, color) in enumerate(names)}
    return [{"type": "value", "options": options}]


def fixed_colors(names: tuple[tuple[str, str], ...]) -> list[dict]:
    """Overrides colouring each series named ``text`` (its legend) with its fixed ``color``."""
    return [
        {
            "matcher": {"id": "byName", "options": text},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}],
        }
        for text, color in names
    ]


def label_code(metric: str, selector: str, label: str, names: tuple[tuple[str, str], ...], by: str) -> str:
    """PromQL giving, per ``by`` group, the index in ``names`` of the ``label`` value whose series is 1.

    For one-hot series like ``gpuperf_gpu_health_state{state=...}`` (1 for the current state): a number a
    stat or state timeline can colour and name through :func:`value_mappings`.
    """
    sel = f"{selector}, " if selector else ""
    parts = [f'({metric}{{{sel}{label}="{name}"}} == 1) * {i}' for i, (name, _color) in enumerate(names)]
    return f"max by ({by}) (" + " or ".join(parts) + ")"


# --- dashboards as data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """One panel as data: what it shows (queries of (expr, legend)), how (kind, unit, options), and its size.

    ``options`` are passed to the kind's builder as keyword arguments (``drawStyle``, ``overrides``,
    ``hide``, ``thresholds``, ...).
    """

    title: str
    queries: tuple[tuple[str, str], ...]
    unit: str | None = None  # None: the kind's default ("none" for stats, "" otherwise)
    kind: str = "timeseries"
    w: int = 12
    h: int = 8
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"panel {self.title!r}: unknown kind {self.kind!r}; one of {sorted(KINDS)}")
        if not self.queries or not all(expr for expr, _legend in self.queries):
            raise ValueError(f"panel {self.title!r}: every panel needs at least one query, none empty")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


@dataclass(frozen=True)
class Row:
    """A titled row of panels, placed left to right."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Kind:
    """How a panel kind is built: its builder and how its queries run."""

    build: Callable[..., g.Panel]
    instant: bool = False
    fmt: str = "time_series"


KINDS: dict[str, Kind] = {
    "timeseries": Kind(timeseries),
    "stat": Kind(stat),
    "table": Kind(table, instant=True, fmt="table"),
    "bargauge": Kind(bar_gauge, instant=True),
    "heatmap": Kind(heatmap, fmt="heatmap"),
    "state-timeline": Kind(state_timeline),
}


def build_panel(spec: Panel) -> g.Panel:
    """The grafanalib panel of one spec."""
    kind = KINDS[spec.kind]
    kwargs = dict(spec.options)
    if spec.unit is not None:
        kwargs["unit"] = spec.unit
    if spec.description:
        kwargs["description"] = spec.description
    return kind.build(spec.title, targets(*spec.queries, instant=kind.instant, fmt=kind.fmt), **kwargs)


class Layout:
    """Places panels on the 24-column grid in the order they are added."""

    WIDTH = 24

    def __init__(self) -> None:
        self.panels: list[g.Panel] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0

    def row(self, title: str) -> None:
        if self._x:
            self._newline()
        self.panels.append(g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=self.WIDTH, x=0, y=self._y)))
        self._y += 1

    def add(self, panel: g.Panel, w: int = 12, h: int = 8) -> None:
        if self._x + w > self.WIDTH:
            self._newline()
        self.panels.append(attr.evolve(panel, gridPos=g.GridPos(h=h, w=w, x=self._x, y=self._y)))
        self._x += w
        self._line_height = max(self._line_height, h)


def layout(rows: tuple[Row, ...]) -> Layout:
    """The one loop from rows of panel specs to placed grafanalib panels."""
    lay = Layout()
    for row in rows:
        lay.row(row.title)
        for spec in row.panels:
            lay.add(build_panel(spec), w=spec.w, h=spec.h)
    return lay


def textbox_variable(name: str, label: str, default: str) -> g.Template:
    """A free-text variable (a number the user types, e.g. a price), ``default`` until changed."""
    return g.Template(name=name, label=label, query=default, type="textbox", default=default)


def dashboard(title: str, uid: str, description: str, rows: tuple[Row, ...], variables: list[g.Template]) -> g.Dashboard:
    """A dashboard of ``rows`` with the gpuperfd tag, links to its siblings and stable panel ids."""
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=[TAG],
        timezone="browser",
        refresh="1m",
        schemaVersion=SCHEMA_VERSION,
        graphTooltip=1,  # shared crosshair
        time=g.Time("now-6h", "now"),
        panels=layout(rows).panels,
        templating=g.Templating(list=[datasource_variable(), *variables]),
        links=[
            g.DashboardLink(
                title="gpuperfd",
                type="dashboards",
                tags=[TAG],
                asDropdown=True,
                includeVars=False,
                keepTime=True,
            )
        ],
    ).auto_panel_ids()
