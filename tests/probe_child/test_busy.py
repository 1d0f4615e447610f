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


def profiled_window() -> profile:
    """The profiler's record of 0.2 s of the tiny attention probe on the CPU, inside the busy window's
    record_function as the probe's busy pass runs it."""
    prepared = prepare(ProbeSpec("attention", preset="tiny", device="cpu"))
    clock = prepared.ctx.new_clock()
    with profile(use_cpu=True, use_kineto=True) as prof:
        with record_function(busy._BUSY_WINDOW):
            n, wall = run_loop(prepared.ctx, prepared.workload, clock, 0.2, None)
    prepared.workload.end(clock, n, wall)
    return prof


def test_kineto_events_give_the_busy_ratio_of_the_exported_trace() -> None:
    prof = profiled_window()
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


class _Torch211Event:
    """A kineto event as torch 2.11 gives it: no ``activity_type()`` (the rest of the real event)."""

    def __init__(self, ev: object) -> None:
        self._ev = ev

    def __getattr__(self, name: str) -> object:
        if name == "activity_type":
            raise AttributeError(name)
        return getattr(self._ev, name)


class _FakeDeviceEvent:
    """A device-side kineto event with the fields torch 2.11 has (the CPU build records none)."""

    def __init__(self, name: str, start_ns: int, dur_ns: int, annotation: bool = False) -> None:
        from torch.autograd import DeviceType

        self._name, self._start, self._dur, self._annotation = name, start_ns, dur_ns, annotation
        self._device = DeviceType.CUDA

    def name(self) -> str:
        return self._name

    def start_ns(self) -> int:
        return self._start

    def duration_ns(self) -> int:
        return self._dur

    def device_type(self) -> object:
        return self._device

    def is_user_annotation(self) -> bool:
        return self._annotation


class _Results:
    def __init__(self, events: list[object]) -> None:
        self._events = events

    def events(self) -> list[object]:
        return self._events


def test_busy_ratio_without_activity_type_as_torch_2_11_gives_it() -> None:
    """torch 2.11's events lack ``activity_type()`` (the probe fell back to NVML's utilization on an
    H100): the categories read from device_type() and is_user_annotation() give the same busy ratio
    and count as the activity types do; the device side of the window's record_function (spanning the
    whole window) counts as no busy time, kernels and copies do."""
    prof = profiled_window()
    real = list(prof.kineto_results.events())
    if not hasattr(real[0], "activity_type"):
        pytest.skip("this torch has no activity_type() to compare with")  # the 2.11 path runs anyway below
    with_types, info = busy.busy_ratio_from_trace(busy._trace_events(prof), "cpu")
    old = type("Prof", (), {"kineto_results": _Results([_Torch211Event(ev) for ev in real])})()
    derived, derived_info = busy.busy_ratio_from_trace(busy._trace_events(old), "cpu")
    assert derived is not None and derived == with_types
    assert derived_info == info
    # the device side: the window on the card (an annotation) and two kernels and a copy inside it
    window = next(ev for ev in real if ev.name() == busy._BUSY_WINDOW)
    t0, length = window.start_ns(), window.duration_ns()
    device = [_FakeDeviceEvent(busy._BUSY_WINDOW, t0, length, annotation=True),
              _FakeDeviceEvent("void gemv_kernel<bf16>", t0, length // 4),
              _FakeDeviceEvent("Memcpy DtoD (Device -> Device)", t0 + length // 2, length // 4),
              _FakeDeviceEvent("Memset (Device)", t0 + length // 2, length // 8)]
    cuda = type("Prof", (), {"kineto_results": _Results([_Torch211Event(window), *device])})()
    events = busy._trace_events(cuda)
    assert [e["cat"] for e in events] == ["user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy",
                                          "gpu_memset"]
    ratio, cuda_info = busy.busy_ratio_from_trace(events, "cuda")
    assert ratio == pytest.approx(0.5, abs=1e-3)
    assert cuda_info["busy_activities"] == 3


def test_events_without_the_fields_fall_back_to_the_export() -> None:
    """A torch whose events have neither activity_type() nor is_user_annotation(): the chrome-trace
    export (slower, the same answer), not an error that costs the probe its busy figure."""
    with profile(use_cpu=True, use_kineto=True) as prof:
        with record_function(busy._BUSY_WINDOW):
            sum(range(10000))
            pytest.importorskip("torch").ones(64).sum()

    class Bare:
        def __init__(self, ev: object) -> None:
            self._ev = ev

        def __getattr__(self, name: str) -> object:
            if name in ("activity_type", "is_user_annotation"):
                raise AttributeError(name)
            return getattr(self._ev, name)

    class Old:
        kineto_results = _Results([Bare(ev) for ev in prof.kineto_results.events()])

        def export_chrome_trace(self, path: str) -> None:
            prof.export_chrome_trace(path)

    ratio, info = busy.busy_ratio_from_trace(busy._trace_events(Old()), "cpu")
    assert ratio is not None and info["busy_activities"] > 0


def test_the_busy_pass_runs_the_iterations_that_fill_its_seconds_on_the_device() -> None:
    """Timed on the host, the pass ran two LLM requests for its 0.1 s (the host enqueues the next before
    the GPU ends the first): twice the kernel records, 1.0-1.4 s of the daemon's turn on an H200. Its
    count now comes from the windows: enough iterations to fill its seconds, at least one."""
    from gpuperfd.probe_child.harness import busy_iterations, measure
    from gpuperfd.probe_data.result import RepeatResult

    def window(iterations: int, seconds: float) -> RepeatResult:
        return RepeatResult(index=0, measured_seconds=seconds, units_of_work=1.0, iterations=iterations)

    assert busy_iterations([window(17, 2.69)], 0.1) == 1  # H200 llm: 0.158 s a request
    assert busy_iterations([window(190, 2.0), window(190, 2.02)], 0.1) == 10  # ViT: 10.6 ms a batch
    assert busy_iterations([window(0, 1.0)], 0.1) is None  # no window told: host time, as before
    assert busy_iterations([], 0.1) is None

    prepared = prepare(ProbeSpec("llm", preset="tiny", device="cpu", repeats=2, measure_seconds=0.3,
                                 busy_profile_seconds=0.2))
    result = measure(prepared)
    expected = busy_iterations(result.repeats, 0.2)
    assert expected is not None and expected >= 1
    assert result.extra["busy_iterations"] == expected
