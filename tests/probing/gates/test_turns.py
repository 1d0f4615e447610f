"""GpuTurns: one holder per GPU, claimants served one at a time in arrival order, releases heard."""

from __future__ import annotations

import threading
import time

import pytest

from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Release, Turn

ROUND = Holder(HolderKind.ROUND, "round")
SET_01 = Holder(HolderKind.INTERCONNECT, "0,1")


def queued(turns: GpuTurns, gpu: int, count: int) -> None:
    """Until ``count`` claimants queue for ``gpu`` (a state, not a race)."""
    deadline = time.monotonic() + 10
    while len(turns._slots[gpu].queue) < count and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(turns._slots[gpu].queue) == count


def queued_for_node(turns: GpuTurns) -> None:
    deadline = time.monotonic() + 10
    while not turns._node.queue and time.monotonic() < deadline:
        time.sleep(0.005)


def claim(turns: GpuTurns, gpu: int, holder: Holder, served: list[str], hold: float = 0.05) -> threading.Thread:
    """A claimant that takes ``gpu``, records its name, holds it ``hold`` s, and gives it back."""

    def run() -> None:
        assert turns.take(gpu, holder, 10) is Turn.GRANTED
        served.append(holder.name)
        time.sleep(hold)
        turns.release(gpu)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_holder_says_who_holds_each_gpu() -> None:
    turns = GpuTurns([0, 1, 2])
    assert turns.take(1, SET_01, 0) is Turn.GRANTED
    assert [turns.holder(g) for g in (0, 1, 2)] == [None, SET_01, None]
    turns.release(1)
    assert turns.holder(1) is None


def test_claimants_of_one_gpu_are_served_one_at_a_time_in_arrival_order() -> None:
    turns = GpuTurns([0])
    assert turns.take(0, Holder(HolderKind.INTERCONNECT, "first"), 0) is Turn.GRANTED
    served: list[str] = []
    threads = []
    for count, name in enumerate(("a", "b", "c", "d"), 1):
        threads.append(claim(turns, 0, Holder(HolderKind.ROUND, name), served))
        queued(turns, 0, count)  # each queues before the next arrives
    assert served == [] and turns.holder(0) == Holder(HolderKind.INTERCONNECT, "first")
    turns.release(0)
    for thread in threads:
        thread.join(10)
    assert served == ["a", "b", "c", "d"]


def test_a_release_hands_the_gpu_to_the_next_and_never_two_at_once() -> None:
    turns = GpuTurns([0])
    inside, most = [0], [0]
    lock = threading.Lock()

    def run() -> None:
        assert turns.take(0, ROUND, 10) is Turn.GRANTED
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        with lock:
            inside[0] -= 1
        turns.release(0)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most[0] == 1 and turns.holder(0) is None


def test_an_interconnect_run_on_gpus_0_1_blocks_a_round_on_gpu_1_not_on_gpu_2() -> None:
    turns = GpuTurns([0, 1, 2])
    for gpu in (0, 1):
        assert turns.take(gpu, SET_01, 0) is Turn.GRANTED
    started = time.monotonic()
    assert turns.take(1, ROUND, 0.2) is Turn.TIMEOUT
    assert time.monotonic() - started >= 0.2
    assert turns.take(2, ROUND, 0) is Turn.GRANTED
    assert turns.holder(1) == SET_01 and turns.holder(2) == ROUND
    turns.release(1)
    assert turns.take(1, ROUND, 0) is Turn.GRANTED


def test_a_waiter_whose_served_check_comes_true_leaves_the_queue_at_a_nudge() -> None:
    turns = GpuTurns([0])
    assert turns.take(0, ROUND, 0) is Turn.GRANTED
    done = threading.Event()
    got: list[Turn] = []
    thread = threading.Thread(target=lambda: got.append(turns.take(0, Holder(HolderKind.ROUND, "b"), 10, done.is_set)))
    thread.start()
    queued(turns, 0, 1)
    done.set()
    turns.nudge()
    thread.join(5)
    assert got == [Turn.SERVED] and turns.holder(0) == ROUND


def test_a_timed_out_head_lets_the_next_in_line_have_the_gpu() -> None:
    turns = GpuTurns([0])
    assert turns.take(0, ROUND, 0) is Turn.GRANTED
    results: dict[str, Turn] = {}
    first = threading.Thread(target=lambda: results.__setitem__("short", turns.take(0, Holder(HolderKind.ROUND, "s"), 0.1)))
    first.start()
    queued(turns, 0, 1)
    second = threading.Thread(target=lambda: results.__setitem__("long", turns.take(0, Holder(HolderKind.ROUND, "l"), 10)))
    second.start()
    first.join(5)
    turns.release(0)
    second.join(5)
    assert results == {"short": Turn.TIMEOUT, "long": Turn.GRANTED}


def test_listeners_hear_a_release_before_the_next_holder_gets_the_gpu() -> None:
    turns = GpuTurns([0])
    heard: list[tuple[Release, Holder | None]] = []
    turns.listeners.append(lambda done: heard.append((done, turns.holder(0))))
    assert turns.take(0, SET_01, 0) is Turn.GRANTED
    turns.release(0, (12.5, 20.0), wrote=True)
    done, holder_then = heard[0]
    assert (done.gpu, done.holder, done.load, done.wrote) == (0, SET_01, (12.5, 20.0), True)
    assert holder_then == SET_01  # still held while the listeners run: the next holder's gate sees our tail


def test_the_node_turn_serves_one_at_a_time_and_gives_up_when_told_to_stop() -> None:
    turns = GpuTurns([0, 1])
    assert turns.take_node(ROUND, 0)
    assert not turns.take_node(ROUND, 0.05)
    stop = threading.Event()
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(turns.take_node(ROUND, 30, stop.is_set)))
    thread.start()
    queued_for_node(turns)
    stop.set()
    turns.nudge()
    thread.join(5)
    assert got == [False]
    turns.release_node()
    assert turns.take_node(ROUND, 0)


def test_wait_released_waits_for_every_holder() -> None:
    turns = GpuTurns([0, 1])
    assert turns.wait_released(0)
    assert turns.take(1, ROUND, 0) is Turn.GRANTED
    assert not turns.wait_released(0.05)
    threading.Timer(0.1, lambda: turns.release(1)).start()
    assert turns.wait_released(5)


def test_releasing_a_gpu_nobody_holds_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        GpuTurns([0]).release(0)


APPLY = Holder(HolderKind.APPLY, "apply pass")


def test_an_apply_change_waits_in_arrival_order_with_the_rounds() -> None:
    """Apply mode's change is one more claimant in the GPU's line: after the round that came first,
    before the round that came after it."""
    turns = GpuTurns([0])
    assert turns.take(0, ROUND, 0) is Turn.GRANTED
    served: list[str] = []
    first = claim(turns, 0, Holder(HolderKind.ROUND, "first"), served)
    queued(turns, 0, 1)
    applying = threading.Thread(target=lambda: turns.take_each([0], APPLY, 10, lambda gpu: bool(served.append("apply"))))
    applying.start()
    queued(turns, 0, 2)
    last = claim(turns, 0, Holder(HolderKind.ROUND, "last"), served)
    queued(turns, 0, 3)
    turns.release(0)
    for thread in (first, applying, last):
        thread.join(10)
    assert served == ["first", "apply", "last"] and turns.holder(0) is None


def test_take_each_serves_a_free_gpu_while_keeping_its_place_behind_a_held_one() -> None:
    """GPU 1 is free: its change runs at once. GPU 0 is held: the claimant keeps its place there (a round
    arriving later queues behind it) and gets GPU 0 when it is given back; each release is heard as a write."""
    turns = GpuTurns([0, 1])
    heard: list[tuple[int, Holder, bool]] = []
    turns.listeners.append(lambda done: heard.append((done.gpu, done.holder, done.wrote)))
    assert turns.take(0, ROUND, 0) is Turn.GRANTED
    worked: list[tuple[int, Holder | None]] = []
    left: list[list[int]] = []

    def work(gpu: int) -> bool:
        worked.append((gpu, turns.holder(gpu)))
        return True

    thread = threading.Thread(target=lambda: left.append(turns.take_each([0, 1], APPLY, 10, work)))
    thread.start()
    deadline = time.monotonic() + 10
    while not worked and time.monotonic() < deadline:
        time.sleep(0.005)
    assert worked == [(1, APPLY)] and turns.holder(1) is None  # GPU 1 done and given back already
    served: list[str] = []
    later = claim(turns, 0, Holder(HolderKind.ROUND, "later"), served)
    queued(turns, 0, 2)  # behind the apply claimant
    turns.release(0)
    thread.join(10)
    later.join(10)
    assert worked == [(1, APPLY), (0, APPLY)] and left == [[]] and served == ["later"]
    assert [(g, h.kind, w) for g, h, w in heard] == [(1, HolderKind.APPLY, True), (0, HolderKind.ROUND, False),
                                                     (0, HolderKind.APPLY, True), (0, HolderKind.ROUND, False)]


def test_take_each_gives_up_a_held_gpu_after_its_timeout_or_at_stop_and_leaves_its_line() -> None:
    turns = GpuTurns([0, 1])
    assert turns.take(0, ROUND, 0) is Turn.GRANTED
    started = time.monotonic()
    assert turns.take_each([0, 1], APPLY, 0.2, lambda gpu: False) == [0]
    assert time.monotonic() - started >= 0.2 and turns.holder(1) is None and not turns._slots[0].queue
    stop = threading.Event()
    left: list[list[int]] = []
    thread = threading.Thread(target=lambda: left.append(turns.take_each([0], APPLY, 30, lambda gpu: False, stop.is_set)))
    thread.start()
    queued(turns, 0, 1)
    stop.set()
    turns.nudge()
    thread.join(5)
    assert left == [[0]] and not turns._slots[0].queue and turns.holder(0) == ROUND


def test_take_each_gives_the_gpu_back_when_its_work_fails() -> None:
    turns = GpuTurns([0])
    heard: list[bool] = []
    turns.listeners.append(lambda done: heard.append(done.wrote))

    def fail(gpu: int) -> bool:
        raise RuntimeError("injected")

    with pytest.raises(RuntimeError):
        turns.take_each([0], APPLY, 1, fail)
    assert turns.holder(0) is None and heard == [True] and not turns._slots[0].queue
