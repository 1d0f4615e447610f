"""SIGHUP re-reads the config: a valid one changes schedules without a restart; a bad one is rejected."""

from __future__ import annotations

import signal
import time

import requests

BASE = """
device: {{backend: simulated}}
simulation: {{gpus: 1, seed: 2}}
probes:
  state_dir: {state}
  history: {{path: null}}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.2
  simulated_measure_seconds: 0.2
  schedules:
{schedules}
"""


def runs(url: str, probe: str) -> float:
    total = 0.0
    for line in requests.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("gpuperf_probe_runs_total{") and f'probe="{probe}"' in line and 'result="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_sighup_applies_a_good_config_and_rejects_a_bad_one(start_daemon, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(config_text=BASE.format(state=state, schedules="    - {probe: vit, interval_seconds: 3600}"))
    config = tmp_path / "gpuperfd.yaml"
    assert wait_for(lambda: runs(daemon.url, "vit") == 1)
    assert runs(daemon.url, "attention") == 0

    # a good config: a new schedule appears and runs, without a restart (same pid)
    config.write_text(BASE.format(state=state, schedules="    - {probe: attention, interval_seconds: 3600}"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: runs(daemon.url, "attention") == 1), daemon.log()
    assert "configuration reloaded: 1 probe schedule(s)" in daemon.log()

    # a bad config: rejected with a clear line, the old one keeps running
    config.write_text(BASE.format(state=state, schedules="    - {probe: attention, interval_seconds: -1}"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "reload rejected, keeping the running configuration" in daemon.log())
    assert "probes.schedules.0.interval_seconds" in daemon.log()
    assert daemon.proc.poll() is None
    assert requests.get(daemon.url + "/healthz", timeout=5).status_code == 200
    assert daemon.stop() == 0
