"""Boards without NVLink or NVSwitch are never judged by rules that assume them; blame of slow pairs."""

from __future__ import annotations

import threading

from gpuperfd.config import InterconnectFaultConfig
from gpuperfd.health.interconnect import findings, read_topology
from gpuperfd.probe_data.interconnect import InterconnectRequest
from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor

from simnode import Node

INTERCONNECT_CHECKS = {"fabric_not_started", "fabric_in_progress", "fabric_failed", "nvlink_links_below_topology",
                       "interconnect_below_expected", "nvlink_link_down"}


def run_probe(node: Node) -> None:
    result = SimulatedInterconnectExecutor(node.backend.interconnect, seed=2).run(
        node.gpus, InterconnectRequest(), threading.Event())
    assert result.ok
    node.monitor.interconnect_seen(result, *read_topology(node.backend, node.gpus))


def test_pcie_board_gets_no_nvlink_or_fabric_verdict(tmp_path) -> None:
    node = Node(tmp_path, gpus=4, topology="pcie",
                interconnect_faults=[InterconnectFaultConfig(kind="half_bandwidth", gpu=0, peer=1),
                                     InterconnectFaultConfig(kind="fabric", gpu="*", fabric_state="not_started")])
    node.step()
    run_probe(node)
    verdicts = node.step(61)
    fired = {r.check for v in verdicts.values() for r in v.reasons}
    assert not fired & INTERCONNECT_CHECKS, fired
    assert all(v.state == "healthy" for v in verdicts.values())


def test_nvlink_pair_gets_no_fabric_verdict_but_its_links_are_judged(tmp_path) -> None:
    node = Node(tmp_path, gpus=2, interconnect_faults=[
        InterconnectFaultConfig(kind="fabric", gpu="*", fabric_state="not_started")])
    verdicts = node.step(31)
    assert all(v.state == "healthy" for v in verdicts.values()), verdicts
    node.backend.interconnect.link_down(0, 2)
    run_probe(node)
    verdicts = node.step(61)
    for gpu in (0, 1):  # a direct pair: both ends lost the links; nobody can tell whose fault it is
        checks = {r.check for r in verdicts[gpu].reasons}
        assert {"nvlink_links_below_topology", "nvlink_link_down"} <= checks
        assert not {"fabric_not_started", "fabric_in_progress", "fabric_failed"} & checks


def test_healthy_hgx_node_is_healthy_after_a_probe(tmp_path) -> None:
    node = Node(tmp_path, gpus=8)
    node.step()
    run_probe(node)
    assert all(v.state == "healthy" for v in node.step(61).values())


def test_one_slow_gpu_is_blamed_not_its_peers() -> None:
    want = 100.0
    measured = {(a, b): (40.0 if 2 in (a, b) else 99.0, want) for a in range(4) for b in range(4) if a != b}
    assert findings(0, measured, 0.85) == []
    assert {f["peer"] for f in findings(2, measured, 0.85)} == {0, 1, 3}


def test_one_shot_judge_reads_the_checks_interconnect_run() -> None:
    """``gpuperfd check``'s judge: the same rows, fed the check's own run and topology."""
    from gpuperfd.config import SimulationConfig
    from gpuperfd.device.simulated import SimulatedBackend
    from gpuperfd.health.evaluate import GpuInputs
    from gpuperfd.health.interconnect import interconnect_inputs
    from gpuperfd.health.judge import judge

    node = SimulatedBackend(SimulationConfig(gpus=2, seed=3, interconnect_faults=[
        InterconnectFaultConfig(kind="half_bandwidth", gpu=0, peer=1)]))
    result = SimulatedInterconnectExecutor(node.interconnect, seed=3).run(
        node.devices(), InterconnectRequest(), threading.Event())
    inputs = [GpuInputs(gpu=d.index, uuid=d.info().uuid, not_probed="not probed in this test")
              for d in node.devices()]
    plain = judge(inputs, None, 1000.0)
    assert not any(r.check == "interconnect_below_expected" for v in plain for r in v.reasons)
    verdicts = judge(inputs, None, 1000.0, interconnect_inputs(result, *read_topology(node, node.devices())))
    for verdict in verdicts:
        found = [r for r in verdict.reasons if r.check == "interconnect_below_expected"]
        assert sorted(r.key for r in found) == ["0-1", "1-0"]  # both directions of the pair
        assert {(r.severity, r.action) for r in found} == {("degraded", "check_hardware")}


def test_the_monitor_takes_the_samplers_topology_reading_and_calls_no_nvml_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One NVML owner for topology reads: the sampler reads the pairs (its own thread in the daemon, here
    ``sample_once``); the monitor's evaluation takes its last reading and makes no topology call."""
    import threading

    node = Node(tmp_path, gpus=4, topology="hgx")
    callers: list[str] = []
    real = node.backend.topology

    def topology():  # type: ignore[no-untyped-def]
        callers.append(threading.current_thread().name)
        return real()

    node.backend.topology = topology  # type: ignore[method-assign]
    node.sampler.sample_once()  # the sampler's read
    assert callers and node.sampler.topology() is not None
    callers.clear()
    evaluating = threading.Thread(target=node.monitor.evaluate_once, name="health-monitor")
    evaluating.start()
    evaluating.join(30)
    assert callers == []  # no topology call from the monitor's thread
    assert node.monitor.interconnect["links"], node.monitor.interconnect  # it judges the sampler's pairs
