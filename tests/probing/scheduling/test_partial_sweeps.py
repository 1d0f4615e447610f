"""Issue 50, sweeps on busy GPUs: a sweep that gave way to a user's job keeps its points and the next gap
measures only the caps left; the parts join into one sweep only when they agree on GPU, driver, probe
build and temperature band, and only while fresh; otherwise the whole sweep is due again."""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.base import GpuInfo
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.partial import PartialSweeps
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading
from hand_scheduler import JOB, dispatch, fire

SWEEP = ScheduleConfig(probe="llm", interval_seconds=3600, caps=["max", 600, 500, 400], settle_seconds=0)


def idle_reading() -> Reading:
    return Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, time.monotonic())


@pytest.fixture
def node(tmp_path):
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5, initial_power_limits={0: 700.0}))
    device = backend.devices()[0]
    tracker = IdleTracker(0.05)
    tracker.observe(0, "utilization", idle_reading())
    config = ProbesConfig(read_only=False, jitter_seconds=0, first_run_delay_seconds=3600, idle_seconds=0,
                          stop_early=False, state_dir=tmp_path / "state", history={"path": None}, schedules=[SWEEP])
    registry = CollectorRegistry()
    service = ProbeService(config, [device], simulated_executor(0.05, seed=1), ProbeMetrics(registry), tracker)
    scheduler = ProbeScheduler(service, [0], recheck_seconds=0.0)
    scheduler.scheduler.start(paused=True)
    scheduler.apply(config)
    measured: list[list[float]] = [[]]
    service.point_listeners.append(lambda gpu, probe, preset, point: measured[-1].append(round(point.cap_watts)))
    yield device, tracker, service, scheduler, registry, measured
    scheduler.stop()


def test_a_sweep_that_gave_way_measures_only_the_caps_left_in_the_next_gap_and_joins(node, caplog):
    device, tracker, service, scheduler, registry, measured = node
    caplog.set_level(logging.INFO)

    def job_arrives_after_two_points(gpu, probe, preset, point):
        if len(measured[-1]) == 2 and not device._foreign:  # a user's job takes the GPU mid-sweep
            device.add_foreign_process(pid=999_999, memory_bytes=1 << 30)

    service.point_listeners.append(job_arrives_after_two_points)
    fire(scheduler)
    assert measured[0][:2] == [700, 600] and scheduler.due.get(JOB, 0) is not None  # gave way, still due
    kept = scheduler.partials.resumable((JOB, 0), service._info(device), SWEEP, 3600)
    assert kept is not None and kept.remaining() == [500, 400]
    service.point_listeners.remove(job_arrives_after_two_points)
    device.remove_foreign_process(999_999)
    tracker.observe(0, "utilization", idle_reading())
    measured.append([])
    dispatch(scheduler)
    assert measured[1] == [500, 400]  # only the caps left; each part a whole owned sweep of its own
    assert "llm sweep joined from its parts (4 caps): recommended cap" in caplog.text
    assert scheduler.due.get(JOB, 0) is None and device.power_limits().enforced_watts == 700.0  # operator's cap back


def points(temperatures, caps=(700, 600)):  # type: ignore[no-untyped-def]
    made = []
    for cap, celsius in zip(caps, temperatures):
        result = ProbeResult.failure("llm", "graph", "gpt2", "aborted", "", started_at=time.time())
        made.append(SweepPoint(cap, dataclasses.replace(result, status="ok", failure_reason=None,
                                                        temperature_celsius_max=celsius)))
    return made


INFO = GpuInfo(0, "GPU-1", "H100", "0000:01:00.0", "570.1", "9.0", 80 << 30, "nvml")


def test_parts_join_only_in_one_temperature_band_and_while_fresh_on_the_same_driver() -> None:
    parts = PartialSweeps()
    caps = (700, 600, 500, 400)
    assert parts.keep(("j", 0), INFO, SWEEP, points([61, 64]), caps) is not None
    assert parts.join(("j", 0), points([66, 69], (500, 400)))[0] is not None  # 60-69 C: one band
    parts.keep(("j", 0), INFO, SWEEP, points([61, 64]), caps)
    joined, why = parts.join(("j", 0), points([71, 72], (500, 400)))
    assert joined is None and "temperature bands" in why  # hotter: not one sweep
    parts.keep(("j", 0), INFO, SWEEP, points([61, 64]), caps)
    upgraded = dataclasses.replace(INFO, driver_version="575.2")
    assert parts.resumable(("j", 0), upgraded, SWEEP, 3600) is None  # a new driver: start again
    parts.keep(("j", 0), INFO, SWEEP, points([61, 64]), caps)
    assert parts.resumable(("j", 0), INFO, SWEEP, 3600, now=time.time() + 3601) is None  # stale
    parts.keep(("j", 0), INFO, SWEEP, points([61, 64]), caps)
    other = SWEEP.model_copy(update={"options": {"batch_size": 8}})
    assert parts.resumable(("j", 0), INFO, other, 3600) is None  # another probe build
    assert parts.keep(("j", 0), INFO, SWEEP, points([61, 64]), (700,)) is None  # one cap: nothing to take in parts
