#!/usr/bin/env python3
"""The PCIe link on a real GPU at idle, under load and after: what the health checks read.

    python3 benchmarks/pcie_link_idle_busy.py --json OUT.json     # GPU node, read-only

The ``pcie_generation_below_max`` / ``pcie_width_below_max`` checks count busy samples with the
link below its maximum. Boards may train the link down at idle to save power, so a link reading
taken at idle must never be paired with busy utilization (the health monitor keeps only values
read since the busy streak began). This measures, on the card: each link getter's cost (median of
500 calls: may the link be read on the fast lane?), the link and utilization at idle, every 50 ms
while a matmul loop runs, and after it stops (how soon it trains down, if it does). Nothing is
set on the GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import pynvml

GETTERS = {
    "generation": pynvml.nvmlDeviceGetCurrPcieLinkGeneration,
    "width": pynvml.nvmlDeviceGetCurrPcieLinkWidth,
    "max_generation": pynvml.nvmlDeviceGetMaxPcieLinkGeneration,
    "max_width": pynvml.nvmlDeviceGetMaxPcieLinkWidth,
    "utilization": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
}


def read(handle) -> dict:
    return {"t": time.monotonic(), **{name: get(handle) for name, get in GETTERS.items()}}


def trace(handle, seconds: float, period: float = 0.05) -> list[dict]:
    rows, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        rows.append(read(handle))
        time.sleep(period)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--busy-seconds", type=float, default=4.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    costs = {}
    for name, get in GETTERS.items():
        samples = []
        for _ in range(500):
            start = time.perf_counter()
            get(handle)
            samples.append((time.perf_counter() - start) * 1e6)
        costs[name] = statistics.median(samples)
    idle = trace(handle, 1.0)

    import torch  # only now: the idle trace runs before any CUDA context exists

    a = torch.randn(8192, 8192, device=f"cuda:{args.gpu}", dtype=torch.float16)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    worker = threading.Thread(target=load)
    worker.start()
    busy = trace(handle, args.busy_seconds)
    stop.set()
    worker.join()
    after = trace(handle, 4.0)
    report = {"gpu": pynvml.nvmlDeviceGetName(handle), "driver": pynvml.nvmlSystemGetDriverVersion(),
              "getter_median_us": costs, "idle": idle, "busy": busy, "after": after}
    for name, rows in (("idle", idle), ("busy", busy), ("after", after)):
        gens = sorted({(r["generation"], r["width"]) for r in rows})
        print(f"{name:5} {len(rows):3} reads: (gen, width) seen {gens}, utilization {min(r['utilization'] for r in rows)}-"
              f"{max(r['utilization'] for r in rows)} %, max gen/width {rows[0]['max_generation']}/{rows[0]['max_width']}")
    print("getter median us:", {k: round(v, 2) for k, v in costs.items()})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
