"""Apply mode in real daemon processes on simulated GPUs whose limits persist in a state file (as a real
board keeps its limit): SIGKILL while applied, SIGTERM, SIGHUP to mode off, and `gpuperfd apply
--revert` each end with the operator's caps back, as they do for sweeps (tests/probing/sweep/test_crash_restore.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from persisted_boards import ORIGINAL, apply_config as config, board_limits
from waiting import wait_for

#: GPU 1 reports XID 48 (double-bit ECC error) at start: its verdict, from the daemon's own health monitor.
XID_ON_GPU_1 = "  xid_events: [{gpu: 1, xid: 48}]\n"


def wait_applied(daemon, state: Path, timeout: float = 30.0) -> dict[str, float]:  # type: ignore[no-untyped-def]
    def applied() -> dict[str, float] | None:
        now = board_limits(state)
        return now if all(now[k] < ORIGINAL[k] for k in ORIGINAL) and daemon.log().count("applied power cap") >= 2 \
            else None

    return wait_for(applied, timeout, lambda: f"never applied: {board_limits(state)}\n{daemon.log()}")


def test_sigkill_while_applied_is_undone_by_the_next_start(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state))
    applied = wait_applied(daemon, state)
    daemon.stop(signal.SIGKILL)
    assert board_limits(state) == applied and len(list(state.glob("*.cap.json"))) == 2  # the journal holds the operator's
    checker = start_daemon(config_text=config(state, mode="off", first_run=3600))
    assert board_limits(state) == ORIGINAL and list(state.glob("*.cap.json")) == []
    assert "restored original power cap" in checker.log()
    assert checker.stop(signal.SIGTERM) == 0


def test_sigterm_gives_every_applied_cap_back(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state))
    applied = wait_applied(daemon, state)
    text = requests.get(daemon.url + "/metrics", timeout=5).text  # the apply series, promtool-clean
    for gpu in ("0", "1"):
        assert f'gpuperf_apply_cap_watts{{gpu="{gpu}"' in text and f'reason="applied"' in text
    assert f'gpuperf_apply_operator_cap_watts{{gpu="0",uuid=' in text and 'gpuperf_apply_info{mode="on",workload="llm"} 1.0' in text
    assert f" {applied['0']}" in text.split("gpuperf_apply_cap_watts{gpu=\"0\"")[1].splitlines()[0]
    api = requests.get(daemon.url + "/api/v1/apply", timeout=5).json()
    assert api["mode"] == "on" and api["workload"] == "llm" and api["budget_ratio"] == 0.1
    assert [(g["gpu"], g["reason"], g["operator_watts"]) for g in api["gpus"]] == [(0, "applied", 650.0), (1, "applied", 640.0)]
    lint = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"], input=text,
                          capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout.strip() == "" and lint.stderr.strip() == "", lint.stdout + lint.stderr
    assert daemon.stop(signal.SIGTERM) == 0
    assert board_limits(state) == ORIGINAL and list(state.glob("*.cap.json")) == []
    assert "(stopped)" in daemon.log() and "Traceback" not in daemon.log()


def test_sighup_to_mode_off_gives_the_caps_back_and_keeps_running(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state))
    wait_applied(daemon, state)
    (tmp_path / "gpuperfd.yaml").write_text(config(state, mode="off"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: board_limits(state) == ORIGINAL, 15, daemon.log)
    assert list(state.glob("*.cap.json")) == [] and "(mode)" in daemon.log()
    assert daemon.proc.poll() is None
    assert daemon.stop(signal.SIGTERM) == 0 and board_limits(state) == ORIGINAL


def test_apply_revert_from_the_command_line_while_the_daemon_runs(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state))
    wait_applied(daemon, state)
    status = subprocess.run([sys.executable, "-m", "gpuperfd", "apply", "--status", "--config",
                             str(tmp_path / "gpuperfd.yaml")], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and status.stdout.count("applied, operator's") == 2 and "held by pid" in status.stdout
    revert = subprocess.run([sys.executable, "-m", "gpuperfd", "apply", "--revert", "--config",
                             str(tmp_path / "gpuperfd.yaml")], capture_output=True, text=True, timeout=60)
    assert revert.returncode == 0, revert.stderr
    assert "operator's cap 650 W back" in revert.stdout and "the board reads 640 W" in revert.stdout
    assert board_limits(state) == ORIGINAL and list(state.glob("*.cap.json")) == []
    # The board is shared (issue 51): the running daemon sees the operator's caps back and leaves both GPUs
    # quietly (no override alert for the operator's own revert), and its stop writes nothing over them.
    def reverted() -> list[dict] | None:
        gpus = requests.get(daemon.url + "/api/v1/apply", timeout=5).json()["gpus"]
        return gpus if all(g["detail"].startswith("reverted:") for g in gpus) else None

    gpus = wait_for(reverted, 15, daemon.log)
    assert all(g["reason"] == "rolled_back" and not g["overridden"] and g["applied_watts"] is None for g in gpus)
    assert 'gpuperf_apply_overridden{gpu="0"' in (text := requests.get(daemon.url + "/metrics", timeout=5).text)
    assert all(line.endswith(" 0.0") for line in text.splitlines() if line.startswith("gpuperf_apply_overridden{"))
    assert daemon.stop(signal.SIGTERM) == 0 and board_limits(state) == ORIGINAL
    assert "(stopped)" not in daemon.log()


def test_a_gpu_whose_real_verdict_is_not_healthy_is_never_applied(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    text = config(state).replace("  state_file:", XID_ON_GPU_1 + "  state_file:")
    daemon = start_daemon(config_text=text)
    wait_for(lambda: board_limits(state)["0"] < ORIGINAL["0"] and "applied power cap" in daemon.log(), 30, daemon.log)
    time.sleep(2.5)  # two more passes
    gpus = {g["gpu"]: g for g in requests.get(daemon.url + "/api/v1/apply", timeout=5).json()["gpus"]}
    assert gpus[0]["reason"] == "applied"
    assert gpus[1]["reason"] == "verdict" and "xid" in gpus[1]["detail"] and gpus[1]["applied_watts"] is None
    assert board_limits(state)["1"] == ORIGINAL["1"] and len(list(state.glob("*.cap.json"))) == 1
    assert daemon.stop(signal.SIGTERM) == 0 and board_limits(state) == ORIGINAL
