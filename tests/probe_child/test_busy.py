"""The busy pass reads the profiler's activities straight from its kineto results: the same answer as
the chrome-trace export it replaced, without writing and parsing the JSON (gpuperfd.probe_child.busy)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from gpuperfd.probe_child import busy  # noqa: E402
from gpuperfd.probe_child.harness import prepare  # noqa: E402
from gpuperfd.probe_child.loop import run_loop  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec  # noqa: E402


def test_kineto_events_give_the_busy_ratio_of_the_exported_trace() -> None:
    prepared = prepare(ProbeSpec("attention", preset="tiny", device="cpu"))
    clock = prepared.ctx.new_clock()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function(busy._BUSY_WINDOW):
            n, wall = run_loop(prepared.ctx, prepared.workload, clock, 0.2, None)
    prepared.workload.end(clock, n, wall)
    direct, info = busy.busy_ratio_from_trace(busy._trace_events(prof), "cpu")
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            exported, exported_info = busy.busy_ratio_from_trace(json.load(fh)["traceEvents"], "cpu")
    finally:
        os.unlink(path)
    assert direct is not None and 0.0 < direct <= 1.0
    assert direct == pytest.approx(exported, abs=1e-4)
    assert info["busy_activities"] == exported_info["busy_activities"] > 0
    assert info["busy_window_seconds"] == pytest.approx(exported_info["busy_window_seconds"], rel=1e-4)
