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


def measure_busy(ctx: ProbeContext, workload: Workload, seconds: float,
                 iterations: int | None = None) -> tuple[float | None, dict[str, Any]]:
    """The profiled pass: ``iterations`` steps if given (the windows' count for ``seconds`` on the
    GPU), else steps for ``seconds`` of host time; (busy ratio, details)."""
    # torch.autograd's kineto profiler, not torch.profiler.profile: the latter's start asks
    # ``hasattr(torch, "_inductor")``, which imports Inductor, Dynamo and SymPy (~800 modules: 1.7 s
    # on a CPU, ~4.5 s as an attention child's first busy pass on an H100) to read one flag.
    from torch.autograd.profiler import profile, record_function

    clock = ctx.new_clock(host=workload.host_clock)
    with ctx.nvtx("gpuperfd:busy_profile"):
        with profile(use_cpu=True, use_device="cuda" if ctx.is_cuda else None, use_kineto=True) as prof:
            with record_function(_BUSY_WINDOW):
                ctx.synchronize()
                n, wall = run_loop(ctx, workload, clock, seconds, iterations)
    workload.end(clock, n, wall)
    ratio, info = busy_ratio_from_trace(_trace_events(prof), "cuda" if ctx.is_cuda else "cpu")
    info["busy_iterations"] = n
    return ratio, info


def _trace_events(prof: Any) -> list[dict[str, Any]]:
    """The profiler's activities as trace events (name, cat, ts/dur in microseconds), read from its
    kineto results: an LLM pass has ~60,000 kernels, whose chrome-trace export and JSON parse cost
    ~1 s more than the pass itself (H100). Each event's category is its kineto activity type where torch
    names it (``activity_type()``, torch 2.12 and later), else read from the fields every torch since
    2.4 has (:func:`_category`); only a torch with neither falls back to the export."""
    try:
        events = list(prof.kineto_results.events())
        if events:
            _category(events[0])  # the fields exist (AttributeError otherwise)
    except AttributeError:
        events = None
    if events is not None:
        # Times from the first event, in integer nanoseconds first: an epoch in microseconds as a float
        # (1.8e15) keeps only quarter-microsecond steps, which dropped sub-microsecond operators.
        base = min((ev.start_ns() for ev in events), default=0)
        return [{"ph": "X", "name": ev.name(), "cat": _category(ev), "ts": (ev.start_ns() - base) / 1e3,
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


def _category(ev: Any) -> str:
    """A kineto event's trace category, as the chrome-trace export writes it.

    torch 2.11's ``_KinetoEvent`` has no ``activity_type()`` (the probe's busy pass failed on an H100
    with it and fell back to NVML's utilization); it has ``device_type()`` and ``is_user_annotation()``:
    an activity on the device is a kernel, a copy or a set (by kineto's names ``Memcpy ...`` and
    ``Memset ...``), or the device side of a ``record_function`` (a user annotation spanning what it
    enclosed, never counted as busy); on the host, a user annotation or an operator."""
    kind = getattr(ev, "activity_type", None)
    if kind is not None:
        return str(kind())
    annotation = bool(ev.is_user_annotation())
    if ev.device_type() != _cpu_device_type():
        if annotation:
            return "gpu_user_annotation"
        name = ev.name()
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset"):
            return "gpu_memset"
        return "kernel"
    if annotation:
        return "user_annotation"
    if getattr(ev, "is_python_function", None) is not None and ev.is_python_function():
        return "python_function"
    return "cpu_op"


def _cpu_device_type() -> Any:
    from torch.autograd import DeviceType

    return DeviceType.CPU
