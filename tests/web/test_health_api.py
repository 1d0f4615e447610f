"""GET /api/v1/health over real HTTP, against a real `gpuperfd run` on simulated GPUs.

The daemon runs with an injected uncorrectable ECC error on GPU 1 and an XID 79 on GPU 2
(from the simulator's config, as an operator would write it); GPU 0 stays healthy.
"""

from __future__ import annotations

import json
import socket
import time

import bcrypt
import requests

from gpuperfd.health.verdict import ACTIONS, SCHEMA, STATES

FAULTS = """
  ecc_errors: [{gpu: 1, uncorrected: 2}]
  xid_events: [{gpu: 2, xid: 31}]
"""


def config(tmp_path, gpus: int = 3, faults: str = "") -> str:
    """A simulated node whose state (sticky verdicts, history) lives in the test's own directory.

    The default state directory is /var/lib/gpuperfd: a daemon test that used it would leave
    its GPUs there and the next one would see them "missing" (check gpu_missing).
    """
    return f"""
device: {{backend: simulated}}
simulation:
  gpus: {gpus}
  seed: 1
{faults}
probes: {{state_dir: {tmp_path / "state"}, history: {{path: {tmp_path / "history.jsonl"}}}}}
health: {{interval_seconds: 0.5}}
"""


def _wait_json(url: str, predicate, auth=None, timeout: float = 60.0) -> dict:
    """Poll until the body satisfies ``predicate`` (the verdict is evaluated on its own thread)."""
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        try:
            response = requests.get(url, auth=auth, timeout=5)
            if response.status_code == 200:
                body = response.json()
                if predicate(body):
                    return body
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no matching answer from {url} in {timeout}s; last: {json.dumps(body)[:2000]}")


def _faulted(body: dict) -> bool:
    gpus = {g["gpu"]: g for g in body["gpus"]}
    return gpus[1]["state"] == "unhealthy" and gpus[2]["reasons"] != []


def test_health_api_shape_node_verdict_and_evidence(start_daemon, tmp_path) -> None:
    daemon = start_daemon([], config_text=config(tmp_path, faults=FAULTS))
    body = _wait_json(daemon.url + "/api/v1/health", _faulted)

    assert set(body) >= {"schema", "node", "state", "action", "gpus"}
    assert body["schema"] == SCHEMA and body["node"] == socket.gethostname()
    gpus = {g["gpu"]: g for g in body["gpus"]}
    assert sorted(gpus) == [0, 1, 2]
    for gpu in body["gpus"]:
        assert set(gpu) == {"gpu", "uuid", "state", "action", "evaluated_at", "reasons"}
        assert gpu["state"] in STATES and gpu["action"] in ACTIONS and gpu["uuid"].startswith("GPU-")

    # GPU 0: healthy, nothing to do, no reasons
    assert (gpus[0]["state"], gpus[0]["action"], gpus[0]["reasons"]) == ("healthy", "none", [])
    # GPU 1: the ECC error, with the value read as evidence
    ecc = [r for r in gpus[1]["reasons"] if r["check"] == "ecc_uncorrectable_volatile"]
    assert len(ecc) == 1 and gpus[1]["action"] == "reset_gpu"
    assert ecc[0]["severity"] == "unhealthy" and ecc[0]["action"] == "reset_gpu"
    assert ecc[0]["evidence"], ecc[0]
    assert 2.0 in [v for v in ecc[0]["evidence"].values() if isinstance(v, (int, float))], ecc[0]["evidence"]
    assert "uncorrectable" in ecc[0]["message"]
    assert set(ecc[0]) == {"check", "key", "severity", "action", "message", "since", "last_seen", "evidence"}
    # GPU 2: XID 31 (catalog: RESTART_APP) -> its reason names the code
    xid = [r for r in gpus[2]["reasons"] if r["check"] == "xid"]
    assert len(xid) == 1 and xid[0]["key"] == "31", gpus[2]
    # the node verdict is the worst GPU's
    assert (body["state"], body["action"]) == ("unhealthy", "reset_gpu")

    # ... on the landing page
    page = requests.get(daemon.url + "/", timeout=5).text
    row = page.split('data-gpu="1"', 1)[1].split("</tr>", 1)[0]
    assert 'data-state="unhealthy" data-action="reset_gpu"' in row and "uncorrectable ECC" in row
    # ... and on /metrics
    metrics = requests.get(daemon.url + "/metrics", timeout=5).text
    uuid1 = gpus[1]["uuid"]
    assert f'gpuperf_gpu_health_state{{gpu="1",uuid="{uuid1}",state="unhealthy"}} 1' in metrics
    assert f'gpuperf_gpu_health_action{{gpu="1",uuid="{uuid1}",action="reset_gpu"}} 1' in metrics


def test_health_api_methods_match_metrics(start_daemon, tmp_path) -> None:
    daemon = start_daemon([], config_text=config(tmp_path, gpus=1))
    for path in ("/metrics", "/api/v1/health"):
        head = requests.head(daemon.url + path, timeout=5)
        assert head.status_code == 200 and head.content == b""
        post = requests.post(daemon.url + path, data=b"x", timeout=5)
        assert post.status_code == 405 and post.headers["Allow"] == "GET, HEAD"
    get = requests.get(daemon.url + "/api/v1/health", timeout=5)
    assert get.headers["Content-Type"].startswith("application/json")
    assert int(requests.head(daemon.url + "/api/v1/health", timeout=5).headers["Content-Length"]) > 0
    assert requests.get(daemon.url + "/api/v1/health/", timeout=5).status_code == 404


def test_health_api_needs_the_same_basic_auth_as_metrics(start_daemon, tmp_path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: {hashed}\n")
    daemon = start_daemon(["--web.config.file", str(web)], config_text=config(tmp_path, gpus=1), ready=False)
    _wait_json(daemon.url + "/api/v1/health", lambda b: b["gpus"] != [], auth=("prom", "s3cret"))
    for path in ("/metrics", "/api/v1/health"):
        anonymous = requests.get(daemon.url + path, timeout=5)
        assert anonymous.status_code == 401 and "Basic" in anonymous.headers["WWW-Authenticate"]
        assert b"gpuperf" not in anonymous.content and b"uuid" not in anonymous.content
        assert requests.get(daemon.url + path, auth=("prom", "wrong"), timeout=5).status_code == 401
        assert requests.head(daemon.url + path, timeout=5).status_code == 401
    ok = requests.get(daemon.url + "/api/v1/health", auth=("prom", "s3cret"), timeout=5)
    assert ok.status_code == 200 and ok.json()["state"] == "healthy" and len(ok.json()["gpus"]) == 1


def test_wrong_results_reach_the_verdict_and_the_counter(start_daemon, tmp_path) -> None:
    """Issue 31 end to end: a simulated GPU that computes wrong numbers (simulation.degrade
    wrong_results) fails its scheduled probe with wrong_result; the daemon's verdict for it is
    unhealthy / contact_support and gpuperf_probe_wrong_results_total counts it; its peers stay healthy."""
    text = config(tmp_path, gpus=3, faults="  degrade: [{gpu: 1, wrong_results: true}]\n") + """
probes:
  state_dir: %s
  history: {path: %s}
  read_only: true
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.5
  simulated_measure_seconds: 0.2
  schedules:
    - {probe: llm, interval_seconds: 3600, caps: [current]}
""" % (tmp_path / "state", tmp_path / "history.jsonl")
    text = text.replace(f'probes: {{state_dir: {tmp_path / "state"}, history: {{path: {tmp_path / "history.jsonl"}}}}}\n', "")
    daemon = start_daemon([], config_text=text)
    body = _wait_json(daemon.url + "/api/v1/health",
                      lambda b: any(r["check"] == "probe_wrong_result" for g in b["gpus"] for r in g["reasons"]))
    gpus = {g["gpu"]: g for g in body["gpus"]}
    assert (gpus[1]["state"], gpus[1]["action"]) == ("unhealthy", "contact_support")
    assert [r["check"] for r in gpus[1]["reasons"]] == ["probe_wrong_result"]
    assert all(gpus[g]["state"] == "healthy" for g in (0, 2)), body
    metrics = requests.get(daemon.url + "/metrics", timeout=5).text
    counted = [line for line in metrics.splitlines()
               if line.startswith("gpuperf_probe_wrong_results_total{") and 'gpu="1"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 1, counted
    assert 'gpuperf_gpu_health_action{gpu="1"' in metrics
