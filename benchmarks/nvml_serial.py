"""libnvidia-ml with two threads inside at once, and what one caller at a time costs. Read-only.

    race   NVML's first GPM round on two GPUs from two threads at once, each in a fresh process
           (fork), RUNS times per mode; a process killed by SIGSEGV is a crash:
             raw        plain pynvml, no lock (the crash of a 2x H200 node: 35-38 of 40)
             raw_lock   plain pynvml, one lock around every call
             gpuperfd   gpuperfd's NvmlDevice.gpm_metrics() (every call through device/serial.py's gate)
           A report for NVIDIA: the raw mode needs nothing but nvidia-ml-py and two GPUs.
    cost   what the gate costs: one thread's getter calls through gpuperfd against plain pynvml
           (alternated), then the daemon's sampler (every collector, every GPU, two lanes each and
           the XID poll) for SECONDS: calls, how many waited, mean and max wait, the gate's busy share.

Usage: python3 benchmarks/nvml_serial.py race [RUNS] | cost [SECONDS]   [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _raw_first_round(locked: bool) -> None:
    import pynvml as n

    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    lock = threading.Lock()
    go = threading.Barrier(2)

    def call(fn, *args):  # type: ignore[no-untyped-def]
        if not locked:
            return fn(*args)
        with lock:
            return fn(*args)

    def gpm(handle) -> None:  # type: ignore[no-untyped-def]
        go.wait()
        call(n.nvmlGpmQueryDeviceSupport, handle)
        first, second = call(n.nvmlGpmSampleAlloc), call(n.nvmlGpmSampleAlloc)
        call(n.nvmlGpmSampleGet, handle, first)
        time.sleep(0.1)
        call(n.nvmlGpmSampleGet, handle, second)
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = n.NVML_GPM_METRIC_SM_OCCUPANCY
        request.metrics[1].metricId = n.NVML_GPM_METRIC_DRAM_BW_UTIL
        call(n.nvmlGpmMetricsGet, request)

    threads = [threading.Thread(target=gpm, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _gpuperfd_first_round() -> None:
    from gpuperfd.device.nvml import NvmlBackend

    devices = NvmlBackend(indices=[0, 1]).devices()
    go = threading.Barrier(2)

    def gpm(device) -> None:  # type: ignore[no-untyped-def]
        go.wait()
        device.gpm_metrics()

    threads = [threading.Thread(target=gpm, args=(d,)) for d in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


MODES = {"raw": lambda: _raw_first_round(False), "raw_lock": lambda: _raw_first_round(True),
         "gpuperfd": _gpuperfd_first_round}


def race(runs: int) -> dict[str, object]:
    out: dict[str, object] = {}
    context = mp.get_context("fork")
    for mode, target in MODES.items():
        crashes, other = 0, []
        for _ in range(runs):
            process = context.Process(target=target)
            process.start()
            process.join(60)
            if process.exitcode == -signal.SIGSEGV:
                crashes += 1
            elif process.exitcode != 0:
                other.append(process.exitcode)
        out[mode] = {"runs": runs, "sigsegv": crashes, "other_exit_codes": other}
        print(f"{mode:>9}: {crashes} of {runs} fresh processes died with SIGSEGV"
              + (f"; other exits {other}" if other else ""), flush=True)
    return out


def _per_call_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def cost(seconds: float) -> dict[str, object]:
    import pynvml

    from gpuperfd.device.nvml import GATE, NvmlBackend
    from gpuperfd.telemetry.collectors import COLLECTORS
    from gpuperfd.telemetry.sampler import Sampler

    backend = NvmlBackend()
    devices = backend.devices()
    handle = devices[0].handle
    raw = lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)  # noqa: E731
    ours = devices[0].temperature_celsius
    pairs = [(_per_call_us(raw, 5000), _per_call_us(ours, 5000)) for _ in range(5)]
    raw_us = statistics.median(p[0] for p in pairs)
    ours_us = statistics.median(p[1] for p in pairs)
    print(f"one thread, temperature getter: plain pynvml {raw_us:.2f} us, through gpuperfd {ours_us:.2f} us "
          f"(+{ours_us - raw_us:.2f} us: the gate, error translation, unit conversion)")
    collectors = [cls() for name, cls in COLLECTORS.items() if name != "allocation"]
    sampler = Sampler(backend, devices, collectors, interval_seconds=1.0)
    before = GATE.stats()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    after = GATE.stats()
    calls = after.calls - before.calls
    waited = after.waited - before.waited
    wait_s = after.wait_seconds - before.wait_seconds
    busy = (after.inside_seconds - before.inside_seconds) / seconds
    result = {"gpus": len(devices), "seconds": seconds, "calls": calls, "calls_per_second": calls / seconds,
              "waited": waited, "waited_share": waited / max(calls, 1),
              "mean_wait_ms_of_those_that_waited": 1000 * wait_s / max(waited, 1),
              "max_wait_ms": 1000 * after.max_wait_seconds, "gate_busy_share": busy,
              "single_thread_us": {"plain_pynvml": raw_us, "gpuperfd": ours_us}, "set_aside": after.set_aside}
    print(f"sampler, {len(devices)} GPU(s), {seconds:g} s: {calls} NVML calls ({calls / seconds:.0f}/s), "
          f"{waited} waited ({100 * waited / max(calls, 1):.1f} %), mean wait of those "
          f"{result['mean_wait_ms_of_those_that_waited']:.2f} ms, max {result['max_wait_ms']:.1f} ms; "
          f"NVML busy {100 * busy:.2f} % of the time")
    backend.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("race", "cost"))
    parser.add_argument("amount", nargs="?", type=float)
    parser.add_argument("--json")
    args = parser.parse_args()
    result = race(int(args.amount or 40)) if args.what == "race" else cost(args.amount or 20.0)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
