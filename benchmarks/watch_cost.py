#!/usr/bin/env python3
"""What the probe watch costs on a real GPU: one ``compute_processes()`` read through gpuperfd's NVML
device (the gate, error translation), the read a running probe's parent makes every watch interval to
see a user's job arrive. Read-only.

    python3 benchmarks/watch_cost.py --gpu 0 --calls 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from gpuperfd.device.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        device = backend.devices()[args.gpu]
        times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            device.compute_processes()
            times.append(time.perf_counter() - t0)
    finally:
        backend.close()
    times.sort()
    row = {"calls": len(times), "p50_us": 1e6 * statistics.median(times), "p99_us": 1e6 * times[int(0.99 * len(times))],
           "max_us": 1e6 * times[-1]}
    print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
