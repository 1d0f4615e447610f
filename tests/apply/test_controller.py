"""apply/controller.py on simulated GPUs swept by the real probe service, with the real journal."""

from __future__ import annotations

import dataclasses
import threading
import time

from gpuperfd.commands.apply import revert
from gpuperfd.apply.policy import ApplySettings
from gpuperfd.caps.journal import CapJournal, restore_all
from gpuperfd.config import FaultConfig
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.result import ProbeResult

from simfleet import SCHEDULE, drift, make_node


def entry(node, index):  # type: ignore[no-untyped-def]
    return node.journal.entry(node.devices[index].info().uuid)


def cap(node, index):  # type: ignore[no-untyped-def]
    return node.devices[index].power_limits().enforced_watts


def applied_node(tmp_path, gpus=2, **kw):  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=gpus, **kw)
    node.sweep()
    node.controller.tick()
    return node


def test_applies_the_recommended_cap_journaling_the_operators_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    uuid = node.devices[0].info().uuid
    state = node.controller.states[0]
    assert state.reason == "applied" and cap(node, 0) == state.applied_watts < 700
    record = entry(node, 0)
    assert record.original_watts == 700.0 and record.applied_watts == state.applied_watts
    assert node.sample("gpuperf_apply_cap_watts", gpu="0", uuid=uuid) == state.applied_watts
    assert node.sample("gpuperf_apply_operator_cap_watts", gpu="0", uuid=uuid) == 700.0
    assert node.sample("gpuperf_apply_state", gpu="0", uuid=uuid, reason="applied") == 1
    # the daemon holds the apply lock: restore-caps and another start leave the live cap alone
    assert restore_all([node.journal], node.devices) == [] and cap(node, 0) == state.applied_watts


def test_a_sweep_on_an_applied_gpu_returns_to_the_applied_cap_and_measures_savings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    applied = node.controller.states[0].applied_watts
    node.sweep()
    assert cap(node, 0) == applied and entry(node, 0).original_watts == 700.0  # operator's cap still journaled
    uuid = node.devices[0].info().uuid
    assert node.service.metrics.original_cap.labels("0", uuid)._value.get() == 700.0  # not the applied cap
    node.controller.tick()
    labels = {"gpu": "0", "uuid": uuid, "probe": "llm", "preset": "gpt2"}
    assert node.sample("gpuperf_apply_realized_power_saved_watts", **labels) > 50
    assert 0 < node.sample("gpuperf_apply_realized_energy_saving_ratio", **labels) < 0.6
    assert node.sample("gpuperf_apply_realized_throughput_loss_ratio", **labels) <= 0.10
    assert node.controller.states[0].reason == "applied"


def test_a_cap_someone_else_set_is_never_fought(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    node.devices[0].set_power_limit(650.0)  # the operator, by hand
    node.controller.tick()
    state, uuid = node.controller.states[0], node.devices[0].info().uuid
    assert state.reason == "overridden" and state.overridden and cap(node, 0) == 650.0
    assert entry(node, 0) is None  # no later start puts 700 W over their choice
    assert node.sample("gpuperf_apply_overridden", gpu="0", uuid=uuid) == 1
    node.sweep()
    node.controller.tick()
    assert cap(node, 0) == 650.0 and state.reason == "overridden"  # it stays out of apply mode
    assert restore_all([node.journal], node.devices) == [] and cap(node, 0) == 650.0
    assert node.controller.states[1].reason == "applied"  # the other GPU is not affected


def test_a_cap_a_sweep_could_not_put_back_is_rolled_back_not_taken_for_an_operators(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A sweep on an applied GPU whose last step (back to the applied cap) fails leaves a sweep point's
    cap; apply mode must not read it as an override and forget the operator's cap."""
    node = applied_node(tmp_path)
    device, applied = node.devices[0], node.controller.states[0].applied_watts
    real_set, asked = device.set_power_limit, []

    def set_power_limit(watts: float) -> None:
        asked.append(watts)
        if watts == applied:  # the sweep's way back to the applied cap
            raise DeviceError("the driver refused the cap (injected)")
        real_set(watts)

    device.set_power_limit = set_power_limit  # type: ignore[method-assign]
    node.service.run(SCHEDULE.model_copy(update={"caps": ["max", 600]}), 0)  # ends above the applied cap
    left = cap(node, 0)
    assert asked == [700.0, 600.0, applied] and left == 600.0
    assert entry(node, 0).sweep_unrestored and entry(node, 0).original_watts == 700.0
    device.set_power_limit = real_set  # type: ignore[method-assign]
    node.controller.tick()
    state, uuid = node.controller.states[0], device.info().uuid
    assert cap(node, 0) == 700.0 and entry(node, 0) is None  # the operator's cap, read back, then cleared
    assert state.reason == "rolled_back" and not state.overridden and state.detail.startswith("sweep_unrestored")
    assert f"reads {left:.0f} W" in state.detail
    assert node.sample("gpuperf_apply_rollbacks_total", gpu="0", uuid=uuid, reason="sweep_unrestored") == 1
    assert node.sample("gpuperf_apply_overridden", gpu="0", uuid=uuid) == 0


def test_a_failed_way_back_that_left_the_applied_cap_is_forgotten_so_the_operator_still_wins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sweep's last point was the applied cap itself, so the way back has nothing to write (the rule
    reads the cap first: issue 51) and nothing is marked; an operator's later cap is theirs (left alone,
    not rolled over)."""
    node = applied_node(tmp_path)
    device, applied = node.devices[0], node.controller.states[0].applied_watts
    real_set = device.set_power_limit
    calls = []

    def set_power_limit(watts: float) -> None:
        calls.append(watts)
        if len(calls) > 1 and calls[-2] == watts == applied:  # the last point, then the way back to it
            raise DeviceError("the driver refused the cap (injected)")
        real_set(watts)

    device.set_power_limit = set_power_limit  # type: ignore[method-assign]
    node.service.run(SCHEDULE.model_copy(update={"caps": ["max", applied]}), 0)
    device.set_power_limit = real_set  # type: ignore[method-assign]
    assert cap(node, 0) == applied and not entry(node, 0).sweep_unrestored
    assert calls.count(applied) == 1  # the way back wrote nothing: the board already read the applied cap
    node.controller.tick()
    assert node.controller.states[0].reason == "applied" and not entry(node, 0).sweep_unrestored
    device.set_power_limit(650.0)  # the operator, by hand
    node.controller.tick()
    assert node.controller.states[0].reason == "overridden" and cap(node, 0) == 650.0


def test_a_round_that_ends_gives_the_controller_its_turn_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On GPUs swept back to back, a pass every interval_seconds could miss every gap between rounds:
    the end of a round wakes the controller, which takes the cap lock before the next round does."""
    node = make_node(tmp_path, gpus=1)
    node.service.turns.listeners.append(node.controller.gpu_released)
    node.controller.start(interval_seconds=3600)  # no timed pass within this test
    try:
        node.sweep()  # the round ends: the recommendation is there and the GPU is free
        deadline = time.monotonic() + 10
        while node.controller.states[0].reason != "applied" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.controller.states[0].reason == "applied" and cap(node, 0) < 700.0
    finally:
        node.controller.stop()
    assert cap(node, 0) == 700.0  # stop gives the operator's cap back


def test_drift_rolls_back_to_the_operators_cap_and_says_why(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    node.reasons[1] = [drift()]
    node.controller.tick()
    state, uuid = node.controller.states[1], node.devices[1].info().uuid
    assert cap(node, 1) == 700.0 and entry(node, 1) is None
    assert state.reason == "rolled_back" and "drift" in state.detail and "probe_throughput_baseline" in state.detail
    assert node.sample("gpuperf_apply_rollbacks_total", gpu="1", uuid=uuid, reason="drift") == 1
    assert node.sample("gpuperf_apply_cap_watts", gpu="1", uuid=uuid) is None
    node.reasons.clear()
    node.sweep()
    node.controller.tick()
    assert cap(node, 1) == 700.0  # no flapping: out until the mode changes
    node.controller.configure(dataclasses.replace(node.controller.settings, mode="canary", canary_gpus=(0, 1)))
    node.controller.tick()
    assert cap(node, 1) < 700.0  # a new mode lets it try again


def _at_applied(node, index, **result) -> SweepPoint:  # type: ignore[no-untyped-def]
    state = node.controller.states[index]
    base = dict(probe="llm", variant="simulated", preset="gpt2", measured_seconds=1.0, started_at=state.applied_at + 1)
    return SweepPoint(state.applied_watts, ProbeResult(**{**base, **result}))


def test_a_failed_probe_or_a_loss_over_budget_at_the_applied_cap_rolls_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    node.controller.observe(0, "llm", "gpt2", _at_applied(node, 0, status="failed", failure_reason="cuda_error"))
    top = max(node.controller.book.of(1), key=lambda p: p.cap_watts).result
    slow = top.units_of_work / top.measured_seconds * 0.8  # 20% slower than the operator's cap: budget is 10%
    node.controller.observe(1, "llm", "gpt2", _at_applied(node, 1, units_of_work=slow, average_power_watts=300.0,
                                                          energy_per_unit_joules=300.0 / slow))
    node.controller.tick()
    assert [cap(node, i) for i in (0, 1)] == [700.0, 700.0]
    assert node.controller.states[0].detail.startswith("probe_failed")
    assert node.controller.states[1].detail.startswith("over_budget")
    assert node.journal.entries() == []


def test_advise_publishes_what_it_would_set_and_changes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=2, settings=ApplySettings(mode="advise", probe="llm", budget_ratio=0.10))
    node.sweep()
    node.controller.tick()
    uuid = node.devices[0].info().uuid
    assert cap(node, 0) == 700.0 and node.journal.entries() == []
    assert node.controller.states[0].reason == "advise"
    assert 200 <= node.sample("gpuperf_apply_advised_cap_watts", gpu="0", uuid=uuid) < 700
    assert node.sample("gpuperf_apply_cap_watts", gpu="0", uuid=uuid) is None
    assert node.sample("gpuperf_apply_info", mode="advise", workload="llm") == 1


def test_busy_gpu_and_unsupported_caps_change_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=2, faults=[FaultConfig(gpu=1, call="power_limits", kind="not_supported")])
    node.sweep()
    node.idle[0] = False
    node.controller.tick()
    assert node.controller.states[0].reason == "busy" and cap(node, 0) == 700.0
    assert node.controller.states[1].reason == "not_supported"
    assert node.journal.entries() == []


def test_stop_and_mode_off_restore_every_operator_cap_read_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path, gpus=3)
    node.controller.configure(dataclasses.replace(node.controller.settings, mode="canary", canary_gpus=(0, 1)))
    assert cap(node, 2) == 700.0 and "mode" in node.controller.states[2].detail  # left the canary
    assert cap(node, 0) < 700.0
    done = node.controller.stop()
    assert len(done) == 2 and all("back" in line for line in done)
    assert [cap(node, i) for i in range(3)] == [700.0] * 3 and node.journal.entries() == []


def test_a_crash_while_applied_is_undone_by_the_journal_at_the_next_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    for state in node.controller.states.values():
        state.hold.release()  # the kernel drops the daemon's locks when it dies (SIGKILL)
    actions = restore_all([CapJournal(node.journal.state_dir)], node.devices)
    assert len(actions) == 2 and [cap(node, i) for i in (0, 1)] == [700.0, 700.0]
    assert node.journal.entries() == []


def test_revert_from_the_command_line_while_the_daemon_holds_the_cap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    results = revert([node.journal], node.devices)
    assert [r.ok for r in results] == [True, True] and all("the board reads 700 W" in r.words for r in results)
    assert node.journal.entries() == [] and [cap(node, i) for i in (0, 1)] == [700.0, 700.0]
    node.controller.tick()  # the daemon sees its cap changed and leaves the GPUs alone
    # ... quietly: the operator's own revert is no override (issue 51: no alert for it, no rollback counted)
    states = node.controller.states.values()
    assert {s.reason for s in states} == {"rolled_back"} and not any(s.overridden for s in states)
    assert all(s.detail.startswith("reverted:") and s.applied_watts is None for s in states)
    uuid = node.devices[0].info().uuid
    assert node.sample("gpuperf_apply_overridden", gpu="0", uuid=uuid) == 0
    assert not node.sample("gpuperf_apply_rollbacks_total", gpu="0", uuid=uuid, reason="stopped")
    assert [cap(node, i) for i in (0, 1)] == [700.0, 700.0]


def test_a_cap_not_reverted_at_stop_is_left_to_the_daemons_journal_pass(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuperfd.caps.ownership import GpuLock

    node = applied_node(tmp_path)
    uuid = node.devices[0].info().uuid
    other = GpuLock(node.journal.state_dir, uuid)  # a stuck owner of GPU 0's cap (same name form: no specials)
    other.acquire()
    try:
        done = node.controller.stop()
        assert any("gpu 0: not reverted now" in line for line in done) and cap(node, 1) == 700.0
        assert cap(node, 0) < 700.0 and node.controller.states[0].hold is None  # the apply lock is let go
    finally:
        other.release()
    assert restore_all([node.journal], node.devices) and cap(node, 0) == 700.0 and node.journal.entries() == []


def test_a_lost_gpu_keeps_its_applied_cap_journaled_and_the_pass_goes_on(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    node = applied_node(tmp_path)
    node.devices[0].inject(FaultConfig(gpu=0, call="power_limits", kind="gpu_lost"))
    node.controller.tick()
    assert entry(node, 0).applied_watts == node.controller.states[0].applied_watts  # kept for the next start
    assert node.controller.states[1].reason == "applied" and "Traceback" not in caplog.text


def test_a_board_that_refuses_the_cap_changes_nothing_and_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=2)
    node.sweep()
    node.devices[1].inject(FaultConfig(gpu=1, call="set_power_limit", kind="not_supported"))
    node.controller.tick()
    state = node.controller.states[1]
    assert state.reason == "not_supported" and "failed_to_apply" in state.detail and state.hold is None
    assert cap(node, 1) == 700.0 and entry(node, 1) is None and node.controller.states[0].reason == "applied"
    node.controller.tick()
    assert state.reason == "not_supported" and entry(node, 1) is None  # not tried again


def test_current_in_a_sweep_under_apply_is_the_operators_cap_so_savings_are_measured(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuperfd.config import ScheduleConfig

    schedule = ScheduleConfig(probe="llm", interval_seconds=60, caps=["current", 500, 400, 300], settle_seconds=0)
    node = make_node(tmp_path, gpus=1, initial_power_limits={0: 650.0})
    node.sweep(schedule)
    node.controller.tick()
    applied = node.controller.states[0].applied_watts
    assert applied < 650 and entry(node, 0).original_watts == 650.0
    node.sweep(schedule)  # "current" is the operator's 650 W, not the applied cap
    caps = {round(p.cap_watts) for p in node.controller.book.of(0)
            if p.result.started_at >= node.controller.states[0].applied_at}
    assert 650 in caps and cap(node, 0) == applied
    node.controller.tick()
    uuid = node.devices[0].info().uuid
    assert node.sample("gpuperf_apply_realized_power_saved_watts", gpu="0", uuid=uuid, probe="llm", preset="gpt2") > 0


def test_the_busy_guard_is_read_at_the_write_and_a_job_that_arrives_rolls_the_cap_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 51: a job that started while the idle tracker still said idle got a cap applied under it. The
    guard is read live under the GPU's lock at the write (a foreign process, a pod), and a job that arrives
    after the write gives the operator's cap back at the controller's next pass (allow_busy: false)."""
    node = make_node(tmp_path, gpus=2)
    node.sweep()
    node.devices[0].add_foreign_process(4242, 1 << 30)  # the tracker has not seen it: node.idle says idle
    node.controller.tick()
    state0, state1 = node.controller.states[0], node.controller.states[1]
    assert state0.reason == "busy" and "4242" in state0.detail and cap(node, 0) == 700.0 and entry(node, 0) is None
    assert state1.reason == "applied" and cap(node, 1) == state1.applied_watts < 700.0
    node.devices[1].add_foreign_process(4343, 1 << 30)  # a job arrives after the write
    node.controller.tick()
    uuid = node.devices[1].info().uuid
    assert cap(node, 1) == 700.0 and entry(node, 1) is None
    assert state1.reason == "rolled_back" and state1.detail.startswith("busy") and "4343" in state1.detail
    assert node.sample("gpuperf_apply_rollbacks_total", gpu="1", uuid=uuid, reason="busy") == 1
    node.devices[0].remove_foreign_process(4242)
    node.devices[1].remove_foreign_process(4343)
    node.controller.tick()
    assert state0.reason == "applied" and cap(node, 0) < 700.0  # applied once idle
    assert state1.reason == "applied" and cap(node, 1) < 700.0  # a busy rollback does not keep it out


def test_allow_busy_applies_and_keeps_the_cap_under_a_users_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = make_node(tmp_path, gpus=1, settings=ApplySettings(mode="on", probe="llm", budget_ratio=0.10,
                                                              allow_busy=True))
    node.sweep()
    node.devices[0].add_foreign_process(4242, 1 << 30)
    node.controller.tick()
    node.controller.tick()
    assert node.controller.states[0].reason == "applied" and cap(node, 0) < 700.0


def test_the_operators_own_cap_set_back_by_hand_leaves_apply_mode_without_an_alert(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 51: the operator's own revert raised the override alert. By hand (no CLI), the cap reads the
    journaled operator's cap again: the GPU leaves apply mode quietly and the decision is journaled."""
    node = applied_node(tmp_path)
    node.devices[0].set_power_limit(700.0)  # the operator's own cap, by hand
    node.controller.tick()
    state, uuid = node.controller.states[0], node.devices[0].info().uuid
    assert state.reason == "rolled_back" and state.detail.startswith("reverted:") and not state.overridden
    assert node.sample("gpuperf_apply_overridden", gpu="0", uuid=uuid) == 0
    assert all(node.sample("gpuperf_apply_rollbacks_total", gpu="0", uuid=uuid, reason=r) == 0
               for r in ("sweep_unrestored", "stopped"))
    assert entry(node, 0) is None and cap(node, 0) == 700.0
    assert any(d["believed"] == "operator" and d["detail"].startswith("reverted") for d in node.journal.decisions())


def test_an_unchanged_pass_renders_nothing_and_a_change_renders_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The scrape re-renders the apply registry when its version moves (telemetry/exporter.py): a pass that
    changes no series (the applied cap held, advise's or a held-back GPU's state unchanged) moves nothing."""
    node = applied_node(tmp_path, gpus=2)
    node.controller.tick()  # the realized savings of the points seen: published once
    before = node.metrics.version()
    text = node.metrics.registry.get_sample_value
    shown = text("gpuperf_apply_cap_watts", {"gpu": "0", "uuid": node.devices[0].info().uuid})
    for _ in range(3):
        node.controller.tick()
    assert node.metrics.version() == before
    assert text("gpuperf_apply_cap_watts", {"gpu": "0", "uuid": node.devices[0].info().uuid}) == shown
    node.reasons[1] = [drift()]  # a change: GPU 1 rolls back, its series change, the version moves
    node.controller.tick()
    moved = node.metrics.version()
    assert moved > before and node.controller.states[1].reason == "rolled_back"
    node.controller.tick()
    assert node.metrics.version() == moved


def test_a_probe_round_does_not_wait_for_a_pass_that_changes_no_cap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A pass that only looks (the applied cap holds) takes no cap lock: a round that starts during it
    runs at once instead of finding the lock held and giving up with ``busy``."""
    node = applied_node(tmp_path, gpus=1)
    applied = node.controller.states[0].applied_watts
    in_pass, go_on = threading.Event(), threading.Event()
    verdicts = node.controller.verdicts

    def slow_verdicts():  # type: ignore[no-untyped-def]
        in_pass.set()  # the pass is under way (it reads the verdict after the cap and the journal)
        go_on.wait(30)
        return verdicts()

    node.controller.verdicts = slow_verdicts
    passing = threading.Thread(target=node.controller.tick)
    passing.start()
    try:
        assert in_pass.wait(10)
        outcome = node.service.run(SCHEDULE, 0)
    finally:
        go_on.set()
        passing.join(10)
    assert (outcome.result, outcome.reason) == ("ok", ""), outcome
    assert node.controller.states[0].reason == "applied" and cap(node, 0) == applied


def test_a_pass_with_a_change_due_takes_the_cap_lock_and_waits_for_a_round(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The look hands a change (here a rollback) to a pass under the GPU's cap lock: while a writer holds
    it, nothing is changed and the state so far stays published; the next pass rolls back."""
    node = applied_node(tmp_path, gpus=1)
    node.reasons[0] = [drift()]
    from gpuperfd.caps.ownership import safe_name
    lock = node.journal.lock(safe_name(node.devices[0].info().uuid))
    lock.acquire()
    try:
        node.controller.tick()
        assert node.controller.states[0].reason == "applied" and entry(node, 0) is not None
    finally:
        lock.release()
    node.controller.tick()
    assert node.controller.states[0].reason == "rolled_back" and cap(node, 0) == 700.0


def restarted(node):  # type: ignore[no-untyped-def]
    """A new controller on the same boards and state directory: what the daemon's next start builds."""
    from gpuperfd.apply.controller import ApplyController

    controller = ApplyController(node.controller.settings, node.devices, node.journal, verdicts=node.verdicts,
                                 idle=lambda i: True, metrics=node.metrics, held_caps=node.service.held_caps)
    node.service.point_listeners.append(controller.observe)
    node.controller = controller
    return node


def test_an_operators_cap_holds_across_a_restart_until_given_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 61: a new controller (the next start) applied over the operator's hand-set cap again."""
    from gpuperfd.caps.holds import NoSuchGpu, NotHeld, holds_in

    node = applied_node(tmp_path)
    node.devices[0].set_power_limit(650.0)  # the operator, by hand
    node.controller.tick()
    assert node.controller.states[0].reason == "overridden"
    node.controller.stop()
    [hold] = holds_in([node.journal.state_dir])
    assert (hold.gpu_index, hold.watts, hold.uuid) == (0, 650.0, node.devices[0].info().uuid) and hold.since > 0
    restarted(node)
    node.sweep()
    node.controller.tick()
    state = node.controller.states[0]
    assert cap(node, 0) == 650.0 and state.reason == "overridden" and state.applied_watts is None
    assert "held until given back (gpuperfd apply --release 0" in state.detail
    assert node.controller.states[1].reason == "applied"
    node.controller.configure(dataclasses.replace(node.controller.settings, budget_ratio=0.2))  # a reload
    node.controller.tick()
    assert cap(node, 0) == 650.0 and state.reason == "overridden"
    for bad, error, words in ((7, NoSuchGpu, "GPU 7 does not exist on this node (its GPUs: 0, 1)"),
                              (1, NotHeld, "GPU 1 is not held by an operator")):
        try:
            node.controller.release(bad)
        except error as exc:
            assert words in str(exc)
        else:
            raise AssertionError(f"release({bad}) passed")
    assert node.controller.release(0).watts == 650.0 and holds_in([node.journal.state_dir]) == []
    node.controller.tick()
    assert state.reason == "applied" and cap(node, 0) == state.applied_watts < 650.0
    assert state.held_since is None and not state.overridden


def test_the_operators_own_cap_set_back_by_hand_is_held_quietly_across_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 61: the operator's own cap set back by hand is their word too (kept until given back), and
    stays as quiet as when the GPU left (no override alert) in this process and the next."""
    from gpuperfd.caps.holds import holds_in

    node = applied_node(tmp_path)
    node.devices[0].set_power_limit(700.0)  # the operator's own cap, by hand
    for _ in range(2):
        node.controller.tick()
    state, uuid = node.controller.states[0], node.devices[0].info().uuid
    assert state.reason == "rolled_back" and state.detail.startswith("reverted:") and not state.overridden
    assert [h.kind for h in holds_in([node.journal.state_dir])] == ["reverted"]
    node.controller.stop()
    restarted(node)
    node.sweep()
    node.controller.tick()
    state = node.controller.states[0]
    assert state.reason == "rolled_back" and "held until given back" in state.detail and cap(node, 0) == 700.0
    assert node.sample("gpuperf_apply_overridden", gpu="0", uuid=uuid) == 0
    node.controller.release(0)
    node.controller.tick()
    assert state.reason == "applied" and cap(node, 0) < 700.0
