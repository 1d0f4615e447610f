#!/usr/bin/env python3
"""Why a probe's windows scatter: its rate, SM clock and power traced finely under steady load.

    python3 benchmarks/clock_trace.py --probes attention,vit --seconds 20 --json clock_trace.json

Builds each probe as the child does (:func:`gpuperfd.probe_child.harness.prepare`, default preset,
on the GPU), warms it, then runs it without a break for ``--seconds`` in slices of ``--slice``
seconds, recording each slice's work rate, while a thread reads NVML's SM clock, power, temperature
and clock-event reasons every ``--interval`` seconds. Reported per probe:

* the rate of each slice against its mean SM clock (correlation, and the spread of rate/clock: if
  the rate is the clock times a constant, the scatter is the clock's, i.e. the power controller's);
* the dominant period of the SM clock (autocorrelation), and the clock events seen;
* the CV of contiguous windows' rates for several window lengths cut from the same trace (what a
  point's windows would have scattered by), and for windows of whole controller periods.

Read-only: nothing is set on the GPU. Runs in this process (imports torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sampler(device: Any, interval: float, stop: threading.Event, out: list[dict]) -> None:
    t0 = time.perf_counter()
    while not stop.wait(interval):
        row: dict[str, Any] = {"t": time.perf_counter() - t0}
        try:
            row["sm_mhz"] = device.clocks().sm_hertz / 1e6
            row["power_w"] = device.power_watts()
            row["temp_c"] = device.temperature_celsius()
            row["events"] = sorted(device.clock_events().active)
        except Exception as exc:  # noqa: BLE001 - a trace with a hole says so
            row["error"] = str(exc)
        out.append(row)


def _window_cv(slices: list[tuple[float, float, float]], window: float) -> tuple[float | None, int]:
    """CV of contiguous windows of ~``window`` seconds cut from the slices (t_end, units, seconds)."""
    rates, units, secs = [], 0.0, 0.0
    for _, u, s in slices:
        units += u
        secs += s
        if secs >= window - 1e-9:
            rates.append(units / secs)
            units = secs = 0.0
    if len(rates) < 3:
        return None, len(rates)
    return statistics.stdev(rates) / statistics.fmean(rates), len(rates)


def _period(series: list[float], step: float) -> float | None:
    """The lag (seconds) of the highest autocorrelation peak after the first dip below zero."""
    n = len(series)
    if n < 20:
        return None
    m = statistics.fmean(series)
    dev = [x - m for x in series]
    var = sum(d * d for d in dev) or 1e-12
    ac = [sum(dev[i] * dev[i + lag] for i in range(n - lag)) / var for lag in range(n // 2)]
    start = next((lag for lag, a in enumerate(ac) if a < 0), None)
    if start is None:
        return None
    best = max(range(start, len(ac)), key=lambda lag: ac[lag])
    return best * step if ac[best] > 0.1 else None


def trace(probe: str, seconds: float, slice_seconds: float, interval: float, gpu: int) -> dict:
    from gpuperfd.probe_child import harness
    from gpuperfd.probe_child.loop import run_loop
    from gpuperfd.probe_data.spec import ProbeSpec

    spec = ProbeSpec(probe=probe, device=f"cuda:{gpu}" if gpu else "cuda")
    prepared = harness.prepare(spec)
    ctx, workload = prepared.ctx, prepared.workload
    clock = ctx.new_clock(host=workload.host_clock)
    n, wall = run_loop(ctx, workload, clock, 3.0, None, min_iterations=3)  # warm: graphs, allocator, clocks
    workload.end(clock, n, wall)
    samples: list[dict] = []
    stop = threading.Event()
    thread = threading.Thread(target=_sampler, args=(ctx.nvml, interval, stop, samples), daemon=True)
    slices: list[tuple[float, float, float]] = []
    t0 = time.perf_counter()
    thread.start()
    while time.perf_counter() - t0 < seconds:
        clock = ctx.new_clock(host=workload.host_clock)
        n, wall = run_loop(ctx, workload, clock, slice_seconds, None)
        stats = workload.end(clock, n, wall)
        slices.append((time.perf_counter() - t0, float(stats.units), wall))
    stop.set()
    thread.join()
    good = [s for s in samples if "sm_mhz" in s]
    slice_clock = []
    for end, _, secs in slices:
        inside = [s["sm_mhz"] for s in good if end - secs <= s["t"] <= end]
        slice_clock.append(statistics.fmean(inside) if inside else None)
    pairs = [(u / s, c) for (_, u, s), c in zip(slices, slice_clock) if c]
    rates, clocks = [p[0] for p in pairs], [p[1] for p in pairs]
    ratio = [r / c for r, c in pairs]
    period = _period([s["sm_mhz"] for s in good], interval)
    windows = {f"{w:g}": _window_cv(slices, w) for w in (0.25, 0.5, 0.75, 1.0, 1.5, 3.0)}
    if period:
        windows[f"period x1 ({period:.2f} s)"] = _window_cv(slices, period)
        windows[f"period x2 ({2 * period:.2f} s)"] = _window_cv(slices, 2 * period)
    events: dict[str, int] = {}
    for s in good:
        for e in s["events"]:
            events[e] = events.get(e, 0) + 1
    out = {
        "probe": probe, "gpu_name": ctx.gpu_name, "power_limit_watts": ctx.read_power_limit() or ctx.power_limit_watts,
        "seconds": seconds, "slice_seconds": slice_seconds, "interval": interval,
        "rate_clock_correlation": statistics.correlation(rates, clocks) if len(pairs) > 2 else None,
        "rate_cv_per_slice": statistics.stdev(rates) / statistics.fmean(rates) if len(rates) > 2 else None,
        "clock_cv_per_slice": statistics.stdev(clocks) / statistics.fmean(clocks) if len(clocks) > 2 else None,
        "rate_over_clock_cv": statistics.stdev(ratio) / statistics.fmean(ratio) if len(ratio) > 2 else None,
        "sm_mhz_mean": statistics.fmean(clocks) if clocks else None,
        "power_w_mean": statistics.fmean(s["power_w"] for s in good) if good else None,
        "clock_period_seconds": period, "clock_events_samples": events, "samples": len(good),
        "window_cv": {k: {"cv": v[0], "windows": v[1]} for k, v in windows.items()},
        "slices": slices, "trace": good,
    }
    del prepared, workload
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", default="attention,vit")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--slice", type=float, default=0.05, help="slice of load between rate marks, s")
    parser.add_argument("--interval", type=float, default=0.02, help="NVML sampling interval, s")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    results = []
    for probe in args.probes.split(","):
        r = trace(probe, args.seconds, args.slice, args.interval, args.gpu)
        results.append(r)
        print(f"{probe}: {r['gpu_name']} limit {r['power_limit_watts']} W, SM {r['sm_mhz_mean']:.0f} MHz, "
              f"power {r['power_w_mean']:.0f} W, events {r['clock_events_samples']}")
        print(f"  per {args.slice}s slice: rate CV {100 * r['rate_cv_per_slice']:.2f} %, clock CV "
              f"{100 * r['clock_cv_per_slice']:.2f} %, rate/clock CV {100 * r['rate_over_clock_cv']:.2f} %, "
              f"corr {r['rate_clock_correlation']:.2f}; clock period {r['clock_period_seconds']}")
        for k, v in r["window_cv"].items():
            cv = f"{100 * v['cv']:.2f} %" if v["cv"] is not None else "-"
            print(f"  windows {k:>22s}: CV {cv} over {v['windows']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                               "command": " ".join([sys.executable, *sys.argv]),
                                               "results": results}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
