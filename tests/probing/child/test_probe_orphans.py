"""No orphans (issue 19, case 4): probe children die with the daemon or CLI that started them, and a
starting daemon ends what a SIGKILLed one left behind (pid and start time checked first)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from child_processes import alive

from gpuperfd.probing.child.runner import (
    RECORD_PREFIX,
    end_leftover_children,
    process_start_time,
)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


HANGING = """
device: {{backend: simulated}}
simulation: {{gpus: 1, seed: 1}}
probes:
  state_dir: {state}
  history: {{path: null}}
  executor: child
  torch_device: cpu
  timeout_seconds: 600
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.1
  schedules:
    - {{probe: attention, preset: tiny, interval_seconds: 3600, options: {{inject_fault: hang}}}}
"""


def test_case4_sigkilled_daemon_takes_its_hanging_probe_child_with_it(start_daemon, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("GPUPERFD_TEST_FAULTS", "1")  # a schedule's inject_fault needs the test-only switch
    state = tmp_path / "state"
    daemon = start_daemon(config_text=HANGING.format(state=state))
    record = wait_until(lambda: next(iter(state.glob(RECORD_PREFIX + "*")), None), 60, "the probe child")
    child = int(record.name[len(RECORD_PREFIX):])
    assert alive(child)
    daemon.stop(signal.SIGKILL)
    wait_until(lambda: not alive(child), 5, f"probe child {child} to die with its parent")
    assert record.exists()  # the SIGKILLed daemon could not clean up; the next start does
    second = start_daemon(config_text=HANGING.format(state=state).replace("first_run_delay_seconds: 0.1",
                                                                          "first_run_delay_seconds: 3600"))
    assert not list(state.glob(RECORD_PREFIX + "*"))
    assert second.stop() == 0


def test_case4_starting_daemon_ends_a_recorded_leftover_and_spares_a_reused_pid(start_daemon, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    leftover = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a child that outlived its daemon
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a pid reused by someone else
    try:
        (state / f"{RECORD_PREFIX}{leftover.pid}").write_text(f"{leftover.pid} {process_start_time(leftover.pid)}\n")
        (state / f"{RECORD_PREFIX}{bystander.pid}").write_text(f"{bystander.pid} {process_start_time(bystander.pid) - 5}\n")
        daemon = start_daemon(config_text=f"""
device: {{backend: simulated}}
simulation: {{gpus: 1, seed: 1}}
probes: {{state_dir: {state}, history: {{path: null}}}}
""")
        assert leftover.wait(timeout=5) == -signal.SIGKILL
        assert bystander.poll() is None
        log = wait_until(lambda: "listening on" in (text := daemon.log()) and text, 10, "listening on")
        assert f"ended probe child {leftover.pid} left running by an earlier gpuperfd" in log
        assert log.index(f"ended probe child {leftover.pid}") < log.index("listening on")
        assert not list(state.glob(RECORD_PREFIX + "*"))
        assert daemon.stop() == 0
    finally:
        for proc in (leftover, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_case4_end_leftover_children_ignores_garbage_records(tmp_path):
    (tmp_path / f"{RECORD_PREFIX}1").write_text("not a record")
    (tmp_path / f"{RECORD_PREFIX}2").write_text(f"{os.getpid()} 0\n")  # our own pid, wrong start time
    assert end_leftover_children(tmp_path) == []
    assert not list(tmp_path.glob(RECORD_PREFIX + "*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_case4_probe_cli_ends_its_child_on_a_stop_signal(tmp_path, sig):
    pytest.importorskip("torch")
    cli = subprocess.Popen(
        [sys.executable, "-m", "gpuperfd", "probe", "attention", "--preset", "tiny", "--device", "cpu",
         "--repeats", "1", "--measure-seconds", "120", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        from gpuperfd.probing.child.runner import _descendants

        kids = wait_until(lambda: _descendants(cli.pid), 60, "the probe child")
        time.sleep(1.0)
        kids = _descendants(cli.pid) or kids
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode == 128 + sig, err
        assert f"stopped by {signal.Signals(sig).name}; the probe child was ended" in err
        wait_until(lambda: not any(alive(k) for k in kids), 5, "the probe child to end")
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
