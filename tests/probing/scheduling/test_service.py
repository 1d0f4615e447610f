"""The daemon's probe service on simulated GPUs: gating, skips with reasons, published series, history."""

from __future__ import annotations

import logging
import re

import threading
import time
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.executors import PerPointExecutor, simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.history import HistoryWriter, read_history
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading


def make(tmp_path, idle_seconds=0.0, **probes):
    backend = SimulatedBackend(SimulationConfig(gpus=2, seed=5, initial_power_limits={0: 680.0}))
    devices = backend.devices()
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    tracker = IdleTracker(0.05)
    for d in devices:  # the sampler has seen every GPU idle
        tracker.observe(d.index, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    config = ProbesConfig(**{"read_only": False, **probes}, state_dir=tmp_path / "state", idle_seconds=idle_seconds)
    history = HistoryWriter(tmp_path / "history.jsonl")
    service = ProbeService(config, devices, simulated_executor(0.05, seed=1), metrics, tracker, history)
    return backend, devices, registry, service


def sample(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_sweep_publishes_series_with_labels_and_restores(tmp_path):
    backend, devices, registry, service = make(tmp_path)
    uuid = devices[0].info().uuid
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["max", 500, 300], settle_seconds=0)
    outcome = service.run(schedule, 0)
    assert outcome.result == "ok" and len(outcome.points) == 3
    assert devices[0].power_limits().enforced_watts == 680.0
    base = {"gpu": "0", "uuid": uuid, "probe": "llm", "preset": "gpt2"}
    for cap in ("700", "500", "300"):
        rate = sample(registry, "gpuperf_probe_work_units_per_second", **base, power_cap=cap, unit="token")
        energy = sample(registry, "gpuperf_probe_energy_per_unit_joules", **base, power_cap=cap, unit="token")
        power = sample(registry, "gpuperf_probe_average_power_watts", **base, power_cap=cap)
        assert rate > 1000 and 0 < energy < 1
        assert power == pytest.approx(energy * rate, rel=0.02)  # J/token x tokens/s = W
        assert power <= int(cap) * 1.01
        assert sample(registry, "gpuperf_probe_power_cap_watts", **base, power_cap=cap) == int(cap)
    assert sample(registry, "gpuperf_probe_runs_total", **base, result="ok", reason="") == 3
    assert sample(registry, "gpuperf_power_cap_original_watts", gpu="0", uuid=uuid) == 680.0
    assert sample(registry, "gpuperf_sweep_in_progress", gpu="0", uuid=uuid) == 0
    assert sample(registry, "gpuperf_sweep_cap_watts", gpu="0", uuid=uuid) is None
    # histograms only observe runs at the operator's cap (680 W is not in this sweep)
    assert sample(registry, "gpuperf_probe_ttft_seconds_count", **base) is None
    records = list(read_history(tmp_path / "history.jsonl"))
    assert [r["power_cap_watts"] for r in records] == [700, 500, 300]
    assert {r["original_cap_watts"] for r in records} == {680.0} and len({r["sweep_id"] for r in records}) == 1
    assert records[0]["gpu"]["uuid"] == uuid and records[0]["result"]["status"] == "ok"


def test_run_at_operator_cap_fills_latency_histograms(tmp_path):
    backend, devices, registry, service = make(tmp_path)
    service.run(ScheduleConfig(probe="llm", interval_seconds=60), 0)
    labels = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "llm", "preset": "gpt2"}
    assert sample(registry, "gpuperf_probe_ttft_seconds_count", **labels) == 8
    assert sample(registry, "gpuperf_probe_tpot_seconds_count", **labels) == 32
    assert sample(registry, "gpuperf_probe_tpot_seconds_bucket", **labels, le="0.0005") < 32 <= sample(
        registry, "gpuperf_probe_tpot_seconds_bucket", **labels, le="+Inf")
    service.run(ScheduleConfig(probe="vit", interval_seconds=60), 1)
    vit = {**labels, "gpu": "1", "uuid": devices[1].info().uuid, "probe": "vit", "preset": "vit-b16"}
    assert sample(registry, "gpuperf_probe_batch_latency_seconds_count", **vit) == 32


def test_gpu_with_a_foreign_process_is_skipped_as_allocated(tmp_path):
    """Any process but ours makes the GPU someone's (issue 14): reason allocated, not busy."""
    backend, devices, registry, service = make(tmp_path)
    devices[1].add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    outcome = service.run(ScheduleConfig(probe="vit", interval_seconds=60, caps=[500]), 1)
    assert outcome.result == "skipped" and outcome.reason == "allocated"
    assert devices[1].power_limits().enforced_watts == 700.0  # never touched
    labels = {"gpu": "1", "uuid": devices[1].info().uuid, "probe": "vit", "preset": "vit-b16"}
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="skipped", reason="allocated") == 1
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="skipped", reason="busy") is None


def test_gpu_not_idle_long_enough_is_skipped(tmp_path, caplog):
    backend, devices, registry, service = make(tmp_path, idle_seconds=3600)
    with caplog.at_level(logging.INFO, logger="gpuperfd.probing.scheduling.service"):
        outcome = service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0)
    assert (outcome.result, outcome.reason) == ("skipped", "not_idle")
    # the log line says how long it was idle against what it needs (not_idle_text), never "idle 5 s < 5 s"
    assert re.search(r"skipped: not_idle \(idle for [0-9.]+ s, needs 3600 s\)", caplog.text)


def test_no_two_runs_on_one_gpu(tmp_path):
    backend, devices, registry, service = make(tmp_path, queue_seconds=0)
    schedule = ScheduleConfig(probe="train", interval_seconds=60, caps=["max", 400], settle_seconds=0.3)
    results = []
    first = threading.Thread(target=lambda: results.append(service.run(schedule, 0)))
    first.start()
    while service.turns.holder(0) is None:
        pass
    second = service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0)
    first.join()
    assert (second.result, second.reason) == ("skipped", "overlap")
    assert results[0].result == "ok"
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 1).result == "ok"  # other GPUs are free


def test_read_only_config_never_changes_caps(tmp_path):
    backend, devices, registry, service = make(tmp_path, read_only=True)
    outcome = service.run(ScheduleConfig(probe="attention", interval_seconds=60, caps=[300, 200]), 0)
    assert outcome.result == "ok" and [p.cap_watts for p in outcome.points] == [680.0]
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").iterdir())


def test_history_rotates(tmp_path):
    writer = HistoryWriter(tmp_path / "h.jsonl", max_bytes=4096, backups=2)
    backend = SimulatedBackend(SimulationConfig(gpus=1))
    info = backend.devices()[0].info()
    for n in range(60):
        result = ProbeResult(probe="vit", variant="simulated", preset="vit-b16", extra={"n": n, "pad": "x" * 200})
        writer.append(info, result.to_dict(), 700.0)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["h.jsonl", "h.jsonl.1", "h.jsonl.2"]
    records = list(read_history(tmp_path / "h.jsonl"))
    assert all(r["schema"] == "gpuperfd.run/1" and r["source"] == "daemon" for r in records)
    kept = [r["result"]["extra"]["n"] for r in records]
    assert kept == sorted(kept) and kept[-1] == 59  # oldest dropped, order kept


def test_process_appearing_mid_probe_gives_way_and_frees_the_gpu(tmp_path):
    """A user's job arriving mid-measurement: the GPU is given back at once, and that is a preemption
    (skipped, preempted), not a failure or an abort; the cap's last completed result stays published."""
    backend, devices, registry, service = make(tmp_path)
    gpu = devices[0]
    schedule = ScheduleConfig(probe="vit", interval_seconds=60, caps=["max", 500], settle_seconds=0)
    assert service.run(schedule, 0).result == "ok"
    labels = {"gpu": "0", "uuid": gpu.info().uuid, "probe": "vit", "preset": "vit-b16"}
    before = published(registry, labels)
    assert any(name == "gpuperf_probe_last_run_timestamp_seconds" for name, _ in before) and len(before) > 10
    latest = service.latest()[(0, "vit", "vit-b16")]
    # A 20 s window: "given back at once" is told from "after the window" by a wide margin, not by luck.
    service.executor = simulated_executor(20.0, seed=1)
    timer = threading.Timer(0.3, lambda: gpu.add_foreign_process(pid=424242, memory_bytes=1 << 30))
    timer.start()
    started = time.monotonic()
    outcome = service.run(schedule, 0)
    elapsed = time.monotonic() - started
    timer.join()
    assert (outcome.result, outcome.reason) == ("skipped", "preempted") and elapsed < 10
    assert len(outcome.points) == 1 and "424242" in outcome.points[0].result.error_message  # 500 W never ran
    assert gpu.compute_processes() and all(p.pid == 424242 for p in gpu.compute_processes())  # ours is gone
    assert gpu.power_limits().enforced_watts == 680.0  # and the cap is back
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="skipped", reason="preempted") == 1
    for result in ("failed", "aborted"):
        assert not any(s.labels["result"] == result for s in runs_samples(registry, labels)), result
    assert published(registry, labels) == before  # every result series, and its timestamp, as it was
    assert service.latest()[(0, "vit", "vit-b16")] == latest  # the landing page's latest points too
    record = list(read_history(tmp_path / "history.jsonl"))[-1]["result"]
    assert (record["status"], record["failure_reason"]) == ("skipped", "preempted")  # recorded honestly


def test_one_gpu_gives_way_mid_round_while_the_other_completes(tmp_path):
    """Two GPUs probing at once; a user's job lands on GPU 1 mid-round: GPU 1's run is skipped/preempted,
    its earlier results stay on /metrics and its cap comes back, and GPU 0's round completes ok."""
    backend, devices, registry, service = make(tmp_path, parallel_gpus=True)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["max", 500], settle_seconds=0)
    assert [service.run(schedule, g).result for g in (0, 1)] == ["ok", "ok"]
    labels = [{"gpu": str(g), "uuid": devices[g].info().uuid, "probe": "llm", "preset": "gpt2"} for g in (0, 1)]
    before = [published(registry, lab) for lab in labels]
    latest_1 = service.latest()[(1, "llm", "gpt2")]
    service.executor = simulated_executor(1.0, seed=2)
    outcomes: dict[int, object] = {}
    threads = [threading.Thread(target=lambda g=g: outcomes.__setitem__(g, service.run(schedule, g))) for g in (0, 1)]
    for thread in threads:
        thread.start()
    time.sleep(0.4)  # both are measuring their first cap now
    assert service.turns.holder(0) is not None and service.turns.holder(1) is not None
    devices[1].add_foreign_process(pid=515151, memory_bytes=1 << 30)
    for thread in threads:
        thread.join(30)
    assert (outcomes[1].result, outcomes[1].reason) == ("skipped", "preempted")
    assert (outcomes[0].result, len(outcomes[0].points)) == ("ok", 2)
    assert sample(registry, "gpuperf_probe_runs_total", **labels[1], result="skipped", reason="preempted") == 1
    assert {s.labels["result"] for s in runs_samples(registry, labels[1])} == {"ok", "skipped"}
    assert published(registry, labels[1]) == before[1] and service.latest()[(1, "llm", "gpt2")] == latest_1
    assert sample(registry, "gpuperf_probe_runs_total", **labels[0], result="ok", reason="") == 4
    last = "gpuperf_probe_last_run_timestamp_seconds"
    assert sample(registry, last, **labels[0]) > before[0][(last, tuple(sorted(labels[0].items())))]
    assert devices[1].power_limits().enforced_watts == 700.0 and devices[0].power_limits().enforced_watts == 680.0


def test_a_pod_allocated_the_gpu_between_points_ends_the_round_as_preempted(tmp_path):
    """The kubelet gives the GPU to a pod while a sweep runs: no further cap is measured, the round's
    other schedule never starts, both are skipped/preempted, and the operator's cap is restored."""
    from gpuperfd.attribution.allocations import PodResourcesWatcher

    backend, devices, registry, service = make(tmp_path)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["max", 500, 300], settle_seconds=0)
    assert service.run(schedule, 0).result == "ok"
    labels = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "llm", "preset": "gpt2"}
    kept = {cap: sample(registry, "gpuperf_probe_work_units_per_second", **labels, power_cap=cap, unit="token")
            for cap in ("500", "300")}
    watcher = PodResourcesWatcher(str(tmp_path / "kubelet.sock"))
    watcher.apply([])
    service.gate.allocations = watcher.state
    inner = service.executor.measure

    def measure_then_allocate(device, sched, abort, settle, hold=0.0):
        result = inner(device, sched, abort, settle, hold)
        watcher.apply(_pods(("ml", "trainer-0", "nvidia.com/gpu", device.info().uuid)))
        return result

    service.executor.measure = measure_then_allocate
    vit = ScheduleConfig(probe="vit", interval_seconds=60, settle_seconds=0)
    source = OneClaim(("job:vit", vit))
    outcome = service.run(schedule, 0, key="job:llm", source=source)
    assert (outcome.result, outcome.reason) == ("skipped", "preempted")
    assert [round(p.cap_watts) for p in outcome.points] == [700]  # 500 and 300 gave way
    assert devices[0].power_limits().enforced_watts == 680.0
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="skipped", reason="preempted") == 1
    vit_labels = {**labels, "probe": "vit", "preset": "vit-b16"}
    assert sample(registry, "gpuperf_probe_runs_total", **vit_labels, result="skipped", reason="preempted") == 1
    for cap, value in kept.items():  # the caps it did not reach keep their last completed results
        assert sample(registry, "gpuperf_probe_work_units_per_second", **labels, power_cap=cap, unit="token") == value


class OneClaim:
    """A scheduler's round source that claims one more schedule for the round."""

    def __init__(self, claimed):
        self._claimed = [claimed]

    def claim(self, gpu, keys):
        claimed, self._claimed = self._claimed, []
        return claimed

    def claimed(self):
        return list(self._claimed)

    def current(self, key):
        return None if key != "job:vit" else ScheduleConfig(probe="vit", interval_seconds=60, settle_seconds=0)


def runs_samples(registry, labels):
    return [s for m in registry.collect() if m.name == "gpuperf_probe_runs" for s in m.samples
            if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items())]


def published(registry, labels):
    """Every probe result series of ``labels`` (per-cap and per-run gauges), as {(name, labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect()
            if m.type == "gauge" and m.name.startswith("gpuperf_probe_") for s in m.samples
            if all(s.labels.get(k) == v for k, v in labels.items())}


def test_executor_bug_is_counted_and_the_cap_restored(tmp_path):
    backend, devices, registry, service = make(tmp_path)

    def broken(device, schedule, abort):
        raise ZeroDivisionError("bug in an executor")

    service.executor = PerPointExecutor(broken)
    outcome = service.run(ScheduleConfig(probe="vit", interval_seconds=60, caps=[500], settle_seconds=0), 0)
    assert (outcome.result, outcome.reason) == ("failed", "exception")
    assert devices[0].power_limits().enforced_watts == 680.0
    labels = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "vit", "preset": "vit-b16"}
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="failed", reason="exception") == 1


def test_a_failed_point_withdraws_that_caps_result_until_it_succeeds_again(tmp_path):
    """After a GPU degrades and its top-cap run fails, the stale top-cap result must not stay a candidate."""
    backend, devices, registry, service = make(tmp_path)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=[700, 500, 300], settle_seconds=0)
    assert service.run(schedule, 0).result == "ok"
    base = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "llm", "preset": "gpt2"}
    assert sample(registry, "gpuperf_probe_power_cap_watts", **base, power_cap="700") == 700
    ok_executor = service.executor

    def fails_at_700(device, schedule, abort):
        result = ok_executor.measure(device, schedule, abort, 0.0)
        if round(device.power_limits().enforced_watts) == 700:
            return replace(result, status="failed", failure_reason="oom", error_message="out of memory")
        return result

    service.executor = PerPointExecutor(fails_at_700)
    outcome = service.run(schedule, 0)
    assert outcome.result == "failed"
    for name in ("gpuperf_probe_power_cap_watts", "gpuperf_probe_average_power_watts"):
        assert sample(registry, name, **base, power_cap="700") is None, name
    for name in ("gpuperf_probe_work_units_per_second", "gpuperf_probe_energy_per_unit_joules"):
        assert sample(registry, name, **base, power_cap="700", unit="token") is None, name
        assert sample(registry, name, **base, power_cap="500", unit="token") > 0, name
    assert sample(registry, "gpuperf_probe_runs_total", **base, result="failed", reason="oom") == 1
    assert [round(p.cap_watts) for p in service.latest()[(0, "llm", "gpt2")]] == [500, 300]
    service.executor = ok_executor  # the cap works again: its result is back
    assert service.run(schedule, 0).result == "ok"
    assert sample(registry, "gpuperf_probe_power_cap_watts", **base, power_cap="700") == 700


def test_reload_withdraws_caps_and_schedules_no_longer_run(tmp_path):
    backend, devices, registry, service = make(tmp_path)
    llm = ScheduleConfig(probe="llm", interval_seconds=60, caps=["current", 500, 300], settle_seconds=0)
    vit = ScheduleConfig(probe="vit", interval_seconds=60, caps=[500], settle_seconds=0)
    for gpu in (0, 1):
        assert service.run(llm, gpu).result == "ok" and service.run(vit, gpu).result == "ok"
    uuids = [d.info().uuid for d in devices]
    config = service.config.model_copy(update={"schedules": [llm.model_copy(update={"caps": ["current", 500]})]})
    service.apply_config(config)
    for gpu in (0, 1):
        base = {"gpu": str(gpu), "uuid": uuids[gpu], "probe": "llm", "preset": "gpt2"}
        current = "680" if gpu == 0 else str(round(devices[1].power_limits().enforced_watts))
        assert sample(registry, "gpuperf_probe_power_cap_watts", **base, power_cap=current) is not None
        assert sample(registry, "gpuperf_probe_power_cap_watts", **base, power_cap="500") == 500
        assert sample(registry, "gpuperf_probe_power_cap_watts", **base, power_cap="300") is None
        assert sample(registry, "gpuperf_probe_work_units_per_second", **base, power_cap="300", unit="token") is None
        assert sample(registry, "gpuperf_probe_power_cap_watts", gpu=str(gpu), uuid=uuids[gpu], probe="vit",
                      preset="vit-b16", power_cap="500") is None
    assert set(service.latest()) == {(0, "llm", "gpt2"), (1, "llm", "gpt2"), (0, "vit", "vit-b16"), (1, "vit", "vit-b16")}
    assert service.latest()[(0, "vit", "vit-b16")] == []
    assert [round(p.cap_watts) for p in service.latest()[(0, "llm", "gpt2")]] == [680, 500]


def _pods(*held):
    from gpuperfd.attribution.podresources import (
        ContainerDevices,
        ContainerResources,
        PodResources,
    )

    return [PodResources(pod, ns, (ContainerResources("c", (ContainerDevices(resource, (device,)),)),))
            for ns, pod, resource, device in held]


def test_allocated_but_idle_gpu_is_never_probed_and_a_free_one_is(tmp_path):
    from gpuperfd.attribution.allocations import PodResourcesWatcher

    backend, devices, registry, service = make(tmp_path)
    watcher = PodResourcesWatcher(str(tmp_path / "kubelet.sock"))
    watcher.apply(_pods(("ml", "trainer-0", "nvidia.com/gpu", devices[0].info().uuid)))
    service.gate.allocations = watcher.state
    assert devices[0].utilization().gpu_ratio == 0.0  # idle: utilization alone would let it run
    schedule = ScheduleConfig(probe="vit", interval_seconds=60, caps=["max", 500], settle_seconds=0)
    outcome = service.run(schedule, 0)
    assert (outcome.result, outcome.reason) == ("skipped", "allocated")
    assert devices[0].power_limits().enforced_watts == 680.0 and not outcome.points
    labels = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "vit", "preset": "vit-b16"}
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="skipped", reason="allocated") == 1
    assert service.run(schedule, 1).result == "ok"  # the unallocated idle GPU runs


def test_mig_device_of_a_gpu_held_by_a_pod_makes_the_gpu_allocated(tmp_path):
    from gpuperfd.attribution.allocations import PodResourcesWatcher

    backend, devices, registry, service = make(tmp_path)
    migs = devices[1].set_mig_devices(3)
    watcher = PodResourcesWatcher(str(tmp_path / "kubelet.sock"))
    watcher.apply(_pods(("ml", "infer", "nvidia.com/mig-1g.10gb", migs[2])))
    service.gate.allocations = watcher.state
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 1).reason == "allocated"
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).result == "ok"


def test_operator_marked_pods_are_ours_to_probe(tmp_path):
    from gpuperfd.attribution.allocations import PodResourcesWatcher

    backend, devices, registry, service = make(tmp_path, ours={"namespaces": ["gpuperfd"], "pods": ["probe-hold-*"]})
    watcher = PodResourcesWatcher(str(tmp_path / "kubelet.sock"))
    watcher.apply(_pods(("gpuperfd", "reserve", "nvidia.com/gpu", devices[0].info().uuid),
                        ("default", "probe-hold-1", "nvidia.com/gpu", devices[1].info().uuid)))
    service.gate.allocations = watcher.state
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).result == "ok"
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 1).result == "ok"
    # ...but a foreign pod sharing the GPU (time-slicing) makes it someone's again
    watcher.apply(_pods(("gpuperfd", "reserve", "nvidia.com/gpu", devices[0].info().uuid),
                        ("ml", "sneaky", "nvidia.com/gpu", devices[0].info().uuid + "::1")))
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).reason == "allocated"


def test_kubelet_that_never_answered_leaves_every_gpu_allocated(tmp_path):
    from gpuperfd.attribution.allocations import AllocationState

    backend, devices, registry, service = make(tmp_path)
    service.gate.allocations = lambda: AllocationState(seen=True, answered=False, ok=False, reason="timeout")
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).reason == "allocated"
    service.gate.allocations = lambda: AllocationState()  # no kubelet on this node: processes decide
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).result == "ok"


def test_in_a_pod_without_the_kubelet_socket_every_gpu_is_allocated(tmp_path, caplog):
    from gpuperfd.attribution.allocations import AllocationState, PodResourcesWatcher

    backend, devices, registry, service = make(tmp_path)
    socket = str(tmp_path / "kubelet.sock")
    service.gate.kubelet_socket = socket  # required: the daemon runs inside a Kubernetes pod
    service.gate.allocations = lambda: AllocationState()  # socket never seen (not mounted)
    with caplog.at_level("INFO", logger="gpuperfd.probing.scheduling.service"):
        outcome = service.run(ScheduleConfig(probe="vit", interval_seconds=60, caps=["max", 500]), 0)
    assert (outcome.result, outcome.reason) == ("skipped", "allocated")
    assert f"no kubelet PodResources socket at {socket}" in caplog.text  # the log names what is missing
    assert "attribution.kubernetes.required" in caplog.text
    assert devices[0].power_limits().enforced_watts == 680.0
    service.gate.allocations = None  # the allocation collector switched off: still unknown
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).reason == "allocated"
    watcher = PodResourcesWatcher(socket)
    watcher.apply(_pods(("ml", "trainer-0", "nvidia.com/gpu", devices[1].info().uuid)))
    service.gate.allocations = watcher.state  # the kubelet answered: its map decides
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).result == "ok"
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 1).reason == "allocated"


@pytest.mark.parametrize(("setting", "environ", "required"), [
    ("auto", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, True),
    ("auto", {}, False),
    ("auto", {"KUBERNETES_SERVICE_HOST": ""}, False),
    (True, {}, True),
    (False, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, False),
])
def test_kubelet_is_required_inside_a_pod_unless_configured(setting, environ, required):
    from gpuperfd.attribution.allocations import kubelet_required

    assert kubelet_required(setting, environ) is required


def test_gpu_in_mig_mode_is_skipped_unless_allowed(tmp_path):
    def with_mig(allow):
        backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5, mig=[{"gpu": 0, "instances": 2}]))
        devices = backend.devices()
        registry = CollectorRegistry()
        tracker = IdleTracker(0.05)
        tracker.observe(0, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
        config = ProbesConfig(state_dir=tmp_path / f"state{allow}", idle_seconds=0, allow_mig=allow)
        service = ProbeService(config, devices, simulated_executor(0.05, seed=1), ProbeMetrics(registry), tracker,
                               HistoryWriter(tmp_path / f"history{allow}.jsonl"))
        return devices, registry, service.run(ScheduleConfig(probe="vit", interval_seconds=60, caps=[500]), 0)

    devices, registry, outcome = with_mig(False)
    assert (outcome.result, outcome.reason) == ("skipped", "mig")
    assert devices[0].power_limits().enforced_watts == 700.0  # never touched
    labels = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "vit", "preset": "vit-b16"}
    assert sample(registry, "gpuperf_probe_runs_total", **labels, result="skipped", reason="mig") == 1
    devices, registry, outcome = with_mig(True)
    assert outcome.result == "ok"


def test_probe_publishes_gpm_means_that_say_compute_or_memory_bound(tmp_path):
    backend, devices, registry, service = make(tmp_path)
    service.run(ScheduleConfig(probe="attention", interval_seconds=60, caps=["max"], settle_seconds=0), 0)
    service.run(ScheduleConfig(probe="llm", interval_seconds=60, caps=["max"], settle_seconds=0), 1)
    attention = {"gpu": "0", "uuid": devices[0].info().uuid, "probe": "attention", "preset": "default",
                 "power_cap": "700"}
    decode = {"gpu": "1", "uuid": devices[1].info().uuid, "probe": "llm", "preset": "gpt2", "power_cap": "700"}
    assert sample(registry, "gpuperf_probe_gpm_tensor_active_ratio", **attention) > 0.6
    assert sample(registry, "gpuperf_probe_gpm_tensor_active_ratio", **decode) < 0.2
    assert sample(registry, "gpuperf_probe_gpm_dram_bandwidth_active_ratio", **decode) > 0.5
    records = list(read_history(tmp_path / "history.jsonl"))
    assert records[0]["result"]["gpm_tensor_active_mean_ratio"] > 0.6


def test_our_own_runs_utilization_tail_does_not_make_the_gpu_busy(tmp_path, monkeypatch):
    """NVML averages utilization over its last sample period: right after our own run the GPU
    still reads busy (an H200 skipped the next probe 1 ms after one ended). Within the grace the
    reading is taken again; long after our run, or for a foreign load, busy stays busy."""
    import gpuperfd.probing.gates.idle as idle_module
    import gpuperfd.probing.gates.gate as gate_module
    from gpuperfd.probing.gates.idle import BusyKind, BusyReason

    backend, devices, registry, service = make(tmp_path)
    readings: list[str | None] = []

    def tail_then_idle(device, threshold, own_pids=()):
        readings.append("read")
        return BusyReason(BusyKind.UTILIZATION, "utilization 100% above 5%") if len(readings) == 1 else None

    monkeypatch.setattr(gate_module, "OWN_LOAD_GRACE_SECONDS", 0.3)
    monkeypatch.setattr(idle_module, "busy_reason", tail_then_idle)
    service.gate.load_ended(0, time.monotonic())  # our run ended just now
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).result == "ok"
    assert len(readings) == 2  # read again once the grace was over
    readings.clear()
    service.gate.load_ended(1, time.monotonic() - 10)  # long ago: a high reading is someone's load
    outcome = service.run(ScheduleConfig(probe="vit", interval_seconds=60), 1)
    assert (outcome.result, outcome.reason) == ("skipped", "busy") and len(readings) == 1
    readings.clear()
    monkeypatch.setattr(idle_module, "busy_reason", lambda *a, **k: readings.append(1) or BusyReason(
        BusyKind.FOREIGN_PROCESS, "compute process(es) 42 running"))
    service.gate.load_ended(0, time.monotonic())
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).reason == "busy" and len(readings) == 1


def test_a_run_records_when_our_load_ended(tmp_path):
    backend, devices, registry, service = make(tmp_path)
    before = time.monotonic()
    assert service.run(ScheduleConfig(probe="vit", interval_seconds=60), 0).result == "ok"
    ended = service.gate.last_load_end(0)
    assert ended is not None and before <= ended <= time.monotonic()


def test_a_reload_reaches_the_gate(tmp_path):
    """The gate reads the probes config a reload hands the service: idle_seconds lowered, the GPU passes."""
    backend, devices, registry, service = make(tmp_path, idle_seconds=3600.0)
    schedule = ScheduleConfig(probe="vit", interval_seconds=60)
    assert service.run(schedule, 0).reason == "not_idle"
    service.apply_config(service.config.model_copy(update={"idle_seconds": 0.0}))
    assert service.gate.config is service.config and service.run(schedule, 0).result == "ok"


def test_simulated_wrong_results_fail_runs_and_count(tmp_path):
    """simulation.degrade wrong_results: that GPU's runs fail with wrong_result and count; its peer stays ok."""
    from gpuperfd.config import config_from_mapping

    sim = config_from_mapping({"simulation": {"gpus": 2, "seed": 5, "degrade": [{"gpu": 1, "wrong_results": True}]}})
    backend = SimulatedBackend(sim.simulation)
    devices = backend.devices()
    registry = CollectorRegistry()
    tracker = IdleTracker(0.05)
    for d in devices:
        tracker.observe(d.index, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    schedule = ScheduleConfig(probe="attention", interval_seconds=60, caps=["max", 500], settle_seconds=0)
    config = ProbesConfig(read_only=False, state_dir=tmp_path / "state", idle_seconds=0.0, schedules=[schedule])
    service = ProbeService(config, devices, simulated_executor(0.05, seed=1), ProbeMetrics(registry), tracker,
                           HistoryWriter(tmp_path / "history.jsonl"))
    service.apply_config(config)
    labels = [{"gpu": str(g), "uuid": devices[g].info().uuid, "probe": "attention", "preset": "default"} for g in (0, 1)]
    for lab in labels:  # declared from 0 before any run, so increase() sees the first wrong result
        assert sample(registry, "gpuperf_probe_wrong_results_total", **lab) == 0
    service.run(schedule, 0)
    service.run(schedule, 1)
    assert sample(registry, "gpuperf_probe_wrong_results_total", **labels[0]) == 0
    assert sample(registry, "gpuperf_probe_wrong_results_total", **labels[1]) == 2
    assert sample(registry, "gpuperf_probe_runs_total", **labels[1], result="failed", reason="wrong_result") == 2
    assert sample(registry, "gpuperf_probe_work_units_per_second", **labels[1], power_cap="500",
                  unit="iteration") is None  # a wrong answer's throughput is no candidate
    assert devices[1].power_limits().enforced_watts == devices[1].power_limits().default_watts  # cap restored
    records = list(read_history(tmp_path / "history.jsonl"))
    by_gpu = {g: [r["result"] for r in records if r["gpu"]["index"] == g] for g in (0, 1)}
    assert all(r["status"] == "ok" and r["correctness"]["status"] == "ok" for r in by_gpu[0])
    assert all(r["status"] == "failed" and r["failure_reason"] == "wrong_result"
               and r["correctness"]["status"] == "mismatch" for r in by_gpu[1]) and len(by_gpu[1]) == 2
    assert by_gpu[0][0]["correctness"]["fingerprint"] != by_gpu[1][0]["correctness"]["fingerprint"]


def test_a_sweep_stopped_after_one_point_recommends_nothing_and_says_so(tmp_path, caplog):
    """A shutdown mid-sweep: the second point comes back aborted. The one point measured is no
    ground for a recommendation ("recommended cap 700 W, saves 0.0 %" was logged before)."""
    backend, devices, registry, service = make(tmp_path)
    ok_executor = service.executor
    calls = []

    def aborted_second(device, schedule, abort):
        calls.append(1)
        result = ok_executor.measure(device, schedule, abort, 0.0)
        if len(calls) == 2:
            return ProbeResult.failure(result.probe, result.variant, result.preset, "aborted",
                                       "probe aborted by the caller", status="aborted")
        return result

    service.executor = PerPointExecutor(aborted_second)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=[700, 500, 300], settle_seconds=0)
    with caplog.at_level(logging.INFO, logger="gpuperfd.probing.scheduling.service"):
        outcome = service.run(schedule, 0)
    assert outcome.result == "aborted" and len(outcome.points) == 2
    assert "recommended cap" not in caplog.text
    assert "gpu 0 llm/gpt2: sweep interrupted after 1 of 3 points: no recommendation" in caplog.text
    assert devices[0].power_limits().enforced_watts == 680.0


def test_a_sweep_in_progress_is_kept_point_by_point_and_cleared(tmp_path):
    """service.sweeps() (the landing page's and /api/v1/gpus' sweep marker): the cap held, point k of n in the
    sweep's cap order, set when the cap is, gone once the operator's cap is back."""
    backend, devices, registry, service = make(tmp_path)
    seen = []
    service.on_cap_change = lambda gpu: seen.append(service.sweeps().get(gpu))
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["max", 500, 300], settle_seconds=0)
    assert service.run(schedule, 0).result == "ok"
    held = [(s.gpu, s.probe, s.preset, s.cap_watts, s.point, s.points) for s in seen if s is not None]
    assert held == [(0, "llm", "gpt2", 700, 1, 3), (0, "llm", "gpt2", 500, 2, 3), (0, "llm", "gpt2", 300, 3, 3)]
    assert seen[-1] is None and service.sweeps() == {}
    assert all(s.since > 0 for s in seen if s is not None)


def test_a_round_waits_in_line_for_apply_modes_turn_and_not_for_a_cap_lock_held_without_it(tmp_path):
    """Apply mode changes a cap under the GPU's turn (HolderKind.APPLY): a round that comes meanwhile waits
    in the GPU's line and runs once the turn is given back. A cap lock held without the turn is another
    process's (a CLI sweep): the round does not wait for it, the GPU is counted busy at once."""
    from gpuperfd.caps.ownership import GpuLock, safe_name
    from gpuperfd.probing.gates.turns import Holder, HolderKind, Turn

    backend, devices, registry, service = make(tmp_path)
    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=[700, 500], settle_seconds=0)
    lock = GpuLock(service.journal.state_dir, safe_name(devices[0].info().uuid))
    lock.acquire()
    try:
        started = time.monotonic()
        outcome = service.run(schedule, 0)
    finally:
        lock.release()
    assert (outcome.result, outcome.reason) == ("skipped", "busy") and time.monotonic() - started < 1.5
    assert service.turns.take(0, Holder(HolderKind.APPLY, "apply pass"), 0) is Turn.GRANTED
    threading.Timer(0.5, lambda: service.turns.release(0, wrote=True)).start()
    started = time.monotonic()
    assert service.run(schedule, 0).result == "ok"
    assert time.monotonic() - started >= 0.5 and devices[0].power_limits().enforced_watts == 680.0
