"""``gpuperfd dashboards --out DIR``: write the Grafana dashboards as JSON."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboards",
        help="write the Grafana dashboards (JSON) into a directory",
        description=(
            "Render the four gpuperfd Grafana dashboards (fleet, node/GPU, probes, power-cap efficiency) as JSON."
            " Needs grafanalib: pip install 'gpuperfd[dashboards]'."
        ),
    )
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write the JSON files into (created if missing; its parent must exist)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        import grafanalib  # noqa: F401
    except ImportError:
        print("gpuperfd dashboards: grafanalib is not installed; pip install 'gpuperfd[dashboards]'", file=sys.stderr)
        return 1
    from gpuperfd.dashboards.generate import OutDirError, write_all

    try:
        written = write_all(args.out)
    except OutDirError as exc:
        print(f"gpuperfd dashboards: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
