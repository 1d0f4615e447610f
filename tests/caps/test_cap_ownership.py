"""A power cap always comes back (issue 19): real `gpuperfd sweep` processes on simulated GPUs whose
limits persist in ``simulation.state_file``, ended by real signals and a real closed terminal, racing
for one GPU, and journals that are malformed or cannot be written.

Each test is named after the issue's case: 1 signals, 2 two writers, 6 malformed journals,
8 errors that mislead.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import pty
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import requests

from gpuperfd.caps.guard import CapGuard
from gpuperfd.caps.journal import CapJournal, restore_pending
from gpuperfd.caps.ownership import GpuBusy, GpuLock, is_owned, safe_name
from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend, simulated_uuid

ORIGINAL = {"0": 650.0, "1": 640.0}
CONFIG = """
log_level: {level}
device: {{backend: simulated}}
simulation: {{gpus: 2, seed: 1, initial_power_limits: {{0: 650, 1: 640}}, state_file: {sim}}}
probes: {{state_dir: {state}, simulated_measure_seconds: {measure}, history: {{path: null}}}}
"""


def write_config(tmp_path: Path, name: str, measure: float, state: Path | None = None, level: str = "info") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(CONFIG.format(level=level, sim=tmp_path / "sim-limits.json", state=state or tmp_path / "state",
                                  measure=measure))
    return path


def sweep_cmd(config: Path, *extra: str, gpu: int = 0, caps: str = "max,500,400,300") -> list[str]:
    return [sys.executable, "-m", "gpuperfd", "sweep", "--config", str(config), "--probe", "llm", "--caps", caps,
            "--settle", "0", "--gpu", str(gpu), "--no-progress", *extra]


def start(cmd: list[str], **kwargs) -> subprocess.Popen:
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(cmd, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"), **kwargs)


def limits(tmp_path: Path) -> dict[str, float]:
    path = tmp_path / "sim-limits.json"
    return json.loads(path.read_text()) if path.exists() else dict(ORIGINAL)


def journal(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state").glob("*.cap.json"))


def wait_sweeping(tmp_path: Path, proc: subprocess.Popen, gpu: str = "0", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (limits(tmp_path)[gpu] != ORIGINAL[gpu] and journal(tmp_path)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep never changed a cap"
        time.sleep(0.02)


# --- 1: every signal that can end a CLI sweep puts the cap back --------------------------------


@pytest.mark.parametrize("signals", [
    [signal.SIGTERM], [signal.SIGHUP], [signal.SIGINT], [signal.SIGQUIT], [signal.SIGINT, signal.SIGINT],
], ids=["SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGINT-twice"])
def test_case1_cli_sweep_stopped_by_a_signal_restores_and_says_so(tmp_path, signals):
    proc = start(sweep_cmd(write_config(tmp_path, "c", measure=2.0)))
    wait_sweeping(tmp_path, proc)
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.005)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signals[0], err
    assert limits(tmp_path) == ORIGINAL
    assert journal(tmp_path) == []
    name = signal.Signals(signals[0]).name
    assert re.search(rf"sweep stopped by {name}: interrupted after [0-3] of 4 points, no recommendation; "
                     r"gpu 0: power cap restored, reads back 650 W \(the original\)", err), err
    assert "recommended cap" not in err
    assert "Traceback" not in err


def test_case1_closed_terminal_restores_the_cap(tmp_path):
    """The sweep runs as the controlling process of a real pty; closing the master hangs it up."""
    master, slave = pty.openpty()
    config = write_config(tmp_path, "c", measure=2.0, level="warning")

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(sweep_cmd(config), stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=take_terminal)
    os.close(slave)
    try:
        wait_sweeping(tmp_path, proc)
    finally:
        os.close(master)  # the terminal goes away: the kernel sends SIGHUP, writes then fail with EIO
    assert proc.wait(timeout=30) == 128 + signal.SIGHUP
    assert limits(tmp_path) == ORIGINAL
    assert journal(tmp_path) == []


# --- 2: one owner per GPU ----------------------------------------------------------------------


def test_case2_second_writer_is_refused_and_restore_caps_leaves_a_live_owner_alone(tmp_path):
    owner = start(sweep_cmd(write_config(tmp_path, "slow", measure=1.5)))
    wait_sweeping(tmp_path, owner)
    fast = write_config(tmp_path, "fast", measure=0.05)
    changed = limits(tmp_path)["0"]

    second = subprocess.run(sweep_cmd(fast), capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert f"gpu 0: its power cap is owned by pid {owner.pid}" in second.stderr
    restore = subprocess.run([sys.executable, "-m", "gpuperfd", "restore-caps", "--config", str(fast)],
                             capture_output=True, text=True, timeout=60)
    assert restore.returncode == 0, restore.stderr
    assert f"a running sweep (pid {owner.pid}) owns this GPU" in restore.stderr
    other = subprocess.run(sweep_cmd(fast, gpu=1), capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert "restored original power cap" not in other.stderr  # --gpu 1 never touches gpu 0's entry
    assert len(journal(tmp_path)) == 1 and owner.poll() is None  # the owner's entry, untouched
    assert limits(tmp_path)["0"] != 650.0 and changed != 650.0

    _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert limits(tmp_path) == ORIGINAL and journal(tmp_path) == []


def test_case2_owner_sigkilled_while_another_waits_then_the_waiter_restores_first(tmp_path):
    owner = start(sweep_cmd(write_config(tmp_path, "slow", measure=3.0)))
    wait_sweeping(tmp_path, owner)
    waiter = start(sweep_cmd(write_config(tmp_path, "fast", measure=0.05), "--wait", "60"))
    time.sleep(1.0)
    assert waiter.poll() is None  # waiting for the lock, not sweeping
    assert len(journal(tmp_path)) == 1
    owner.kill()
    owner.wait()
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    taken_over = err.index(f"restored original power cap 650 W left changed by pid {owner.pid}")
    assert taken_over < err.index("gpu 0: llm at 700 W")  # before its own first point
    assert limits(tmp_path) == ORIGINAL and journal(tmp_path) == []


def test_case2_daemon_skips_a_gpu_a_cli_sweep_owns_and_leaves_its_entry(start_daemon, tmp_path):
    owner = start(sweep_cmd(write_config(tmp_path, "slow", measure=2.0)))
    wait_sweeping(tmp_path, owner)
    daemon = start_daemon(config_text=f"""
device: {{backend: simulated}}
simulation: {{gpus: 2, seed: 1, initial_power_limits: {{0: 650, 1: 640}}, state_file: {tmp_path}/sim-limits.json}}
probes:
  read_only: false
  state_dir: {tmp_path}/state
  history: {{path: null}}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.1
  simulated_measure_seconds: 0.05
  schedules: [{{probe: llm, interval_seconds: 3600, caps: [max, 300], settle_seconds: 0, gpus: [0]}}]
""")
    deadline = time.monotonic() + 20
    while 'reason="busy",result="skipped"' not in (text := requests.get(daemon.url + "/metrics", timeout=5).text):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)
    assert len(journal(tmp_path)) == 1 and owner.poll() is None  # the daemon's start-up restore left it alone
    assert "owned by pid" in daemon.log() and "restored original power cap" not in daemon.log()
    assert daemon.stop() == 0
    _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert limits(tmp_path) == ORIGINAL and journal(tmp_path) == []
    del text


def test_case2_lock_is_exclusive_across_descriptors_and_names_its_owner(tmp_path):
    first = GpuLock(tmp_path, "GPU-a")
    first.acquire()
    assert is_owned(tmp_path, "GPU-a") == os.getpid()
    with pytest.raises(GpuBusy) as busy:
        GpuLock(tmp_path, "GPU-a").acquire(wait_seconds=0.1)
    assert busy.value.owner_pid == os.getpid()
    first.release()
    assert is_owned(tmp_path, "GPU-a") is None
    GpuLock(tmp_path, "GPU-a").acquire()  # free again


# --- 6: malformed journal files ----------------------------------------------------------------


@pytest.fixture
def sim(tmp_path):
    config = SimulationConfig(gpus=2, seed=1, initial_power_limits={0: 650, 1: 640},
                              state_file=tmp_path / "sim-limits.json")
    return config


def entry(uuid: str, watts: float = 650.0) -> str:
    return json.dumps({"uuid": uuid, "gpu_index": 0, "original_watts": watts, "default_watts": 700,
                       "recorded_at": 0, "pid": 1})


def test_case6_deep_nesting_is_that_entrys_error_and_the_others_are_restored(tmp_path, sim, caplog):
    state = tmp_path / "state"
    state.mkdir()
    backend = SimulatedBackend(sim)
    gpus = backend.devices()
    for gpu in gpus:
        gpu.set_power_limit(300.0)
    (state / f"{safe_name(simulated_uuid('H100', 0))}.cap.json").write_text("[" * 30_000 + "]" * 30_000)
    (state / f"{safe_name(simulated_uuid('H100', 1))}.cap.json").write_text(entry(simulated_uuid("H100", 1), 640))
    with caplog.at_level(logging.WARNING):
        actions = restore_pending(CapJournal(state), gpus)
    assert sorted(actions) == ["gpu 0: default 700 W (corrupt journal)", "gpu 1: 640 W"]
    assert "nested too deeply" in caplog.text
    assert [g.power_limits().enforced_watts for g in gpus] == [700.0, 640.0]


@pytest.mark.parametrize("kind", ["fifo", "symlink_dev_zero", "oversized"])
def test_case6_fifo_symlink_and_huge_files_never_hang_restore_caps(tmp_path, kind):
    state = tmp_path / "state"
    state.mkdir()
    path = state / f"{safe_name(simulated_uuid('H100', 0))}.cap.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink_dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b" " * (1 << 20) + entry(simulated_uuid("H100", 0)).encode())
    (tmp_path / "sim-limits.json").write_text(json.dumps({"0": 300.0, "1": 640.0}))
    config = write_config(tmp_path, "c", measure=0.05)
    done = subprocess.run([sys.executable, "-m", "gpuperfd", "restore-caps", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unreadable power-cap journal entry" in done.stderr
    assert limits(tmp_path) == {"0": 700.0, "1": 640.0}  # the board default, the safe choice
    assert not os.path.lexists(path)


def test_case6_the_file_name_decides_the_gpu_not_the_uuid_inside(tmp_path, sim, caplog):
    state = tmp_path / "state"
    state.mkdir()
    gpus = SimulatedBackend(sim).devices()
    gpus[0].set_power_limit(300.0)
    # gpu 0's file claims to be gpu 1's entry with a 250 W "original": it must not set gpu 1 to 250 W
    (state / f"{safe_name(simulated_uuid('H100', 0))}.cap.json").write_text(entry(simulated_uuid("H100", 1), 250))
    with caplog.at_level(logging.ERROR):
        restore_pending(CapJournal(state), gpus)
    assert [g.power_limits().enforced_watts for g in gpus] == [700.0, 640.0]
    assert "not the GPU of its file name" in caplog.text


# --- 8: errors that mislead --------------------------------------------------------------------


def test_case8_journal_that_cannot_be_removed_is_reported_truthfully(tmp_path, sim, caplog, monkeypatch):
    gpu = SimulatedBackend(sim).devices()[0]
    jr = CapJournal(tmp_path / "state")

    def read_only_unlink(self, uuid):
        raise OSError(30, "Read-only file system")

    with caplog.at_level(logging.INFO):
        with CapGuard(gpu, jr) as guard:
            guard.set(300.0)
            monkeypatch.setattr(CapJournal, "clear", read_only_unlink)
    assert gpu.power_limits().enforced_watts == 650.0
    assert "power cap restored to 650 W (read back 650 W), but its journal entry" in caplog.text
    assert "Read-only file system" in caplog.text and "remove it by hand" in caplog.text
    assert "could not restore" not in caplog.text and "Traceback" not in caplog.text


def test_case8_unwritable_state_dir_is_one_clear_line_and_no_temp_file(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("x")
    config = write_config(tmp_path, "c", measure=0.05, state=blocked / "state")
    done = subprocess.run(sweep_cmd(config), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "gpuperfd: cannot use the state directory" in done.stderr and "Not a directory" in done.stderr
    assert "Traceback" not in done.stderr and "OSError" not in done.stderr
    assert limits(tmp_path) == ORIGINAL


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs we can fill or turn read-only (needs root, as the daemon has)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_case8_full_state_dir_leaves_no_temp_file_and_no_change(tmp_path, tmpfs):
    state = tmpfs / "state"
    state.mkdir()
    fd = os.open(tmpfs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    config = write_config(tmp_path, "c", measure=0.05, state=state)
    done = subprocess.run(sweep_cmd(config), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "cannot write the power-cap journal" in done.stderr and "the cap was not changed" in done.stderr
    assert "Traceback" not in done.stderr
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]
    assert limits(tmp_path) == ORIGINAL


def test_case8_state_dir_turned_read_only_mid_sweep_logs_what_happened(tmp_path, tmpfs):
    state = tmpfs / "state"
    proc = start(sweep_cmd(write_config(tmp_path, "c", measure=1.0, state=state)))
    deadline = time.monotonic() + 30
    while not list(state.glob("*.cap.json")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    _, err = proc.communicate(timeout=60)
    assert limits(tmp_path) == ORIGINAL
    assert "power cap restored to 650 W (read back 650 W), but its journal entry" in err
    assert "could not restore" not in err and "Traceback" not in err
    # A cap that cannot be journaled before it is written is not written (issue 51: a crash after it
    # would leave a cap no restore could tell from an operator's): the sweep stops at the next cap.
    assert "cannot write the power-cap journal" in err and "the cap was not changed" in err
    assert proc.returncode == 1


def test_a_cap_changed_by_hand_mid_sweep_stops_the_sweep_and_stays(tmp_path):
    """Issue 51: compare before every write. An operator's `nvidia-smi -pl` between two points is theirs:
    the sweep stops, writes nothing more (not its next cap, not the original), and exits 1 saying so."""
    proc = start(sweep_cmd(write_config(tmp_path, "c", measure=1.0)))
    deadline = time.monotonic() + 30
    while limits(tmp_path)["0"] == ORIGINAL["0"]:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    hand = dict(limits(tmp_path), **{"0": 600.0})
    (tmp_path / "sim-limits.json").write_text(json.dumps(hand))  # the operator, on the shared board
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "the cap reads 600 W" in err and "someone else changed it; theirs stays" in err
    assert limits(tmp_path) == hand and journal(tmp_path) == []
    decisions = (tmp_path / "state" / "cap-decisions.jsonl").read_text()
    assert '"believed": "operator"' in decisions and '"watts": 600.0' in decisions
