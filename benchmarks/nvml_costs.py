"""Per-call cost of every NvmlDevice getter and the RSS each layer adds (read-only).

Usage (on a GPU node): python benchmarks/nvml_costs.py [--calls 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rss = {"python": rss_mb()}
    import pynvml  # noqa: F401

    rss["+pynvml import"] = rss_mb()
    from gpuperfd.device.nvml import NvmlBackend

    backend = NvmlBackend()
    device = backend.devices()[0]
    rss["+nvmlInit"] = rss_mb()
    import gpuperfd.daemon  # noqa: F401  (apscheduler, prometheus_client, the config schema)

    rss["+daemon imports"] = rss_mb()
    costs = {}
    cpu_costs = {}
    for name in ("utilization", "memory", "temperature_celsius", "power_watts", "energy_joules", "power_limits",
                 "clocks", "clock_events", "pcie_throughput", "ecc_errors", "compute_processes", "info"):
        method = getattr(device, name)
        calls = args.calls if name != "pcie_throughput" else 20
        wall, cpu = [], []
        for _ in range(calls):
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                method()
            except Exception as exc:  # noqa: BLE001
                costs[name] = f"{type(exc).__name__}"
                break
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        if wall:
            costs[name] = round(1e6 * statistics.median(wall), 1)
            cpu_costs[name] = round(1e6 * statistics.fmean(cpu), 1)
    xid_wall = time.perf_counter()
    xid_cpu = time.process_time()
    try:
        backend.wait_xid_events(2.0)
        xid = {"wall_s": time.perf_counter() - xid_wall, "cpu_s": time.process_time() - xid_cpu}
    except Exception as exc:  # noqa: BLE001
        xid = {"error": repr(exc)}
    backend.close()
    result = {"median_wall_us": costs, "mean_cpu_us": cpu_costs, "xid_wait_2s": xid, "rss_mb": rss}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
