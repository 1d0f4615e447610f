"""The real daemon process sweeping simulated GPUs: SIGTERM and SIGKILL mid-sweep never leave a cap changed."""

from __future__ import annotations

import json
import signal

import requests

from daemon_configs import probes_section
from persisted_boards import ORIGINAL, board_limits, boards
from waiting import wait_for

CONFIG = """
log_level: debug
{boards}{probes}  first_run_delay_seconds: 0.5
  simulated_measure_seconds: 1.0
  stop_early: false  # every cap runs: the series of all five are checked
  schedules:
    - probe: llm
      interval_seconds: 3600
      caps: [max, 500, 400, 300, 200]
      settle_seconds: 0.2
"""


def sweeping(state):
    try:
        limits = board_limits(state)
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return limits.get("0") not in (650.0, None) and list(state.glob("*.cap.json"))


def test_probe_series_appear_with_expected_labels(start_daemon, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(config_text=CONFIG.format(boards=boards(state), probes=probes_section(state, writable=True)))
    text = wait_for(
        lambda: (t := requests.get(daemon.url + "/metrics", timeout=5).text).count("gpuperf_probe_energy_per_unit_joules{") >= 10 and t,
        timeout=60, what="a full sweep on both GPUs",
    )
    assert 'gpuperf_probe_work_units_per_second{gpu="0",power_cap="400",preset="gpt2",probe="llm",unit="token"' in text
    assert 'gpuperf_probe_runs_total{gpu="1",preset="gpt2",probe="llm",reason="",result="ok"' in text
    assert 'gpuperf_power_cap_original_watts{gpu="0"' in text
    wait_for(lambda: board_limits(state) == ORIGINAL, what="caps restored after the sweep")


def test_sigterm_mid_sweep_restores_the_original_cap(start_daemon, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(config_text=CONFIG.format(boards=boards(state), probes=probes_section(state, writable=True)))
    wait_for(lambda: sweeping(state), what="the sweep to change a cap")
    assert daemon.stop(signal.SIGTERM) == 0
    assert board_limits(state) == ORIGINAL
    assert not list(state.glob("*.cap.json"))
    assert "power cap restored to 650 W" in daemon.log()


def test_sigkill_mid_sweep_then_restart_restores_before_any_probe(start_daemon, tmp_path):
    state = tmp_path / "state"
    config = CONFIG.format(boards=boards(state), probes=probes_section(state, writable=True))
    first = start_daemon(config_text=config)
    wait_for(lambda: sweeping(state), what="the sweep to change a cap")
    first.stop(signal.SIGKILL)
    left = board_limits(state)
    assert left["0"] != 650.0 and list(state.glob("*.cap.json"))  # the crash left a changed cap and a journal

    second = start_daemon(config_text=config.replace("first_run_delay_seconds: 0.5", "first_run_delay_seconds: 3600"))
    assert board_limits(state) == ORIGINAL
    assert not list(state.glob("*.cap.json"))
    wait_for(lambda: "listening on" in second.log(), what="the start-up log line")  # /healthz answers just before it
    log = second.log()
    restored = log.index("restored original power cap 650 W")
    assert restored < log.index("listening on")  # before the HTTP server and the scheduler started
    assert "gpuperf_power_limit_watts{gpu=\"0\"" in requests.get(second.url + "/metrics", timeout=5).text
