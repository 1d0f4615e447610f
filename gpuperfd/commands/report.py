"""``gpuperfd report``: write report.html, report.png, summary.csv and points.csv.

    gpuperfd report --history /var/lib/gpuperfd/history.jsonl --out report/
    gpuperfd report --history h100.jsonl a100.jsonl --out compare/      # one comparative report
    gpuperfd report --prometheus http://prometheus:9090 --start now-7d --end now --out report/

Exit codes: 0 written; 1 no usable data or Prometheus unreachable; 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a PNG/HTML/CSV report from probe history files or Prometheus",
        description=(
            "Plot throughput, latency, power, energy per unit, temperature, utilization and loss against power cap; "
            "throughput, latency (TTFT, TPOT, per batch) and peak memory against every parameter that varies "
            "(model size, batch size, sequence length, n_groups); grouped bars comparing variants, GPUs and hosts; "
            "the recommended cap with its energy saving and slowdown. Several inputs make one comparative report. "
            "Outliers "
            "are removed per (GPU, probe, preset, batch size, cap): median +- 3 x 1.4826 x MAD (docs/reports.md)."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--history", "--input", nargs="+", metavar="PATH",
                        help="run files or folders: what probe --output, sweep --output and the daemon's history "
                             "write (.jsonl or .csv; rotated backups FILE.1, FILE.2... are read too)")
    source.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://prometheus:9090")
    parser.add_argument("--start", metavar="TIME",
                        help="start of the range: unix seconds, RFC 3339, now-7d (required with --prometheus)")
    parser.add_argument("--end", metavar="TIME", help="end of the range (default: now)")
    parser.add_argument("--step", metavar="DURATION", help="Prometheus query resolution, e.g. 30s (default: range/10000, >= 15s)")
    parser.add_argument("--out", metavar="DIR", default="gpuperfd-report", help="output folder (default: gpuperfd-report)")
    parser.add_argument("--max-slowdown", type=float, default=0.10, metavar="RATIO",
                        help="with --rule within-slowdown: slowdown allowed for the recommended cap, 0..1 (default 0.10)")
    parser.add_argument("--rule", choices=("within-slowdown", "min-energy"), default="within-slowdown",
                        help="recommended cap: lowest energy per unit among caps at most --max-slowdown slower than "
                             "the highest cap (within-slowdown, default), or lowest energy outright (min-energy)")
    parser.add_argument("--keep-outliers", action="store_true", help="do not remove outliers")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--log-y", dest="log_y", action="store_const", const=True, default=None,
                       help="log y axes on every chart (default: only where a panel's values span > 2 decades)")
    scale.add_argument("--linear-y", dest="log_y", action="store_const", const=False,
                       help="linear y axes everywhere, even where values span > 2 decades")
    parser.add_argument("--no-rotated", action="store_true", help="read only the named history files, not FILE.1...")
    parser.add_argument("--facet", metavar="KEY",
                        help="one report per value of the run label KEY (--label KEY=VALUE), in DIR/KEY=VALUE/, "
                             "and DIR/index.html with every value's figure side by side")
    parser.add_argument("--free-y", action="store_true",
                        help="with --facet: each facet scales its power-cap panels to its own data (default: one "
                             "y-scale per panel across the facets, so they compare by eye)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from gpuperfd.report.prometheus import check_base_url, parse_duration, parse_time
    from gpuperfd.report.records import ReportError

    if not 0 <= args.max_slowdown < 1:
        print("gpuperfd: --max-slowdown must be in [0, 1)", file=sys.stderr)
        return 2
    if args.prometheus and not args.start:
        print("gpuperfd: --prometheus needs --start (and optionally --end, --step)", file=sys.stderr)
        return 2
    if args.free_y and not args.facet:
        print("gpuperfd: --free-y frees the y-scales of facets; it needs --facet KEY", file=sys.stderr)
        return 2
    from gpuperfd.report import check_out_dir

    try:
        check_out_dir(args.out)
        if args.prometheus:
            check_base_url(args.prometheus)
        start = parse_time(args.start) if args.start else None
        end = parse_time(args.end) if args.end else None
        step = parse_duration(args.step) if args.step else None
    except ReportError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("gpuperfd: the report needs matplotlib: pip install 'gpuperfd[report]'", file=sys.stderr)
        return 1
    from gpuperfd.report import load_history
    from gpuperfd.report.prometheus import load_prometheus

    try:
        if args.prometheus:
            import time

            loaded = load_prometheus(args.prometheus, start, end if end is not None else time.time(), step)
        else:
            loaded = load_history(args.history, start, end, include_rotated=not args.no_rotated)
        if args.facet:
            return _write_facets(args, loaded)
        report, files = _build_and_write(args, loaded, args.out)
    except ReportError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpuperfd: cannot write the report: {exc}", file=sys.stderr)
        return 1
    _print_summary(report, files)
    return 0


def _build_and_write(args: argparse.Namespace, loaded: Any, out: Any) -> tuple[Any, Any]:
    """The report of ``loaded`` with the command's options, written to ``out``: (report, its files)."""
    from gpuperfd.report import build_report, write_report

    report = build_report(loaded, args.max_slowdown, remove_outliers=not args.keep_outliers, rule=args.rule,
                          log_y=args.log_y)
    return report, write_report(report, out)


def _write_facets(args: argparse.Namespace, loaded: Any) -> int:
    """``--facet KEY``: a report per label value and the index page that sets them side by side; each
    power-cap panel on one y-scale across the facets (unless ``--free-y``)."""
    from pathlib import Path

    from gpuperfd.report import build_report, write_report
    from gpuperfd.report.facets import FacetFiles, facet_folder, split_by_label, write_index
    from gpuperfd.report.figures import cap_panel_ranges
    from gpuperfd.report.scales import merge, shared

    out = Path(args.out)
    facets = []
    reports = {value: build_report(subset, args.max_slowdown, remove_outliers=not args.keep_outliers, rule=args.rule,
                                   log_y=args.log_y)
               for value, subset in split_by_label(loaded, args.facet).items()}
    ranges = None if args.free_y else merge(cap_panel_ranges(r) for r in reports.values())
    out.mkdir(exist_ok=True)  # checked in main: its parent exists; each facet's folder goes inside
    for value, report in reports.items():
        folder = facet_folder(out, args.facet, value)
        with shared(ranges):
            files = write_report(report, folder)
        print(f"{args.facet} = {value}:")
        _print_summary(report, files)
        facets.append(FacetFiles(value, folder))
    print(write_index(out, args.facet, facets))
    return 0


def _print_summary(report: Any, files: Any) -> None:
    from gpuperfd.probe_data.recommend import comparison_words
    from gpuperfd.report.html import WRONG_RESULT

    print(f"{len(report.gpus)} GPU(s), {len(report.series)} series, {report.runs_total} runs "
          f"({report.runs_text})")
    wrong = [r for r in report.failed if r.failure_reason == WRONG_RESULT]
    if wrong:
        gpus = sorted({f"{r.gpu.node}/{r.gpu.index}" for r in wrong})
        print(f"WRONG RESULTS: {len(wrong)} run(s) computed wrong numbers on GPU(s) {', '.join(gpus)} "
              "(silent data corruption; see the report's failed runs)")
    print(report.rule_text)
    for s in report.series:
        rec = s.recommendation
        if rec is not None:
            print(f"  {s.label} {s.probe}/{s.preset} b={s.batch_size} [{s.variant}]: {rec.cap_watts:.0f} W "
                  f"({comparison_words(rec, s.work_unit)}"
                  + (f"; {s.power_saving_watts:.0f} W less while busy" if s.power_saving_watts is not None else "")
                  + ")")
        else:  # said, as the sweep CLI says it: an interrupted sweep once got a recommendation here
            print(f"  {s.label} {s.probe}/{s.preset} b={s.batch_size} [{s.variant}]: no recommendation "
                  "(fewer than two measured caps, or its latest sweep was cut short)")
    from gpuperfd.report.realized import realized_lines

    for line in realized_lines(report.realized):
        print(line)
    for path in (files.html, files.png, files.summary_csv, files.points_csv):
        print(path)
