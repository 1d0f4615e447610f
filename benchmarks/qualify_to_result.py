#!/usr/bin/env python3
"""From the moment a GPU qualifies to the published result, per probe, on a real GPU (issue 50): where the
time goes, split into what runs on the CPU only (the child's start and imports, before it touches the
GPU) and what holds the GPU (build, compile, settle, the measured window).

    python3 benchmarks/qualify_to_result.py --gpu 0 --probes llm,vit,attention,train --repeats 1 --json q2r.json

It builds the daemon itself on NVML (read-only: caps [current], nothing is ever set), and for each probe
calls the probe service's run (what the gap dispatcher calls the moment the GPU qualifies) in a fresh
probe child, twice: the first with the compile cache as the state directory has it, the second warm.
Per run it prints: total (call to result published), child imports (CPU only: the child reports
``import_seconds`` before any CUDA call), setup (build and compile, GPU), point wall (settle and the
measured windows, GPU), measured (the windows alone) and the rest (spawn, hand-offs, publishing).
The GPU must be idle; the script refuses a GPU with a compute process on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--probes", default="llm,vit,attention,train")
    parser.add_argument("--repeats", type=int, default=1,
                        help="measured windows per point (0: the probe's default, the daemon's: 5 of 1.5 s)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--state-dir", default=None, help="the daemon's state directory (its compile cache); default: a new one")
    parser.add_argument("--standby", choices=["off", "on", "both"], default="both",
                        help="start the run's child before the qualifying moment, as the daemon's dispatcher does "
                             "when the GPU will qualify within a child's start (probing/child/standby.py); both: each run twice")
    parser.add_argument("--busy-profile-seconds", type=float, default=None,
                        help="the probes' busy pass length (default: the preset's)")
    parser.add_argument("--ahead", default="",
                        help="other probes scheduled on the GPU (comma list): a standby child imports their code after "
                             "saying ready, as the daemon's does for the GPU's other schedules")
    parser.add_argument("--ahead-wait", type=float, default=0.0,
                        help="seconds to wait after the standby child is ready (its import-ahead done), before the run")
    parser.add_argument("--json", default=None)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="check the script without a GPU: simulated GPUs, probe children on the CPU, tiny presets")
    args = parser.parse_args()

    import gpuperfd.cli  # noqa: F401 - the configuration's vocabulary
    from gpuperfd.config import ScheduleConfig, config_from_mapping
    from gpuperfd.daemon import Daemon

    state = Path(args.state_dir or tempfile.mkdtemp(prefix="gpuperfd-q2r-"))
    smoke = {"executor": "child", "torch_device": "cpu"} if args.cpu_smoke else {}
    config = config_from_mapping({
        "web": {"listen_address": "127.0.0.1:0"},
        "device": {"gpus": [args.gpu], **({"backend": "simulated"} if args.cpu_smoke else {})},
        "probes": {"state_dir": str(state), "history": {"path": None}, "idle_seconds": 0, "read_only": True, **smoke,
                   "schedules": [{"probe": p, "interval_seconds": 86400, **({"preset": "tiny"} if args.cpu_smoke else {})}
                                 for p in args.ahead.split(",") if p]},
        "health": {"enabled": False},
        # a lent machine is a container of Kubernetes with no kubelet socket: the daemon would rightly call
        # every GPU allocated there (the benchmark's own GPU is known to be free: it refuses one in use)
        "attribution": {"kubernetes": {"required": False}},
    })
    daemon = Daemon(config)
    try:
        daemon.sampler.sample_once()
        device = daemon.probes.devices[args.gpu]
        if device.compute_processes():
            print(f"gpu {args.gpu} has compute processes: not idle, not measured", file=sys.stderr)
            return 1
        rows = []
        for probe in args.probes.split(","):
            schedule = ScheduleConfig(probe=probe, interval_seconds=86400, settle_seconds=0.0 if args.cpu_smoke else 5.0,
                                      preset="tiny" if args.cpu_smoke else None,
                                      options={**({"repeats": args.repeats} if args.repeats > 0 else {}),
                                               **({"busy_profile_seconds": args.busy_profile_seconds}
                                                  if args.busy_profile_seconds is not None else {})})
            modes = {"off": [False], "on": [True], "both": [False, True]}[args.standby]
            for run, standby in ((r, m) for r in range(1, args.runs + 1) for m in modes):
                if standby:  # the child imports before the qualifying moment; the clock starts when it is ready
                    if not daemon.probes.stand_by(args.gpu, schedule):
                        print(f"{probe} run {run}: no standby child (no room, or no child executor)", file=sys.stderr)
                        continue
                    if not daemon.probes.standby.wait_ready(args.gpu, 600):
                        print(f"{probe} run {run}: the standby child did not start", file=sys.stderr)
                        continue
                    time.sleep(args.ahead_wait)
                results = []
                daemon.probes.point_listeners.append(lambda gpu, p, preset, point: results.append(point.result))
                t0 = time.perf_counter()
                outcome = daemon.probes.run(schedule, args.gpu)
                total = time.perf_counter() - t0
                daemon.probes.point_listeners.pop()
                if outcome.result != "ok" or not results:
                    print(f"{probe} run {run}: {outcome.result} {outcome.reason}", file=sys.stderr)
                    continue
                result = results[-1]
                extra = result.extra
                imports = float(extra.get("import_seconds") or 0.0)  # in the child, before any CUDA call
                start = float(extra.get("child_start_seconds") or 0.0)  # spawn until the child said ready
                setup = float(extra.get("child_setup_seconds") or 0.0)  # build and compile, on the GPU
                prepare = float(extra.get("child_prepare_seconds") or 0.0)
                point = float(result.wall_seconds or 0.0)  # the parent's whole point, start included
                measured = float(result.measured_seconds or 0.0)
                cpu = start + prepare + imports  # spawn and imports: the child makes no CUDA call before its build
                phases = {k: round(float(v), 3) for k, v in (extra.get("phase_seconds") or {}).items()}
                checks = (result.correctness or {}).get("seconds")
                row = {"probe": probe, "run": run, "standby": standby, "busy_profile_seconds": args.busy_profile_seconds, "total_seconds": total, "cpu_only_seconds": cpu,
                       "phase_seconds": phases, "correctness_seconds": checks,
                       "settle_seconds": extra.get("settle_seconds"), "warmup_seconds": extra.get("warmup_seconds"),
                       "gpu_seconds": max(0.0, total - cpu), "child_start_seconds": start,
                       "child_prepare_seconds": prepare, "setup_gpu_seconds": setup, "point_seconds": point,
                       "measured_seconds": measured, "measured_share": measured / total if total else None,
                       **{key: extra.get(key) for key in ("settle_steady", "windows_measured", "busy_window_seconds",
                                                          "busy_activities", "busy_iterations", "compile_seconds")}}
                rows.append(row)
                print(f"{probe:9s} run {run} standby {'on ' if standby else 'off'}: total {total:6.1f} s | CPU only (spawn, imports) {cpu:5.1f} | "
                      f"GPU held {row['gpu_seconds']:5.1f} (start {start:.1f}, prepare {prepare:.1f}, build "
                      f"{setup:.1f}) | measured {measured:4.1f} ({100 * (row['measured_share'] or 0):.0f} %) | phases {phases}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        daemon.probes.stop()
        daemon.web.stop()
        daemon.backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
