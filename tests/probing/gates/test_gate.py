"""The node's gate (:class:`GpuGate`): the one answer to "may this GPU be probed now", with the state it
reads (allocations, the tracker, our own load's end, the probes config a reload hands it)."""

from __future__ import annotations

import threading
import time

from gpuperfd.attribution.allocations import AllocationState, PodResourcesWatcher
from gpuperfd.attribution.podresources import ContainerDevices, ContainerResources, PodResources
from gpuperfd.config import ProbesConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.gates.gate import GpuGate
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Turn
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading


def gate(idle_seconds: float = 0.0, **probes: object) -> tuple[GpuGate, list]:
    devices = SimulatedBackend(SimulationConfig(gpus=2, seed=5)).devices()
    tracker = IdleTracker(0.05)
    for device in devices:  # the sampler has seen every GPU idle
        tracker.observe(device.index, "utilization",
                        Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    config = ProbesConfig(idle_seconds=idle_seconds, **probes)
    return GpuGate(config, tracker, threading.Event()), devices


def test_an_idle_free_gpu_passes_and_a_foreign_process_makes_it_busy() -> None:
    g, devices = gate()
    assert g.refusal(devices[0]) is None and g.claimed_now(devices[0]) is None
    devices[1].add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    assert g.refusal(devices[1])[0] == "allocated"  # a process not ours holds it, even idle
    assert g.claimed_now(devices[1]) is not None


def test_a_pod_holding_the_gpu_refuses_it_and_is_wanted_between_points(tmp_path) -> None:
    g, devices = gate()
    watcher = PodResourcesWatcher(str(tmp_path / "kubelet.sock"))
    uuid = devices[0].info().uuid
    watcher.apply([PodResources("trainer-0", "ml", (ContainerResources("c", (ContainerDevices("nvidia.com/gpu",
                                                                                             (uuid,)),)),))])
    g.allocations = watcher.state
    assert g.refusal(devices[0])[0] == "allocated"
    assert g.claimed_now(devices[0]) is not None and g.wanted(devices[0]) is not None
    assert g.refusal(devices[1]) is None and g.wanted(devices[1]) is None
    g.allocations = lambda: AllocationState(seen=True, answered=False, ok=False, reason="timeout")
    assert g.refusal(devices[1])[0] == "allocated"  # a kubelet that never answered: every GPU is someone's


def test_the_gate_reads_the_config_it_holds_now() -> None:
    g, devices = gate(idle_seconds=3600.0)
    assert g.refusal(devices[0])[0] == "not_idle"
    g.config = ProbesConfig(idle_seconds=0.0)  # what ProbeService.apply_config hands it
    assert g.refusal(devices[0]) is None


def test_a_release_with_a_load_starts_our_tail_and_one_without_does_not() -> None:
    g, devices = gate()
    turns = GpuTurns([d.index for d in devices])
    turns.listeners.append(g.released)
    holder = Holder(HolderKind.APPLY, "apply")
    assert turns.take(0, holder, 1.0) is Turn.GRANTED
    turns.release(0)  # an apply change: no load of ours
    assert g.last_load_end(0) is None
    assert turns.take(0, holder, 1.0) is Turn.GRANTED
    before = time.monotonic()
    turns.release(0, (before - 1.0, before))
    assert g.last_load_end(0) == before and g.last_load_end(1) is None
