"""Admission of probe children by host memory: never over the budget, FIFO, waits, refuses, wakes."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from gpuperfd.probing.gates.admission import MIB, POLL_SECONDS, RSS_READ_SECONDS, Admission, PeakBook, Ticket, memory_limit

CHILD = 100 * MIB


def _admission(children: int, headroom: int = 0) -> Admission:
    """A budget for ``children`` children of CHILD bytes (the daemon's RSS is 0 here)."""
    return Admission(children * CHILD + headroom, "test limit", PeakBook(CHILD), daemon_rss=lambda: 0,
                     headroom_bytes=headroom)


def test_eight_gpus_never_exceed_the_budget_and_all_run() -> None:
    admission = _admission(3)
    abort, lock = threading.Event(), threading.Lock()
    running, peak, done = [0], [0], []

    def gpu(index: int) -> None:
        for _ in range(3):  # three rounds each, fake children of random length
            ticket = admission.acquire(index, CHILD, abort)
            assert ticket.granted
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(random.uniform(0.005, 0.03))
            with lock:
                running[0] -= 1
            admission.release(ticket)
        done.append(index)

    threads = [threading.Thread(target=gpu, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(done) == list(range(8))  # everyone ran: waited, never skipped
    assert peak[0] == 3
    state = admission.state()
    assert state.running == 0 and state.reserved_bytes == 0 and state.waiting == 0
    assert state.wait_seconds_total > 0


def test_waiters_are_served_in_arrival_order() -> None:
    admission = _admission(1)
    abort = threading.Event()
    first = admission.acquire(0, CHILD, abort)
    order: list[int] = []

    def wait(index: int) -> None:
        ticket = admission.acquire(index, CHILD, abort)
        order.append(index)
        admission.release(ticket)

    threads = []
    for index in (5, 2, 7, 1):
        threads.append(threading.Thread(target=wait, args=(index,)))
        threads[-1].start()
        while admission.state().waiting < len(threads):
            time.sleep(0.005)
    admission.release(first)
    for thread in threads:
        thread.join(5)
    assert order == [5, 2, 7, 1]


def test_a_small_child_does_not_overtake_the_head_of_the_queue() -> None:
    admission = _admission(2)
    abort = threading.Event()
    held = admission.acquire(0, CHILD, abort)
    got: list[int] = []
    big = threading.Thread(target=lambda: got.append(admission.acquire(1, 2 * CHILD, abort).gpu))
    big.start()
    while admission.state().waiting < 1:
        time.sleep(0.005)
    small = admission.acquire(2, CHILD, abort, deadline=time.monotonic() + 0.3)  # would fit, but not its turn
    assert small.reason == "deadline"
    admission.release(held)
    big.join(5)
    assert got == [1]


def _one_waiting(admission: Admission, abort: threading.Event) -> tuple[Ticket, list[Ticket], threading.Thread]:
    """GPU 0's child holds the one child's budget; GPU 1 waits for it on a thread (its answer into the list)."""
    held = admission.acquire(0, CHILD, abort)
    answers: list[Ticket] = []
    waiter = threading.Thread(target=lambda: answers.append(admission.acquire(1, CHILD, abort)))
    waiter.start()
    while admission.state().waiting < 1:
        time.sleep(0.005)
    return held, answers, waiter


def test_abort_wakes_waiters() -> None:
    admission = _admission(1)
    abort = threading.Event()
    held, answers, waiter = _one_waiting(admission, abort)
    t0 = time.monotonic()
    abort.set()
    admission.wake()
    waiter.join(2)
    assert not waiter.is_alive() and time.monotonic() - t0 < 1.0
    assert answers[0].reason == "aborted" and not answers[0].granted
    admission.release(held)
    assert admission.state().running == 0


def test_too_small_a_budget_refuses_at_once_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    admission = Admission(CHILD + 50 * MIB, "cgroup memory limit", PeakBook(CHILD), daemon_rss=lambda: 40 * MIB,
                          headroom_bytes=20 * MIB)
    abort = threading.Event()
    with caplog.at_level(logging.ERROR):
        for gpu in range(4):
            ticket = admission.acquire(gpu, CHILD, abort)
            assert ticket.reason == "memory_budget" and ticket.waited_seconds < 0.1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    text = errors[0].getMessage()
    assert "100 MiB" in text and "cgroup memory limit of 150 MiB" in text and "at least 160 MiB" in text
    assert admission.state().running == 0


def test_no_limit_admits_everyone() -> None:
    admission = Admission(None, "none", daemon_rss=lambda: 0)
    abort = threading.Event()
    tickets = [admission.acquire(i, 10 * 2**30, abort) for i in range(8)]
    assert all(t.granted for t in tickets) and admission.state().running == 8
    assert admission.budget_bytes() is None


def test_budget_is_limit_less_daemon_and_headroom() -> None:
    rss, now = [30 * MIB], [0.0]
    admission = Admission(1000 * MIB, "x", daemon_rss=lambda: rss[0], headroom_bytes=100 * MIB, clock=lambda: now[0])
    assert admission.budget_bytes() == 870 * MIB
    rss[0] = 50 * MIB
    now[0] += RSS_READ_SECONDS  # the daemon's RSS is read again once the last reading is that old
    assert admission.budget_bytes() == 850 * MIB


def test_waiters_read_the_daemons_rss_at_a_bounded_rate_and_afresh_when_a_child_ends() -> None:
    """A waiter wakes every POLL_SECONDS; the budget's /proc read is kept RSS_READ_SECONDS (here the clock
    stands still), and a release (the decision the waiters wait for) reads it afresh."""
    reads = []
    admission = Admission(CHILD, "test limit", PeakBook(CHILD), daemon_rss=lambda: reads.append(1) or 0,
                          headroom_bytes=0, clock=lambda: 0.0)
    abort = threading.Event()
    held, answers, waiter = _one_waiting(admission, abort)
    before = len(reads)
    time.sleep(5 * POLL_SECONDS)  # the waiter looks again at least four times
    assert len(reads) == before  # none of those looks read /proc
    admission.release(held)
    waiter.join(2)
    assert answers and answers[0].granted and before < len(reads) <= before + 2  # the release and its publication
    admission.release(answers[0])


def test_limit_is_the_smaller_of_cgroup_and_budget() -> None:
    assert memory_limit(None, lambda: None) == (None, "none")
    assert memory_limit(2**30, lambda: None) == (2**30, "probes.memory_budget")
    assert memory_limit(2**30, lambda: 2**29) == (2**29, "cgroup memory limit")
    assert memory_limit(2**29, lambda: 2**30) == (2**29, "probes.memory_budget")


def test_peaks_keep_the_largest_and_default_before_measurement() -> None:
    book = PeakBook(1000)
    seen = []
    book.listeners.append(lambda probe, value: seen.append((probe, value)))
    assert book.expected(["llm", "vit"]) == 1000
    book.record("llm", 700)
    book.record("llm", 600)  # smaller: kept 700
    assert book.expected(["llm"]) == 700
    assert book.expected(["llm", "vit"]) == 1000  # vit never measured: the default
    book.record("vit", 1200)
    assert book.expected(["llm", "vit"]) == 1200
    assert seen == [("llm", 700), ("vit", 1200)]
