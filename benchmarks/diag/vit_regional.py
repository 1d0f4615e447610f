"""ViT's compiled forward: the whole forward as one graph against one encoder layer's graph that every
layer calls (regional compilation), side by side on one GPU. Read-only (no cap, clock or mode change).

    python3 benchmarks/diag/vit_regional.py [--preset vit-b16] [--rounds 3] [--json out.json]

Each trial is a fresh process (as a probe child is): build ViT on the GPU, compile and capture the
CUDA graph as the vit probe's build does (three calls on a side stream, then the capture), then
replay the graph in 1 s windows. Per trial: the build's compile-and-capture seconds, images/s (median
of 5 windows), and the logits' distance from the uncompiled forward. The first round runs with each
form's compile cache empty (cold, as a node's first child), later rounds with it filled (warm: every
later child); each form has its own cache folders, and the forms alternate within a round.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRIAL = r'''
import json, statistics, sys, time
t_start = time.perf_counter()
import torch
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probe_child.workloads.models import build_vit
from gpuperfd.probe_child.workloads.vit_fused import FusedViT
form, preset = sys.argv[1], sys.argv[2]
spec = ProbeSpec("vit", preset=preset)
dev = torch.device("cuda:0")
torch.manual_seed(0)
model = build_vit(spec, dev, torch.bfloat16)
pixels = torch.randn(spec.batch_size, 3, spec.image_size, spec.image_size, device=dev, dtype=torch.bfloat16)
with torch.inference_mode():
    fused = FusedViT(model)
    reference = fused(pixels).float()
    torch.cuda.synchronize()
    t_imported = time.perf_counter()
    if form == "regional":
        fused.compile_layers()
        fn = fused
    else:
        fn = torch.compile(fused.__call__)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        for _ in range(3):
            out = fn(pixels)
    torch.cuda.current_stream(dev).wait_stream(stream)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = fn(pixels)
    torch.cuda.synchronize(dev)
    compile_seconds = time.perf_counter() - t_imported
    graph.replay(); torch.cuda.synchronize(dev)
    error = float((graph_out.float() - reference).norm() / reference.norm())
    rates = []
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        graph.replay()
    torch.cuda.synchronize(dev)
    for _ in range(5):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            graph.replay(); n += 1
        torch.cuda.synchronize(dev)
        rates.append(n * spec.batch_size / (time.perf_counter() - t0))
print(json.dumps({"form": form, "compile_and_capture_seconds": round(compile_seconds, 3),
                  "before_compile_seconds": round(t_imported - t_start, 3),
                  "images_per_second": round(statistics.median(rates), 1),
                  "window_rates": [round(r, 1) for r in rates], "relative_error_vs_uncompiled": error}))
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="vit-b16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vit-regional-"))
    rows = []
    try:
        for number in range(args.rounds):
            for form in (("whole", "regional") if number % 2 == 0 else ("regional", "whole")):
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / form / "inductor"),
                           TRITON_CACHE_DIR=str(root / form / "triton"))
                done = subprocess.run([sys.executable, "-c", TRIAL, form, args.preset], env=env,
                                      capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    print(f"{form} round {number}: exit {done.returncode}\n{done.stderr[-3000:]}", file=sys.stderr)
                    continue
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row["cache"] = "cold" if number == 0 else "warm"
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for form in ("whole", "regional"):
        warm = [r for r in rows if r["form"] == form and r["cache"] == "warm"]
        cold = [r for r in rows if r["form"] == form and r["cache"] == "cold"]
        summary[form] = {
            "cold_compile_seconds": cold[0]["compile_and_capture_seconds"] if cold else None,
            "warm_compile_seconds_median": statistics.median(r["compile_and_capture_seconds"] for r in warm) if warm else None,
            "images_per_second_median": statistics.median(r["images_per_second"] for r in rows if r["form"] == form) if rows else None,
        }
    print("SUMMARY", json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
