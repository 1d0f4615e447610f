"""deploy/slurm/epilog-gpuperfd.sh (issue 50): the Slurm Epilog hands the GPUs a job freed to the daemon's
probes. It must return at once, whatever curl does, and always exit 0 (a failing Epilog drains the node);
the daemon takes the hand-off only behind basic auth, and then a due probe runs without waiting out
probes.idle_seconds, while a GPU with a job on it is still never probed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import bcrypt
import requests
from daemon_configs import simulated_daemon

ROOT = Path(__file__).resolve().parents[2]
EPILOG = ROOT / "deploy/slurm/epilog-gpuperfd.sh"


def fake_curl(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A curl that records its arguments, then waits for a release file before it ends."""
    args, release, done = tmp_path / "args", tmp_path / "release", tmp_path / "done"
    curl = tmp_path / "curl"
    curl.write_text(f"""#!/bin/bash
printf '%s\\n' "$@" > {args}.tmp && mv {args}.tmp {args}
while [ ! -e {release} ]; do sleep 0.02; done
touch {done}
""")
    curl.chmod(0o755)
    return curl, release, done


def run_epilog(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(EPILOG)], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=30)


def wait_for(predicate, timeout=20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_epilog_returns_before_its_request_ends_and_names_the_jobs_gpus(tmp_path) -> None:
    curl, release, done = fake_curl(tmp_path)
    netrc = tmp_path / "netrc"
    result = run_epilog({"CURL": str(curl), "GPUPERFD_URL": "http://127.0.0.1:9", "GPUPERFD_NETRC": str(netrc),
                         "SLURM_JOB_GPUS": "0,2"})
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert not done.exists()  # the Epilog is back while its request still runs: the next job never waits on it
    args = wait_for(lambda: (tmp_path / "args").exists() and (tmp_path / "args").read_text().split("\n"))
    assert "http://127.0.0.1:9/api/v1/free?gpus=0,2" in args and ["--request", "POST"] == args[args.index("--request"):][:2]
    assert args[args.index("--netrc-file") + 1] == str(netrc) and args[args.index("--max-time") + 1] == "2"
    release.touch()
    wait_for(done.exists)


def test_no_gpu_list_hands_the_node_and_no_curl_still_exits_0(tmp_path) -> None:
    curl, release, _ = fake_curl(tmp_path)
    release.touch()
    assert run_epilog({"CURL": str(curl), "SLURM_JOB_GPUS": "GPU-1234,x"}).returncode == 0
    args = wait_for(lambda: (tmp_path / "args").exists() and (tmp_path / "args").read_text().split("\n"))
    assert "http://127.0.0.1:10187/api/v1/free" in args  # not a GPU index list: every GPU, the daemon decides
    assert run_epilog({"CURL": str(tmp_path / "absent")}).returncode == 0


CONFIG = """
{daemon}  first_run_delay_seconds: 0.2
  simulated_measure_seconds: 0.2
  schedules:
    - {{probe: llm, interval_seconds: 3600, settle_seconds: 0}}
"""


def config(tmp_path: Path) -> str:
    """Two GPUs whose probe waits out an hour of idleness unless the Epilog hands its GPU over."""
    return CONFIG.format(daemon=simulated_daemon(tmp_path / "state", gpus=2, seed=9, history=False, idle_seconds=3600))


def ok_runs(url: str, auth, gpu: str) -> float:  # type: ignore[no-untyped-def]
    for line in requests.get(url + "/metrics", auth=auth, timeout=5).text.splitlines():
        if (line.startswith("gpuperf_probe_runs_total{") and f'gpu="{gpu}"' in line and 'result="ok"' in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_gpu_handed_over_by_the_epilog_is_probed_without_waiting_out_idle_seconds(start_daemon, tmp_path) -> None:
    daemon, auth = _behind_basic_auth(start_daemon, tmp_path)
    wait_for(lambda: "llm skipped: not_idle" in daemon.log())  # the first firing: idle 0.2 s of 3600
    assert requests.post(daemon.url + "/api/v1/free", timeout=5).status_code == 401  # a write, behind the same auth
    assert requests.post(daemon.url + "/api/v1/free?gpus=x", auth=auth, timeout=5).status_code == 400
    assert requests.get(daemon.url + "/api/v1/free", auth=auth, timeout=5).status_code == 404
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login slurm password s3cret\n")
    result = run_epilog({"GPUPERFD_URL": daemon.url, "GPUPERFD_NETRC": str(netrc), "SLURM_JOB_GPUS": "1"})
    assert result.returncode == 0
    wait_for(lambda: ok_runs(daemon.url, auth, "1") == 1)  # GPU 1 handed over: its due probe ran
    assert ok_runs(daemon.url, auth, "0") == 0  # GPU 0 was not: it still waits out idle_seconds
    assert "GPU(s) [1] handed over as free by the scheduler" in daemon.log()


def test_without_basic_auth_the_daemon_refuses_the_hand_off(start_daemon, tmp_path) -> None:
    daemon = start_daemon(config_text=config(tmp_path))
    answer = requests.post(daemon.url + "/api/v1/free", timeout=5)
    assert answer.status_code == 403 and "basic auth" in answer.json()["error"]
    assert requests.post(daemon.url + "/metrics", timeout=5).status_code == 405  # other paths: no writes


def test_handing_over_a_gpu_the_node_lacks_is_refused_naming_it_and_a_repeat_counts_once(start_daemon, tmp_path):
    """Issue 61: ``gpus=7`` on a node without GPU 7 answered 200 with an empty list, and ``gpus=0,0,1``
    handed GPU 0 over twice."""
    daemon, auth = _behind_basic_auth(start_daemon, tmp_path)
    missing = requests.post(daemon.url + "/api/v1/free?gpus=7", auth=auth, timeout=5)
    assert missing.status_code == 400
    assert missing.json() == {"error": "gpus: GPU 7 is not on this node (its GPUs: 0, 1); nothing handed over"}
    partly = requests.post(daemon.url + "/api/v1/free?gpus=1,7", auth=auth, timeout=5)
    assert partly.status_code == 400 and "GPU 7 is not on this node" in partly.json()["error"]
    assert "handed over as free" not in daemon.log()  # nothing changed by a refused request
    twice = requests.post(daemon.url + "/api/v1/free?gpus=0,0,1", auth=auth, timeout=5)
    assert twice.status_code == 200 and twice.json() == {"handed_over": [0, 1]}


def _behind_basic_auth(start_daemon, tmp_path):  # type: ignore[no-untyped-def]
    """A daemon on CONFIG behind basic auth (the hand-off is a write: refused without it), and its auth."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  slurm: {hashed}\n")
    daemon = start_daemon(["--web.config.file", str(web)], config_text=config(tmp_path), ready=False)
    auth = ("slurm", "s3cret")
    wait_for(lambda: _answers(daemon.url, auth))
    return daemon, auth


def _answers(url: str, auth) -> bool:  # type: ignore[no-untyped-def]
    try:
        return requests.get(url + "/healthz", auth=auth, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False
