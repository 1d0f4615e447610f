#!/usr/bin/env python3
"""What a probe's first point is made of, in fresh processes: imports, CUDA context, build, compile
(with the compile cache empty, then filled), the profiled busy pass (first and second time).

    python3 benchmarks/first_point_parts.py --probes vit,attention --runs 2 --json first_point_parts.json

Each run is a new process (as a new probe child is) sharing one compile cache folder (as the
daemon's state directory holds it): run 1 starts from an empty cache, later runs find it filled.
Per run and probe it prints the seconds of ``import torch``, ``import transformers``, the CUDA
context, ``harness.prepare`` (of which the workload's own ``compile_seconds``), the inductor FX-graph
cache hits and misses, and two profiled busy passes (the first pays the profiler's CUPTI start).
Read-only: builds and runs probes, never sets anything on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _one_run(probes: list[str]) -> dict:
    """In this (fresh) process: time each part for each probe, in order."""
    out: dict = {}
    t = time.perf_counter()
    import torch

    out["import_torch"] = time.perf_counter() - t
    t = time.perf_counter()
    import transformers  # noqa: F401

    out["import_transformers"] = time.perf_counter() - t
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out["cuda_context"] = time.perf_counter() - t
    from torch._dynamo.utils import counters

    from gpuperfd.probe_child import harness
    from gpuperfd.probe_child.busy import measure_busy
    from gpuperfd.probe_data.spec import ProbeSpec

    for probe in probes:
        counters.clear()
        t = time.perf_counter()
        prepared = harness.prepare(ProbeSpec(probe=probe))
        row = {"prepare": time.perf_counter() - t,
               "compile": float(getattr(prepared.workload, "compile_seconds", 0.0) or 0.0),
               "context": prepared.phase_seconds.get("context"),
               "fxgraph_cache": {k: v for k, v in counters["inductor"].items() if "cache" in k}}
        for n in (1, 2):
            t = time.perf_counter()
            ratio, info = measure_busy(prepared.ctx, prepared.workload, 0.3)
            row[f"busy_pass_{n}"] = time.perf_counter() - t
            row[f"busy_ratio_{n}"] = ratio
            row[f"busy_activities_{n}"] = info.get("busy_activities")
        out[probe] = row
        del prepared
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", default="vit,attention,llm,train")
    parser.add_argument("--runs", type=int, default=2, help="fresh processes, one compile cache (default 2)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--exit", choices=("normal", "os_exit"), default="normal",
                        help="how each run's process ends: normal interpreter exit, or os._exit as the probe "
                             "child does (no atexit handlers: does the compile cache still persist?)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_one_run(args.probes.split(","))), flush=True)
        if args.exit == "os_exit":
            os._exit(0)
        return 0
    from gpuperfd.probing.child.compile_cache import compile_cache_env

    runs = []
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, **compile_cache_env(state), "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")])}
        for n in range(1, args.runs + 1):
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--child", "--probes", args.probes, "--exit", args.exit], env=env,
                                  capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            run["process_wall"] = wall
            runs.append(run)
            print(f"run {n} ({'empty' if n == 1 else 'filled'} compile cache): process {wall:.1f} s, import torch "
                  f"{run['import_torch']:.2f} s, transformers {run['import_transformers']:.2f} s, CUDA context "
                  f"{run['cuda_context']:.2f} s")
            for probe in args.probes.split(","):
                r = run[probe]
                print(f"  {probe:9s} prepare {r['prepare']:6.2f} s (compile {r['compile']:5.2f} s) cache "
                      f"{r['fxgraph_cache']}  busy pass {r['busy_pass_1']:.2f} s then {r['busy_pass_2']:.2f} s "
                      f"({r['busy_activities_1']} activities)")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                               "command": " ".join([sys.executable, *sys.argv]), "runs": runs},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
