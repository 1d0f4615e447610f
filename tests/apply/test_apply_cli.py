"""`gpuperfd apply --revert` and `gpuperfd restore-caps` on a node without a driver (this machine):
exit 3 with the driver named, and the journal entry (the operator's cap) kept for a node that has one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuperfd.probing.sweep.journal import CapJournal
from gpuperfd.probing.sweep.ownership import safe_name

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
        assert done.returncode == 2 and f"--state-dir {state_dir} {words}" in done.stderr, done.stderr
        assert not (tmp_path / "missing").exists()
