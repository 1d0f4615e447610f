"""One test per row of the check table, each through the simulator's faults, the real sampler and
the monitor; a table row without a scenario here fails test_every_row_has_a_scenario."""

from __future__ import annotations

import threading

import pytest

from gpuperfd.config import FaultConfig, InterconnectFaultConfig
from gpuperfd.health.interconnect import read_topology
from gpuperfd.probe_data.interconnect import InterconnectRequest
from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor
from gpuperfd.health.checks import CHECKS
from gpuperfd.health.monitor import HealthMonitor
from gpuperfd.health.store import HealthStore, SavedState

from simnode import Node, node  # noqa: F401 (node: the fixture)


def reasons(verdict) -> dict[str, object]:
    return {r.check: r for r in verdict.reasons}


def healthy_others(verdicts, bad: set) -> None:
    for key, verdict in verdicts.items():
        if key not in bad:
            assert verdict.state == "healthy" and verdict.reasons == [], (key, verdict.to_dict())


def scenario_xid(node: Node):
    node.backend.inject_xid(1, 79)
    v = node.step()[1]
    assert (v.state, v.action) == ("unhealthy", "reboot_node")
    assert reasons(v)["xid"].evidence["bucket"] == "RESTART_BM"
    return {1}


def scenario_gpu_recovery_action(node: Node):
    node.gpus[2].inject_recovery_action(2)
    v = node.step()[2]
    assert (v.state, v.action) == ("unhealthy", "reboot_node")
    return {2}


def scenario_ecc_uncorrectable_volatile(node: Node):
    node.gpus[0].inject_ecc(uncorrected=2)
    v = node.step()[0]
    assert (v.state, v.action) == ("unhealthy", "reset_gpu")
    assert reasons(v)["ecc_uncorrectable_volatile"].evidence["value"] == 2
    return {0}


def scenario_row_remap_pending(node: Node):
    node.gpus[3].inject_remapped_rows(uncorrectable=1, pending=True)
    v = node.step()[3]
    assert (v.state, v.action) == ("degraded", "reset_gpu")
    return {3}


def scenario_row_remap_failed(node: Node):
    node.gpus[3].inject_remapped_rows(uncorrectable=1, failure=True)
    v = node.step()[3]
    assert (v.state, v.action) == ("unhealthy", "contact_support")
    return {3}


def scenario_retired_pages(node: Node):
    node = Node(node.tmp / "a100", model="A100")
    # The simulator has no retired-page fault: feed the series as an NVML A100 would report it.
    from gpuperfd.device.base import RetiredPages

    node.gpus[0].retired_pages = lambda: RetiredPages(0, 61)  # type: ignore[method-assign]
    v = node.step()[0]
    assert (v.state, v.action) == ("unhealthy", "contact_support")
    node.gpus[0].retired_pages = lambda: RetiredPages(0, 59)  # type: ignore[method-assign]
    assert node.step()[0].state == "healthy"
    return None


def _busy_link(node: Node, **link) -> dict:
    node.gpus[1].inject_pcie_link(**link)
    verdicts = node.step()
    assert verdicts[1].state == "healthy"  # idle: the link trains down anyway, nothing to say
    node.busy(1)
    # The first busy round read the link before the utilization that showed it busy: not counted.
    for _ in range(3):
        assert node.step()[1].state == "healthy"  # fewer busy samples than busy_min_samples
    return node.step()


def scenario_pcie_generation_below_max(node: Node):
    v = _busy_link(node, generation=3)[1]
    assert (v.state, v.action) == ("degraded", "check_hardware")
    assert reasons(v)["pcie_generation_below_max"].evidence["reference"] == 5
    return {1}


def test_link_read_at_idle_is_not_counted_while_busy(node: Node):
    """Some boards train the link down at idle. A link reading from before a busy streak began
    (the collector on a longer interval, ``collectors.pcie_link.interval_seconds``, or its read
    failing meanwhile), seen beside busy utilization, says nothing about the link under load (it
    made a healthy GPU degraded in a fleet run). Only a link read during the streak counts."""
    not_due = frozenset({"pcie_link"})
    node.gpus[2].inject_pcie_link(generation=3)
    node.step()  # idle: both links read at gen 1
    node.busy(1)
    node.busy(2)
    for _ in range(6):  # busy, the link not read again yet
        verdicts = node.step(1.0, skip=not_due)
        assert verdicts[1].state == verdicts[2].state == "healthy", verdicts[1].to_dict()
    for _ in range(4):  # the link read again, under load
        verdicts = node.step(1.0)
    assert verdicts[1].state == "healthy"
    assert set(reasons(verdicts[2])) == {"pcie_generation_below_max"}
    assert reasons(verdicts[2])["pcie_generation_below_max"].evidence["busy_samples"] == 4
    node.busy(2, on=False)
    node.step(1.0)  # idle again: the streak ends; the next one does not count the idle link reading
    node.busy(2)
    verdicts = node.step(1.0, skip=not_due)
    assert reasons(verdicts[2])["pcie_generation_below_max"].evidence["busy_samples"] == 4


def scenario_pcie_width_below_max(node: Node):
    v = _busy_link(node, width=8)[1]
    assert set(reasons(v)) == {"pcie_width_below_max"}
    return {1}


def scenario_pcie_replay_rate(node: Node):
    node.step()
    for _ in range(13):
        node.gpus[2].inject_pcie_replays(5)  # 60/min
        v = node.step()[2]
    assert (v.state, v.action) == ("degraded", "check_hardware")
    return {2}


def scenario_nvlink_link_down(node: Node):
    node.gpus[0].inject_nvlink(down=[3])
    v = node.step()[0]
    assert (v.state, v.action) == ("degraded", "reset_gpu")
    assert reasons(v)["nvlink_link_down"].key == "link=3"
    return {0}


def _thermal(node: Node, check: str):
    node = Node(node.tmp / "thermal", degrade=[{"gpu": 2, "thermal_throttle": True}])
    node.busy(2)
    node.gpus[2]._temperature = 120.0  # start hot rather than wait for the simulated heat-up
    for _ in range(4):
        verdicts = node.step(30)
    if check == "clock_hw_thermal_slowdown":
        assert check in reasons(verdicts[2]), verdicts[2].to_dict()
        assert verdicts[2].state == "degraded"
        healthy_others(verdicts, {2})
        return None
    # hw_slowdown and power brake: the simulator raises them only with thermal throttling, so the
    # same generic busy_share evaluator is proven with the series a real GPU would give.
    from gpuperfd.health.evaluate import GpuInputs, busy_share
    from gpuperfd.health.checks import by_id, defaults

    reason = check.removeprefix("clock_")
    samples = [(t, {"gpuperf_clock_event_active": [({"reason": reason}, 1.0)]}) for t in range(100, 400, 10)]
    fired = busy_share(by_id()[check], GpuInputs(0, "u", busy_samples=samples), [], defaults(), 400)
    assert fired and fired[0].severity == "degraded"
    return None


def scenario_clock_hw_slowdown(node):
    return _thermal(node, "clock_hw_slowdown")


def scenario_clock_hw_thermal_slowdown(node):
    return _thermal(node, "clock_hw_thermal_slowdown")


def scenario_clock_hw_power_brake_slowdown(node):
    return _thermal(node, "clock_hw_power_brake_slowdown")


def scenario_gpu_lost(node: Node):
    node.backend.inject(FaultConfig(gpu=3, kind="gpu_lost"))
    v = node.step()[3]
    assert (v.state, v.action) == ("unhealthy", "reboot_node")
    return {3}


def scenario_gpu_missing(node: Node):
    HealthStore(node.tmp).save(SavedState("boot-1", [node.uuid(g) for g in range(4)] + ["GPU-gone"]))
    node.monitor = node.new_monitor()
    verdicts = node.step()
    v = verdicts["GPU-gone"]
    assert (v.gpu, v.state, v.action) == (None, "unhealthy", "reboot_node")
    return {"GPU-gone"}


def _baseline_runs(node: Node, gpu: int, **last) -> None:
    for g in range(4):
        for _ in range(3):
            node.run(g, rate=1000.0, energy=0.5)
    node.run(gpu, **{"rate": 1000.0, "energy": 0.5, **last})
    for g in range(4):
        if g != gpu:
            node.run(g)


def scenario_probe_throughput_baseline(node: Node):
    node.thresholds["peer_min_count"] = 99  # this scenario is about the own baseline only
    node.monitor = node.new_monitor()
    _baseline_runs(node, 1, rate=800.0)
    v = node.step()[1]
    assert set(reasons(v)) == {"probe_throughput_baseline"}
    assert reasons(v)["probe_throughput_baseline"].evidence["ratio"] == pytest.approx(0.8)
    return {1}


def scenario_probe_energy_baseline(node: Node):
    _baseline_runs(node, 2, energy=0.6)
    v = node.step()[2]
    assert set(reasons(v)) == {"probe_energy_baseline"}
    assert v.action == "check_hardware"
    return {2}


def scenario_probe_slower_than_peers(node: Node):
    node.thresholds["baseline_min_runs"] = 99  # peers only
    node.monitor = node.new_monitor()
    _baseline_runs(node, 0, rate=850.0)
    v = node.step()[0]
    assert set(reasons(v)) == {"probe_slower_than_peers"}
    return {0}


def scenario_probe_failures(node: Node):
    node.run(3)
    for reason in ("timeout", "gpu_busy", "crash", "timeout"):
        node.run(3, status="failed", reason=reason)
    v = node.step()[3]
    assert (v.state, v.action) == ("degraded", "reset_gpu")
    assert reasons(v)["probe_failures"].evidence["count"] == 3  # gpu_busy says nothing about the GPU
    return {3}


def scenario_probe_wrong_result(node: Node):
    """Silent data corruption (issue 31): one wrong answer makes the GPU unhealthy, and a later
    passing run does not clear it: a reset and a passing probe do."""
    node.run(2)
    node.run(2, status="failed", reason="wrong_result")
    v = node.step()[2]
    assert (v.state, v.action) == ("unhealthy", "contact_support")
    assert "repeat" in reasons(v)["probe_wrong_result"].message
    node.run(2)
    assert node.step()[2].state == "unhealthy"  # sticky: reset_and_probe
    return {2}


def scenario_probe_answers_differ_from_peers(node: Node):
    """Every GPU's own repeats agree, but GPU 1's answers differ from the three others'."""
    for g in range(4):
        node.run(g, fingerprint="fp-odd" if g == 1 else "fp-majority")
    v = node.step()[1]
    assert (v.state, v.action) == ("unhealthy", "contact_support")
    evidence = reasons(v)["probe_answers_differ_from_peers"].evidence
    assert (evidence["fingerprint"], evidence["majority_fingerprint"], evidence["peers"]) == ("fp-odd", "fp-majority", 3)
    return {1}


def test_two_gpus_that_disagree_name_nobody(tmp_path) -> None:
    """Without a strict majority nobody can tell which GPU is wrong: no peer reason."""
    node = Node(tmp_path, gpus=2)
    node.run(0, fingerprint="a")
    node.run(1, fingerprint="b")
    assert all(v.state == "healthy" for v in node.step().values())


def scenario_health_state_unreadable(node: Node):
    (node.tmp / "health.json").write_text("{not json")
    node.monitor = node.new_monitor()
    verdicts = node.step()
    assert all(v.state == "unknown" for v in verdicts.values())
    assert (node.tmp / "health.json.corrupt").exists()
    for g in range(4):
        node.run(g)
    assert all(v.state == "healthy" for v in node.step().values())
    return None


def _fabric(node: Node, gpu: int, state: str, status: str | None = None):
    node.backend.interconnect.inject(
        InterconnectFaultConfig(kind="fabric", gpu=gpu, fabric_state=state, fabric_status=status))
    return node.step(31)[gpu]  # the fabric collector's 30 s lane


def scenario_fabric_not_started(node: Node):
    v = _fabric(node, 1, "not_started")
    assert (v.state, v.action) == ("degraded", "restart_fabric_manager")
    return {1}


def scenario_fabric_in_progress(node: Node):
    v = _fabric(node, 2, "in_progress")
    assert (v.state, v.action) == ("degraded", "none")
    return {2}


def scenario_fabric_failed(node: Node):
    v = _fabric(node, 3, "completed", "NVML_ERROR_UNKNOWN")
    assert (v.state, v.action) == ("unhealthy", "restart_fabric_manager")
    return {3}


def scenario_nvlink_links_below_topology(node: Node):
    node.backend.interconnect.link_down(2, 3)  # HGX: three of GPU 2's links into the NVSwitches
    v = node.step(61)  # the next topology read
    assert "nvlink_links_below_topology" in reasons(v[2]) and v[2].action == "reset_gpu"
    assert reasons(v[2])["nvlink_links_below_topology"].evidence["value"] == 15
    return {2}  # its peers' pairs are short too, but GPU 2 alone is blamed


def scenario_interconnect_below_expected(node: Node):
    node.backend.interconnect.inject(InterconnectFaultConfig(kind="half_bandwidth", gpu=1, peer=3))
    result = SimulatedInterconnectExecutor(node.backend.interconnect, seed=1).run(
        node.gpus, InterconnectRequest(), threading.Event())
    node.monitor.interconnect_seen(result, *read_topology(node.backend, node.gpus))
    v = node.step()
    for gpu in (1, 3):
        assert (v[gpu].state, v[gpu].action) == ("degraded", "check_hardware")
        assert 0.45 < reasons(v[gpu])["interconnect_below_expected"].evidence["ratio"] < 0.55
    return {1, 3}


SCENARIOS = {name.removeprefix("scenario_"): fn for name, fn in globals().items() if name.startswith("scenario_")}


def test_every_row_has_a_scenario():
    assert set(SCENARIOS) == {check.id for check in CHECKS}


@pytest.mark.parametrize("check", [c.id for c in CHECKS])
def test_row(check, node):
    assert node.step()[0].state == "healthy"
    bad = SCENARIOS[check](node)
    if bad is not None:
        verdicts = node.monitor.verdicts()
        healthy_others({v.gpu if v.gpu is not None else v.uuid: v for v in verdicts}, bad)
        assert any(r.check == check for v in verdicts for r in v.reasons)


def test_gpus_left_out_by_the_selection_are_not_missing(tmp_path) -> None:
    """``device.gpus`` may select 2 of the node's 4 GPUs: the other two are not "missing"; a GPU the
    driver no longer lists at all is, whether it was selected or not."""
    node = Node(tmp_path)
    everyone = [node.uuid(g) for g in range(4)]
    HealthStore(node.tmp).save(SavedState("boot-1", everyone))
    node.sampler.devices = node.gpus[:2]  # what selected_devices() gives for device.gpus: [0, 1]
    node.monitor = HealthMonitor(node.sampler, node.tmp, node.history, node_uuids=everyone,
                                 thresholds=node.thresholds, clock=lambda: node.now, boot_id=lambda: node.boot)
    verdicts = node.step()
    assert sorted(k for k in verdicts if isinstance(k, int)) == [0, 1]
    assert not [k for k in verdicts if isinstance(k, str)], verdicts
    assert all(v.state == "healthy" for v in verdicts.values())
    node.monitor = HealthMonitor(node.sampler, node.tmp, node.history, node_uuids=everyone[:3],
                                 thresholds=node.thresholds, clock=lambda: node.now, boot_id=lambda: node.boot)
    gone = node.step()[everyone[3]]
    assert (gone.gpu, gone.state, gone.action) == (None, "unhealthy", "reboot_node")


def test_unnamed_simulated_nodes_keep_verdicts_in_memory(tmp_path) -> None:
    """A simulated node without a state file or state directory of its own writes nothing to the
    machine's default directory (its verdicts would leak into later, unrelated runs)."""
    from gpuperfd.config import Config
    from gpuperfd.daemon import health_state_dir

    simulated = Config.model_validate({"device": {"backend": "simulated"}, "simulation": {"gpus": 2}})
    assert health_state_dir(simulated) is None
    own_dir = Config.model_validate({"device": {"backend": "simulated"}, "probes": {"state_dir": str(tmp_path)}})
    assert health_state_dir(own_dir) == tmp_path
    nvml = Config.model_validate({"device": {"backend": "nvml"}})
    assert str(health_state_dir(nvml)) == "/var/lib/gpuperfd"
    store = HealthStore(None)
    store.save(SavedState("boot-1", ["GPU-a"]))
    assert store.load() == (None, None)


def test_runs_that_gave_way_to_a_users_job_change_no_verdict(node: Node):
    """A preempted run (status skipped, reason preempted) is no failure: five of them after two failed
    runs neither reach probe_failures' threshold of three nor change the GPU's verdict."""
    node.run(3)
    for _ in range(2):
        node.run(3, status="failed", reason="crash")
    before = node.step()[3]
    for _ in range(5):
        node.run(3, status="skipped", reason="preempted")
    after = node.step()[3]
    assert "probe_failures" not in reasons(after)
    assert (after.state, after.action, set(reasons(after))) == (before.state, before.action, set(reasons(before)))
    node.run(3, status="failed", reason="crash")  # the streak they did not break: a third failure fires
    assert reasons(node.step()[3])["probe_failures"].evidence["count"] == 3
