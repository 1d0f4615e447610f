#!/usr/bin/env python3
"""What a probe child could do before its GPU qualifies, and what its costs on the GPU are made of (issue 60).

    python3 benchmarks/child_costs.py --gpu 0 --json child_costs.json

Each question runs in a fresh Python process (as a probe child is), read-only on the GPU:

* ``context``: which calls made before any CUDA work put the process on the GPU (a CUDA context, seen as
  a compute process by NVML, as a user's job would see it): ``torch.cuda.is_available()``,
  ``get_device_properties``, the profiler's start and stop with CUDA activity, and, for contrast, one
  allocation. A call that leaves no compute process could run in a standby child while a job holds the GPU.
* ``profiler``: the seconds of the GPU-busy pass's profiler sessions in one process: the first (CUPTI's
  start) and the next ones, around the same small load.
* ``vit_build``: ViT's build (model, ``torch.compile`` with the state directory's cache warm, CUDA graph)
  with Inductor's default compile workers and with ``TORCHINDUCTOR_COMPILE_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONTEXT = textwrap.dedent("""
    import json, os, sys, time
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
    def on_gpu():
        return any(p.pid == os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    out = {}
    t = time.perf_counter(); import torch; out["import_torch_seconds"] = time.perf_counter() - t
    steps = [
        ("is_available", lambda: torch.cuda.is_available()),
        ("device_count", lambda: torch.cuda.device_count()),
        ("get_device_properties", lambda: torch.cuda.get_device_properties(0)),
        ("get_device_capability", lambda: torch.cuda.get_device_capability(0)),
        ("profiler_start_stop", lambda: _profile()),
        ("allocate", lambda: torch.ones(1, device="cuda")),
    ]
    def _profile():
        from torch.autograd.profiler import profile
        with profile(use_cpu=True, use_device="cuda", use_kineto=True):
            pass
    for name, call in steps:
        t = time.perf_counter(); call(); seconds = time.perf_counter() - t
        time.sleep(0.3)
        out[name] = {"seconds": round(seconds, 4), "on_gpu_after": on_gpu()}
    print(json.dumps(out))
""")

PROFILER = textwrap.dedent("""
    import json, time, torch
    from torch.autograd.profiler import profile
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(10): a @ a
    torch.cuda.synchronize()
    out = []
    for _ in range(4):
        t = time.perf_counter()
        with profile(use_cpu=True, use_device="cuda", use_kineto=True) as prof:
            for _ in range(50): a @ a
            torch.cuda.synchronize()
        n = len(list(prof.kineto_results.events()))
        out.append({"seconds": round(time.perf_counter() - t, 4), "events": n})
    print(json.dumps(out))
""")

VIT = textwrap.dedent("""
    import json, sys, time
    t = time.perf_counter()
    from gpuperfd.probe_child import harness
    from gpuperfd.probe_data.spec import ProbeSpec
    imports = time.perf_counter() - t
    spec = ProbeSpec("vit", preset="vit-b16")
    prepared = harness.prepare(spec)
    print(json.dumps({"imports_seconds": imports, "setup_seconds": prepared.setup_seconds,
                      "compile_seconds": prepared.workload.compile_seconds,
                      "cuda_graph": prepared.workload.graph is not None}))
""")


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> object:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--vit-runs", type=int, default=2)
    args = parser.parse_args()
    gpu_env = {"CUDA_VISIBLE_DEVICES": str(args.gpu)}
    report: dict[str, object] = {"context": _run(CONTEXT, "0", env=gpu_env)}
    print("context:", json.dumps(report["context"]), flush=True)
    report["profiler"] = _run(PROFILER, env=gpu_env)
    print("profiler:", json.dumps(report["profiler"]), flush=True)
    cache = Path(tempfile.mkdtemp(prefix="gpuperfd-vit-cache-"))
    cache_env = {**gpu_env, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
                 "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    vit: dict[str, list[object]] = {"cold": [_run(VIT, env=cache_env)]}
    print("vit cold:", json.dumps(vit["cold"]), flush=True)
    for label, extra in (("warm_default", {}), ("warm_threads_1", {"TORCHINDUCTOR_COMPILE_THREADS": "1"})):
        vit[label] = [_run(VIT, env={**cache_env, **extra}) for _ in range(args.vit_runs)]
        print(f"vit {label}:", json.dumps(vit[label]), flush=True)
    report["vit_build"] = vit
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
