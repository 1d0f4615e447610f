"""Collectors read their own settings; build_collectors is the one place that builds the sampler's set."""

from __future__ import annotations

from pathlib import Path

from gpuperfd.config import SimulationConfig, config_from_mapping
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.telemetry.collectors import COLLECTORS, build_collectors
from gpuperfd.telemetry.collectors.allocation import AllocationCollector
from gpuperfd.telemetry.collectors.processes import ProcessesCollector
from gpuperfd.telemetry.sampler import Sampler


def config(**sections):
    return config_from_mapping({"device": {"backend": "simulated"}, **sections}, "<test>")


def test_defaults_switch_on_every_collector_on_by_default_in_name_order():
    built = build_collectors(config())
    assert built.names == sorted(name for name, cls in COLLECTORS.items() if cls.enabled_by_default)
    assert built.xid_enabled == ("xid" in built.names)
    for collector in built.collectors:
        cls = type(collector)
        assert built.intervals[cls.name] == (cls.default_interval_seconds or 1.0)


def test_a_section_switches_a_collector_and_sets_its_interval():
    built = build_collectors(config(sampler={"interval_seconds": 2.0, "collectors": {
        "xid": {"enabled": False}, "allocation": {"enabled": False}, "pcie": {"interval_seconds": 3.0},
        "power": {"enabled": True}}}))
    assert "xid" not in built.names and not built.xid_enabled
    assert "allocation" not in built.names and built.pod_resources is None
    assert built.intervals["pcie"] == 3.0
    assert built.intervals["power"] == 2.0  # no interval of its own: the sampler's
    assert built.intervals["energy"] == COLLECTORS["energy"].default_interval_seconds


def test_attribution_collectors_take_their_options_from_their_sections(tmp_path: Path):
    built = build_collectors(config(attribution={
        "processes": {"top_n": 3, "expose_names": True, "proc_root": str(tmp_path)},
        "kubernetes": {"socket": str(tmp_path / "kubelet.sock"), "interval_seconds": 7}}))
    processes = next(c for c in built.collectors if isinstance(c, ProcessesCollector))
    assert (processes.top_n, processes.expose_names, processes.proc_root) == (3, True, tmp_path)
    allocation = next(c for c in built.collectors if isinstance(c, AllocationCollector))
    assert built.pod_resources is allocation.watcher
    assert allocation.watcher is not None and allocation.watcher.socket_path == str(tmp_path / "kubelet.sock")


def test_cap_changed_rereads_only_the_collectors_that_publish_the_cap():
    backend = SimulatedBackend(SimulationConfig(gpus=1))
    built = build_collectors(config())
    sampler = Sampler(backend, backend.devices(), built.collectors, intervals=built.intervals)
    read: list[str] = []
    sampler.listeners.append(lambda _gpu, name, _reading: read.append(name))
    sampler.cap_changed(0)
    assert read == [name for name in built.names if COLLECTORS[name].reads_power_cap] == ["power"]
