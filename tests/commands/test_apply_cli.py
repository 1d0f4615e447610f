"""`gpuperfd apply --revert` and `gpuperfd restore-caps` on a node without a driver (this machine):
exit 3 with the driver named, and the journal entry (the operator's cap) kept for a node that has one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuperfd.caps.journal import CapJournal
from gpuperfd.caps.ownership import safe_name

UUID = "GPU-5db0f908-4917-53a2-4a4f-b7adb8c81a50"


@pytest.mark.parametrize("command", [["apply", "--revert"], ["restore-caps"]])
def test_no_driver_exits_3_and_keeps_the_operators_cap_journaled(tmp_path: Path, command: list[str]) -> None:
    entry = tmp_path / (safe_name(UUID) + CapJournal.SUFFIX)
    body = {"uuid": UUID, "gpu_index": 0, "original_watts": 700.0, "default_watts": 700.0, "recorded_at": 1.0,
            "pid": 1, "applied_watts": 450.0}
    entry.write_text(json.dumps(body))
    config = tmp_path / "gpuperfd.yaml"
    config.write_text(f"device: {{backend: nvml}}\nprobes: {{state_dir: {tmp_path}}}\n")
    done = subprocess.run([sys.executable, "-m", "gpuperfd", *command, "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "no NVIDIA driver found" in done.stderr and "Traceback" not in done.stderr
    assert json.loads(entry.read_text()) == body  # nothing cleared: a node with a driver restores it later


# --- issue 51: one truthful emergency command ------------------------------------------------------------

def _boards_config(tmp_path: Path, state: Path) -> Path:
    from persisted_boards import boards

    config = tmp_path / "gpuperfd.yaml"
    config.write_text(boards(tmp_path) + f"probes: {{read_only: false, state_dir: {state}, simulated_measure_seconds: 2}}\n")
    return config


def _run(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuperfd", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=120)


def test_apply_revert_restores_a_killed_sweeps_cap_and_says_what_the_board_reads(tmp_path: Path) -> None:
    """Once `apply --revert` said "nothing to revert (no applied cap in the journal)" and exited 0 while a
    SIGKILLed sweep's entry and changed cap stood."""
    import time

    from persisted_boards import ORIGINAL, board_limits

    state = tmp_path / "state"
    config = _boards_config(tmp_path, state)
    sweep = subprocess.Popen([sys.executable, "-m", "gpuperfd", "sweep", "--config", str(config), "--probe", "llm",
                              "--caps", "max,500", "--settle", "0", "--gpu", "1", "--no-progress"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while board_limits(tmp_path)["1"] == ORIGINAL["1"]:
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    sweep.kill()
    sweep.wait()
    done = _run("apply", "--revert", config=config)
    assert done.returncode == 0, done.stderr
    assert "gpu 1: operator's cap 640 W back; the board reads 640 W" in done.stdout
    assert board_limits(tmp_path) == ORIGINAL and not list(state.glob("*.cap.json"))


def test_apply_revert_handles_a_corrupt_entry_as_restore_caps_does(tmp_path: Path) -> None:
    from persisted_boards import board_limits

    state = tmp_path / "state"
    state.mkdir()
    (state / (safe_name(UUID) + CapJournal.SUFFIX)).write_text('{"uuid": "wrong schema"}')
    (tmp_path / "sim-limits.json").write_text(json.dumps({"0": 650.0, "1": 300.0}))
    done = _run("apply", "--revert", config=_boards_config(tmp_path, state))
    assert done.returncode == 0, done.stderr
    assert "gpu 1: default 700 W (corrupt journal); the board reads 700 W" in done.stdout
    assert board_limits(tmp_path)["1"] == 700.0 and not list(state.glob("*.cap.json"))


@pytest.mark.parametrize("kind", ["missing", "a_file"])
def test_apply_revert_refuses_a_state_dir_it_cannot_read(tmp_path: Path, kind: str) -> None:
    """Once exit 0 with "nothing to revert" for a --state-dir that did not exist or was a file."""
    state = tmp_path / "state"
    if kind == "a_file":
        state.write_text("")
    config = _boards_config(tmp_path, tmp_path / "elsewhere")
    done = _run("apply", "--revert", "--state-dir", str(state), config=config)
    what = "does not exist" if kind == "missing" else "is not a directory"
    assert done.returncode == 2 and f"state directory {state} {what}" in done.stderr, done.stderr
    assert "nothing to revert" not in done.stdout


def test_status_lists_the_applied_caps_by_gpu_index_not_by_uuid(tmp_path: Path) -> None:
    uuids = {0: "GPU-f0000000-0000-0000-0000-000000000000", 1: "GPU-a1111111-1111-1111-1111-111111111111",
             2: "GPU-c2222222-2222-2222-2222-222222222222"}  # UUID order: 1, 2, 0
    for index, uuid in uuids.items():
        body = {"uuid": uuid, "gpu_index": index, "original_watts": 700.0, "default_watts": 700.0,
                "recorded_at": 1.0, "pid": 1, "applied_watts": 400.0 + index}
        (tmp_path / (safe_name(uuid) + CapJournal.SUFFIX)).write_text(json.dumps(body))
    done = subprocess.run([sys.executable, "-m", "gpuperfd", "apply", "--status", "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("gpu ")]
    assert listed == ["0", "1", "2"], done.stdout


@pytest.mark.parametrize("command", ["--status", "--revert"])
def test_a_state_dir_that_is_not_one_is_an_error_not_no_applied_cap(command: str, tmp_path: Path) -> None:
    """``apply --status --state-dir /etc/passwd`` once answered "no applied cap" (exit 0)."""
    afile = tmp_path / "file"
    afile.write_text("x")
    for state_dir, words in ((afile, "is not a directory"), (tmp_path / "missing", "does not exist")):
        done = subprocess.run([sys.executable, "-m", "gpuperfd", "apply", command, "--state-dir", str(state_dir)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"state directory {state_dir} {words}" in done.stderr, done.stderr
        assert not (tmp_path / "missing").exists()


# --- issue 61: --status shows what --revert would act on ----------------------------------------------------

def _status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuperfd", "apply", "--status", *args],
                          capture_output=True, text=True, timeout=120)


def test_status_shows_a_killed_sweeps_entry_and_a_corrupt_one_that_revert_acts_on(tmp_path: Path) -> None:
    """Once "no applied cap" where the directory held a killed sweep's entry and a corrupt one, both of
    which ``apply --revert`` then acted on."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sweep = {"uuid": UUID, "gpu_index": 1, "original_watts": 640.0, "default_watts": 700.0, "recorded_at": 1.0,
             "pid": dead.pid}
    (tmp_path / (safe_name(UUID) + CapJournal.SUFFIX)).write_text(json.dumps(sweep))
    other = "GPU-a1111111-1111-1111-1111-111111111111"
    corrupt = tmp_path / (safe_name(other) + CapJournal.SUFFIX)
    corrupt.write_text('{"uuid": "wrong schema"}')
    done = _status("--state-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "no applied cap" not in done.stdout
    assert (f"gpu 1 {UUID}: a sweep's cap, operator's 640 W journaled (its sweep (pid {dead.pid}) is gone: "
            "--revert or the next start puts it back)") in done.stdout, done.stdout
    assert f"{corrupt}: unreadable power-cap journal entry (KeyError: 'gpu_index'): --revert sets its GPU to the " \
           "default limit (the safe choice)" in done.stdout, done.stdout


def test_status_on_a_node_whose_state_dir_was_never_made_says_nothing_is_applied(tmp_path: Path) -> None:
    """Once exit 2 on a node without /var/lib/gpuperfd (no daemon ever journaled a cap there). A directory
    named on the command line that is missing stays an error (a typo): the test above."""
    missing = tmp_path / "never-made"
    config = tmp_path / "gpuperfd.yaml"
    config.write_text(f"device: {{backend: simulated}}\nprobes: {{state_dir: {missing}}}\n")
    done = _status("--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"no applied cap: no power-cap journal entry in {missing} (does not exist)" in done.stdout, done.stdout
    assert not missing.exists()
