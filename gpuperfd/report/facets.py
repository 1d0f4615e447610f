"""``gpuperfd report --facet KEY``: one report per value of a run label, side by side.

A label that varies is already a series (a line, a bar); a facet goes further: each value of
the label gets its own full set of panels (its own report in ``DIR/KEY=VALUE/``), and
``DIR/index.html`` shows every facet's one-page figure next to the others, so that studies on
different datasets or drivers are compared panel by panel without their lines crossing.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, replace
from pathlib import Path

from gpuperfd.report.records import Loaded, ReportError

__all__ = ["FacetFiles", "split_by_label", "facet_folder", "write_index"]

#: The facet of runs that do not carry the label.
UNSET = "(unset)"


@dataclass(frozen=True)
class FacetFiles:
    """One facet's value and the folder its report was written to."""

    value: str
    folder: Path


def split_by_label(loaded: Loaded, key: str) -> dict[str, Loaded]:
    """``loaded``'s runs by their value of label ``key`` (sorted; runs without it under ``(unset)``).

    ReportError, naming the labels the runs do carry, when no run has ``key``.
    """
    groups: dict[str, list] = {}
    for run in loaded.runs:
        groups.setdefault(run.labels.get(key, UNSET), []).append(run)
    if set(groups) <= {UNSET}:
        seen = sorted({k for run in loaded.runs for k in run.labels})
        have = f"the runs carry {', '.join(seen)}" if seen else "the runs carry no labels (--label KEY=VALUE)"
        raise ReportError(f"--facet {key}: no run has the label {key!r}; {have}")
    return {value: replace(loaded, runs=groups[value]) for value in sorted(groups, key=lambda v: (v == UNSET, v))}


def facet_folder(out_dir: Path, key: str, value: str) -> Path:
    """``DIR/KEY=VALUE`` with anything but letters, digits and ``_ . - =`` replaced (a value may hold ``/``)."""
    name = re.sub(r"[^A-Za-z0-9_.=-]", "_", f"{key}={value}" if value != UNSET else f"{key}-unset")
    return out_dir / name


def write_index(out_dir: Path, key: str, facets: list[FacetFiles]) -> Path:
    """``DIR/index.html``: every facet's one-page figure side by side, each linking to its report."""
    cells = []
    for facet in facets:
        png = facet.folder / "report.png"
        image = base64.b64encode(png.read_bytes()).decode("ascii") if png.exists() else ""
        link = f"{facet.folder.name}/report.html"
        cells.append(
            f'<div class="facet"><h2><a href="{html.escape(link)}">{html.escape(key)} = {html.escape(facet.value)}'
            f'</a></h2><img alt="report for {html.escape(key)} = {html.escape(facet.value)}" '
            f'src="data:image/png;base64,{image}"></div>'
        )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gpuperfd report by {html.escape(key)}</title><style>"
        "body{font-family:sans-serif;margin:1em}.grid{display:flex;flex-wrap:wrap;gap:1em}"
        ".facet{flex:1 1 40em;min-width:30em}.facet img{width:100%;border:1px solid #ccc}</style></head><body>"
        f"<h1>gpuperfd report, one facet per {html.escape(key)}</h1>"
        f"<p>{len(facets)} values; each has its own report (click a title). Runs with different labels are never "
        f"merged.</p><div class='grid'>{''.join(cells)}</div></body></html>"
    )
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
