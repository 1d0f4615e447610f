"""Every PromQL query of the dashboards, ready to run against Prometheus.

:func:`all_panel_queries` returns ``(dashboard title, panel title, expr)`` for
every panel target, with Grafana's variables replaced so that the query selects
everything the dashboard could show: label variables (``$instance``, ``$gpu``,
``$model``, ...; always used with ``=~``) become ``.+``, ``$__rate_interval`` and
``$__interval`` become ``1m``, ``$__range`` and the probes' ``$window`` ``1h``;
a textbox variable (a number the user types, like the fleet's ``$price_per_kwh``)
becomes its dashboard's default. A variable in neither raises ValueError, so a
new one cannot slip through unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

#: Variable -> replacement. Label variables match everything; intervals get a fixed duration.
SUBSTITUTIONS: dict[str, str] = {
    "instance": ".+",
    "gpu": ".+",
    "model": ".+",
    "probe": ".+",
    "preset": ".+",
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "window": "1h",
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute_variables(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with every ``$var`` / ``${var}`` replaced from ``values`` (a dashboard's textbox
    defaults, :func:`textbox_defaults`) or else :data:`SUBSTITUTIONS`."""
    table = {**SUBSTITUTIONS, **(values or {})}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in table:
            raise ValueError(f"unknown dashboard variable ${name} in {expr!r}")
        return table[name]

    return _VARIABLE.sub(replace, expr)


def textbox_defaults(dash: dict[str, Any]) -> dict[str, str]:
    """Name -> default value of each textbox variable of a dashboard's JSON."""
    return {v["name"]: str(v["query"]) for v in dash.get("templating", {}).get("list", []) if v.get("type") == "textbox"}


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels") or [])


def all_panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, expr with variables substituted) for every panel target."""
    from gpuperfd.dashboards.generate import dashboards_json

    found = []
    for dash in dashboards_json():
        values = textbox_defaults(dash)
        for panel in iter_panels(dash.get("panels", [])):
            for tgt in panel.get("targets") or []:
                expr = (tgt.get("expr") or "").strip()
                if expr:
                    found.append((dash["title"], panel["title"], substitute_variables(expr, values)))
    return found
