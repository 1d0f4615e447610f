"""The simulated board with a ``state_file`` is one board for every process, as a real one is: a limit
another process or an operator (editing the file) sets is what every later limit read of every other
process returns, not the limit that process last set or found at its start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import FOREIGN_PROFILE, SimulatedBackend


def backend(state_file: Path) -> SimulatedBackend:
    return SimulatedBackend(SimulationConfig(gpus=2, seed=1, initial_power_limits={0: 650, 1: 640},
                                             state_file=state_file))


def test_a_cap_set_by_another_backend_is_read_by_this_one(tmp_path: Path) -> None:
    state = tmp_path / "sim-limits.json"
    daemon, cli = backend(state), backend(state)
    assert daemon.devices()[1].power_limits().enforced_watts == 640.0
    cli.devices()[1].set_power_limit(300)
    assert daemon.devices()[1].power_limits().enforced_watts == 300.0  # not the 640 it found at its start
    assert daemon.devices()[0].power_limits().enforced_watts == 650.0  # each GPU's limit is its own
    daemon.devices()[0].set_power_limit(500)
    assert cli.devices()[0].power_limits().enforced_watts == 500.0
    assert cli.devices()[1].power_limits().enforced_watts == 300.0  # the daemon's write kept the CLI's cap


def test_an_operators_hand_edit_and_another_process_are_seen(tmp_path: Path) -> None:
    state = tmp_path / "sim-limits.json"
    daemon = backend(state)
    gpu = daemon.devices()[0]
    gpu.set_power_limit(400)
    state.write_text(json.dumps({"0": 600.0, "1": 640.0}))  # the operator, as nvidia-smi -pl would
    assert gpu.power_limits().enforced_watts == 600.0
    code = ("from gpuperfd.config import SimulationConfig\nfrom gpuperfd.device.simulated import SimulatedBackend\n"
            f"b = SimulatedBackend(SimulationConfig(gpus=2, seed=1, state_file={str(state)!r}))\n"
            "b.devices()[0].set_power_limit(350)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert gpu.power_limits().enforced_watts == 350.0
    # The power it draws under load follows the board's cap, not the one this process set.
    assert gpu.operating_point(FOREIGN_PROFILE).power_watts <= 350.0 + 1e-6
