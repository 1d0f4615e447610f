"""Issue 50: freshness, not firing times. A firing makes a result due; a due result runs at its GPU's
first qualifying moment (plus a jitter drawn for that moment), a run that gave way stays due, a cron
window closes counted, probes stay within their share of GPU time, and the due series say it all.

The real APScheduler jobs (paused: nothing fires by the clock), probe service and simulated GPUs; the
dispatcher's passes are called one at a time (:meth:`ProbeScheduler.dispatch_once`)."""

from __future__ import annotations

import functools
import random
import time
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.scheduling.due import Qualifying
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.scheduling.gpu_time import GpuTimeLedger
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService, RunOutcome
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading
from hand_scheduler import JOB, dispatch, fire, nodes_stopped_after

LLM = ScheduleConfig(probe="llm", interval_seconds=3600, settle_seconds=0)


def idle_reading() -> Reading:
    return Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, time.monotonic())


class Node:
    def __init__(self, tmp_path, schedules=(LLM,), recheck=0.0, **probes) -> None:
        self.backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5))
        self.devices = self.backend.devices()
        self.device = self.devices[0]
        self.registry = CollectorRegistry()
        self.tracker = IdleTracker(0.05)
        self.tracker.observe(0, "utilization", idle_reading())
        self.config = ProbesConfig(**{"jitter_seconds": 0, "first_run_delay_seconds": 3600, "idle_seconds": 0,
                                      "state_dir": tmp_path / "state", "history": {"path": None},
                                      "schedules": list(schedules), **probes})
        self.service = ProbeService(self.config, self.devices, simulated_executor(0.05, seed=1),
                                    ProbeMetrics(self.registry), self.tracker)
        self.scheduler = ProbeScheduler(self.service, [0], recheck_seconds=recheck)
        self.scheduler.scheduler.start(paused=True)
        self.scheduler.apply(self.config)
        self.uuid = self.device.info().uuid

    def fire(self, job_id=JOB) -> None:
        fire(self.scheduler, job_id)

    def dispatch(self) -> int:
        return dispatch(self.scheduler)

    def stop(self) -> None:
        self.scheduler.stop()

    def value(self, name, probe="llm", **labels):
        labels = {"gpu": "0", "uuid": self.uuid, "probe": probe,
                  "preset": {"llm": "gpt2", "vit": "vit-b16"}[probe], **labels}
        return self.registry.get_sample_value(name, labels)

    def runs(self, result="ok", reason="", probe="llm"):
        return self.value("gpuperf_probe_runs_total", probe, result=result, reason=reason) or 0


@pytest.fixture
def node(tmp_path):
    yield from nodes_stopped_after(functools.partial(Node, tmp_path))


def test_a_result_due_on_a_busy_gpu_runs_at_its_first_gap_not_an_interval_later(node):
    n = node()
    assert n.value("gpuperf_probe_due") == 1  # none yet: due
    n.device.add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire()
    assert n.runs("skipped", "allocated") == 1  # the firing finds it busy, counted as before
    assert n.dispatch() == 0 and n.runs() == 0  # still busy: the result stays due, nothing starts
    assert n.value("gpuperf_probe_due") == 1
    n.device.remove_foreign_process(999_999)
    n.tracker.observe(0, "utilization", idle_reading())
    before = datetime.now(timezone.utc)
    assert n.dispatch() == 1
    assert n.runs() == 1 and n.value("gpuperf_probe_due") == 0
    # due again an interval after this result, not on the old grid
    next_run = n.scheduler.scheduler.get_job(JOB).next_run_time
    assert before + timedelta(seconds=3600) <= next_run <= datetime.now(timezone.utc) + timedelta(seconds=3600)
    assert n.registry.get_sample_value("gpuperf_probe_qualified_to_result_seconds_count", {"probe": "llm"}) == 1
    assert n.dispatch() == 0 and n.runs() == 1  # fresh: not run again


def test_a_run_that_gave_way_to_a_job_stays_due(node):
    n = node()
    n.fire()
    assert n.runs() == 1 and n.value("gpuperf_probe_due") == 0
    n.scheduler._on_outcome(0, JOB, RunOutcome("skipped", "preempted"))
    assert n.scheduler.due.get(JOB, 0) is not None and n.value("gpuperf_probe_due") == 1
    assert n.dispatch() == 1 and n.runs() == 2 and n.value("gpuperf_probe_due") == 0


def test_a_cron_window_runs_at_its_first_gap_or_closes_counted(node):
    nightly = ScheduleConfig(probe="llm", cron="0 2 * * *", window_seconds=0.5, settle_seconds=0)
    n = node(schedules=(nightly,))
    assert n.value("gpuperf_probe_due") == 0  # a cron result is due only while its window is open
    n.device.add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire()
    assert n.value("gpuperf_probe_due") == 1
    time.sleep(0.6)  # the window closes with the GPU still busy
    n.device.remove_foreign_process(999_999)
    assert n.dispatch() == 0 and n.runs() == 0
    assert n.runs("skipped", "window_closed") == 1 and n.value("gpuperf_probe_due") == 0
    # the next window, with a gap inside it: taken
    n.device.add_foreign_process(pid=999_998, memory_bytes=1 << 30)
    n.fire()
    n.device.remove_foreign_process(999_998)
    assert n.dispatch() == 1 and n.runs() == 1


def test_probes_stay_within_their_share_of_gpu_time(node):
    n = node()
    n.service.gpu_time.record(0, time.monotonic() - 900, time.monotonic() - 10)  # 890 s of today's 864
    assert n.registry.get_sample_value("gpuperf_probe_gpu_time_budget_ratio") == 0.01
    n.fire()
    assert n.runs() == 0 and n.runs("skipped", "gpu_time_budget") == 1
    assert n.dispatch() == 0 and n.value("gpuperf_probe_due") == 1  # waits, still due
    n.service.gpu_time.ratio = 0.02  # a reload raising the share lets it run
    assert n.dispatch() == 1 and n.runs() == 1
    took = n.registry.get_sample_value("gpuperf_probe_gpu_seconds_total", {"gpu": "0", "uuid": n.uuid})
    assert took > 0  # the round's own GPU time, counted


def test_the_ledger_counts_only_the_last_day() -> None:
    now = [100_000.0]
    ledger = GpuTimeLedger(0.01, clock=lambda: now[0])
    ledger.record(0, 10_000.0, 10_500.0)  # a day and more ago: gone
    ledger.record(0, 13_500.0, 14_000.0)  # straddles the window's start (14 000 - 86 400 + 100 000 = 13 600)
    ledger.record(0, 99_000.0, 99_300.0)
    assert ledger.used(0) == pytest.approx(400 + 300)
    assert ledger.allows(0, 164) and not ledger.allows(0, 165)  # 864 s a day
    assert ledger.used(1) == 0


def test_gpus_freed_together_start_apart_and_keep_their_draw_while_idle() -> None:
    now = [1000.0]
    busy_until = {0: 990.0, 1: 990.0, 2: 990.0}
    qualifying = Qualifying(lambda gpu: now[0] - busy_until[gpu], lambda: now[0], random.Random(3))
    assert qualifying.start_at(0, 15.0, 60.0) is None  # idle 10 s of the 15 it needs
    now[0] = 1010.0
    starts = [qualifying.start_at(gpu, 15.0, 60.0) for gpu in range(3)]
    assert all(1005.0 <= s <= 1065.0 for s in starts) and len(set(starts)) == 3  # from the moment, apart
    now[0] = 1020.0
    assert [qualifying.start_at(gpu, 15.0, 60.0) for gpu in range(3)] == starts  # the same gap: the same draw
    busy_until[0] = 1019.0  # busy again, then a new gap: a new moment and a new draw
    now[0] = 1040.0
    assert qualifying.start_at(0, 15.0, 60.0) != starts[0] and qualifying.moment(0, 15.0) == 1034.0


def test_a_reload_that_drops_a_schedule_drops_its_due_result_and_series(node):
    vit = ScheduleConfig(probe="vit", interval_seconds=3600, settle_seconds=0)
    n = node(schedules=(LLM, vit))
    n.device.add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire("1-vit-gpu0")
    assert n.scheduler.due.get("1-vit-gpu0", 0) is not None and n.value("gpuperf_probe_due", "vit") == 1
    n.scheduler.apply(n.config.model_copy(update={"schedules": [LLM]}))
    assert n.scheduler.due.get("1-vit-gpu0", 0) is None and n.value("gpuperf_probe_due", "vit") is None
    assert n.value("gpuperf_probe_due") == 1


def test_a_gpu_the_gate_refused_is_asked_again_only_after_the_recheck(node):
    """The idle tracker calls the GPU free, the gate (a pod, MIG, a foreign process the sampler has not
    seen yet) does not: its device reads are not repeated every pass."""
    n = node(recheck=3600.0)
    asked = []
    real = n.service.gate.refusal
    n.service.gate.refusal = lambda device, wait=True: asked.append(device.index) or real(device, wait)
    n.device.add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire()  # its own gate refuses it (counted skipped, as before)
    asked.clear()
    assert n.dispatch() == 0 and n.dispatch() == 0 and asked == [0]  # refused once, not asked again
    n.device.remove_foreign_process(999_999)
    assert n.dispatch() == 0  # still within the recheck
    n.scheduler.hand_off([0])  # the scheduler's word: asked again at once
    deadline = time.monotonic() + 30
    while n.runs() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert n.runs() == 1  # it could not have run without the gate asked again


def test_an_idle_gpu_a_pod_holds_is_not_counted_free(node):
    """The tracker sees no process and no load, but the gate refuses (here a process the sampler has not
    seen; on Kubernetes a pod holding an idle GPU): no free time is counted, so the coverage alert says
    the GPUs were never free rather than free and not probed."""
    n = node(recheck=3600.0)
    free = lambda: n.registry.get_sample_value("gpuperf_probe_gpu_free_seconds_total",  # noqa: E731
                                               {"gpu": "0", "uuid": n.uuid}) or 0.0
    n.device.add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire()
    n.dispatch()  # the gate refuses: not free from now
    before = free()
    time.sleep(0.2)
    n.dispatch()
    assert free() == before
