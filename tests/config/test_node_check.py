"""Issue 61: ``gpuperfd check-config`` said OK where the daemon then warned that ``apply.canary_share``
picks none of the node's GPUs; it gives that warning now, or says it cannot tell (no GPU readable here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CANARY = """
device: {{backend: {backend}}}
simulation: {{gpus: 2}}
probes: {{read_only: false, state_dir: {state}, schedules: [{{probe: llm, interval_seconds: 600, caps: [max, 500]}}]}}
apply: {{mode: canary, workload: llm, canary_share: {share}}}
"""


def _check(tmp_path: Path, backend: str, share: float) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "gpuperfd.yaml"
    config.write_text(CANARY.format(backend=backend, share=share, state=tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "gpuperfd", "check-config", str(config)], capture_output=True,
                          text=True, timeout=60)


def test_check_config_warns_as_the_daemon_does_when_the_canary_share_picks_no_gpu(tmp_path: Path, start_daemon) -> None:
    done = _check(tmp_path, "simulated", 0.05)
    assert done.returncode == 0 and ": OK (backend simulated" in done.stdout, done.stderr
    assert ("warning: apply.canary_share 0.05 (by a hash of each GPU's UUID) picks none of this node's 2 GPU(s): "
            "canary mode would apply no cap here; name them in apply.canary_gpus or raise apply.canary_share"
            in done.stderr), done.stderr
    daemon = start_daemon([], (tmp_path / "gpuperfd.yaml").read_text())  # the daemon says the same at its start
    assert "picks none of this node's 2 GPU(s)" in daemon.log()


def test_check_config_is_quiet_when_the_share_picks_a_gpu(tmp_path: Path) -> None:
    done = _check(tmp_path, "simulated", 1.0)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert not (tmp_path / "state").exists()


def test_check_config_says_it_cannot_tell_without_the_gpus(tmp_path: Path) -> None:
    """This machine has no NVIDIA driver: which GPUs the share picks cannot be known, and it says so."""
    done = _check(tmp_path, "nvml", 0.05)
    assert done.returncode == 0, done.stderr
    assert ("warning: apply.canary_share 0.05 (by a hash of each GPU's UUID): cannot tell which of this node's "
            "GPUs it picks (no NVIDIA driver found"
            in done.stderr and "the daemon warns at its start if it picks none" in done.stderr), done.stderr


def test_check_config_refuses_canary_gpus_the_node_lacks_as_the_daemon_does(tmp_path: Path, start_daemon) -> None:
    """A careless operator's try: ``device.gpus`` narrows the node to GPUs 0 and 1 and canary_gpus names 3:
    the file alone passed (the simulation has 4 GPUs), check-config said OK, the daemon refused to start."""
    config = tmp_path / "gpuperfd.yaml"
    config.write_text(f"""
device: {{backend: simulated, gpus: [0, 1]}}
simulation: {{gpus: 4}}
probes: {{read_only: false, state_dir: {tmp_path / "state"}, schedules: [{{probe: llm, interval_seconds: 600}}]}}
apply: {{mode: canary, workload: llm, canary_gpus: [3]}}
""")
    done = subprocess.run([sys.executable, "-m", "gpuperfd", "check-config", str(config)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == (f"gpuperfd: {config}: invalid configuration: apply.canary_gpus: GPU 3 does not exist on "
                           "this node (its GPUs: 0, 1): the daemon refuses to start\n")
    daemon = start_daemon(["--config", str(config)], ready=False)
    assert daemon.proc.wait(30) == 2 and "apply.canary_gpus: GPU 3 does not exist on this node" in daemon.log()
