#!/usr/bin/env python3
"""Where the daemon's resident memory goes on a real GPU node: RSS (anonymous and file-backed) after
each step of a start-up, from the interpreter to a running exporter. Read-only (no setter is called).

    python3 benchmarks/nvml_rss.py [--json FILE]

Steps: interpreter -> gpuperfd.daemon imported -> pynvml loaded -> nvmlInit -> device handles ->
one call of every read the collectors make (each line shows what that call added) -> a full
sampler round through the real collectors -> an NVML event set (the XID watcher). The figures
explain the daemon's idle RSS in docs/benchmarks.md and show which NVML calls cost memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss() -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of this process, in MB."""
    out: dict[str, float] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the steps as JSON here")
    args = parser.parse_args()
    steps: list[dict[str, object]] = []

    def step(name: str) -> None:
        now = rss()
        previous = steps[-1]["VmRSS"] if steps else now["VmRSS"]
        steps.append({"step": name, **now, "added": now["VmRSS"] - previous})  # type: ignore[operator]
        print(f"{name:48s} RSS {now['VmRSS']:6.1f} MB (anon {now['RssAnon']:5.1f}, file {now['RssFile']:5.1f})"
              f"  +{now['VmRSS'] - previous:5.1f}", flush=True)  # type: ignore[operator]

    step("interpreter")
    import gpuperfd.daemon  # noqa: F401
    step("gpuperfd.daemon imported")
    import pynvml
    step("pynvml imported")
    pynvml.nvmlInit()
    step("nvmlInit")
    from gpuperfd.device.nvml import NvmlBackend

    backend = NvmlBackend()
    devices = backend.devices()
    step(f"NvmlBackend: {len(devices)} device(s)")
    for name in ("info", "utilization", "memory", "temperature_celsius", "power_watts", "energy_joules",
                 "power_limits", "clocks", "clock_events", "pcie_throughput", "ecc_errors",
                 "compute_processes", "gpm_activity", "mig_uuids"):
        call = getattr(devices[0], name, None)
        if call is None:
            continue
        try:
            call()
            step(f"  {name}()")
        except Exception as exc:  # noqa: BLE001 - unsupported calls are part of the picture
            step(f"  {name}() -> {type(exc).__name__}")
    from gpuperfd.telemetry.collectors import COLLECTORS

    for device in devices:
        for collector in COLLECTORS.values():
            try:
                collector().read(device)
            except Exception:  # noqa: BLE001
                pass
    step("every collector on every device")
    try:
        events = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, events)
        step("XID event set registered")
    except Exception as exc:  # noqa: BLE001
        step(f"XID event set -> {type(exc).__name__}")
    time.sleep(1)
    step("after 1 s")
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.node(), "python": platform.python_version(),
                                         "date": time.strftime("%Y-%m-%d"), "steps": steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
