"""The real interconnect executor on the CPU path (gloo workers): figures, checked sums, every
ordered pair, and that no failure (a raising, crashing or hanging rank, an abort, a user's job)
leaves a worker behind."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.interconnect import InterconnectRequest, bus_bandwidth
from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor
from gpuperfd.probing.child.runner import RECORD_PREFIX

SMALL = InterconnectRequest(copy_bytes=1 << 14, allreduce_bytes=(1 << 10, 1 << 16), repeats=3, warmup=1,
                            timeout_seconds=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _none_left(executor: ProcessInterconnectExecutor) -> None:
    assert executor.last_pids, "the run started no worker"
    assert [pid for pid in executor.last_pids if _alive(pid)] == []


@pytest.fixture(scope="module")
def three_ranks():
    executor = ProcessInterconnectExecutor("cpu", ranks=3)
    return executor, executor.run([], SMALL, threading.Event())


def test_three_ranks_measure_every_ordered_pair_and_both_sizes(three_ranks):
    executor, result = three_ranks
    assert result.status == "ok", result.error_message
    assert result.backend == "gloo" and result.gpus == (0, 1, 2)
    assert [(c.src, c.dst) for c in result.copies] == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert all(c.ok and c.bandwidth_bytes_per_second > 0 and c.repeats == 3 for c in result.copies)
    assert [a.bytes for a in result.allreduce] == [1 << 10, 1 << 16]
    for reduce in result.allreduce:
        assert reduce.sum_ok and reduce.ranks == 3 and reduce.repeats == 3
        assert 0 < reduce.latency_p50_seconds <= reduce.latency_p99_seconds
        assert reduce.algorithm_bandwidth_bytes_per_second == pytest.approx(reduce.bytes / reduce.latency_p50_seconds)
        assert reduce.bus_bandwidth_bytes_per_second == pytest.approx(
            bus_bandwidth(reduce.bytes, reduce.latency_p50_seconds, 3))
    _none_left(executor)


def test_two_ranks_one_pair_each_way():
    executor = ProcessInterconnectExecutor("cpu", ranks=2)
    result = executor.run([], SMALL, threading.Event())
    assert result.status == "ok", result.error_message
    assert [(c.src, c.dst) for c in result.copies] == [(0, 1), (1, 0)]
    assert all(a.sum_ok and a.ranks == 2 for a in result.allreduce)
    _none_left(executor)


def test_a_wrong_sum_fails_the_run_as_a_wrong_result():
    executor = ProcessInterconnectExecutor("cpu", ranks=2, inject_fault=(1, "wrong_sum"))
    result = executor.run([], SMALL, threading.Event())
    assert (result.status, result.failure_reason) == ("failed", "wrong_result")
    assert [a.sum_ok for a in result.allreduce] == [False, False]
    assert all(c.ok for c in result.copies)
    _none_left(executor)


def test_a_wrong_copy_fails_the_run_naming_the_pair():
    executor = ProcessInterconnectExecutor("cpu", ranks=3, inject_fault=(2, "wrong_copy"))
    result = executor.run([], SMALL, threading.Event())
    assert (result.status, result.failure_reason) == ("failed", "wrong_result")
    assert [(c.src, c.dst) for c in result.copies if not c.ok] == [(2, 0), (2, 1)]
    assert "2->0" in result.error_message and all(a.sum_ok for a in result.allreduce)
    _none_left(executor)


@pytest.mark.parametrize("fault, reason", [("exception", "exception"), ("crash", "crash")])
def test_a_failing_rank_ends_every_rank(fault, reason):
    executor = ProcessInterconnectExecutor("cpu", ranks=3, inject_fault=(1, fault))
    t0 = time.monotonic()
    result = executor.run([], SMALL, threading.Event())
    assert (result.status, result.failure_reason) == ("failed", reason)
    assert "rank 1" in result.error_message
    assert time.monotonic() - t0 < 30  # the blocked ranks were killed, not waited out
    _none_left(executor)


def test_a_hanging_rank_times_out_and_all_are_killed():
    executor = ProcessInterconnectExecutor("cpu", ranks=2, inject_fault=(0, "hang"))
    request = InterconnectRequest(copy_bytes=1 << 10, allreduce_bytes=(1 << 10,), repeats=1, warmup=0,
                                  timeout_seconds=8)
    result = executor.run([], request, threading.Event())
    assert (result.status, result.failure_reason) == ("failed", "timeout")
    _none_left(executor)


def test_abort_kills_the_group_and_its_records_go(tmp_path):
    executor = ProcessInterconnectExecutor("cpu", ranks=2, inject_fault=(1, "hang"), record_dir=tmp_path)
    abort = threading.Event()
    seen = []

    def look_then_abort():
        seen.extend(sorted(p.name for p in tmp_path.glob(RECORD_PREFIX + "*")))  # a restarted daemon ends these
        abort.set()

    threading.Timer(4.0, look_then_abort).start()
    t0 = time.monotonic()
    result = executor.run([], SMALL, abort)
    assert (result.status, result.failure_reason) == ("aborted", "aborted")
    assert time.monotonic() - t0 < 15
    assert seen == sorted(f"{RECORD_PREFIX}{pid}" for pid in executor.last_pids)
    assert list(tmp_path.glob(RECORD_PREFIX + "*")) == []
    _none_left(executor)


@pytest.fixture
def node():
    return SimulatedBackend(SimulationConfig(gpus=3)).devices()


@pytest.mark.parametrize("gpus, words", [((0, 7), "no GPU 7 on this node"), ((1,), "at least two GPUs"),
                                         ((0, 1, 0), "GPU 0 is named twice")])
def test_bad_sets_are_refused_before_anything_starts(node, gpus, words):
    executor = ProcessInterconnectExecutor("cuda")
    with pytest.raises(ValueError, match=words):
        executor.run(node, InterconnectRequest(gpus=gpus), threading.Event())
    assert executor.last_pids == []


def test_one_rank_alone_is_refused():
    with pytest.raises(ValueError, match="at least two ranks"):
        ProcessInterconnectExecutor("cpu", ranks=1).run([], SMALL, threading.Event())


def test_a_user_job_on_one_gpu_of_the_set_makes_it_give_way(node):
    executor = ProcessInterconnectExecutor("cpu", watch_interval=0.1, inject_fault=(0, "hang"))
    threading.Timer(3.0, lambda: node[1].add_foreign_process(999_999, 1 << 30)).start()
    result = executor.run(node[:2], SMALL, threading.Event())
    assert (result.status, result.failure_reason) == ("skipped", "preempted")
    assert result.extra["gpu"] == 1 and result.extra["foreign_pids"] == [999_999]
    _none_left(executor)


def test_a_busy_gpu_starts_no_worker(node):
    node[2].add_foreign_process(999_998, 1 << 30)
    executor = ProcessInterconnectExecutor("cpu", idle_wait_seconds=0)
    result = executor.run(node, SMALL, threading.Event())
    assert (result.status, result.failure_reason) == ("skipped", "preempted")
    assert "GPU 2" in result.error_message and executor.last_pids == []


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as fh:
            return fh.read()
    except OSError:
        return ""


def test_workers_die_with_a_killed_parent():
    """The parent SIGKILLed mid-run (no finally runs): every worker dies with it (PR_SET_PDEATHSIG)."""
    import signal
    import subprocess
    import sys

    from gpuperfd.probing.child.runner import _descendants, child_env

    script = ("import threading; from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor as E; "
              "from gpuperfd.probe_data.interconnect import InterconnectRequest as R; "
              "E('cpu', ranks=2, inject_fault=(1, 'hang')).run([], R(copy_bytes=1024, allreduce_bytes=(1024,), "
              "repeats=1, warmup=0, timeout_seconds=120), threading.Event())")
    parent = subprocess.Popen([sys.executable, "-c", script], env=child_env())
    deadline = time.monotonic() + 30
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        workers = {p for p in _descendants(parent.pid) if "interconnect.worker" in _cmdline(p)}
        time.sleep(0.1)
    assert len(workers) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_state(p) not in (None, "Z") for p in workers):
        time.sleep(0.1)
    assert [p for p in workers if _state(p) not in (None, "Z")] == []
