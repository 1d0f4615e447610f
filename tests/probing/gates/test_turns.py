"""GpuTurns: one holder per GPU, claimants served one at a time in arrival order, releases heard; a
claimant's host memory booked with its GPU by the same rule (first come first served across GPUs, never
over the budget, refused at once when it never fits, given up at a stop)."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from gpuperfd.probing.gates.admission import MIB, POLL_SECONDS, Admission, PeakBook
from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Release, Turn

ROUND = Holder(HolderKind.ROUND, "round")
SET_01 = Holder(HolderKind.INTERCONNECT, "0,1")


def queued(turns: GpuTurns, gpu: int, count: int) -> None:
    """Until ``count`` claimants queue for ``gpu`` (a state, not a race)."""
    deadline = time.monotonic() + 10
    while turns.queued(gpu) < count and time.monotonic() < deadline:
        time.sleep(0.005)
    assert turns.queued(gpu) == count


def queued_for_node(turns: GpuTurns) -> None:
    deadline = time.monotonic() + 10
    while not turns.queued() and time.monotonic() < deadline:
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
    assert time.monotonic() - started >= 0.2 and turns.holder(1) is None and not turns.queued(0)
    stop = threading.Event()
    left: list[list[int]] = []
    thread = threading.Thread(target=lambda: left.append(turns.take_each([0], APPLY, 30, lambda gpu: False, stop.is_set)))
    thread.start()
    queued(turns, 0, 1)
    stop.set()
    turns.nudge()
    thread.join(5)
    assert left == [[0]] and not turns.queued(0) and turns.holder(0) == ROUND


def test_take_each_gives_the_gpu_back_when_its_work_fails() -> None:
    turns = GpuTurns([0])
    heard: list[bool] = []
    turns.listeners.append(lambda done: heard.append(done.wrote))

    def fail(gpu: int) -> bool:
        raise RuntimeError("injected")

    with pytest.raises(RuntimeError):
        turns.take_each([0], APPLY, 1, fail)
    assert turns.holder(0) is None and heard == [True] and not turns.queued(0)


# --- host memory: booked with the GPU, by the same rule ----------------------------------------------

CHILD = 100 * MIB


def book(children: int, headroom: int = 0) -> Admission:
    """A memory book for ``children`` children of CHILD bytes (the daemon's RSS is 0 here)."""
    return Admission(children * CHILD + headroom, "test limit", PeakBook(CHILD), daemon_rss=lambda: 0,
                     headroom_bytes=headroom)


def memory_waiting(turns: GpuTurns, count: int) -> None:
    """Until ``count`` claimants wait for memory (a state, not a race)."""
    deadline = time.monotonic() + 10
    while turns.memory_waiters() < count and time.monotonic() < deadline:
        time.sleep(0.005)
    assert turns.memory_waiters() == count


def test_eight_gpus_never_exceed_the_memory_budget_and_all_run() -> None:
    memory = book(3)
    turns = GpuTurns(range(8), memory)
    lock = threading.Lock()
    running, peak, done = [0], [0], []

    def gpu(index: int) -> None:
        for _ in range(3):  # three rounds each, fake children of random length
            assert turns.take(index, ROUND, 10, memory=CHILD) is Turn.GRANTED
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(random.uniform(0.005, 0.03))
            with lock:
                running[0] -= 1
            turns.release(index)
        done.append(index)

    threads = [threading.Thread(target=gpu, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(done) == list(range(8))  # everyone ran: waited, never skipped
    assert peak[0] == 3
    state = memory.state()
    assert state.running == 0 and state.reserved_bytes == 0 and state.waiting == 0
    assert state.wait_seconds_total > 0 and turns.memory_waiters() == 0


def test_memory_waiters_of_different_gpus_are_served_in_arrival_order() -> None:
    turns = GpuTurns(range(8), book(1))
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    order: list[int] = []

    def wait(index: int) -> None:
        assert turns.take(index, ROUND, 10, memory=CHILD) is Turn.GRANTED
        order.append(index)
        turns.release(index)

    threads = []
    for index in (5, 2, 7, 1):
        threads.append(threading.Thread(target=wait, args=(index,)))
        threads[-1].start()
        memory_waiting(turns, len(threads))
    assert [turns.holder(g) for g in (5, 2, 7, 1)] == [None] * 4  # waiting for memory, they hold no GPU
    turns.release(0)
    for thread in threads:
        thread.join(5)
    assert order == [5, 2, 7, 1]


def test_a_small_child_does_not_overtake_the_head_of_the_memory_line() -> None:
    turns = GpuTurns(range(3), book(2))
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    got: list[Turn] = []
    big = threading.Thread(target=lambda: got.append(turns.take(1, ROUND, 10, memory=2 * CHILD)))
    big.start()
    memory_waiting(turns, 1)
    started = time.monotonic()
    # it would fit, but it is not its turn; its GPU was free at once, so memory_timeout bounds the wait
    assert turns.take(2, ROUND, 0, memory=CHILD, memory_timeout=0.3) is Turn.TIMEOUT
    assert time.monotonic() - started >= 0.3 and turns.holder(2) is None and not turns.queued(2)
    turns.release(0)
    big.join(5)
    assert got == [Turn.GRANTED] and turns.holder(1) == ROUND


def _one_waiting(turns: GpuTurns, stop: threading.Event) -> tuple[list[Turn], threading.Thread]:
    """GPU 0's child holds the one child's budget; GPU 1 waits for it on a thread (its answer into the list)."""
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    answers: list[Turn] = []
    waiter = threading.Thread(target=lambda: answers.append(turns.take(1, ROUND, 10, stop=stop.is_set, memory=CHILD)))
    waiter.start()
    memory_waiting(turns, 1)
    return answers, waiter


@pytest.mark.parametrize("nudged", [True, False])
def test_a_stop_wakes_a_memory_waiter(nudged: bool) -> None:
    """The service's stop nudges; the check's deadline only sets its event: the waiter's poll sees it."""
    memory = book(1)
    turns = GpuTurns(range(2), memory)
    stop = threading.Event()
    answers, waiter = _one_waiting(turns, stop)
    assert memory.state().waiting == 1
    t0 = time.monotonic()
    stop.set()
    if nudged:
        turns.nudge()
    waiter.join(2)
    assert not waiter.is_alive() and time.monotonic() - t0 < (0.5 if nudged else 2 * POLL_SECONDS + 0.5)
    assert answers == [Turn.STOPPED] and turns.holder(1) is None and not turns.queued(1)
    state = memory.state()
    assert state.waiting == 0 and state.running == 1 and state.wait_seconds_total > 0  # its wait is counted
    turns.release(0)
    assert memory.state().running == 0


def test_a_reservation_that_never_fits_is_refused_at_once_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    memory = Admission(CHILD + 50 * MIB, "cgroup memory limit", PeakBook(CHILD), daemon_rss=lambda: 40 * MIB,
                       headroom_bytes=20 * MIB)
    turns = GpuTurns(range(4), memory)
    with caplog.at_level(logging.ERROR):
        for gpu in range(4):
            started = time.monotonic()
            assert turns.take(gpu, ROUND, 30, memory=CHILD) is Turn.REFUSED
            assert time.monotonic() - started < 0.1 and turns.holder(gpu) is None and not turns.queued(gpu)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    text = errors[0].getMessage()
    assert "100 MiB" in text and "cgroup memory limit of 150 MiB" in text and "at least 160 MiB" in text
    assert memory.state().running == 0 and turns.memory_waiters() == 0
    assert turns.take(0, ROUND, 0) is Turn.GRANTED  # a claimant stating no memory: the GPU is free


def test_no_memory_limit_admits_everyone() -> None:
    memory = Admission(None, "none", daemon_rss=lambda: 0)
    turns = GpuTurns(range(8), memory)
    assert all(turns.take(i, ROUND, 0, memory=10 * 2**30) is Turn.GRANTED for i in range(8))
    assert memory.state().running == 8 and memory.budget_bytes() is None


def test_without_a_memory_book_a_claimants_memory_is_ignored() -> None:
    """The simulator starts no child: its turns keep no book, and a stated memory books nothing."""
    turns = GpuTurns([0])
    assert turns.take(0, ROUND, 0, memory=10 * 2**40) is Turn.GRANTED
    assert turns.reserve_now(0, CHILD) is None
    turns.release(0)


def test_memory_waiters_read_the_daemons_rss_at_a_bounded_rate_and_afresh_when_a_child_ends() -> None:
    """A memory waiter wakes every POLL_SECONDS; the budget's /proc read is kept RSS_READ_SECONDS (here the
    clock stands still), and a release (the decision the waiters wait for) reads it afresh."""
    reads: list[int] = []
    memory = Admission(CHILD, "test limit", PeakBook(CHILD), daemon_rss=lambda: reads.append(1) or 0,
                       headroom_bytes=0, clock=lambda: 0.0)
    turns = GpuTurns(range(2), memory)
    answers, waiter = _one_waiting(turns, threading.Event())
    before = len(reads)
    time.sleep(5 * POLL_SECONDS)  # the waiter looks again at least four times
    assert len(reads) == before  # none of those looks read /proc
    turns.release(0)
    waiter.join(2)
    assert answers == [Turn.GRANTED] and before < len(reads) <= before + 2  # the release and its publication
    turns.release(1)


def test_the_gpus_release_frees_the_memory_booked_with_it_before_the_listeners_hear_it() -> None:
    memory = book(2)
    turns = GpuTurns([0], memory)
    heard: list[int] = []
    turns.listeners.append(lambda done: heard.append(memory.state().reserved_bytes))
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    assert memory.state().reserved_bytes == CHILD and memory.state().running == 1
    turns.release(0)
    assert heard == [0] and memory.state().running == 0


def test_a_memory_waiter_keeps_its_gpus_line_but_holds_no_gpu() -> None:
    """The rule: the head of a free GPU's line that waits for memory keeps its place, so an apply change or
    an interconnect run that came after it waits (as when a round held the GPU while it waited for memory);
    a claimant of another GPU stating no memory is not held up by it."""
    turns = GpuTurns(range(3), book(1))
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    waiting = Holder(HolderKind.ROUND, "waits for memory")
    got: list[Turn] = []
    waiter = threading.Thread(target=lambda: got.append(turns.take(1, waiting, 10, memory=CHILD)))
    waiter.start()
    memory_waiting(turns, 1)
    assert turns.holder(1) is None and turns.queued(1) == 1
    assert turns.take_each([1], APPLY, 0.2, lambda gpu: True) == [1]  # its turn did not come
    assert turns.take(1, SET_01, 0.2) is Turn.TIMEOUT
    assert turns.take_each([2], APPLY, 0.2, lambda gpu: True) == []  # another GPU: at once
    turns.release(0)
    waiter.join(5)
    assert got == [Turn.GRANTED] and turns.holder(1) == waiting
    turns.release(1)


def test_memory_is_asked_once_when_the_gpus_turn_comes_and_none_books_nothing() -> None:
    """A round asks its child's bytes when its GPU's turn comes (a standby child holding a reservation by
    then makes them 0: nothing is booked, the round takes that child)."""
    memory = book(1)
    turns = GpuTurns([0], memory)
    assert turns.take(0, SET_01, 0) is Turn.GRANTED
    asked: list[int] = []

    def need() -> int:
        asked.append(1)
        return 0

    got: list[Turn] = []
    waiter = threading.Thread(target=lambda: got.append(turns.take(0, ROUND, 10, memory=need)))
    waiter.start()
    queued(turns, 0, 1)
    time.sleep(0.1)
    assert asked == []  # the GPU is held: its memory is not asked yet
    turns.release(0)
    waiter.join(5)
    assert got == [Turn.GRANTED] and asked == [1] and memory.state().running == 0
    turns.release(0)


def test_a_reservation_made_now_or_never_never_jumps_a_memory_waiter() -> None:
    """A standby child's reservation (reserve_now) is refused while a claimant waits for memory, even where
    it would fit; it is made once nobody waits and it fits, and freed by free()."""
    memory = book(2)
    turns = GpuTurns(range(3), memory)
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    got: list[Turn] = []
    big = threading.Thread(target=lambda: got.append(turns.take(1, ROUND, 10, memory=2 * CHILD)))
    big.start()
    memory_waiting(turns, 1)
    refused = turns.reserve_now(2, CHILD)
    assert refused is not None and refused.reason == "no_room"  # one child's room is free, but a round waits
    turns.release(0)
    big.join(5)
    assert got == [Turn.GRANTED]
    no_room = turns.reserve_now(2, CHILD)
    assert no_room is not None and no_room.reason == "no_room"  # nobody waits, but it does not fit
    turns.release(1)
    ticket = turns.reserve_now(2, CHILD)
    assert ticket is not None and ticket.granted and memory.state().running == 1
    turns.free(ticket)
    assert memory.state().running == 0 and memory.state().reserved_bytes == 0


def test_a_memory_waiters_gpu_line_timeout_ends_where_its_memory_wait_begins() -> None:
    """``timeout`` bounds the wait for the GPU's line; the memory wait after it is ``memory_timeout``'s
    (None: until a stop), as a round waits for memory as long as it takes."""
    turns = GpuTurns(range(2), book(1))
    assert turns.take(0, ROUND, 0, memory=CHILD) is Turn.GRANTED
    stop = threading.Event()
    got: list[Turn] = []
    waiter = threading.Thread(target=lambda: got.append(turns.take(1, ROUND, 0.1, stop=stop.is_set, memory=CHILD)))
    waiter.start()
    memory_waiting(turns, 1)
    time.sleep(0.3)  # past its line's timeout: it still waits for memory
    assert waiter.is_alive() and turns.memory_waiters() == 1
    turns.release(0)
    waiter.join(5)
    assert got == [Turn.GRANTED]
    turns.release(1)
