"""The daemon's interconnect schedule on simulated GPUs with the real gloo workers: it runs only
when every GPU of the set may be probed, holds each GPU against single-GPU rounds and other
processes, and records its result."""

from __future__ import annotations

import json
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.caps.ownership import GpuLock, safe_name
from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.gates.turns import Holder, HolderKind, Turn
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor
from gpuperfd.probing.interconnect.service import InterconnectService
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading

OPTIONS = {"copy_bytes": 1 << 14, "allreduce_bytes": [1 << 10, 1 << 16], "repeats": 2, "warmup": 0}
SCHEDULE = ScheduleConfig(probe="interconnect", interval_seconds=600, options=OPTIONS)


def make(tmp_path, gpus=3, executor=None, **probes):
    backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=5))
    devices = backend.devices()
    registry = CollectorRegistry()
    tracker = IdleTracker(0.05)
    for d in devices:  # the sampler has seen every GPU idle
        tracker.observe(d.index, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    config = ProbesConfig(**{"idle_seconds": 0.0, **probes}, state_dir=tmp_path / "state")
    service = ProbeService(config, devices, simulated_executor(0.05, seed=1), ProbeMetrics(registry), tracker,
                           HistoryWriter(tmp_path / "history.jsonl"))
    built = []

    def make_executor():
        built.append(executor or ProcessInterconnectExecutor("cpu", idle_wait_seconds=0))
        return built[-1]

    return devices, registry, service, InterconnectService(service, make_executor), built


def runs(registry, gpu, uuid, result, reason=""):
    return registry.get_sample_value("gpuperf_probe_runs_total", {"gpu": str(gpu), "uuid": uuid, "probe": "interconnect",
                                                                 "preset": "nccl", "result": result, "reason": reason})


def test_runs_when_every_gpu_of_the_set_is_idle_and_records_it(tmp_path):
    devices, registry, service, ic, _ = make(tmp_path)
    schedule = ScheduleConfig(probe="interconnect", interval_seconds=600, gpus=[0, 2], options=OPTIONS)
    result = ic.run(schedule)
    assert result is not None and result.ok, result
    assert result.gpus == (0, 2) and [(c.src, c.dst) for c in result.copies] == [(0, 2), (2, 0)]
    assert result.energy_joules is not None and result.energy_joules > 0
    assert [runs(registry, g, devices[g].info().uuid, "ok") for g in (0, 1, 2)] == [1, None, 1]
    line = json.loads((tmp_path / "history.interconnect.jsonl").read_text().splitlines()[0])
    assert line["schema"] == "gpuperfd.interconnect/1" and line["source"] == "daemon"
    assert [g["index"] for g in line["gpus"]] == [0, 2] and line["gpus"][1]["uuid"] == devices[2].info().uuid
    assert InterconnectResult.from_dict(line["result"]) == result
    assert not (tmp_path / "history.jsonl").exists()  # the per-GPU history is not mixed with it
    for gpu in (0, 2):  # every hold given back: the per-GPU turn and the cross-process lock
        assert service.turns.take(gpu, Holder(HolderKind.ROUND, "test"), 0) is Turn.GRANTED
        service.turns.release(gpu)
        lock = GpuLock(tmp_path / "state", safe_name(devices[gpu].info().uuid))
        lock.acquire(0.0)
        lock.release()


@pytest.mark.parametrize("why", ["foreign", "not_idle"])
def test_one_gpu_not_free_skips_the_whole_set_and_starts_nothing(tmp_path, why):
    devices, registry, service, ic, built = make(tmp_path, gpus=2, **({"idle_seconds": 3600.0} if why == "not_idle" else {}))
    if why == "foreign":
        devices[1].add_foreign_process(4242, 1 << 30)
    assert ic.run(SCHEDULE) is None
    reason = "allocated" if why == "foreign" else "not_idle"  # a process on it holds it, as for a round
    assert [runs(registry, g, devices[g].info().uuid, "skipped", reason) for g in (0, 1)] == [1, 1]
    assert built == []  # no executor built, no worker started


def test_a_gpu_held_by_another_process_skips_the_set(tmp_path):
    devices, registry, service, ic, built = make(tmp_path, gpus=2)
    (tmp_path / "state").mkdir(exist_ok=True)
    other = GpuLock(tmp_path / "state", safe_name(devices[1].info().uuid))  # flock: per open file, as another process's
    other.acquire(0.0)
    try:
        assert ic.run(SCHEDULE) is None
    finally:
        other.release()
    assert runs(registry, 0, devices[0].info().uuid, "skipped", "busy") == 1 and built == []


def test_no_single_gpu_round_runs_on_a_gpu_of_the_set_meanwhile(tmp_path):
    devices, registry, service, ic, _ = make(tmp_path, gpus=2, queue_seconds=0.5)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (ic.run(SCHEDULE), done.set()))
    thread.start()
    while not service.sweeps() and service.turns.holder(0) is None:  # the set is held
        time.sleep(0.01)
    outcome = service.run(ScheduleConfig(probe="llm", interval_seconds=60), 0)
    assert not done.is_set() and (outcome.result, outcome.reason) == ("skipped", "overlap")
    thread.join(60)
    assert runs(registry, 0, devices[0].info().uuid, "ok") == 1
    assert service.run(ScheduleConfig(probe="llm", interval_seconds=60), 0).result == "ok"  # given back


def test_a_set_naming_a_gpu_not_on_the_node_is_counted_failed(tmp_path, caplog):
    devices, registry, service, ic, built = make(tmp_path, gpus=2)
    assert ic.run(ScheduleConfig(probe="interconnect", interval_seconds=600, gpus=[0, 5])) is None
    assert "no GPU 5 on this node" in caplog.text
    assert runs(registry, 0, devices[0].info().uuid, "failed", "bad_set") == 1 and built == []


def test_the_scheduler_gives_an_interconnect_schedule_one_job_for_the_set(tmp_path):
    devices, registry, service, ic, _ = make(tmp_path, gpus=2)
    scheduler = ProbeScheduler(service, [0, 1], interconnect=ic)
    scheduler.apply(ProbesConfig(schedules=[SCHEDULE, ScheduleConfig(probe="llm", interval_seconds=60)],
                                 state_dir=tmp_path / "state", round_window_seconds=600))
    jobs = sorted(job.id for job in scheduler.scheduler.get_jobs())
    assert jobs == ["0-interconnect", "1-llm-gpu0", "1-llm-gpu1"]
    assert scheduler.claim("1-llm-gpu0", [0, 1], set()) == []  # never a member of a single-GPU round


def test_the_daemons_executor_choice_runs_gloo_workers_for_a_cpu_torch_device(tmp_path):
    """probes.executor child with probes.torch_device cpu: the workers run on this host (what the
    CI can run), each standing for one simulated GPU of the set."""
    from gpuperfd.config import config_from_mapping
    from gpuperfd.daemon import build_interconnect

    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {"gpus": 2, "seed": 1},
                                  "probes": {"executor": "child", "torch_device": "cpu", "idle_seconds": 0,
                                             "state_dir": str(tmp_path / "state")}})
    devices, registry, service, _, _ = make(tmp_path, gpus=2)
    backend = SimulatedBackend(config.simulation)
    result = build_interconnect(config, backend, service).run(SCHEDULE)
    assert result is not None and result.ok and result.backend == "gloo" and result.gpus == (0, 1)
    assert runs(registry, 1, devices[1].info().uuid, "ok") == 1
