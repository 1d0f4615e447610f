"""Apply mode in the daemon's GPU turns (issue 62): each cap change or revert waits for the GPU's turn in
line with the rounds, holds it while it changes the cap and gives it back as a write; without turns (a
controller outside the daemon) the cap lock alone guards it."""

from __future__ import annotations

import threading
import time

from gpuperfd.apply.controller import ApplyController
from gpuperfd.apply.policy import ApplySettings
from gpuperfd.caps.ownership import safe_name
from gpuperfd.probing.gates.turns import Holder, HolderKind, Release, Turn

from simfleet import drift, make_node

ROUND = Holder(HolderKind.ROUND, "a round")


def cap(node, index):  # type: ignore[no-untyped-def]
    return node.devices[index].power_limits().enforced_watts


def releases(node) -> list[Release]:  # type: ignore[no-untyped-def]
    heard: list[Release] = []
    node.service.turns.listeners.append(heard.append)
    return heard


def holders_at_writes(node) -> dict[int, list[Holder | None]]:  # type: ignore[no-untyped-def]
    """Who held each GPU's turn at each of its cap writes."""
    seen: dict[int, list[Holder | None]] = {}
    for device in node.devices:
        real = device.set_power_limit

        def write(watts: float, index: int = device.index, real=real) -> None:  # type: ignore[no-untyped-def]
            seen.setdefault(index, []).append(node.service.turns.holder(index))
            real(watts)

        device.set_power_limit = write  # type: ignore[method-assign]
    return seen


def hold_like_a_round(node, index: int):  # type: ignore[no-untyped-def]
    """GPU ``index`` held as a round holds it: its turn, then its cap lock. Returns the lock."""
    assert node.service.turns.take(index, ROUND, 0) is Turn.GRANTED
    lock = node.journal.lock(safe_name(node.devices[index].info().uuid))
    lock.acquire()
    return lock


def give_back(node, index: int, lock) -> None:  # type: ignore[no-untyped-def]
    lock.release()
    node.service.turns.release(index, (time.monotonic() - 1, time.monotonic()), wrote=True)


def test_each_change_is_made_under_the_gpus_turn_and_given_back_as_a_write(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=2)
    node.sweep()
    heard, seen = releases(node), holders_at_writes(node)
    node.controller.tick()
    assert all(node.controller.states[i].reason == "applied" and cap(node, i) < 700 for i in (0, 1))
    applying = Holder(HolderKind.APPLY, "apply pass")
    assert seen == {0: [applying], 1: [applying]}
    assert [(r.gpu, r.holder, r.load, r.wrote) for r in heard] == [(0, applying, None, True), (1, applying, None, True)]
    assert [node.service.turns.holder(i) for i in (0, 1)] == [None, None]
    node.controller.tick()  # the applied caps hold: a pass that only looks takes no turn
    assert len(heard) == 2
    node.controller.configure(ApplySettings(mode="off", probe="llm", budget_ratio=0.10))  # reverted under turns
    assert cap(node, 0) == 700.0 and seen[0][-1] == Holder(HolderKind.APPLY, "apply revert")
    assert [(r.gpu, r.holder.name) for r in heard[2:]] == [(0, "apply revert"), (1, "apply revert")]


def test_apply_modes_own_release_wakes_no_pass_but_a_rounds_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=1)
    node.sweep()
    node.controller._wake.clear()
    node.controller.tick()
    assert node.controller.states[0].reason == "applied" and not node.controller._wake.is_set()
    give_back(node, 0, hold_like_a_round(node, 0))
    assert node.controller._wake.is_set()


def test_a_round_holding_the_gpu_delays_the_change_until_it_gives_the_gpu_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """GPU 0 is held by a round: the pass changes GPU 1 at once, waits in GPU 0's line, and changes GPU 0
    as soon as the round gives it back, ahead of a round that came after it."""
    node = make_node(tmp_path, gpus=2)
    node.sweep()
    lock = hold_like_a_round(node, 0)
    passing = threading.Thread(target=node.controller.tick)
    passing.start()
    deadline = time.monotonic() + 10
    while node.controller.states[1].reason != "applied" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert node.controller.states[1].reason == "applied" and cap(node, 0) == 700.0 and passing.is_alive()
    order: list[str] = []

    def later_round() -> None:
        assert node.service.turns.take(0, Holder(HolderKind.ROUND, "later"), 10) is Turn.GRANTED
        order.append(f"later saw {cap(node, 0):.0f} W")
        node.service.turns.release(0)

    later = threading.Thread(target=later_round)
    later.start()
    time.sleep(0.2)  # the later round queues behind the pass
    assert cap(node, 0) == 700.0  # still the round's: nothing changed under it
    give_back(node, 0, lock)
    passing.join(10)
    later.join(10)
    applied = node.controller.states[0].applied_watts
    assert node.controller.states[0].reason == "applied" and applied is not None and cap(node, 0) == applied
    assert order == [f"later saw {applied:.0f} W"]


def test_a_pass_stops_waiting_for_a_held_gpu_when_the_next_pass_is_due(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=2)
    node.sweep()
    node.controller.interval_seconds = 0.3
    lock = hold_like_a_round(node, 0)
    try:
        started = time.monotonic()
        node.controller.tick()
        took = time.monotonic() - started
        assert 0.3 <= took < 5 and cap(node, 0) == 700.0 and node.controller.states[1].reason == "applied"
        assert not node.service.turns.queued(0)  # it left GPU 0's line
    finally:
        give_back(node, 0, lock)
    node.controller.tick()
    assert node.controller.states[0].reason == "applied"


def test_a_reload_does_not_wait_out_a_pass_waiting_for_a_round(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=1)
    node.sweep()
    node.controller.interval_seconds = 60
    lock = hold_like_a_round(node, 0)
    try:
        passing = threading.Thread(target=node.controller.tick)
        passing.start()
        deadline = time.monotonic() + 10
        while not node.service.turns.queued(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        node.controller.configure(ApplySettings(mode="advise", probe="llm", budget_ratio=0.10))
        assert time.monotonic() - started < 5
        passing.join(5)
        assert not passing.is_alive() and cap(node, 0) == 700.0
    finally:
        give_back(node, 0, lock)


def test_off_and_advise_take_no_turn(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for mode in ("off", "advise"):
        node = make_node(tmp_path / mode, gpus=2, settings=ApplySettings(mode=mode, probe="llm", budget_ratio=0.10))
        node.sweep()
        heard = releases(node)
        lock = hold_like_a_round(node, 0)  # a round holding a GPU costs these modes' pass nothing
        try:
            started = time.monotonic()
            node.controller.tick()
            assert time.monotonic() - started < 5
        finally:
            give_back(node, 0, lock)
        node.controller.tick()
        assert [r.holder.kind for r in heard] == [HolderKind.ROUND] and cap(node, 1) == 700.0
        reasons = {node.controller.states[i].reason for i in (0, 1)}
        assert reasons == {mode}, reasons


def test_a_controller_without_turns_applies_and_reverts_under_the_cap_lock_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=2)
    standalone = ApplyController(node.controller.settings, node.devices, node.journal, verdicts=node.verdicts,
                                 idle=lambda i: True, held_caps=node.service.held_caps)
    assert standalone.turns is None
    node.service.point_listeners.append(standalone.observe)
    node.sweep()
    heard = releases(node)
    standalone.tick()
    assert all(standalone.states[i].reason == "applied" and cap(node, i) < 700 for i in (0, 1))
    lock = node.journal.lock(safe_name(node.devices[0].info().uuid))
    lock.acquire()  # a writer of another process: its GPU is left to the next pass
    try:
        node.reasons[0] = node.reasons[1] = [drift()]
        standalone.tick()
    finally:
        lock.release()
    assert standalone.states[0].reason == "applied" and standalone.states[1].reason == "rolled_back"
    assert standalone.revert_all() and cap(node, 0) == 700.0 and cap(node, 1) == 700.0
    assert heard == []  # never a turn

