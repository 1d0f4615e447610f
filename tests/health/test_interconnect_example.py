"""examples/interconnect-faults.yaml shows every interconnect verdict on its simulated node."""

from __future__ import annotations

import threading
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from gpuperfd.config import config_from_mapping
from gpuperfd.probe_data.interconnect import InterconnectRequest
from gpuperfd.probing.interconnect.metrics import InterconnectMetrics, result_publisher
from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor

from simnode import Node

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "interconnect-faults.yaml"


def test_each_fault_gives_its_verdict(tmp_path) -> None:
    config = config_from_mapping(yaml.safe_load(EXAMPLE.read_text()))
    simulation = config.simulation.model_dump()
    simulation.pop("seed")
    node = Node(tmp_path, **simulation)
    publish = result_publisher(InterconnectMetrics(CollectorRegistry()), node.backend, node.gpus,
                               [node.monitor.interconnect_seen])
    node.step(31)
    publish(SimulatedInterconnectExecutor(node.backend.interconnect, seed=44).run(
        node.gpus, InterconnectRequest(), threading.Event()))
    verdicts = node.step(61)
    got = {gpu: (v.state, v.action, sorted({r.check for r in v.reasons})) for gpu, v in verdicts.items()}
    assert got == {
        0: ("healthy", "none", []),
        1: ("degraded", "restart_fabric_manager", ["fabric_not_started"]),
        2: ("degraded", "none", ["fabric_in_progress"]),
        3: ("unhealthy", "restart_fabric_manager", ["fabric_failed"]),
        4: ("healthy", "none", []),
        5: ("degraded", "reset_gpu", ["nvlink_link_down", "nvlink_links_below_topology"]),
        6: ("degraded", "check_hardware", ["interconnect_below_expected"]),
        7: ("degraded", "check_hardware", ["interconnect_below_expected"]),
    }, got
