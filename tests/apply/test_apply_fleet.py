"""The proof of issue 45 on a simulated fleet: 3 nodes x 4 GPUs, each node its own probe service,
journal and apply controller. One GPU is degraded (a slow clock and wrong answers, which its own probe
points show), one has its cap changed by hand after apply, one
drifts after apply; then a reload turns one node off, one node crashes and one stops. Every cap ends
where it should, and every GPU that holds no applied cap says why."""

from __future__ import annotations

import dataclasses

from gpuperfd.caps.journal import CapJournal, restore_all
from gpuperfd.config import DegradeConfig

from simfleet import drift, make_node

DEGRADED, HAND, DRIFTS = (0, 1), (1, 2), (2, 3)  # (node, gpu)


def test_twelve_gpus_end_with_every_cap_where_it_should_be(tmp_path) -> None:  # type: ignore[no-untyped-def]
    nodes = [make_node(tmp_path / f"node-{n}", gpus=4, node=f"node-{n}",
                       degrade=[DegradeConfig(gpu=1, sm_clock_factor=0.8, wrong_results=True)] if n == 0 else [])
             for n in range(3)]
    assert len({d.info().uuid for node in nodes for d in node.devices}) == 12
    for node in nodes:
        node.sweep()
        node.controller.tick()
    caps = {(n, d.index): d.power_limits().enforced_watts for n, node in enumerate(nodes) for d in node.devices}
    applied = {key for key, watts in caps.items() if watts < 700}
    assert applied == set(caps) - {DEGRADED}  # eleven applied; the degraded GPU's own wrong answers hold it back
    assert nodes[0].controller.states[1].reason == "incorrect" and nodes[0].journal.entry(
        nodes[0].devices[1].info().uuid) is None

    nodes[HAND[0]].devices[HAND[1]].set_power_limit(600.0)  # an operator, by hand
    nodes[DRIFTS[0]].reasons[DRIFTS[1]] = [drift()]  # the drift alert's check fires after apply
    for node in nodes:
        node.sweep()  # every sweep returns to the applied cap
        node.controller.tick()
    states = {(n, i): s for n, node in enumerate(nodes) for i, s in node.controller.states.items()}
    assert states[HAND].reason == "overridden" and states[DRIFTS].reason == "rolled_back"
    assert "drift" in states[DRIFTS].detail and "600" in states[HAND].detail
    still = {key for key, s in states.items() if s.reason == "applied"}
    assert still == applied - {HAND, DRIFTS}
    for key, s in states.items():  # every GPU without an applied cap says why
        assert s.reason == "applied" or s.detail, key
    for n, node in enumerate(nodes):  # applied GPUs sit at their applied cap after the second sweep
        for index, s in node.controller.states.items():
            if s.reason == "applied":
                assert node.devices[index].power_limits().enforced_watts == s.applied_watts
                assert node.controller.states[index].operator_watts == 700.0

    # node 0: a reload turns apply off; node 1: the daemon dies (SIGKILL); node 2: it stops.
    nodes[0].controller.configure(dataclasses.replace(nodes[0].controller.settings, mode="off"))
    for state in nodes[1].controller.states.values():
        if state.hold is not None:
            state.hold.release()  # what the kernel does to a dead process's locks
    restore_all([CapJournal(nodes[1].journal.state_dir)], nodes[1].devices)  # the next start
    nodes[2].controller.stop()
    final = {(n, d.index): d.power_limits().enforced_watts for n, node in enumerate(nodes) for d in node.devices}
    assert final == {key: (600.0 if key == HAND else 700.0) for key in final}
    assert all(node.journal.entries() == [] for node in nodes)
