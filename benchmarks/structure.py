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

``--sweep-cpu RUNS`` measures instead the sweep's CPU cost on the daemon's side (issue 62: the refactor must
not make the daemon work harder per sweep):

    python3 benchmarks/structure.py --before cc12f16 --sweep-cpu 12 --json sweep-cpu.json

Each run is a fresh Python process on one tree (that tree first on PYTHONPATH; no torch is imported): a
simulated GPU, the simulated executor (``measure_seconds`` 0.02, no child costs), a ``ProbeService`` set up as
the walk's (caps changed, journal in a temporary state directory, no history file) with ``stop_early`` off, and
``--sweeps`` sweeps of llm over five caps (max and 0.9/0.8/0.7/0.6 of it, settle 0) through
``ProbeService.run``, after ``--warmup`` uncounted ones. Per sweep it takes the process's CPU time
(``time.process_time``: every thread, user and system) and subtracts the CPU time the calling thread spent in
the simulated executor's ``measure`` (the simulated window and its result: what the probe child does); what
is left is the daemon's own: turns and gates, the owned sweep, caps and journal, the observer, metrics,
decoding the child's result. Runs alternate between the trees (before first in even rounds, after first in
odd ones) so that drift on a shared machine falls on both. Reported: per tree, the median over runs of each
run's median CPU seconds per sweep (and per point); the ratio after/before of those, and each round's own
ratio.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: A ProbeService on one simulated GPU, idle, with the simulated executor (the walk's and the sweep-CPU runs').
SERVICE = textwrap.dedent("""
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

    def simulated_service(measure_seconds, **probes):
        tmp = Path(tempfile.mkdtemp())
        devices = SimulatedBackend(SimulationConfig(gpus=1, seed=5)).devices()
        tracker = IdleTracker(0.05)
        tracker.observe(0, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
        config = ProbesConfig(read_only=False, state_dir=tmp / "state", idle_seconds=0.0, history={"path": None},
                              **probes)
        executor = simulated_executor(measure_seconds, seed=1)
        return ProbeService(config, devices, executor, ProbeMetrics(CollectorRegistry()), tracker, None), executor
""")

WALK = SERVICE + textwrap.dedent("""
    service, _ = simulated_service(0.05)
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


SWEEP_CPU = SERVICE + textwrap.dedent("""
    import statistics, threading, time
    sweeps, warmup = int(sys.argv[1]), int(sys.argv[2])
    service, executor = simulated_service(0.02, stop_early=False)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=[1.0, 0.9, 0.8, 0.7, 0.6], settle_seconds=0)
    child = [0.0]  # CPU seconds of this thread in the simulated executor's measure: the probe child's part
    measure = executor.measure
    def timed_measure(*args, **kwargs):
        start = time.thread_time()
        try:
            return measure(*args, **kwargs)
        finally:
            child[0] += time.thread_time() - start
    executor.measure = timed_measure
    rows = []
    for number in range(warmup + sweeps):
        child[0] = 0.0
        cpu, wall = time.process_time(), time.perf_counter()
        outcome = service.run(schedule, 0)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        statuses = [point.result.status for point in outcome.points]
        if outcome.result != "ok" or statuses != ["ok"] * 5:
            raise SystemExit(f"sweep {number}: {outcome.result} {statuses}")
        if number >= warmup:
            rows.append({"process_cpu": cpu, "child_cpu": child[0], "daemon_cpu": cpu - child[0], "wall": wall,
                         "points": len(statuses)})
    print(json.dumps({"sweeps": rows, "points_per_sweep": 5, "threads": threading.active_count(),
                      "torch_imported": "torch" in sys.modules,
                      "median_daemon_cpu": statistics.median(r["daemon_cpu"] for r in rows)}))
""")


def _run_script(tree: Path, script: str, *args: str) -> dict[str, object]:
    """``script`` in a fresh interpreter with ``tree`` first on PYTHONPATH; its last line of stdout, as JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600,
                          cwd=tree, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _walk(tree: Path) -> dict[str, object]:
    return _run_script(tree, WALK)


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


def _sweep_cpu(trees: dict[str, Path], args: argparse.Namespace) -> int:
    """The daemon's CPU seconds per sweep on each tree: ``args.sweep_cpu`` runs each, alternated."""
    labels = list(trees)
    runs: list[dict[str, object]] = []
    for number in range(args.sweep_cpu):
        for label in labels if number % 2 == 0 else labels[::-1]:
            run = _run_script(trees[label], SWEEP_CPU, str(args.sweeps), str(args.warmup))
            runs.append({"round": number, "tree": label, **run})
            if "error" in run:
                print(f"{label}: {run['error']}", file=sys.stderr)
                return 1
            print(f"round {number} {label:24s} {1e3 * run['median_daemon_cpu']:7.2f} ms CPU per sweep (daemon)",
                  flush=True)
    summary: dict[str, dict[str, float]] = {}
    for label in labels:
        mine = [r for r in runs if r["tree"] == label]
        points = mine[0]["points_per_sweep"]
        cpu = statistics.median(r["median_daemon_cpu"] for r in mine)
        summary[label] = {
            "runs": len(mine), "sweeps_per_run": args.sweeps, "points_per_sweep": points,
            "daemon_cpu_per_sweep": cpu, "daemon_cpu_per_point": cpu / points,
            "process_cpu_per_sweep": statistics.median(statistics.median(s["process_cpu"] for s in r["sweeps"])
                                                       for r in mine),
            "child_cpu_per_sweep": statistics.median(statistics.median(s["child_cpu"] for s in r["sweeps"])
                                                     for r in mine),
            "wall_per_sweep": statistics.median(statistics.median(s["wall"] for s in r["sweeps"]) for r in mine),
        }
    result: dict[str, object] = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                                 "python": platform.python_version(), "cpu_count": os.cpu_count(),
                                 "machine": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "summary": summary, "runs": runs}
    print(f"\n{'per sweep (median of runs)':34s}" + "".join(f"{label:>26s}" for label in labels))
    for key, unit in (("daemon_cpu_per_sweep", "daemon CPU, ms"), ("daemon_cpu_per_point", "daemon CPU per point, ms"),
                      ("child_cpu_per_sweep", "simulated child CPU, ms"), ("process_cpu_per_sweep", "process CPU, ms"),
                      ("wall_per_sweep", "wall, ms")):
        print(f"{unit:34s}" + "".join(f"{1e3 * summary[label][key]:26.2f}" for label in labels))
    if len(labels) == 2:
        before, after = labels
        per_round = []
        for number in range(args.sweep_cpu):
            pair = {r["tree"]: r["median_daemon_cpu"] for r in runs if r["round"] == number}
            per_round.append(pair[after] / pair[before])
        ratio = summary[after]["daemon_cpu_per_sweep"] / summary[before]["daemon_cpu_per_sweep"]
        result["ratio_after_before"] = ratio
        result["ratio_per_round"] = per_round
        print(f"daemon CPU per sweep, after/before: {ratio:.3f} (rounds: {min(per_round):.3f} .. "
              f"{max(per_round):.3f}, median {statistics.median(per_round):.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="a commit to measure beside this tree")
    parser.add_argument("--json", default=None)
    parser.add_argument("--sweep-cpu", type=int, default=0, metavar="RUNS",
                        help="measure the daemon's CPU time per sweep instead, RUNS processes per tree, alternated")
    parser.add_argument("--sweeps", type=int, default=25, help="counted sweeps per --sweep-cpu run (default 25)")
    parser.add_argument("--warmup", type=int, default=3, help="uncounted sweeps first in each run (default 3)")
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
        if args.sweep_cpu:
            return _sweep_cpu(trees, args)
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
