"""The one-shot point (``measure_once``) of ``gpuperfd probe`` and ``gpuperfd check`` on the
simulator, and the child executor's spec for a request; no child is started here (test_runner.py
runs real children through the same path)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once, simulated_executor


@pytest.fixture
def gpu():  # type: ignore[no-untyped-def]
    return SimulatedBackend(SimulationConfig(gpus=2, seed=1, initial_power_limits={1: 600.0})).devices()[1]


def test_a_one_shot_point_with_repeats_pools_one_window_per_repeat_at_the_cap_held(gpu) -> None:
    events: list[dict[str, Any]] = []
    request = ProbeRequest("vit", options={"repeats": 3, "batch_size": 64}, settle_seconds=0.0)
    result = measure_once(simulated_executor(0.05, seed=1), gpu, request, threading.Event(), events.append)
    assert result.status == "ok" and result.device == "sim:1"
    assert [(e["phase"], e["repeat"], e["repeats"]) for e in events] == [("measure", n, 3) for n in (1, 2, 3)]
    assert len(result.repeats) == 3 and result.extra["simulated"] is True
    assert result.energy_joules == pytest.approx(sum(r.energy_joules for r in result.repeats))
    assert result.measured_seconds == pytest.approx(sum(r.measured_seconds for r in result.repeats))
    rates = [r.throughput["images_per_second"] for r in result.repeats]
    assert min(rates) <= result.throughput["images_per_second"] <= max(rates)
    assert result.params == {"repeats": 3, "batch_size": 64}
    assert result.wall_seconds >= result.measured_seconds  # the whole one-shot run
    assert gpu.power_limits().enforced_watts == 600.0 == result.power_limit_watts  # read-only


def test_a_point_without_repeats_is_one_window_as_the_daemons_sweeps_measure_it(gpu) -> None:
    result = measure_once(simulated_executor(0.05, seed=1), gpu, ProbeRequest("llm", settle_seconds=0.0),
                          threading.Event())
    assert result.status == "ok" and result.repeats == [] and "simulated" not in result.extra


def test_a_window_that_gives_way_is_the_points_result(gpu) -> None:
    threading.Timer(0.15, lambda: gpu.add_foreign_process(515151, 1 << 30)).start()
    request = ProbeRequest("attention", options={"repeats": 5}, settle_seconds=0.0)
    result = measure_once(simulated_executor(0.1, seed=1), gpu, request, threading.Event())
    assert (result.status, result.failure_reason) == ("skipped", "preempted") and "515151" in result.error_message
    assert result.repeats == []


def test_the_child_spec_runs_on_the_requests_device_else_the_gpus_and_never_silently_on_the_cpu(gpu) -> None:
    executor = ChildProcessExecutor(60)
    spec = ProbeSpec("llm", preset="tiny", device="cpu", repeats=1)
    assert executor.spec(None, ProbeRequest.from_spec(spec, 60)) == spec  # gpuperfd probe: the flags' spec
    assert executor.spec(gpu, ProbeRequest("llm", "tiny")).device == "cuda:1"  # the daemon: NVML's index
    with pytest.raises(ValueError, match="device: a cuda probe needs the GPU"):
        executor.spec(None, ProbeRequest("llm", "tiny"))
    assert ChildProcessExecutor(60, torch_device="cpu").spec(None, ProbeRequest("llm", "tiny")).device == "cpu"
