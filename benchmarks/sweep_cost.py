#!/usr/bin/env python3
"""What a power-cap sweep costs in GPU time: the per-point path against the warm path, one run.

    python3 benchmarks/sweep_cost.py --json sweep_cost.json                     # GPU node, default presets
    python3 benchmarks/sweep_cost.py --cpu --preset tiny --json cost_cpu.json   # CPU, tiny presets

For every probe (default presets unless --preset), a full sweep of 5 caps (max and
0.9/0.8/0.7/0.6 of it) runs twice through the daemon's own machinery
(:func:`gpuperfd.probing.sweep.sweeper.run_sweep`, the child executor):

* ``per_point``: every point spawns a child that imports torch, builds the model,
  compiles, captures CUDA graphs, measures, exits (the path before issue 12);
* ``warm``: one child per sweep builds once and measures one point per cap.

Issue 36 adds paths that take the first point's savings apart, each on its own:

* ``warm_cold``: ``warm`` with an empty compile cache (a fresh folder for this sweep: what the
  landed code paid whenever /tmp was emptied, e.g. systemd's PrivateTmp at every restart);
* ``warm_cached``: ``warm`` with the compile cache in the state directory, filled by an earlier
  run (the benchmark runs the sweep once unmeasured to fill it, unless ``warm_cold`` just did);
* ``shared``: one child for every probe of the round (``open_session(after=...)``, as an owned
  sweep of several schedules runs): torch's import and the CUDA context once per GPU, not once per
  probe; compile cache filled by an earlier, uncounted round of the same probes in the same order
  (as the daemon's previous round leaves it).

``--before DIR`` runs DIR's own ``benchmarks/sweep_cost.py --paths warm`` (the landed tree) first,
on the same GPU, and prints its totals next to these. Every point also records its windows'
SM clock and power (``window_sm_mhz``, ``window_power_w``): where a point's rate scatters, they say
whether the clock moved under it (attention's scatter on the H100).

Each warm session is prepared first, as the daemon's owned sweep prepares it: its child imports
torch and the probe's model code before the GPU is taken (no cap changed, no GPU call), so
those seconds are reported apart (``prepare_seconds``), not in the sweep's GPU-seconds.

Both run every cap (no early stop), so they do the same measurements. Per sweep and
point it reports GPU-seconds (wall time the GPU is out of service) and the parts:
spawn (process start and imports), build (model, buffers; ``compile`` shown apart
where the workload records it), settle (cap read back + steady power/clock under
load), measure (the measured windows), other (warmup, busy pass, teardown), and the
CV of each point's rate over its windows.

THE GPU'S POWER LIMIT NEVER CHANGES: the sweep's device is wrapped so that
``set_power_limit`` only records the cap it was asked for (NVML's setter is never
called) and ``power_limits`` reads back the recorded cap, so the sweep machinery
(journal, guard, read back, restore) runs as in production while the board stays at
the operator's limit. The measured points are therefore all at that one limit: this
measures cost, not the cap curve. On --cpu the device is a simulated GPU, wrapped
the same way, and the probes run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBES = ("llm", "vit", "attention", "train")
CAP_FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6)


class RecordingCaps:
    """A device whose cap writes are recorded and never reach the hardware (or the simulator)."""

    def __init__(self, device: Any) -> None:
        self._device = device
        self.writes: list[float] = []
        self._virtual: float | None = None

    def set_power_limit(self, watts: float) -> None:
        self.writes.append(float(watts))
        self._virtual = float(watts)

    def power_limits(self) -> Any:
        from dataclasses import replace

        limits = self._device.power_limits()
        return limits if self._virtual is None else replace(limits, enforced_watts=self._virtual)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)


def parts(result: Any, path: str) -> dict[str, float]:
    """A point's GPU-seconds split into spawn, build, compile, settle, measure, other."""
    extra = result.extra
    wall = float(result.wall_seconds or 0.0) + float(extra.get("cap_read_back_seconds") or 0.0)
    setup = float(extra.get("setup_seconds") or 0.0)
    compile_seconds = float(extra.get("compile_seconds") or 0.0) if setup else 0.0
    child_wall = float(extra.get("child_wall_seconds") or 0.0)
    if path == "warm":
        start = float(extra.get("child_start_seconds") or 0.0)
        spawn = max(start - float(extra.get("child_setup_seconds") or 0.0), 0.0)
    else:
        spawn = max(float(result.wall_seconds or 0.0) - child_wall - setup, 0.0)
    settle = float(extra.get("settle_seconds") or 0.0) + float(extra.get("cap_read_back_seconds") or 0.0)
    measure = float(result.measured_seconds or 0.0)
    other = max(wall - spawn - setup - settle - measure, 0.0)
    phases = extra.get("phase_seconds") or {}
    # "other" taken apart where the child timed its phases (issue 36): context (device, NVML, CUDA
    # context; part of build above), warm-up, answer check, busy pass, the child's imports (part of spawn)
    detail = {f"phase_{name}": float(phases.get(name) or 0.0) for name in ("context", "warmup", "check", "busy")}
    detail["phase_import"] = float(extra.get("import_seconds") or 0.0)
    return {"gpu_seconds": wall, "spawn": spawn, "build": setup - compile_seconds, "compile": compile_seconds,
            "settle": settle, "measure": measure, "other": other, **detail}


def _window_rate(window: Any) -> float | None:
    from gpuperfd.probe_data.result import PRIMARY_METRIC

    for key in PRIMARY_METRIC.values():
        if key in window.throughput:
            return window.throughput[key]
    return None


def sweep(path: str, device: RecordingCaps, executor: Any, schedule: Any, caps: list[float], state: Path,
          holder: dict | None = None) -> dict:
    from gpuperfd.caps.journal import CapJournal
    from gpuperfd.probe_data.recommend import rate_noise
    from gpuperfd.probing.executors import PerPointExecutor, measure_once, open_session
    from gpuperfd.probing.scheduling.schedule_request import request_from_schedule
    from gpuperfd.probing.sweep.sweeper import run_sweep

    abort = threading.Event()
    holder = holder if holder is not None else {}
    request = request_from_schedule(schedule)
    if path == "shared":  # the production path: the previous probe's session hands its child over
        session: Any = open_session(executor, device, request, abort, after=holder.pop("session", None))
    elif path == "per_point":
        session = PerPointExecutor(lambda d, r, a: measure_once(executor, d, r, a)).open(device, request, abort)
    else:
        session = open_session(executor, device, request, abort)
    t_prepare = time.monotonic()
    session.prepare()  # as run_owned_sweep does: the child's imports before the GPU is taken
    prepare_seconds = time.monotonic() - t_prepare
    t0 = time.monotonic()
    try:
        points = run_sweep(device, CapJournal(state), caps, session.measure,  # type: ignore[arg-type]
                           settle_seconds=schedule.settle_seconds)
    finally:
        if path == "shared":
            holder["session"] = session  # closed by the next probe's open_session, or at the end
        else:
            session.close()
    wall = time.monotonic() - t0
    rows = []
    for point in points:
        r = point.result
        rows.append({"cap_watts": point.cap_watts, "status": r.status, "reason": r.failure_reason,
                     "rate": (r.units_of_work / r.measured_seconds) if r.ok and r.measured_seconds else None,
                     "cv": rate_noise(r) if r.ok and len(r.repeats) > 1 else None,
                     "settle_steady": r.extra.get("settle_steady"), "windows": r.extra.get("windows_measured"),
                     "window_seconds": r.extra.get("window_seconds"),
                     "window_sm_mhz": [w.sm_clock_hertz_mean / 1e6 if w.sm_clock_hertz_mean else None
                                       for w in r.repeats],
                     "window_power_w": [w.average_power_watts for w in r.repeats],
                     "window_rate": [_window_rate(w) for w in r.repeats],
                     **parts(r, "warm" if path != "per_point" else path)})
    return {"path": path, "probe": schedule.probe, "preset": schedule.preset, "sweep_gpu_seconds": wall,
            "prepare_seconds": prepare_seconds, "points": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="simulated GPU device, probes on the CPU")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (default 0)")
    parser.add_argument("--preset", help="preset for every probe (default: each probe's default)")
    parser.add_argument("--probes", default=",".join(PROBES), help="comma-separated probes (default: all four)")
    parser.add_argument("--settle", type=float, default=5.0, help="settle bound per cap, seconds (default 5)")
    parser.add_argument("--paths", default="per_point,warm",
                        help="which paths to run: per_point, warm, warm_cold, warm_cached, shared (default: "
                             "per_point,warm); issue 36's comparison: warm_cold,warm_cached,shared")
    parser.add_argument("--before", metavar="DIR", help="a copy of the landed tree: run its sweep_cost.py "
                        "--paths warm first, same GPU, same probes, and print its totals beside these")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    args = parser.parse_args(argv)

    from gpuperfd.config import ScheduleConfig, SimulationConfig
    from gpuperfd.probing.executors import ChildProcessExecutor

    if args.cpu:
        from gpuperfd.device.simulated import SimulatedBackend

        backend: Any = SimulatedBackend(SimulationConfig(gpus=1))
        torch_device = "cpu"
    else:
        from gpuperfd.device.nvml import NvmlBackend

        backend = NvmlBackend(indices=[args.gpu])
        torch_device = "cuda"
    device = RecordingCaps(backend.devices()[0])
    limits = device.power_limits()
    before = limits.enforced_watts
    caps = [round(limits.clamp(f * limits.max_watts)) for f in CAP_FRACTIONS]
    info = device.info()
    print(f"device: {info.name} ({'simulated; probes on the CPU' if args.cpu else 'NVML'}), "
          f"power limit {before:.0f} W, caps {caps}")
    print("cap writes are RECORDED ONLY: NVML's setter is never called; the GPU stays at its limit "
          f"({before:.0f} W) for every point")
    before_run = _run_before(args) if args.before else None
    results = []
    paths = args.paths.split(",")
    holder: dict = {}
    with tempfile.TemporaryDirectory() as state:
        cached = ChildProcessExecutor(1800, torch_device=torch_device, state_dir=state)
        schedules = [ScheduleConfig(probe=probe, preset=args.preset, interval_seconds=3600, caps=caps,
                                    settle_seconds=args.settle) for probe in args.probes.split(",")]
        if "shared" in paths and "warm_cold" not in paths:
            # An earlier round, not counted: the same probes in the same order in one child, as the
            # daemon's previous round left the cache (Inductor's cache key depends on what the process
            # ran before the compile: a cache filled by a child that built ViT alone missed here)
            filler: dict = {}
            for schedule in schedules:
                sweep("shared", device, cached, schedule, caps[:1], Path(state), filler)
            filler["session"].close()
        for schedule in schedules:
            probe = schedule.probe
            if "warm_cached" in paths and "warm_cold" not in paths:
                sweep("warm", device, cached, schedule, caps[:1], Path(state))  # fills the cache, not counted
            for path in paths:
                if path == "warm_cold":  # an empty cache of its own, as /tmp after a restart
                    executor: Any = ChildProcessExecutor(1800, torch_device=torch_device,
                                                         state_dir=tempfile.mkdtemp(dir=state))
                elif path in ("warm_cached", "shared"):
                    executor = cached
                else:
                    executor = ChildProcessExecutor(1800, torch_device=torch_device, compile_cache=False)
                result = sweep(path, device, executor, schedule, caps, Path(state), holder)
                if path == "warm_cold":  # what it compiled now fills the shared state cache
                    _merge_cache(Path(executor.state_dir), Path(state))
                results.append(result)
                print(f"{probe:9s} {path:11s} {result['sweep_gpu_seconds']:7.1f} GPU-s  " + "  ".join(
                    f"{p['cap_watts']:.0f}W:{p['status']}" for p in result["points"]), flush=True)
        if holder.get("session") is not None:
            holder["session"].close()
    after = backend.devices()[0].power_limits().enforced_watts
    backend.close()
    _print_summary(results)
    if before_run is not None:
        _print_before(before_run, results)
    print(f"\ncap writes recorded: {len(device.writes)}; NVML setter calls: 0; "
          f"power limit before {before:.0f} W, after {after:.0f} W")
    if args.json:
        import torch  # noqa: PLC0415 - only for the record, after the sweeps

        Path(args.json).write_text(json.dumps({
            "machine": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "device": info.name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join([sys.executable, *sys.argv]), "caps": caps, "cap_writes": device.writes,
            "limit_before_watts": before, "limit_after_watts": after, "sweeps": results, "before": before_run,
        }, indent=1, default=str))
    failed = [p for r in results for p in r["points"] if p["status"] != "ok"]
    return 1 if failed or round(after) != round(before) else 0


def _merge_cache(source: Path, state: Path) -> None:
    import shutil

    from gpuperfd.probing.child.compile_cache import COMPILE_CACHE_DIR

    src = source / COMPILE_CACHE_DIR
    if src.is_dir():
        shutil.copytree(src, state / COMPILE_CACHE_DIR, dirs_exist_ok=True)


def _run_before(args: argparse.Namespace) -> dict:
    """The landed tree's own benchmark, warm path, same GPU and probes, in a subprocess."""
    import subprocess

    root = Path(args.before).resolve()
    out = Path(tempfile.mkdtemp()) / "before.json"
    cmd = [sys.executable, str(root / "benchmarks" / "sweep_cost.py"), "--paths", "warm", "--probes", args.probes,
           "--settle", str(args.settle), "--json", str(out)]
    cmd += ["--cpu"] if args.cpu else ["--gpu", str(args.gpu)]
    cmd += ["--preset", args.preset] if args.preset else []
    print("before:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), check=False)
    return json.loads(out.read_text()) if out.exists() else {"error": "the landed benchmark wrote no JSON"}


def _print_before(before_run: dict, results: list[dict]) -> None:
    sweeps = before_run.get("sweeps") or []
    total = sum(r["sweep_gpu_seconds"] for r in sweeps)
    firsts = [r["points"][0]["gpu_seconds"] for r in sweeps if r["points"]]
    print(f"\nbefore (landed tree, warm): {total:.1f} GPU-s per GPU; first points "
          f"{', '.join(f'{f:.1f}' for f in firsts)} s")
    for path in dict.fromkeys(r["path"] for r in results):
        mine = [r for r in results if r["path"] == path]
        after = sum(r["sweep_gpu_seconds"] for r in mine)
        first = [r["points"][0]["gpu_seconds"] for r in mine if r["points"]]
        print(f"after ({path}): {after:.1f} GPU-s = {total / after if after else float('nan'):.2f}x less; "
              f"first points {', '.join(f'{f:.1f}' for f in first)} s")


def _print_summary(results: list[dict]) -> None:
    keys = ("spawn", "build", "compile", "settle", "measure", "other", "phase_import", "phase_context", "phase_warmup",
            "phase_check", "phase_busy")
    print(f"\n{'probe':9s} {'path':9s} {'sweep s':>8s} {'per pt':>7s} " + " ".join(f"{k.removeprefix('phase_'):>8s}" for k in keys)
          + f" {'max CV':>7s} {'prepare':>8s}")
    totals: dict[str, float] = {}
    for r in results:
        n = len(r["points"]) or 1
        sums = {k: sum(p[k] for p in r["points"]) for k in keys}
        cvs = [p["cv"] for p in r["points"] if p["cv"] is not None]
        totals[r["path"]] = totals.get(r["path"], 0.0) + r["sweep_gpu_seconds"]
        print(f"{r['probe']:9s} {r['path']:9s} {r['sweep_gpu_seconds']:8.1f} {r['sweep_gpu_seconds'] / n:7.1f} "
              + " ".join(f"{sums[k]:8.1f}" for k in keys)
              + (f" {100 * max(cvs):6.2f}%" if cvs else "       -") + f" {r.get('prepare_seconds', 0.0):8.1f}")
    for path, total in totals.items():
        print(f"all probes, {path}: {total:.1f} GPU-s per GPU")
    prepared = sum(r.get("prepare_seconds", 0.0) for r in results)
    if prepared:
        print(f"(prepare: {prepared:.1f} s of child imports before the GPU was taken, not GPU time: in no row's sweep s)")
    if "per_point" in totals and "warm" in totals and totals["warm"]:
        print(f"warm path: {totals['per_point'] / totals['warm']:.1f}x less GPU time")
    cvs = [p["cv"] for r in results if r["path"] == "warm" for p in r["points"] if p["cv"] is not None]
    if cvs:
        print(f"warm points with CV <= 1%: {sum(c <= 0.01 for c in cvs)}/{len(cvs)} "
              f"(median {100 * statistics.median(cvs):.2f}%)")


if __name__ == "__main__":
    sys.exit(main())
