"""The probe service admits probe children by host memory: 8 GPUs at once never exceed the budget
(the others wait and then run), and a budget too small for one child skips every run with reason
``memory_budget`` after one error line."""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.gates.admission import MIB, Admission, PeakBook
from gpuperfd.probing.executors import PerPointExecutor, simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading

CHILD = 100 * MIB
SCHEDULE = ScheduleConfig(probe="vit", interval_seconds=60)


class FakeChildren:
    """An executor standing in for probe children: counts how many run at once."""

    def __init__(self) -> None:
        self.inner = simulated_executor(0.02, seed=1)
        self.lock = threading.Lock()
        self.running = self.peak = self.calls = 0

    def __call__(self, device, schedule, abort):  # type: ignore[no-untyped-def]
        with self.lock:
            self.running += 1
            self.calls += 1
            self.peak = max(self.peak, self.running)
        try:
            time.sleep(0.05)
            return self.inner.measure(device, schedule, abort, 0.0)
        finally:
            with self.lock:
                self.running -= 1


def _service(tmp_path, limit: int) -> tuple[ProbeService, FakeChildren, CollectorRegistry, list]:  # type: ignore[no-untyped-def]
    devices = SimulatedBackend(SimulationConfig(gpus=8, seed=5)).devices()
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    tracker = IdleTracker(0.05)
    for d in devices:
        tracker.observe(d.index, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    admission = Admission(limit, "cgroup memory limit", PeakBook(CHILD), daemon_rss=lambda: 0, headroom_bytes=0)
    admission.listeners.append(metrics.set_admission)
    children = FakeChildren()
    config = ProbesConfig(state_dir=tmp_path / "state", idle_seconds=0.0, schedules=[SCHEDULE])
    service = ProbeService(config, devices, PerPointExecutor(children), metrics, tracker, admission=admission)
    return service, children, registry, devices


def _run_all(service: ProbeService, gpus: int) -> list:  # type: ignore[type-arg]
    outcomes: list = [None] * gpus  # type: ignore[type-arg]
    threads = [threading.Thread(target=lambda i=i: outcomes.__setitem__(i, service.run(SCHEDULE, i)))
               for i in range(gpus)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_eight_gpus_queue_for_memory_and_all_run(tmp_path) -> None:
    service, children, registry, _ = _service(tmp_path, 2 * CHILD + CHILD // 2)  # room for two
    outcomes = _run_all(service, 8)
    assert [o.result for o in outcomes] == ["ok"] * 8  # waited, never skipped
    assert children.calls == 8 and children.peak == 2
    assert registry.get_sample_value("gpuperf_probe_children_running") == 0
    assert registry.get_sample_value("gpuperf_probe_children_waiting") == 0
    assert registry.get_sample_value("gpuperf_probe_admission_wait_seconds_total") > 0.05
    assert registry.get_sample_value("gpuperf_probe_memory_budget_bytes",
                                     {"source": "cgroup memory limit"}) == 2 * CHILD + CHILD // 2


def test_a_budget_too_small_for_one_child_skips_every_run_and_says_so_once(tmp_path, caplog) -> None:
    service, children, registry, devices = _service(tmp_path, CHILD // 2)
    with caplog.at_level(logging.INFO):
        outcomes = _run_all(service, 8)
        outcomes += _run_all(service, 2)  # the next rounds too: no new error line
    assert {(o.result, o.reason) for o in outcomes} == {("skipped", "memory_budget")}
    assert children.calls == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no probes run" in errors[0].getMessage()
    labels = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "vit", "preset": "vit-b16"}
    assert registry.get_sample_value("gpuperf_probe_runs_total", {**labels, "result": "skipped",
                                                                  "reason": "memory_budget"}) == 2
    assert registry.get_sample_value("gpuperf_probe_runs_total", {**labels, "result": "failed",
                                                                  "reason": "memory_budget"}) is None


def test_stop_wakes_a_round_waiting_for_memory(tmp_path) -> None:
    service, children, _, _ = _service(tmp_path, CHILD)
    held = service.turns.reserve_now(99, CHILD)  # a child holding the whole budget (a standby child's, say)
    assert held is not None and held.granted
    outcome: list = []  # type: ignore[type-arg]
    waiter = threading.Thread(target=lambda: outcome.append(service.run(SCHEDULE, 0)))
    waiter.start()
    while service.admission.state().waiting < 1:  # type: ignore[union-attr]
        time.sleep(0.01)
    assert service.turns.holder(0) is None  # waiting for memory, it holds no GPU
    service.stop(timeout=2)
    waiter.join(2)
    assert not waiter.is_alive() and (outcome[0].result, outcome[0].reason) == ("skipped", "shutting_down")
    assert children.calls == 0
    service.turns.free(held)
    assert service.admission.state().running == 0  # type: ignore[union-attr]


def test_the_admission_series_are_absent_without_an_admission_and_lint_clean(tmp_path) -> None:
    import shutil
    import subprocess

    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    assert b"gpuperf_probe_children_running" not in generate_latest(registry)  # the simulator: no children
    admission = Admission(None, "none", PeakBook(CHILD), daemon_rss=lambda: 0)
    metrics.set_admission(admission.state())
    text = generate_latest(registry).decode()
    assert "gpuperf_probe_children_running 0.0" in text and "gpuperf_probe_memory_budget_bytes{" not in text
    admission.set_limit(4 * CHILD, "probes.memory_budget")
    admission.peaks.record("llm", 3 * MIB)
    metrics.set_admission(admission.state())
    text = generate_latest(registry).decode()
    assert 'gpuperf_probe_memory_budget_bytes{source="probes.memory_budget"}' in text
    assert 'gpuperf_probe_child_peak_rss_bytes{probe="llm"}' in text
    promtool = shutil.which("promtool")
    if promtool:
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr
