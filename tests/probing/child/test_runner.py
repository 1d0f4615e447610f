"""The probe runner with real child processes on the CPU (tiny presets).

Every probe runs as a one-shot point through the child executor's session (``measure_once``, the
path of ``gpuperfd probe`` and ``gpuperfd check``) and must come back with every field filled
consistently; forced faults must come back as failure results (the parent keeps
going and the next probe runs); a busy GPU refuses the start and a GPU process
appearing mid-run aborts the probe (fake Device).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from child_processes import alive

from gpuperfd.device.base import ComputeProcess, Utilization
from gpuperfd.probe_data.result import PRIMARY_METRIC, ProbeResult, summarize
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.spec import PROBES, ProbeSpec
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once
from gpuperfd.probing.gates.idle import BusyKind, busy_reason

FAST = {"repeats": 2, "measure_seconds": 0.15, "busy_profile_seconds": 0.05}


def tiny(probe: str, **fields: Any) -> ProbeSpec:
    return ProbeSpec(probe, preset="tiny", **{**FAST, **fields})


def run_point(spec: ProbeSpec, timeout_seconds: float, device: Any = None, on_progress: Any = None,
              abort: threading.Event | None = None, idle_wait_seconds: float = 5.0) -> ProbeResult:
    """One point of ``spec`` in a child, read-only, as ``gpuperfd probe`` runs it (no state directory)."""
    executor = ChildProcessExecutor(timeout_seconds, idle_wait_seconds=idle_wait_seconds)
    return measure_once(executor, device, ProbeRequest.from_spec(spec, timeout_seconds), abort or threading.Event(),
                        on_progress)


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[ProbeResult, list[dict[str, Any]]]]:
    out = {}
    for probe in PROBES:
        events: list[dict[str, Any]] = []
        result = run_point(tiny(probe), 120, on_progress=events.append)
        out[probe] = (result, events)
    return out


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel)


@pytest.mark.parametrize("probe", PROBES)
def test_probe_returns_every_field_consistently(results: dict, probe: str) -> None:
    result, _ = results[probe]
    assert result.status == "ok", result.error_message
    assert result.failure_reason is None and result.error_message is None
    assert result.probe == probe and result.preset == "tiny" and result.device == "cpu"
    assert result.params["batch_size"] >= 1
    assert len(result.repeats) == 2
    assert result.measured_seconds == pytest.approx(sum(r.measured_seconds for r in result.repeats))
    assert all(r.measured_seconds >= FAST["measure_seconds"] for r in result.repeats)
    assert result.wall_seconds > result.measured_seconds
    assert result.units_of_work == pytest.approx(sum(r.units_of_work for r in result.repeats))
    assert result.units_of_work > 0
    metric = PRIMARY_METRIC[probe]
    # Headline rate == work over measured time (pooled and per window).
    if result.work_unit in ("token", "image", "iteration") and metric != "flops_per_second":
        assert _close(result.throughput[metric], result.units_of_work / result.measured_seconds)
        for rep in result.repeats:
            assert _close(rep.throughput[metric], rep.units_of_work / rep.measured_seconds)
    # CPU: no energy counter, no NVML telemetry; memory is the process's resident set.
    assert result.energy_joules is None and result.energy_per_unit_joules is None
    assert result.average_power_watts is None and result.power_limit_watts is None
    assert result.gpu_name is None and result.sm_clock_hertz_mean is None and result.clock_events_seen == []
    assert result.peak_memory_bytes is not None and result.allocated_memory_bytes is not None
    assert result.peak_memory_bytes >= result.allocated_memory_bytes > 0
    # No GPU to be busy: no GPU-busy fraction and never the LOW-BUSY flag (issue 43: every CPU row was
    # flagged); the profiler's operator union is kept apart, as the CPU's own figure.
    assert result.extra["gpu_busy_method"] == "profiler_cpu_op_union"
    assert result.gpu_busy_ratio is None and result.low_gpu_busy is False
    assert 0.0 < result.extra["cpu_op_busy_ratio"] <= 1.0
    assert result.extra["busy_iterations"] >= 1
    summary = summarize(result)
    assert summary["throughput"][metric]["n"] == 2
    for name, lat in summary["latencies"].items():
        assert lat["p50"] <= lat["p95"] <= lat["p99"], name


def test_llm_fields(results: dict) -> None:
    result, _ = results["llm"]
    p = result.params
    B, T, O = p["batch_size"], p["prompt_tokens"], p["output_tokens"]
    n = result.extra["iterations"]
    assert result.work_unit == "token"
    assert result.units_of_work == B * O * n
    lat = result.latencies
    assert len(lat["ttft_seconds"]) == len(lat["request_seconds"]) == len(lat["tpot_seconds"]) == n
    assert _close(result.throughput["prompt_tokens_per_second"], B * T * n / sum(lat["ttft_seconds"]), 1e-6)
    assert _close(result.throughput["requests_per_second"], B * n / result.measured_seconds)
    assert _close(result.throughput["total_tokens_per_second"], B * (T + O) * n / result.measured_seconds)
    for ttft, req, tpot in zip(lat["ttft_seconds"], lat["request_seconds"], lat["tpot_seconds"]):
        assert 0 < ttft < req
        assert tpot == pytest.approx((req - ttft) / (O - 1))
    assert sum(lat["request_seconds"]) <= result.measured_seconds
    assert result.extra["kv_cache"] == "static" and result.extra["cuda_graph"] is False


def test_vit_attention_train_fields(results: dict) -> None:
    vit, _ = results["vit"]
    n = vit.extra["iterations"]
    assert vit.work_unit == "image" and vit.units_of_work == vit.params["batch_size"] * n
    assert len(vit.latencies["batch_seconds"]) == n
    assert sum(vit.latencies["batch_seconds"]) <= vit.measured_seconds
    assert _close(vit.throughput["model_flops_per_second"],
                  vit.units_of_work * vit.extra["flops_per_image"] / vit.measured_seconds)

    att, _ = results["attention"]
    n = att.extra["iterations"]
    assert att.work_unit == "iteration" and att.units_of_work == n
    assert _close(att.throughput["flops_per_second"], n * att.extra["flops_per_call"] / att.measured_seconds)
    assert _close(att.throughput["bytes_per_second"], n * att.extra["bytes_per_call"] / att.measured_seconds)

    train, _ = results["train"]
    n = train.extra["iterations"]
    assert train.units_of_work == n * train.params["batch_size"] * train.params["seq_len"]
    assert len(train.latencies["step_seconds"]) == n
    assert math.isfinite(train.extra["loss"]) and train.extra["loss"] > 0
    assert math.isfinite(train.extra["loss_first"])


def test_progress_reports_every_repeat(results: dict) -> None:
    _, events = results["llm"]
    phases = [e["phase"] for e in events]
    assert phases[0] == "setup" and "warmup" in phases and phases[-1] == "busy_profile"
    measures = [e for e in events if e["phase"] == "measure"]
    assert [(e["repeat"], e["repeats"]) for e in measures] == [(1, 2), (2, 2)]


def test_parent_does_not_import_torch() -> None:
    code = ("import sys, gpuperfd.probing.executors, gpuperfd.probe_data.spec, gpuperfd.probing.child.runner, gpuperfd.commands.probe, gpuperfd.probe_data.result, gpuperfd.probing.check.flow;"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


# --- failures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "reason", "text"),
    [
        ("exception", "exception", "injected fault: exception"),
        ("oom", "oom", "allocate"),
        ("crash", "crash", "SIGSEGV"),
        ("cuda_error", "cuda_error", "CUDA error"),
    ],
)
def test_fault_becomes_a_failure_result(fault: str, reason: str, text: str) -> None:
    spec = tiny("attention", inject_fault=fault, memory_limit_bytes=256 << 20 if fault == "oom" else None)
    t0 = time.monotonic()
    result = run_point(spec, 60)
    assert result.status == "failed"
    assert result.failure_reason == reason, result.error_message
    assert text in (result.error_message or ""), result.error_message
    assert result.throughput == {} and result.measured_seconds is None
    assert time.monotonic() - t0 < 60
    if fault == "crash":
        assert result.extra["exit_code"] == -11
        assert "Fatal Python error" in result.error_message  # faulthandler's output from the child's log
    if fault in ("exception", "oom", "cuda_error"):
        assert "Traceback" in result.extra["traceback"]


def test_timeout_kills_the_child_and_the_next_probe_runs() -> None:
    t0 = time.monotonic()
    hung = run_point(tiny("attention", inject_fault="hang"), 8)
    elapsed = time.monotonic() - t0
    assert hung.status == "failed" and hung.failure_reason == "timeout"
    assert 8 <= elapsed < 20
    assert hung.wall_seconds >= 8
    after = run_point(tiny("attention"), 60)
    assert after.status == "ok"


class FakeDevice:
    """Just enough of gpuperfd.device.base.Device for the runner's idle check and watch."""

    def __init__(self, pids_after: float | None = None, busy_pids: tuple[int, ...] = (), util: float = 0.0):
        self.start = time.monotonic()
        self.pids_after = pids_after
        self.busy_pids = busy_pids
        self.util = util
        self.calls = 0

    def compute_processes(self) -> list[ComputeProcess]:
        self.calls += 1
        if self.pids_after is not None and time.monotonic() - self.start >= self.pids_after:
            return [ComputeProcess(pid=4_000_000)]
        return [ComputeProcess(pid=p) for p in self.busy_pids]

    def utilization(self) -> Utilization:
        return Utilization(gpu_ratio=self.util, memory_ratio=0.0)


def test_busy_gpu_is_refused_without_starting(monkeypatch) -> None:
    """A user's job that holds the GPU before the start: the probe gives way (skipped, preempted), not a failure."""
    import gpuperfd.probing.child.runner as runner_module

    def spawn(*_args, **_kwargs):
        raise AssertionError("a child was spawned on a busy GPU")

    monkeypatch.setattr(runner_module.ProbeChild, "start", spawn)  # no child, told directly, not by timing
    result = run_point(tiny("llm"), 60, device=FakeDevice(busy_pids=(4242,)), idle_wait_seconds=0.3)
    assert (result.status, result.failure_reason) == ("skipped", "preempted") and result.preempted
    assert "4242" in result.error_message and result.extra["busy_kind"] == "foreign_process"
    hot = run_point(tiny("llm"), 60, device=FakeDevice(util=0.8), idle_wait_seconds=0.3)
    assert (hot.status, hot.failure_reason) == ("skipped", "preempted") and "80%" in hot.error_message
    # our own processes do not count
    assert busy_reason(FakeDevice(busy_pids=(4242,)), 0.05, own_pids=(4242,), wait_seconds=0) is None


def test_idle_check_waits_for_the_gpu_to_calm_down() -> None:
    class Cooling(FakeDevice):
        def utilization(self) -> Utilization:
            return Utilization(0.9 if time.monotonic() - self.start < 0.5 else 0.0, 0.0)

    assert busy_reason(Cooling(), 0.05, wait_seconds=3, poll_interval=0.1) is None
    hot = busy_reason(Cooling(), 0.05, wait_seconds=0)
    assert hot is not None and hot.kind is BusyKind.UTILIZATION


def test_new_gpu_process_preempts_the_probe() -> None:
    """A user's process appearing mid-measurement: the child is killed at once and the point gave way."""
    device = FakeDevice(pids_after=1.0)
    t0 = time.monotonic()
    result = run_point(tiny("attention", inject_fault="hang"), 60, device=device)
    assert (result.status, result.failure_reason) == ("skipped", "preempted") and result.preempted
    assert result.extra["foreign_pids"] == [4_000_000]
    assert time.monotonic() - t0 < 10
    assert device.calls >= 3


def test_caller_can_abort() -> None:
    t0 = time.monotonic()
    abort = threading.Event()
    threading.Timer(1.0, abort.set).start()
    result = run_point(tiny("attention", inject_fault="hang"), 60, abort=abort)
    assert result.status == "aborted" and result.failure_reason == "aborted"
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("probe", PROBES)
def test_answers_are_checked_across_the_pipe(results: dict, probe: str) -> None:
    result, events = results[probe]
    check = result.correctness
    assert check["status"] == "ok" and check["checks"] == 2 and check["elements_checked"] > 0, check
    assert check["seconds"] < result.wall_seconds and isinstance(check["fingerprint"], str)
    assert any(e.get("phase") == "check" for e in events)


def test_wrong_result_in_the_child_fails_the_point(monkeypatch) -> None:
    monkeypatch.setenv("GPUPERFD_TEST_FAULTS", "1")  # the child inherits the switch
    result = run_point(tiny("attention", inject_fault="wrong_result_bit"), 60)
    assert result.status == "failed" and result.failure_reason == "wrong_result"
    assert result.correctness["status"] == "mismatch" and result.correctness["max_rel_error"] > 0.05


# --- footprint (issue 36) -----------------------------------------------------------------


FOOTPRINT_SCRIPT = """
import os, sys, threading
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once

spec = ProbeSpec("attention", preset="tiny", repeats=2, measure_seconds=0.15, busy_profile_seconds=0.05)
result = measure_once(ChildProcessExecutor(120), None, ProbeRequest.from_spec(spec), threading.Event())
assert result.status == "ok", result.error_message
me = str(os.getpid())
kids = []
for entry in os.listdir("/proc"):
    try:
        stat = open(f"/proc/{entry}/stat").read()
        cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
    except (OSError, ValueError):
        continue
    if entry.isdigit() and stat.rsplit(")", 1)[1].split()[1] == me:
        kids.append(cmd)
print("CHILDREN", kids)
print("TORCH", "torch" in sys.modules)
"""


def test_a_real_probe_leaves_no_resource_tracker_and_no_leaked_semaphores() -> None:
    """After a real CPU child probe the parent is one process again: multiprocessing's resource
    tracker was never started, and nothing warns of leaked semaphores at the parent's shutdown."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, "-c", FOOTPRINT_SCRIPT], capture_output=True, text=True, cwd=root,
                          timeout=300, env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0, done.stderr
    assert "CHILDREN []" in done.stdout, done.stdout
    assert "TORCH False" in done.stdout, done.stdout
    assert "leaked semaphore" not in done.stderr and "resource_tracker" not in done.stderr, done.stderr


def test_one_child_serves_several_probes_and_a_failed_build_ends_it() -> None:
    """``rebuild``: the next probe of a round is built in the same child (no new interpreter, no new
    import of torch); each result is its own probe's; a rebuilt probe that fails comes back as a
    failure result and ends the child, as any failure does."""
    from gpuperfd.probing.child.runner import ProbeChild

    child = ProbeChild(tiny("attention"))
    try:
        deadline = time.monotonic() + 120
        assert child.start(deadline) is None
        pid = child.pid
        first = child.measure(deadline)
        assert first.status == "ok" and first.probe == "attention"
        assert child.rebuild(tiny("vit"), time.monotonic() + 120) is None
        assert child.pid == pid and child.ready["import_seconds"] == 0.0
        second = child.measure(time.monotonic() + 120)
        assert second.status == "ok" and second.probe == "vit", second.error_message
        assert PRIMARY_METRIC["vit"] in second.throughput
        assert child.rebuild(tiny("llm", inject_fault="exception"), time.monotonic() + 120) is None
        failed = child.measure(time.monotonic() + 120)
        assert failed.status == "failed" and failed.failure_reason == "exception", failed.error_message
        assert not child.alive
        assert child.rebuild(tiny("llm"), time.monotonic() + 120).failure_reason == "crash"  # gone: no build
    finally:
        child.close()


HANGING_PARENT = """
import sys, threading
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once
spec = ProbeSpec('attention', preset='tiny', inject_fault='hang')
measure_once(ChildProcessExecutor(600, state_dir=sys.argv[1]), None, ProbeRequest.from_spec(spec), threading.Event())
"""


def test_a_sigkilled_parent_takes_its_python_m_child_with_it(tmp_path) -> None:
    """The child started with ``python -m`` leads its own process group and dies with its parent
    (PR_SET_PDEATHSIG), even when the parent gets no chance to clean up."""
    import signal

    from gpuperfd.probing.child.runner import RECORD_PREFIX

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    parent = subprocess.Popen([sys.executable, "-c", HANGING_PARENT, str(tmp_path)], cwd=root,
                              env=dict(os.environ, PYTHONPATH=root))
    try:
        deadline = time.monotonic() + 60
        while not (records := list(tmp_path.glob(RECORD_PREFIX + "*"))):
            assert time.monotonic() < deadline and parent.poll() is None, "no probe child was recorded"
            time.sleep(0.05)
        child = int(records[0].name[len(RECORD_PREFIX):])
        assert os.getpgid(child) == child
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    deadline = time.monotonic() + 20
    while alive(child):
        assert time.monotonic() < deadline, f"probe child {child} outlived its SIGKILLed parent"
        time.sleep(0.05)


def test_the_channel_frames_messages_and_polls_above_descriptor_1023() -> None:
    """Length-prefixed messages arrive whole and in order, EOF is an EOFError, a garbled length is
    refused, and ``poll`` works on a descriptor select() could not watch (a busy daemon's)."""
    import resource
    import socket

    from gpuperfd.probe_data import wire

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip("cannot open descriptors above 1023 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    a, b = socket.socketpair()
    high = os.dup2(a.fileno(), 1050)
    a.close()
    try:
        ours, theirs = wire.Channel(socket.socket(fileno=high)), wire.Channel(b)
        assert not ours.poll(0.01)
        wire.send(theirs, "result", {"x": 1.5, "big": "y" * 50_000})
        wire.send(theirs, "progress", {})
        assert ours.poll(1.0)
        assert wire.recv(ours) == ("result", {"x": 1.5, "big": "y" * 50_000})
        assert wire.recv(ours) == ("progress", {})
        b.sendall((wire.MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(ValueError):
            ours.recv_bytes()
        theirs.close()
        assert ours.poll(1.0)  # the end of the channel is readable
        with pytest.raises(EOFError):
            ours.recv_bytes()
        ours.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
