"""GPU-busy fraction of a workload: the union of device-activity intervals over a profiled pass.

Why this method is described in :mod:`gpuperfd.probe_child.harness`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

from gpuperfd.probe_child.context import ProbeContext, Workload
from gpuperfd.probe_child.loop import run_loop

_BUSY_WINDOW = "gpuperfd_busy_window"
_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def busy_ratio_from_trace(events: list[dict[str, Any]], device_kind: str) -> tuple[float | None, dict[str, Any]]:
    """Union of device-activity intervals inside the busy window, over the window's length.

    ``device_kind`` "cuda" counts kernels, memcpys and memsets; "cpu" counts torch
    operator intervals (nested ones are covered by the union).
    """
    window = None
    for ev in events:
        if ev.get("ph") == "X" and ev.get("name") == _BUSY_WINDOW and ev.get("cat") == "user_annotation":
            window = (float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0)))
            break
    if window is None or window[1] <= window[0]:
        return None, {"busy_error": "busy window not found in the profiler trace"}
    categories = _DEVICE_CATEGORIES if device_kind == "cuda" else {"cpu_op"}
    intervals = []
    count = 0
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in categories:
            continue
        start = float(ev["ts"])
        end = start + float(ev.get("dur", 0.0))
        start, end = max(start, window[0]), min(end, window[1])
        if end > start:
            intervals.append((start, end))
            count += 1
    intervals.sort()
    busy = 0.0
    cur_start = cur_end = None
    for start, end in intervals:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        busy += cur_end - cur_start
    length = window[1] - window[0]
    return min(busy / length, 1.0), {"busy_window_seconds": length / 1e6, "busy_activities": count}


def measure_busy(ctx: ProbeContext, workload: Workload, seconds: float) -> tuple[float | None, dict[str, Any]]:
    # torch.autograd's kineto profiler, not torch.profiler.profile: the latter's start asks
    # ``hasattr(torch, "_inductor")``, which imports Inductor, Dynamo and SymPy (~800 modules: 1.7 s
    # on a CPU, ~4.5 s as an attention child's first busy pass on an H100) to read one flag.
    from torch.autograd.profiler import profile, record_function

    clock = ctx.new_clock(host=workload.host_clock)
    with ctx.nvtx("gpuperfd:busy_profile"):
        with profile(use_cpu=True, use_device="cuda" if ctx.is_cuda else None, use_kineto=True) as prof:
            with record_function(_BUSY_WINDOW):
                ctx.synchronize()
                n, wall = run_loop(ctx, workload, clock, seconds, None)
    workload.end(clock, n, wall)
    ratio, info = busy_ratio_from_trace(_trace_events(prof), "cuda" if ctx.is_cuda else "cpu")
    info["busy_iterations"] = n
    return ratio, info


def _trace_events(prof: Any) -> list[dict[str, Any]]:
    """The profiler's activities as trace events (name, cat, ts/dur in microseconds), read from its
    kineto results: an LLM pass has ~60,000 kernels, whose chrome-trace export and JSON parse cost
    ~1 s more than the pass itself (H100). Falls back to the export where torch lacks the API."""
    try:
        events = list(prof.kineto_results.events())
    except AttributeError:
        events = None
    if events is not None:
        # Times from the first event, in integer nanoseconds first: an epoch in microseconds as a float
        # (1.8e15) keeps only quarter-microsecond steps, which dropped sub-microsecond operators.
        base = min((ev.start_ns() for ev in events), default=0)
        return [{"ph": "X", "name": ev.name(), "cat": ev.activity_type(), "ts": (ev.start_ns() - base) / 1e3,
                 "dur": ev.duration_ns() / 1e3} for ev in events]
    fd, path = tempfile.mkstemp(prefix="gpuperfd-busy-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace
