"""Warm sweeps (issue 12): one probe child per sweep, built once and measured at every cap; a child
killed between or during points; stop early; and a daemon that never loads torch, numpy or
transformers after real child probes (plain data across the pipe)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuperfd.caps.journal import CapJournal
from gpuperfd.config import ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.spec import PROBES
from gpuperfd.probing.executors import (
    ChildProcessExecutor,
    SimulatedExecutor,
    open_session,
)
from gpuperfd.probe_data.recommend import recommend
from gpuperfd.probing.scheduling.schedule_request import request_from_schedule
from gpuperfd.probing.sweep.sweeper import run_sweep

ROOT = Path(__file__).resolve().parents[3]
FAST = {"repeats": 2, "measure_seconds": 0.15, "busy_profile_seconds": 0.0}


def tiny_schedule(probe: str = "attention", **options) -> ScheduleConfig:
    return ScheduleConfig(probe=probe, preset="tiny", interval_seconds=60, settle_seconds=0,
                          options={**FAST, **options})


def tiny_request(probe: str = "attention", **options) -> ProbeRequest:
    """The tiny schedule's probe request, as an owned sweep builds it."""
    return request_from_schedule(tiny_schedule(probe, **options))


@pytest.fixture
def gpu():
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=3))
    yield backend.devices()[0]
    backend.close()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().decode(errors="replace").rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_warm_child_measures_every_cap_in_one_process(gpu, tmp_path):
    pytest.importorskip("torch")
    executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=tmp_path / "state")
    session = open_session(executor, gpu, tiny_request(), threading.Event())
    try:
        points = run_sweep(gpu, CapJournal(tmp_path / "state"), [600, 400, 250], session.measure, settle_seconds=1)
        pids = {p.result.extra["child_pid"] for p in points}
        assert session.children == 1 and len(pids) == 1
        assert session.child is not None and session.child.alive  # still warm for another point
        assert [p.result.extra["point_index"] for p in points] == [0, 1, 2]
    finally:
        session.close()
    assert [p.result.status for p in points] == ["ok", "ok", "ok"], [p.result.error_message for p in points]
    assert all(p.result.units_of_work > 0 for p in points)
    # the first point measures the 2 windows asked for; further ones half-length windows, 2 to 4 of them
    assert len(points[0].result.repeats) == 2
    assert all(2 <= len(p.result.repeats) <= 4 and p.result.extra["window_seconds"] < points[0].result.extra["window_seconds"]
               for p in points[1:])
    # Built once: the setup time is the first point's only; later points are measure-only.
    first, *later = points
    assert first.result.extra["setup_seconds"] > 0 and first.result.extra["child_start_seconds"] > 0
    assert all(p.result.extra["setup_seconds"] == 0 and p.result.extra["child_start_seconds"] == 0 for p in later)
    assert all(p.result.extra["cap_read_back_seconds"] is not None for p in points)
    assert gone(pids.pop())
    assert gpu.power_limits().enforced_watts == 700 and not list((tmp_path / "state").glob("*.json"))
    assert not list((tmp_path / "state").glob("probe-child.*"))  # its record went with it


def test_child_killed_between_points_and_during_a_point(gpu, tmp_path):
    """Between points: the next point starts a new child and succeeds. During a point: that point
    fails as a crash with its reason, the sweep goes on with a new child, and the cap comes back."""
    pytest.importorskip("torch")
    executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=tmp_path / "state")
    # Windows long enough to kill the child inside one (3 x 1 s).
    session = open_session(executor, gpu, tiny_request(repeats=3, measure_seconds=1.0), threading.Event())
    killed: list[int] = []

    def run_point(cap: float):
        if cap == 500:  # between points: the idle warm child dies
            pid = session.child.pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            killed.append(pid)
        if cap == 400:  # during the point: kill it while it measures
            pid = session.child.pid
            threading.Timer(0.7, lambda: os.kill(pid, signal.SIGKILL)).start()
            killed.append(pid)
        return session.measure(cap)

    try:
        points = run_sweep(gpu, CapJournal(tmp_path / "state"), [600, 500, 400, 300], run_point, settle_seconds=1)
    finally:
        session.close()
    statuses = [(p.cap_watts, p.result.status, p.result.failure_reason) for p in points]
    assert statuses == [(600, "ok", None), (500, "ok", None), (400, "failed", "crash"), (300, "ok", None)], \
        [p.result.error_message for p in points]
    assert "SIGKILL" in points[2].result.error_message
    pids = [p.result.extra.get("child_pid") for p in points]
    assert pids[0] == killed[0] and pids[1] == killed[1] != pids[0] and pids[3] not in killed
    assert session.children == 3
    assert gpu.power_limits().enforced_watts == 700 and not list((tmp_path / "state").glob("*.json"))


def test_a_child_that_cannot_be_built_is_not_rebuilt_for_every_cap(gpu, tmp_path):
    pytest.importorskip("torch")
    executor = ChildProcessExecutor(60, torch_device="cpu")
    # Token ids outside the vocabulary fail in the build, before the first window (a file that is not
    # token ids at all is refused before any child starts: gpuperfd/probe_data/datasets.py).
    import numpy as np

    bad = tmp_path / "tokens.npy"
    np.save(bad, np.full(4096, 10**9, dtype=np.int64))
    session = open_session(executor, gpu, tiny_request("llm", dataset_path=str(bad)), threading.Event())
    try:
        points = run_sweep(gpu, CapJournal(tmp_path), [600, 400], session.measure, settle_seconds=0)
    finally:
        session.close()
    assert [p.result.status for p in points] == ["failed", "failed"]
    assert points[1].result.error_message.startswith("not run: the probe could not be built")
    assert session.children == 1


@pytest.mark.parametrize("probe", PROBES)
def test_early_stop_gives_the_full_sweeps_recommendation(tmp_path, probe):
    caps = [700, 600, 500, 450, 400, 350, 300, 250, 200]
    runs = {}
    for mode, stop in (("full", None), ("early", 0.10)):
        backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5))
        gpu = backend.devices()[0]
        executor = SimulatedExecutor(0.05, seed=11, noise=0.004, watch_interval=0.01)
        schedule = ScheduleConfig(probe=probe, interval_seconds=60, settle_seconds=0)
        session = open_session(executor, gpu, request_from_schedule(schedule), threading.Event())
        runs[mode] = run_sweep(gpu, CapJournal(tmp_path / mode), caps, session.measure, settle_seconds=0,
                               stop_early=stop)
        backend.close()
    full, early = runs["full"], runs["early"]
    assert [p.cap_watts for p in early] == caps  # every cap is reported, run or skipped
    skipped = [p for p in early if p.result.status == "skipped"]
    baseline = full[0].result.units_of_work / full[0].result.measured_seconds
    losses = [1 - p.result.units_of_work / p.result.measured_seconds / baseline for p in full]
    # Memory-bound decode (llm) barely slows down to the lowest cap (docs/simulator.md): then no
    # cap is clearly slower and none may be skipped. Where a cap loses far more than the 10 % budget
    # plus the noise margin (compute-bound probes), the tail must be skipped.
    if max(losses) < 0.10:
        assert not skipped, f"skipped caps though none lost 10 %: {losses}"
        assert recommend(early).cap_watts == recommend(full).cap_watts
        return
    if max(losses) > 0.15:
        assert skipped, f"no cap was skipped though the slow end lost {max(losses):.0%}"
    assert all(p.result.failure_reason == "early_stop" for p in skipped)
    assert all(p.result.status == "ok" for p in early if p not in skipped)
    assert recommend(early).cap_watts == recommend(full).cap_watts
    if not skipped:
        return
    first_skipped = early.index(skipped[0])
    assert all(p in skipped for p in early[first_skipped:])  # only the tail is skipped
    # And the skipped caps really were out of the budget in the full sweep.
    for p in full[first_skipped:]:
        assert p.result.units_of_work / p.result.measured_seconds < 0.9 * baseline


def test_simulated_session_settles_by_measurement_and_crosses_as_plain_data(gpu, tmp_path):
    schedule = ScheduleConfig(probe="vit", interval_seconds=60, settle_seconds=2.0)
    session = open_session(SimulatedExecutor(0.05, seed=1), gpu, request_from_schedule(schedule), threading.Event())
    points = run_sweep(gpu, CapJournal(tmp_path), [600, 300], session.measure, settle_seconds=2.0)
    for point in points:
        extra = point.result.extra
        assert extra["warm"] is True and extra["settle_steady"] is True
        assert 0 < extra["settle_seconds"] < 2.0  # steady long before the bound
        assert 0 <= extra["cap_read_back_seconds"] < 0.5
    assert [p.result.extra["point_index"] for p in points] == [0, 1]


DAEMON_CONFIG = """
device: {{backend: simulated}}
simulation: {{gpus: 1, seed: 1}}
probes:
  read_only: false
  state_dir: {state}
  history: {{path: {history}}}
  executor: child
  torch_device: cpu
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.1
  schedules:
    - {{probe: llm, preset: tiny, interval_seconds: 3600, caps: [max, 500], settle_seconds: 0.5,
        options: {{repeats: 2, measure_seconds: 0.2}}}}
"""


def _mapped(pid: int, names: tuple[str, ...]) -> list[str]:
    with open(f"/proc/{pid}/maps") as handle:
        return sorted({line.split()[-1] for line in handle if any(n in line.split()[-1] for n in names)})


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:"))


def test_daemon_never_maps_torch_after_real_child_probes(start_daemon, tmp_path):
    """The real daemon sweeps a real child probe (CPU, tiny) at two caps; its memory maps then hold
    no torch, numpy or transformers, and its resident set stays that of a daemon without them."""
    pytest.importorskip("torch")
    history = tmp_path / "history.jsonl"
    daemon = start_daemon(config_text=DAEMON_CONFIG.format(state=tmp_path / "state", history=history))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not history.exists() or len(history.read_text().splitlines()) < 2):
        time.sleep(0.2)
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert [(r["power_cap_watts"], r["result"]["status"]) for r in lines] == [(700, "ok"), (500, "ok")], daemon.log()
    assert lines[0]["result"]["extra"]["child_pid"] == lines[1]["result"]["extra"]["child_pid"]  # one warm child
    pid = daemon.proc.pid
    assert _mapped(pid, ("torch", "numpy", "transformers", "_multiarray")) == []
    assert _rss_bytes(pid) < 120 * 1024 * 1024  # torch alone would take it past 200 MB
    assert daemon.stop() == 0


def test_executor_in_process_leaves_no_torch_in_sys_modules(tmp_path):
    """The check of the before-stop hook, through the daemon's executor: sys.modules and maps."""
    pytest.importorskip("torch")
    code = """
import json, os, sys, threading
from gpuperfd.config import ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once, open_session
from gpuperfd.probing.scheduling.schedule_request import request_from_schedule
if __name__ == "__main__":
    gpu = SimulatedBackend(SimulationConfig(gpus=1)).devices()[0]
    schedule = ScheduleConfig(probe="train", preset="tiny", interval_seconds=60, settle_seconds=0,
                              options={"repeats": 1, "measure_seconds": 0.1})
    once = measure_once(ChildProcessExecutor(120, torch_device="cpu"), gpu, request_from_schedule(schedule),
                        threading.Event())
    session = open_session(ChildProcessExecutor(120, torch_device="cpu"), gpu, request_from_schedule(schedule),
                           threading.Event())
    warm = [session.measure(700).status, session.measure(500).status]
    session.close()
    hook = measure_once(ChildProcessExecutor(120), None, ProbeRequest.from_spec(ProbeSpec(
        probe="llm", preset="tiny", device="cpu", repeats=1)), threading.Event()).status
    maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "torch" in l or "numpy" in l})
    print(json.dumps({"statuses": [once.status, *warm, hook], "maps": maps,
                      "modules": [m for m in ("torch", "transformers", "numpy") if m in sys.modules]}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"statuses": ["ok", "ok", "ok", "ok"], "maps": [], "modules": []}


def test_one_child_serves_every_probe_of_a_round(gpu, tmp_path):
    """An owned sweep of several schedules (``gpuperfd sweep --probe a,b``) builds each next probe in
    the previous probe's child: one process for the round, each point its own probe's, the child
    gone at the end and the operator's cap back."""
    pytest.importorskip("torch")
    from gpuperfd.probing.observer import Observers
    from gpuperfd.probing.scheduling.schedule_request import planned_from_schedule
    from gpuperfd.probing.sweep.owned import OwnedStatus, SweepRequest, run_owned_sweep

    state = tmp_path / "state"
    executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=state)
    request = SweepRequest(probes=[planned_from_schedule(tiny_schedule("attention")),
                                   planned_from_schedule(tiny_schedule("vit"))], caps=["max", 500])
    outcome = run_owned_sweep(gpu, CapJournal(state), request, executor, lambda *_: Observers(()),
                              threading.Event())
    assert outcome.status == OwnedStatus.DONE, outcome.detail
    results = [(planned.request.probe, point.result) for planned, points in outcome.sweeps for point in points]
    assert [(probe, r.probe, r.status) for probe, r in results] == [
        ("attention", "attention", "ok"), ("attention", "attention", "ok"), ("vit", "vit", "ok"), ("vit", "vit", "ok")
    ], [r.error_message for _, r in results]
    pids = {r.extra["child_pid"] for _, r in results}
    assert len(pids) == 1
    vit_first = results[2][1]
    assert vit_first.extra["child_start_seconds"] > 0 and vit_first.extra["setup_seconds"] > 0  # rebuilt
    assert gone(pids.pop())
    assert gpu.power_limits().enforced_watts == 700 and not list(state.glob("probe-child.*"))


def test_a_prepared_child_imports_before_the_gpu_is_taken_and_builds_at_the_first_point(gpu, tmp_path):
    """``prepare`` (called by the owned sweep before any cap changes) starts a child that imports
    torch and the probe's model code and builds nothing; the first point builds in that same child,
    after the busy check, and reports the preparation apart from its own time."""
    pytest.importorskip("torch")
    executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=tmp_path / "state")
    session = open_session(executor, gpu, tiny_request("llm"), threading.Event())
    try:
        session.prepare()
        child = session.child
        assert child is not None and child.alive and not child.built
        assert child.ready is not None and child.ready.get("deferred") is True and "setup_seconds" not in child.ready
        assert child.ready["cuda_initialized"] is False  # on a GPU node too: no context before the build
        prepared_pid = child.pid
        assert session.prepare_seconds > 0
        points = run_sweep(gpu, CapJournal(tmp_path / "state"), [600, 400], session.measure, settle_seconds=0)
    finally:
        session.close()
    assert [p.result.status for p in points] == ["ok", "ok"], [p.result.error_message for p in points]
    first, second = (p.result.extra for p in points)
    assert first["child_pid"] == second["child_pid"] == prepared_pid and session.children == 1
    assert first["child_prepare_seconds"] > 0 and second["child_prepare_seconds"] == 0
    assert first["child_start_seconds"] > 0 and first["setup_seconds"] > 0  # the build, in the point
    assert first["import_seconds"] == 0  # paid in prepare, not in the point
    assert gone(prepared_pid)


def test_a_prepared_child_yields_to_a_job_that_starts_before_its_build(gpu, tmp_path):
    """The busy check still runs right before the build: a user's job that appears while the child
    imports makes the first point give way (skipped, preempted), and the prepared child is ended, never built."""
    pytest.importorskip("torch")
    executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=tmp_path / "state")
    session = open_session(executor, gpu, tiny_request("attention"), threading.Event())
    try:
        session.prepare()
        prepared_pid = session.child.pid
        gpu.add_foreign_process(4242, 1 << 30)
        result = session.measure(700)
    finally:
        gpu.remove_foreign_process(4242)
        session.close()
    assert (result.status, result.failure_reason) == ("skipped", "preempted"), result.error_message
    assert gone(prepared_pid)


def test_the_rounds_next_probe_is_preloaded_in_the_carried_child(gpu, tmp_path):
    """In a round the next schedule's session prepares the previous probe's child: it drops the old
    workload and imports the next one's code (same process), then builds it at the first point."""
    pytest.importorskip("torch")
    executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=tmp_path / "state")
    first = open_session(executor, gpu, tiny_request("attention"), threading.Event())
    first.prepare()
    assert first.measure(700).status == "ok"
    pid = first.child.pid
    second = open_session(executor, gpu, tiny_request("vit"), threading.Event(), after=first)
    try:
        second.prepare()
        assert second.child is not None and second.child.pid == pid and not second.child.built
        result = second.measure(700)
    finally:
        second.close()
    assert (result.probe, result.status, result.extra["child_pid"]) == ("vit", "ok", pid), result.error_message
    assert second.children == 0 and gone(pid)


def test_a_deferred_child_refuses_to_measure_before_its_build(tmp_path):
    """The protocol's guard: a child started with ``--defer-build`` and asked to measure answers with
    an error naming the mistake (and ends) instead of measuring nothing."""
    pytest.importorskip("torch")
    from gpuperfd.probe_data.spec import ProbeSpec
    from gpuperfd.probing.child.runner import ProbeChild

    child = ProbeChild(ProbeSpec(probe="attention", preset="tiny", device="cpu", **FAST), record_dir=tmp_path)
    try:
        assert child.start(time.monotonic() + 120, defer_build=True) is None and not child.built
        result = child.measure(time.monotonic() + 60)
    finally:
        child.close()
    assert result.status == "failed" and "measure before build" in (result.error_message or ""), result.error_message
