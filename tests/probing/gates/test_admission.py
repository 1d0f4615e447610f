"""The host-memory book of probe children: the budget's arithmetic, the peaks, what it counts and its
refusal's words. Its waits (never over the budget, FIFO, refused at once, woken at a stop) are the GPU
turns' rule: tests/probing/gates/test_turns.py."""

from __future__ import annotations

import logging

import pytest

from gpuperfd.probing.gates.admission import MIB, RSS_READ_SECONDS, Admission, PeakBook, memory_limit

CHILD = 100 * MIB


def _admission(children: int, headroom: int = 0) -> Admission:
    """A budget for ``children`` children of CHILD bytes (the daemon's RSS is 0 here)."""
    return Admission(children * CHILD + headroom, "test limit", PeakBook(CHILD), daemon_rss=lambda: 0,
                     headroom_bytes=headroom)


def test_the_book_counts_what_the_turns_decide() -> None:
    """The book queues nobody: it says whether bytes fit, books and frees them and counts the waits (who
    waits and who goes is the GPU turns' rule, tests/probing/gates/test_turns.py)."""
    admission = _admission(2)
    assert admission.fits(2 * CHILD) and not admission.fits(3 * CHILD)
    first = admission.reserve(0, CHILD)
    second = admission.reserve(1, CHILD, waited=1.5)
    assert first.granted and second.granted and not admission.fits(1)
    admission.set_waiting(2, CHILD, 1)
    refused = admission.refuse(2, CHILD, 0.5, "deadline")
    assert refused.reason == "deadline" and not refused.granted
    state = admission.state()
    assert (state.running, state.waiting, state.reserved_bytes, state.wait_seconds_total) == (2, 1, 2 * CHILD, 2.0)
    admission.release(first)
    admission.release(refused)  # a refused ticket holds nothing
    assert admission.state().running == 1 and admission.fits(CHILD)


def test_a_budget_too_small_for_one_child_says_so_once_until_a_child_fits(caplog: pytest.LogCaptureFixture) -> None:
    admission = Admission(CHILD + 50 * MIB, "cgroup memory limit", PeakBook(CHILD), daemon_rss=lambda: 40 * MIB,
                          headroom_bytes=20 * MIB)
    with caplog.at_level(logging.ERROR):
        assert all(admission.never_fits(gpu, CHILD) for gpu in range(4))
        assert not admission.never_fits(0, 50 * MIB)
        admission.reserve(0, 50 * MIB)  # a child fitted: the next refusal is logged again
        assert admission.never_fits(1, CHILD)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "cgroup memory limit of 150 MiB" in errors[0].getMessage()


def test_budget_is_limit_less_daemon_and_headroom() -> None:
    rss, now = [30 * MIB], [0.0]
    admission = Admission(1000 * MIB, "x", daemon_rss=lambda: rss[0], headroom_bytes=100 * MIB, clock=lambda: now[0])
    assert admission.budget_bytes() == 870 * MIB
    rss[0] = 50 * MIB
    now[0] += RSS_READ_SECONDS  # the daemon's RSS is read again once the last reading is that old
    assert admission.budget_bytes() == 850 * MIB


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
