"""Apply mode attacked from outside (issue 51), as an operator and as an attacker would: the real
`gpuperfd run` daemon and the real CLI on simulated boards shared by every process (every limit read
re-reads the board). An operator's hand-set cap survives every restorer; a cap a killed writer left
is told from an operator's and put back; the emergency command says what the board reads."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from persisted_boards import ORIGINAL, board_limits, boards, operator_sets

CONFIG = """
log_level: info
sampler: {{interval_seconds: 0.2}}
{boards}health: {{interval_seconds: 0.5}}
probes:
  read_only: false
  state_dir: {state}
  history: {{path: {state}/history.jsonl}}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: {first_run}
  simulated_measure_seconds: {measure}
  schedules:
    - probe: llm
      interval_seconds: {interval}
      caps: [max, current, 500, 400, 300]
      settle_seconds: 0
apply: {{mode: {mode}, workload: llm, budget_ratio: 0.1, interval_seconds: 1}}
"""
HAND = 600.0  # the operator's own cap on GPU 1, set by hand (neither theirs before nor any cap we set)


def config(state: Path, mode: str = "on", first_run: float = 0.1, interval: float = 3600,
           measure: float = 0.05) -> str:
    return CONFIG.format(state=state, boards=boards(state), mode=mode, first_run=first_run, interval=interval,
                         measure=measure)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuperfd", *args, "--config", str(cwd / "gpuperfd.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def wait_for(what, timeout: float = 30.0, log=lambda: ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < deadline, log()[-3000:]
        time.sleep(0.05)
    return got


def applied(state: Path) -> dict[str, float] | None:
    now = board_limits(state)
    entries = [json.loads(p.read_text()) for p in state.glob("*.cap.json")]
    ok = len(entries) == 2 and all(e.get("applied_watts") for e in entries)
    return now if ok and all(now[k] == e["applied_watts"] for k, e in
                             zip(sorted(now), sorted(entries, key=lambda e: e["gpu_index"]))) else None


def gpu_state(daemon, gpu: int) -> dict:  # type: ignore[no-untyped-def]
    return requests.get(daemon.url + "/api/v1/apply", timeout=5).json()["gpus"][gpu]


@pytest.mark.parametrize("restorer", ["sigterm", "revert", "sigkill_restore_caps", "sighup_off"])
def test_an_operators_hand_set_cap_survives_every_restorer(start_daemon, tmp_path, restorer) -> None:  # type: ignore[no-untyped-def]
    """Before issue 51, 6 of 8 such cases wrote the journaled 640 W over the operator's 600 W."""
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state))
    wait_for(lambda: applied(state), log=daemon.log)
    operator_sets(state, 1, HAND)  # then at once, before the controller's next pass can notice
    if restorer == "sigterm":
        assert daemon.stop(signal.SIGTERM) == 0
    elif restorer == "revert":
        done = cli("apply", "--revert", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert f"gpu 1: {HAND:.0f} W kept: not a cap we set" in done.stdout and "the board reads 600 W" in done.stdout
        assert "operator's cap 650 W back" in done.stdout and "the board reads 650 W" in done.stdout
        wait_for(lambda: gpu_state(daemon, 1)["applied_watts"] is None, log=daemon.log)
        assert daemon.stop(signal.SIGTERM) == 0
    elif restorer == "sigkill_restore_caps":
        daemon.stop(signal.SIGKILL)
        done = cli("restore-caps", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "600 W kept: not a cap we set" in done.stdout and "the board reads 600 W" in done.stdout
    else:
        (tmp_path / "gpuperfd.yaml").write_text(config(state, mode="off"))
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: board_limits(state)["0"] == ORIGINAL["0"], log=daemon.log)
        wait_for(lambda: gpu_state(daemon, 1)["applied_watts"] is None, log=daemon.log)
        assert daemon.stop(signal.SIGTERM) == 0
    assert board_limits(state) == {"0": ORIGINAL["0"], "1": HAND}
    assert list(state.glob("*.cap.json")) == []  # no later start may write 640 W over their choice
    decisions = [json.loads(line) for line in (state / "cap-decisions.jsonl").read_text().splitlines()]
    assert any(d["believed"] == "operator" and d["watts"] in (HAND, 0.0) for d in decisions), decisions
    assert "Traceback" not in daemon.log()


def sweep_on_gpu_1(tmp_path: Path, state_dir: Path, measure: float = 3.0) -> subprocess.Popen[str]:
    """A `gpuperfd sweep` of GPU 1 (its own config: slow points) journaling in ``state_dir``."""
    text = config(tmp_path / "state", measure=measure).replace(f"state_dir: {tmp_path / 'state'}",
                                                               f"state_dir: {state_dir}")
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return subprocess.Popen([sys.executable, "-m", "gpuperfd", "sweep", "--config", str(path), "--probe", "llm",
                             "--caps", "max,500", "--settle", "0", "--gpu", "1", "--no-progress", "--wait", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("where", ["same_state_dir", "other_state_dir"])
def test_a_killed_sweeps_cap_on_an_applied_gpu_is_not_taken_for_an_operators(start_daemon, tmp_path, where) -> None:  # type: ignore[no-untyped-def]
    """A CLI sweep SIGKILLed at its 700 W point on an applied GPU: before issue 51 the daemon called the GPU
    "overridden", dropped the entry, and 700 W stayed for good on a GPU whose operator set 640 W."""
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state))
    wait_for(lambda: applied(state), log=daemon.log)
    other = state if where == "same_state_dir" else tmp_path / "other-state"
    sweep = sweep_on_gpu_1(tmp_path, other)
    wait_for(lambda: board_limits(state)["1"] == 700.0 or sweep.poll() is not None)
    assert sweep.poll() is None, sweep.communicate()[1]
    sweep.kill()
    sweep.wait()
    assert board_limits(state)["1"] == 700.0
    # The controller's next pass: the cap is the dead sweep's (its journaled pair), not an operator's.
    got = wait_for(lambda: (g := gpu_state(daemon, 1))["applied_watts"] is None and g, log=daemon.log)
    assert got["reason"] == "rolled_back" and got["detail"].startswith("sweep_unrestored") and not got["overridden"]
    assert board_limits(state)["1"] == ORIGINAL["1"]
    assert daemon.stop(signal.SIGTERM) == 0
    assert board_limits(state) == ORIGINAL
    done = cli("restore-caps", cwd=tmp_path)  # every leftover of every state directory: nothing to write over
    assert done.returncode == 0, done.stderr
    assert board_limits(state) == ORIGINAL
    assert not list(state.glob("*.cap.json")) and not list(other.glob("*.cap.json"))


def test_an_operators_cap_set_during_the_daemons_sweep_of_an_applied_gpu_stays(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Before issue 51 the sweep's end wrote the applied 300 W over the operator's hand-set 600 W."""
    state = tmp_path / "state"
    daemon = start_daemon(config_text=config(state, interval=10, measure=0.4))
    before = wait_for(lambda: applied(state), log=daemon.log)
    wait_for(lambda: board_limits(state)["1"] != before["1"], timeout=40, log=daemon.log)  # the next round sweeps it
    operator_sets(state, 1, HAND)
    got = wait_for(lambda: (g := gpu_state(daemon, 1))["reason"] == "overridden" and g, log=daemon.log)
    assert got["applied_watts"] is None and board_limits(state)["1"] == HAND
    time.sleep(1.5)  # more passes and points: nothing writes over it
    assert board_limits(state)["1"] == HAND
    assert daemon.stop(signal.SIGTERM) == 0
    assert board_limits(state) == {"0": ORIGINAL["0"], "1": HAND} and not list(state.glob("*.cap.json"))
    assert "the cap is changed under it" not in daemon.log() and "Traceback" not in daemon.log()
