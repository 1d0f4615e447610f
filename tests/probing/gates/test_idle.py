"""The one busy check (gpuperfd.probing.gates.idle): typed reasons, one policy for unreadable fields,
the configured threshold, and the grace for our own run's tail."""

from __future__ import annotations

import threading
import time

from gpuperfd.config import OursConfig, ProbesConfig
from gpuperfd.device.errors import DeviceError, NotSupported
from gpuperfd.device.simulated import SimulatedBackend, SimulationConfig
from gpuperfd.probing.gates.idle import (
    DEFAULT_IDLE_THRESHOLD,
    BusyKind,
    allocated_reason,
    busy_after_own_run,
    busy_reason,
    gave_way,
    pod_reason,
)


def gpu():
    return SimulatedBackend(SimulationConfig(gpus=1, seed=1)).devices()[0]


class Readings:
    """A device whose process list and utilization are set per test (or raise)."""

    def __init__(self, pids=(), util=0.0, fail=None):
        self.pids, self.util, self.fail = list(pids), util, fail

    def compute_processes(self):
        if self.fail == "processes":
            raise NotSupported("compute_processes")
        return [type("P", (), {"pid": pid})() for pid in self.pids]

    def utilization(self):
        if self.fail == "utilization":
            raise DeviceError("gpu_lost")
        return type("U", (), {"gpu_ratio": self.util})()


def test_idle_gpu_has_no_reason():
    assert busy_reason(gpu(), DEFAULT_IDLE_THRESHOLD) is None


def test_reasons_are_typed():
    assert busy_reason(Readings(pids=[7]), 0.05).kind is BusyKind.FOREIGN_PROCESS
    assert busy_reason(Readings(pids=[7]), 0.05, own_pids=[7]) is None
    hot = busy_reason(Readings(util=0.5), 0.05)
    assert hot.kind is BusyKind.UTILIZATION and str(hot) == "utilization 50% above 5%"


def test_the_threshold_is_the_configured_one():
    assert DEFAULT_IDLE_THRESHOLD == ProbesConfig().idle_utilization_threshold
    assert busy_reason(Readings(util=0.08), 0.1) is None
    assert busy_reason(Readings(util=0.08), 0.05).kind is BusyKind.UTILIZATION


def test_an_unreadable_field_is_busy_whatever_the_field():
    """One policy: a GPU we cannot see is free is not probed (the runner once called it idle)."""
    for field in ("processes", "utilization"):
        reason = busy_reason(Readings(fail=field), 0.05, wait_seconds=1.0)
        assert reason.kind is BusyKind.UNREADABLE, field


def test_a_gpuperfd_probe_child_is_named_and_a_user_process_beside_it_is_foreign():
    import subprocess
    import sys

    # Each process says "ready" once it runs Python: its exec is done and /proc/PID/cmdline is its own
    # (read before, it is pytest's; that raced a loaded 2-core CI once).
    ready = "import sys, time; print('ready', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", ready, "-m", "gpuperfd.probe_child.child"],
                             stdout=subprocess.PIPE, text=True)
    user = subprocess.Popen([sys.executable, "-c", ready], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n" and user.stdout.readline() == "ready\n"
        ours = busy_reason(Readings(pids=[child.pid]), 0.05)
        assert ours.kind is BusyKind.GPUPERFD_PROBE and str(ours) == f"gpuperfd is probing this GPU (pid {child.pid})"
        mixed = busy_reason(Readings(pids=[child.pid, user.pid]), 0.05)  # a user's job beside it: the user's
        assert mixed.kind is BusyKind.FOREIGN_PROCESS and str(mixed) == f"compute process(es) {user.pid} running"
        assert busy_reason(Readings(pids=[user.pid]), 0.05).kind is BusyKind.FOREIGN_PROCESS
    finally:
        for proc in (child, user):
            proc.kill()
            proc.wait()
            proc.stdout.close()


def test_a_user_job_gives_way_but_an_unreadable_gpu_stays_a_failure():
    assert gave_way(busy_reason(Readings(pids=[7]), 0.05)) == ("skipped", "preempted")
    assert gave_way(busy_reason(Readings(util=0.5), 0.05)) == ("skipped", "preempted")
    assert gave_way(busy_reason(Readings(fail="processes"), 0.05)) == ("failed", "gpu_busy")


def test_pod_reason_reads_only_the_kubelet_map():
    from gpuperfd.attribution.allocations import AllocationState

    device = gpu()
    device.add_foreign_process(4242, 1 << 30)  # a round's own child is on the GPU between points: not read
    assert pod_reason(device, None, OursConfig()) is None
    assert pod_reason(device, AllocationState(), OursConfig()) is None


def test_allocated_reason_is_typed():
    device = gpu()
    ours = OursConfig()
    assert allocated_reason(device, None, ours) is None
    reason = allocated_reason(device, None, ours, kubelet_socket="/nonexistent")
    assert reason.kind is BusyKind.ALLOCATED and "allocation unknown" in str(reason)


def test_own_tail_is_read_again_after_the_grace_and_cut_short_by_abort():
    class Tail(Readings):
        def __init__(self):
            super().__init__(util=0.9)
            self.start = time.monotonic()

        def utilization(self):
            return type("U", (), {"gpu_ratio": 0.9 if time.monotonic() - self.start < 0.2 else 0.0})()

    assert busy_after_own_run(Tail(), 0.05, (), 0.0, 0.4, threading.Event()) is None
    assert busy_after_own_run(Tail(), 0.05, (), 10.0, 0.4, threading.Event()).kind is BusyKind.UTILIZATION
    stop = threading.Event()
    stop.set()
    assert busy_after_own_run(Tail(), 0.05, (), 0.0, 0.4, stop).kind is BusyKind.OWN_TAIL
    assert busy_after_own_run(Readings(pids=[9]), 0.05, (), 0.0, 5.0, stop).kind is BusyKind.FOREIGN_PROCESS
