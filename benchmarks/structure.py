#!/usr/bin/env python3
"""The probing core's structure, measured on two trees side by side (issue 62).

    python3 benchmarks/structure.py --before cc12f16 --json structure.json

For each tree (the ``--before`` commit, checked out in a temporary worktree, and this one) it reports:

* ``walk``: a GPU's walk through a probe round: ``ProbeService.run`` of a one-point llm round on a
  simulated GPU, its own thread traced with ``sys.setprofile``, read in call order as code is read: each
  call into a function of the probing core (``gpuperfd.probing``, ``gpuperfd.caps``; other packages are
  leaves) enters that function's module; consecutive calls in one module are one stay. ``rooms`` counts
  distinct modules, ``stays`` the stays, ``returns`` the stays in a module left earlier. The issue's bound:
  at most 12 module visits and 3 returns.
* ``imports``: module-level import circles among gpuperfd's modules (strongly connected sets of two or more).
* ``functions``: functions longer than 80 lines, and the longest.
* ``duplicates``: the pairs of places sharing six or more lines (the ``duplicates`` tool), in all and in
  the package alone.
* ``getattr_on_objects``: ``getattr(x, "name"...)`` calls on a name other than ``args`` in probing/.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WALK = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    from prometheus_client import CollectorRegistry
    from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
    from gpuperfd.device.simulated import SimulatedBackend
    from gpuperfd.probing.executors import simulated_executor
    from gpuperfd.probing.gates.idle import IdleTracker
    from gpuperfd.probing.metrics import ProbeMetrics
    from gpuperfd.probing.scheduling.service import ProbeService
    from gpuperfd.telemetry.collectors.base import Point
    from gpuperfd.telemetry.sampler import Reading

    tmp = Path(tempfile.mkdtemp())
    devices = SimulatedBackend(SimulationConfig(gpus=1, seed=5)).devices()
    tracker = IdleTracker(0.05)
    tracker.observe(0, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    config = ProbesConfig(read_only=False, state_dir=tmp / "state", idle_seconds=0.0, history={"path": None})
    service = ProbeService(config, devices, simulated_executor(0.05, seed=1), ProbeMetrics(CollectorRegistry()),
                          tracker, None)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["max"], settle_seconds=0)
    CORE = ("gpuperfd.probing", "gpuperfd.caps")
    rooms = []
    def profile(frame, event, arg):
        if event == "call":
            room = frame.f_globals.get("__name__", "")
            if room.startswith(CORE) and (not rooms or rooms[-1] != room):
                rooms.append(room)
    sys.setprofile(profile)
    outcome = service.run(schedule, 0)
    sys.setprofile(None)
    returns = sum(1 for i, r in enumerate(rooms) if r in rooms[:max(0, i - 1)])
    print(json.dumps({"result": outcome.result, "points": len(outcome.points), "rooms": len(set(rooms)),
                      "stays": len(rooms), "returns": returns, "path": rooms}))
""")


def _walk(tree: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=600, cwd=tree, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _module_name(tree: Path, path: Path) -> str:
    parts = list(path.relative_to(tree).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: Path) -> dict[str, object]:
    """Module-level import circles among the package's modules (Tarjan's strongly connected sets)."""
    modules = {_module_name(tree, p): p for p in (tree / "gpuperfd").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.parse(path.read_text()).body:  # module level only: function-level imports are lazy
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return {"modules": len(modules), "circles": circles}


def _functions(tree: Path) -> dict[str, object]:
    lengths = []
    for path in (tree / "gpuperfd").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(tree)}:{node.name}"))
    lengths.sort(reverse=True)
    return {"over_80_lines": sum(1 for n, _ in lengths if n > 80), "longest": lengths[:3]}


def _duplicates(tree: Path) -> dict[str, object]:
    if shutil.which("duplicates") is None:
        return {"error": "the duplicates tool is not on PATH"}
    out = subprocess.run(["duplicates", "--repo", str(tree), "--most", "200"], capture_output=True, text=True,
                         timeout=300).stdout
    pairs = [line for line in out.splitlines() if re.match(r"D\d+ ", line)]
    package = [p for p in pairs if " tests/" not in p and not p.split()[1].startswith("tests/")]
    return {"pairs": len(pairs), "pairs_in_package": len(package)}


def _getattr_on_objects(tree: Path) -> int:
    count = 0
    for path in (tree / "gpuperfd" / "probing").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[0], (ast.Name, ast.Attribute))):
                target = node.args[0]
                name = target.id if isinstance(target, ast.Name) else target.attr
                if name in ("service", "args", "_service") or name.endswith("service"):
                    count += 1
    return count


def measure(tree: Path) -> dict[str, object]:
    return {"walk": _walk(tree), "imports": _imports(tree), "functions": _functions(tree),
            "duplicates": _duplicates(tree), "getattr_on_service_or_args": _getattr_on_objects(tree)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="a commit to measure beside this tree")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    trees: dict[str, Path] = {}
    scratch = None
    if args.before:
        scratch = Path(tempfile.mkdtemp(prefix="gpuperfd-structure-")) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(scratch), args.before], check=True)
        trees[f"before ({args.before})"] = scratch
    trees["after (this tree)"] = ROOT
    report = {}
    try:
        for label, tree in trees.items():
            report[label] = measure(tree)
    finally:
        if scratch is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch)], check=False)
    rows = [("walk: rooms / stays / returns", lambda m: "{rooms} / {stays} / {returns}".format(**m["walk"])
             if "rooms" in m["walk"] else m["walk"].get("error")),
            ("import circles", lambda m: len(m["imports"]["circles"])),
            ("functions over 80 lines", lambda m: m["functions"]["over_80_lines"]),
            ("duplicate pairs (package only)", lambda m: "{pairs} ({pairs_in_package})".format(**m["duplicates"])
             if "pairs" in m["duplicates"] else m["duplicates"]["error"]),
            ("getattr/hasattr on a service or args (probing/)", lambda m: m["getattr_on_service_or_args"])]
    print(f"{'':50s}" + "".join(f"{label:>26s}" for label in report))
    for title, get in rows:
        print(f"{title:50s}" + "".join(f"{str(get(m)):>26s}" for m in report.values()))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
