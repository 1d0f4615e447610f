"""``gpuperfd report``: PNG, HTML and CSV reports from probe history files or Prometheus.

Pipeline: load (:mod:`.records` for history files, :mod:`.prometheus` for a
Prometheus server) -> drop outliers (:mod:`.outliers`, the rule is in
docs/reports.md) -> aggregate per cap and recommend a cap (:mod:`.aggregate`,
reusing :func:`gpuperfd.probe_data.recommend.recommend`) -> figures (:mod:`.figures`,
matplotlib Agg) -> files (:func:`write_report`).

Needs matplotlib (``pip install 'gpuperfd[report]'``); the daemon never imports this package.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gpuperfd.report.aggregate import Report, build_report, point_rows, summary_rows
from gpuperfd.report.records import Loaded, ReportError, load_history

__all__ = ["Report", "ReportError", "ReportFiles", "Loaded", "build_report", "load_history", "write_report"]


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    png: Path
    summary_csv: Path
    points_csv: Path


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        if not rows:
            handle.write("")
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def check_out_dir(out_dir: str | Path, flag: str = "--out") -> Path:
    """``out_dir`` as a folder the report can go into, checked before any run is read or GPU time spent.

    Only the last folder is ever created, as ``mkdir`` does: a mistyped ``/nonexistent/a/b`` grew that
    tree at ``/``, and an empty ``--out`` wrote into the current directory. ReportError naming ``flag``."""
    if not str(out_dir).strip():
        raise ReportError(f"{flag}: empty; name a folder for the report")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"{flag} {out}: is a file; give a folder for the report")
    parent = out.absolute().parent
    if not out.exists() and not parent.is_dir():
        raise ReportError(f"{flag} {out}: its parent {parent} does not exist (only the last folder is created)")
    return out


def write_report(report: Report, out_dir: str | Path) -> ReportFiles:
    """Write report.html (self-contained), report.png (one page), summary.csv and points.csv into ``out_dir``."""
    from gpuperfd.report.figures import (
        axes_figure,
        bar_figure,
        cap_figure,
        overview_figure,
        png_bytes,
        repeats_figure,
        token_figure,
    )
    from gpuperfd.report.html import render_html

    out = check_out_dir(out_dir)
    out.mkdir(exist_ok=True)
    files = ReportFiles(out / "report.html", out / "report.png", out / "summary.csv", out / "points.csv")
    _write_csv(files.summary_csv, summary_rows(report))
    _write_csv(files.points_csv, point_rows(report))
    files.png.write_bytes(png_bytes(overview_figure(report)))
    figures = {}
    for name, make in (("cap", cap_figure), ("axes", axes_figure), ("bars", bar_figure), ("repeats", repeats_figure),
                       ("tokens", token_figure)):
        fig = make(report)
        figures[name] = png_bytes(fig) if fig is not None else None
    links = {"one-page PNG": files.png.name, "summary CSV (recommendations)": files.summary_csv.name,
             "points CSV (every point)": files.points_csv.name}
    files.html.write_text(render_html(report, figures["cap"], figures["axes"], figures["bars"], links,
                                      repeats_png=figures["repeats"], tokens_png=figures["tokens"]),
                          encoding="utf-8")
    return files
