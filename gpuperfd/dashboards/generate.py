"""Render the dashboards to Grafana JSON: one file per dashboard, stable output.

The JSON is deterministic (sorted keys, fixed panel ids), so the copies committed
in ``dashboards/generated/`` can be compared byte for byte with a fresh render
(tests/dashboards/test_dashboards.py does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def builders() -> dict[str, Callable[[], Any]]:
    """File name -> function returning the grafanalib Dashboard (imports grafanalib)."""
    from gpuperfd.dashboards import fleet, node, power_cap, probes

    return {
        "gpuperfd-fleet.json": fleet.build,
        "gpuperfd-node.json": node.build,
        "gpuperfd-probes.json": probes.build,
        "gpuperfd-power-cap.json": power_cap.build,
    }


def render(dashboard: Any) -> str:
    """Grafana JSON text of a grafanalib Dashboard (sorted keys, trailing newline)."""
    from grafanalib._gen import DashboardEncoder

    return json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: render(build()) for name, build in builders().items()}


def dashboards_json() -> list[dict[str, Any]]:
    """Every dashboard as the parsed JSON Grafana would load."""
    return [json.loads(text) for text in render_all().values()]


class OutDirError(ValueError):
    """``--out`` cannot hold the dashboards (a file, not a directory; or not writable)."""


def usable_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a directory that exists and can be written, created if missing.

    Checked before any file is written, so a bad ``--out`` changes nothing; raises OutDirError naming the path.
    Only the last component is created, as ``mkdir`` does: a mistyped ``/nonexistent/dir/x`` would otherwise
    grow a tree at ``/``; an empty ``--out`` is refused rather than taken as the current directory.
    """
    if not str(out_dir).strip():
        raise OutDirError("--out: empty; name a directory (e.g. --out dashboards/generated)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out_dir}: is a file, not a directory")
    parent = out.absolute().parent
    if not out.exists() and not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise OutDirError(f"--out {out_dir}: its parent {parent} {what} (only the last directory is created)")
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutDirError(f"--out {out_dir}: cannot create the directory ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutDirError(f"--out {out_dir}: directory is not writable")
    return out


def write_all(out_dir: str | Path) -> list[Path]:
    """Write every dashboard into ``out_dir`` (created if missing); returns the paths written.

    Everything is rendered, and the directory checked, before the first file is written."""
    texts = render_all()
    out = usable_out_dir(out_dir)
    written = []
    for name, text in texts.items():
        path = out / name
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise OutDirError(f"--out {out_dir}: cannot write {name} ({exc.strerror or exc})") from None
        written.append(path)
    return written
