"""The one-caller gate (gpuperfd.device.serial): order, hangs, refusals, misuse."""

from __future__ import annotations

import threading
import time

import pytest

from gpuperfd.device.errors import DeviceTimeout
from gpuperfd.device.serial import CallGate, EntryCounter


def test_callers_go_in_one_at_a_time_in_arrival_order() -> None:
    gate, counter, order = CallGate("lib"), EntryCounter(), []
    first_inside, release = threading.Event(), threading.Event()

    def slow() -> None:
        first_inside.set()
        release.wait(5)

    holder = threading.Thread(target=gate.call, args=(0, "slow", counter.run, slow))
    holder.start()
    first_inside.wait(5)
    waiters = []
    for n in range(5):
        waiters.append(threading.Thread(target=gate.call, args=(n % 2, f"w{n}", counter.run, order.append, n)))
        waiters[-1].start()
        time.sleep(0.02)  # arrive in a known order
    release.set()
    for thread in [holder, *waiters]:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]
    assert counter.max_inside == 1 and gate.stats().waited == 5


def test_a_busy_caller_cannot_starve_another() -> None:
    gate, stop, other = CallGate("lib"), threading.Event(), []

    def hog() -> None:
        while not stop.is_set():
            gate.call(0, "hog", time.sleep, 0.0005)

    thread = threading.Thread(target=hog)
    thread.start()
    start = time.monotonic()
    for _ in range(50):
        gate.call(1, "other", other.append, 1)
    took = time.monotonic() - start
    stop.set()
    thread.join(5)
    assert len(other) == 50 and took < 1.0, took


def test_a_hung_call_holds_others_only_until_the_hang_threshold() -> None:
    gate, release = CallGate("lib", hang_seconds=0.3), threading.Event()
    hung = threading.Thread(target=gate.call, args=(0, "nvmlStuck", release.wait, 10))
    hung.start()
    time.sleep(0.05)
    start = time.monotonic()
    assert gate.call(1, "nvmlOther", lambda: "ok") == "ok"
    assert 0.2 <= time.monotonic() - start < 1.0
    start = time.monotonic()
    with pytest.raises(DeviceTimeout, match=r"GPU 0: nvmlAgain not called: an earlier nvmlStuck has not returned"):
        gate.call(0, "nvmlAgain", lambda: None)  # waits for GPU 0's hung call, at most the threshold
    assert 0.2 <= time.monotonic() - start < 1.0
    assert gate.stats().hung_now and gate.stats().set_aside == 1 and gate.stats().refused == 1
    release.set()
    hung.join(5)
    assert gate.call(0, "nvmlAgain", lambda: "back") == "back"
    assert not gate.stats().hung_now


def test_an_error_inside_leaves_the_gate_free() -> None:
    gate = CallGate("lib")
    with pytest.raises(ZeroDivisionError):
        gate.call(0, "bad", lambda: 1 / 0)
    assert gate.call(0, "good", lambda: 2) == 2


def test_nested_call_from_the_same_thread_is_a_bug_not_a_deadlock() -> None:
    gate = CallGate("lib")
    with pytest.raises(RuntimeError, match="inner called from inside outer"):
        gate.call(0, "outer", lambda: gate.call(0, "inner", lambda: None))
    assert gate.call(0, "after", lambda: 3) == 3


def test_a_gpus_calls_wait_out_its_slow_call_while_the_others_go_on() -> None:
    """A slow call that does come back (0.5 s, threshold 0.3 s): the same GPU's next call waits for it
    and then runs (a cap restore behind a slow read is not lost); another GPU's calls are not held."""
    gate = CallGate("lib", hang_seconds=0.3)
    slow = threading.Thread(target=gate.call, args=(0, "nvmlSlow", time.sleep, 0.5))
    slow.start()
    time.sleep(0.35)  # past the threshold: the next caller sets it aside
    assert gate.call(1, "nvmlOther", lambda: "gpu1") == "gpu1"
    waiter_result: list[str] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(gate.call(0, "nvmlSetLimit", lambda: "set")))
    waiter.start()
    time.sleep(0.02)
    start = time.monotonic()
    for _ in range(20):
        gate.call(1, "nvmlOther", lambda: None)  # GPU 1 is not held behind GPU 0's waiter
    assert time.monotonic() - start < 0.1
    waiter.join(2)
    slow.join(2)
    assert waiter_result == ["set"] and gate.stats().refused == 0


def test_a_call_queued_behind_a_slow_call_before_it_was_set_aside_still_goes_through() -> None:
    """The fleet's case: a GPU's busy check queued behind its own slow ECC read (0.8 s, threshold
    0.5 s) must wait for the read to return, not be refused for the time it spent queued."""
    gate = CallGate("lib", hang_seconds=0.5)
    slow = threading.Thread(target=gate.call, args=(0, "ecc_errors", time.sleep, 0.8))
    slow.start()
    time.sleep(0.05)
    assert gate.call(0, "compute_processes", lambda: "free") == "free"
    slow.join(2)
    assert gate.stats().refused == 0 and gate.stats().set_aside == 1
