#!/usr/bin/env python3
"""A compiled variant's turn, side by side: what warming the compiler's keys before the GPU and a load
queued beside the build save (issue 60, ViT's 7.1 s turn against a 5.1 s goal on a lent H200).

    python3 benchmarks/compiled_build.py --gpu 0 --probe vit --trials 3 --state-dir /tmp/gq --json cb.json

Each trial is a fresh process, as a probe child is: it imports the build's code the way a standby child
does (``workloads.preload``, or without the compiler keys), says whether it touched the GPU then (NVML's
compute processes, ``torch.cuda.is_initialized``), then builds and measures one point as the daemon's
first point does (``harness.prepare`` with the ramp on or off, ``harness.measure`` settled under load).
Four modes, in a rotated order each trial so drift falls on all: ``plain`` (neither), ``keys``,
``ramp``, ``both`` (the shipped child). One trial before them fills the compile cache and is not
counted. Prints per mode the medians of: the turn (build + point, what follows the qualifying
moment), the build, the settle set aside, the measured rate; and each mode's turn against ``plain``.
Read-only: no cap, clock or mode is touched. The GPU must be idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {"plain": (False, False), "keys": (True, False), "ramp": (False, True), "both": (True, True)}


def one(mode: str, probe: str, gpu: int) -> dict[str, object]:
    """One trial in this process (a child's life): imports, then one point; its figures."""
    keys, ramp = MODES[mode]
    t0 = time.perf_counter()
    import pynvml
    import torch

    from gpuperfd.probe_child import harness, workloads
    from gpuperfd.probe_data.spec import ProbeSpec

    spec = ProbeSpec(probe, device=f"cuda:{gpu}")
    if keys:
        workloads.preload(spec.probe, spec.variant)
    else:
        for name in workloads.build_imports(spec.probe, spec.variant):
            __import__(name)
    preload_seconds = time.perf_counter() - t0
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    on_gpu = any(p.pid == os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    cuda_initialized = torch.cuda.is_initialized()
    t_turn = time.perf_counter()
    prepared = harness.prepare(spec, ramp=ramp)
    result = harness.measure(prepared, settle_seconds=5.0)
    turn = time.perf_counter() - t_turn
    extra = result.extra
    rate = result.throughput.get("images_per_second") or next(iter(result.throughput.values()), None)
    return {"mode": mode, "preload_seconds": preload_seconds, "on_gpu_after_preload": on_gpu,
            "cuda_initialized_after_preload": cuda_initialized, "turn_seconds": turn,
            "build_seconds": prepared.setup_seconds - prepared.phase_seconds.get("context", 0.0),
            "settle_seconds": extra["settle_seconds"], "settle_steady": extra["settle_steady"],
            "ramp_products": extra["ramp_products"], "phase_seconds": extra["phase_seconds"],
            "rate": rate, "power_watts": result.average_power_watts, "status": result.status}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--probe", default="vit")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--state-dir", default=None, help="where the compile cache lives (the daemon's state directory)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.probe, args.gpu)))
        return 0

    import pynvml

    from gpuperfd.probing.child.compile_cache import compile_cache_env

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    if pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        print(f"GPU {args.gpu} has compute processes: refusing", file=sys.stderr)
        return 2
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="gpuperfd-cb-"))
    env = {**os.environ, **compile_cache_env(state), "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}

    def trial(mode: str) -> dict[str, object]:
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--probe", args.probe, "--gpu", str(args.gpu)],
                             env=env, capture_output=True, text=True, check=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])

    warm = trial("both")
    print(f"cache fill (not counted): turn {warm['turn_seconds']:.2f} s, build {warm['build_seconds']:.2f} s")
    names = list(MODES)
    rows: list[dict[str, object]] = []
    for t in range(args.trials):
        for mode in names[t % len(names):] + names[:t % len(names)]:
            row = trial(mode)
            rows.append(row)
            print(f"trial {t} {mode:5s}: turn {row['turn_seconds']:.2f} build {row['build_seconds']:.2f} "
                  f"settle {row['settle_seconds']:.2f} ({row['settle_steady']}) ramp {row['ramp_products']} "
                  f"rate {row['rate']:.1f} power {row['power_watts']} preload {row['preload_seconds']:.1f} "
                  f"on_gpu {row['on_gpu_after_preload']} cuda {row['cuda_initialized_after_preload']}", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for mode in names:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {key: statistics.median(float(r[key]) for r in mine)
                         for key in ("turn_seconds", "build_seconds", "settle_seconds", "rate", "preload_seconds")}
    for mode in names:
        s = summary[mode]
        print(f"{mode:5s} medians: turn {s['turn_seconds']:.2f} s ({s['turn_seconds'] / summary['plain']['turn_seconds']:.2f}x "
              f"plain), build {s['build_seconds']:.2f} s, settle {s['settle_seconds']:.2f} s, rate {s['rate']:.1f}, "
              f"preload {s['preload_seconds']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"warm": warm, "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
