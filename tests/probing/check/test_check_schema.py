"""One shape of answer: the daemon's GET /api/v1/health and ``gpuperfd check --json`` on the same
simulated node (an uncorrectable ECC error on GPU 1) agree on keys and on the passive verdict; the
daemon, configured with ``health.nfd_features_file``, writes the verdict for node-feature-discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from gpuperfd.health.verdict import ACTIONS, SCHEMA, SEVERITIES, STATES

ROOT = Path(__file__).resolve().parents[3]


def _config(tmp_path: Path) -> str:
    return f"""
device: {{backend: simulated}}
simulation: {{gpus: 3, seed: 1, ecc_errors: [{{gpu: 1, uncorrected: 2}}]}}
probes: {{state_dir: {tmp_path / "state"}, history: {{path: {tmp_path / "history.jsonl"}}}}}
health: {{interval_seconds: 0.5, nfd_features_file: {tmp_path / "features.d" / "gpuperfd"}}}
"""


def _daemon_body(url: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = requests.get(url + "/api/v1/health", timeout=5).json()
        if any(g["gpu"] == 1 and g["state"] == "unhealthy" for g in body["gpus"]):
            return body
        time.sleep(0.2)
    raise AssertionError(f"no unhealthy GPU 1 in {timeout}s: {body}")


def _check_shape(body: dict) -> None:
    assert body["schema"] == SCHEMA and body["state"] in STATES and body["action"] in ACTIONS
    for gpu in body["gpus"]:
        assert set(gpu) == {"gpu", "uuid", "state", "action", "evaluated_at", "reasons"}
        for reason in gpu["reasons"]:
            assert set(reason) == {"check", "key", "severity", "action", "message", "since", "last_seen", "evidence"}
            assert reason["severity"] in SEVERITIES and reason["action"] in ACTIONS


def test_daemon_and_check_answer_in_one_shape(start_daemon, tmp_path: Path) -> None:
    daemon = start_daemon([], config_text=_config(tmp_path))
    served = _daemon_body(daemon.url)
    config = tmp_path / "check.yaml"
    config.write_text(_config(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "gpuperfd", "check", "--config", str(config), "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 11, proc.stdout + proc.stderr
    checked = json.loads(proc.stdout)

    for body in (served, checked):
        _check_shape(body)
    assert set(checked) - set(served) == {"check"} and set(served) <= set(checked)
    assert list(served)[:4] == list(checked)[:4] == ["schema", "node", "state", "action"]
    by_gpu = [{g["gpu"]: g for g in body["gpus"]} for body in (served, checked)]
    assert sorted(by_gpu[0]) == sorted(by_gpu[1]) == [0, 1, 2]
    for gpu in (0, 1, 2):
        assert by_gpu[0][gpu]["uuid"] == by_gpu[1][gpu]["uuid"]
        assert by_gpu[0][gpu]["state"] == by_gpu[1][gpu]["state"]
    served_reason = next(r for r in by_gpu[0][1]["reasons"] if r["check"] == "ecc_uncorrectable_volatile")
    checked_reason = next(r for r in by_gpu[1][1]["reasons"] if r["check"] == "ecc_uncorrectable_volatile")
    assert served_reason["message"] == checked_reason["message"]
    assert served_reason["evidence"] == checked_reason["evidence"]

    features = (tmp_path / "features.d" / "gpuperfd").read_text().splitlines()
    assert features[:2] == ["gpuperfd.io/health-state=unhealthy", "gpuperfd.io/health-action=reset_gpu"]
    assert "gpuperfd.io/gpus-unhealthy=1" in features
