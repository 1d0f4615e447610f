"""The busy pass reads the profiler's activities straight from its kineto results: the same answer as
the chrome-trace export it replaced, without writing and parsing the JSON (gpuperfd.probe_child.busy)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

pytest.importorskip("torch")

from torch.autograd.profiler import profile, record_function  # noqa: E402

from gpuperfd.probe_child import busy  # noqa: E402
from gpuperfd.probe_child.harness import prepare  # noqa: E402
from gpuperfd.probe_child.loop import run_loop  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec  # noqa: E402


def test_kineto_events_give_the_busy_ratio_of_the_exported_trace() -> None:
    prepared = prepare(ProbeSpec("attention", preset="tiny", device="cpu"))
    clock = prepared.ctx.new_clock()
    with profile(use_cpu=True, use_kineto=True) as prof:
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


def test_the_busy_pass_does_not_import_the_compiler_stack() -> None:
    """torch.profiler.profile's start imports Inductor, Dynamo and SymPy to read one flag (seconds on
    a probe child's first busy pass); the pass must not, in a child that never compiles."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from gpuperfd.probe_child.harness import prepare\n"
            "from gpuperfd.probe_child.busy import measure_busy\n"
            "from gpuperfd.probe_data.spec import ProbeSpec\n"
            "p = prepare(ProbeSpec('attention', preset='tiny', device='cpu'))\n"
            "before = 'torch._dynamo' in sys.modules\n"
            "ratio, info = measure_busy(p.ctx, p.workload, 0.05)\n"
            "print(before, 'torch._dynamo' in sys.modules, 'sympy' in sys.modules, ratio is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split()[-4:] == ["False", "False", "False", "True"], out.stdout + out.stderr
