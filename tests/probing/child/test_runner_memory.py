"""The runner's account of a child's host memory: its peak RSS when it exits, and a SIGKILL from
the kernel's OOM killer reported as ``host_oom`` (the host's memory, never the GPU's fault)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time

from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.gates.admission import PeakBook
from gpuperfd.probing.child.runner import ProbeChild, _Child

MIB = 2**20


def test_a_real_childs_peak_rss_comes_back_when_it_exits() -> None:
    # 120 MB touched page by page (b"x" * n writes every byte), then freed: the peak stays.
    code = "b = b'x' * (120 << 20); del b; import time; time.sleep(0.2)"
    child = _Child(subprocess.Popen([sys.executable, "-c", code]))
    assert child.is_alive() and child.peak_rss_bytes is None
    child.join(20)
    assert not child.is_alive() and child.exitcode == 0
    parent_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # folded in before the exec
    assert child.peak_rss_bytes is not None and 120 * MIB <= child.peak_rss_bytes < max(parent_peak, 0) + 400 * MIB


def test_a_small_childs_peak_is_small_and_a_signal_is_a_negative_code() -> None:
    child = _Child(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
    time.sleep(0.2)
    os.kill(child.pid or 0, signal.SIGTERM)
    child.join(10)
    assert child.exitcode == -signal.SIGTERM
    # ru_maxrss keeps the high-water mark of the memory the child was forked with, before its exec
    # (the kernel folds the old mm's into it): at most this process's own peak, plus the small child.
    parent_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert child.peak_rss_bytes is not None and child.peak_rss_bytes < max(parent_peak, 0) + 100 * MIB


def _killed_from_outside(oom_counts: list[int | None]) -> tuple[ProbeChild, object]:
    """A real probe child SIGKILLed by someone else while it starts; the OOM counter reads ``oom_counts``."""
    book = PeakBook()
    child = ProbeChild(ProbeSpec("llm", preset="tiny", inject_fault="hang"), on_peak=book.record)
    counts = iter(oom_counts)
    child.oom_kills = lambda: next(counts)  # type: ignore[method-assign]

    def kill_soon() -> None:
        while child.pid is None:
            time.sleep(0.01)
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGKILL)

    threading.Thread(target=kill_soon, daemon=True).start()
    result = child.start(time.monotonic() + 60)
    child.close()
    return child, (result, book)


def test_a_sigkill_with_the_oom_count_rising_is_host_oom_and_its_peak_is_kept() -> None:
    child, (result, book) = _killed_from_outside([3, 4])
    assert result is not None and result.status == "failed"
    assert result.failure_reason == "host_oom", result.error_message
    assert "killed for host memory" in (result.error_message or "")
    assert child.peak_rss_bytes is not None and child.peak_rss_bytes > 5 * MIB
    assert book.peaks() == {"llm": child.peak_rss_bytes}


def test_a_sigkill_without_an_oom_kill_is_a_crash() -> None:
    _, (result, _) = _killed_from_outside([3, 3])
    assert result is not None and result.failure_reason == "crash"


def test_a_probe_childs_peak_reaches_the_book_after_a_normal_run() -> None:
    book = PeakBook()
    child = ProbeChild(ProbeSpec("attention", preset="tiny", repeats=1, measure_seconds=0.1,
                                 busy_profile_seconds=0.05), on_peak=book.record)
    assert child.start(time.monotonic() + 120) is None
    assert child.measure(time.monotonic() + 60).status == "ok"
    child.close()
    peak = book.peaks()["attention"]
    assert peak == child.peak_rss_bytes and peak > 100 * MIB  # torch is in it
