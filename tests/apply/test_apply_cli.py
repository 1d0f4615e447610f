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
