"""The daemon's scheduled interconnect probe on a node where GPU 1 computes wrong answers (issue 61): its
wrong sum is counted on both GPUs of the set, but no verdict charges it to GPU 0, whose own probe passes;
GPU 1 is judged by its own probe."""

from __future__ import annotations

import signal

import requests

from waiting import wait_for

CONFIG = """
device: {{backend: simulated}}
simulation: {{gpus: 2, seed: 1, degrade: [{{gpu: 1, wrong_results: true}}]}}
sampler: {{interval_seconds: 0.2}}
health: {{interval_seconds: 0.5}}
probes:
  state_dir: {state}
  history: {{path: {state}/history.jsonl}}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.1
  simulated_measure_seconds: 0.05
  schedules:
    - {{probe: llm, interval_seconds: 3600, settle_seconds: 0}}
    - {{probe: interconnect, interval_seconds: 3600}}
"""


def test_a_wrong_interconnect_sum_in_the_daemon_condemns_no_healthy_peer(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    daemon = start_daemon(config_text=CONFIG.format(state=tmp_path / "state"))
    wait_for(lambda: "interconnect GPUs (0, 1) failed (wrong_result)" in daemon.log(), log=daemon.log)

    def verdicts() -> dict[int, dict] | None:
        gpus = {g["gpu"]: g for g in requests.get(daemon.url + "/api/v1/health", timeout=5).json()["gpus"]}
        return gpus if gpus[1]["state"] == "unhealthy" else None

    gpus = wait_for(verdicts, log=daemon.log)
    assert gpus[0]["state"] == "healthy", gpus[0]["reasons"]
    assert {r["check"] for r in gpus[1]["reasons"]} >= {"probe_wrong_result"}
    assert all(r["evidence"].get("probe") != "interconnect" for r in gpus[1]["reasons"])
    assert daemon.stop(signal.SIGTERM) == 0
