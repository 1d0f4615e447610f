"""The real daemon wired for operations: basic auth from --web.config.file, sd_notify READY and watchdog."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import bcrypt
import requests
from conftest import free_port


def test_daemon_enforces_basic_auth_from_web_config(start_daemon, tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: {hashed}\n")
    daemon = start_daemon(["--simulate", "1", "--web.config.file", str(web)], ready=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(daemon.url + "/metrics", timeout=1).status_code == 401:
                break
        except requests.RequestException:
            time.sleep(0.1)
    anonymous = requests.get(daemon.url + "/metrics", timeout=5)
    assert anonymous.status_code == 401 and "Basic" in anonymous.headers["WWW-Authenticate"]
    assert requests.get(daemon.url + "/metrics", auth=("prom", "wrong"), timeout=5).status_code == 401
    ok = requests.get(daemon.url + "/metrics", auth=("prom", "s3cret"), timeout=5)
    assert ok.status_code == 200 and "gpuperf_gpu_up" in ok.text


def test_daemon_tells_systemd_ready_after_first_collection_and_pings_watchdog(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    port = free_port()
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000", WATCHDOG_PID="", PYTHONUNBUFFERED="1")
    env.pop("WATCHDOG_PID")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuperfd", "run", "--simulate", "1", "--web.listen-address", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )
    try:
        messages = []
        while not any("WATCHDOG=1" in m for m in messages):
            messages.append(sock.recv(4096).decode())
        ready = next(m for m in messages if "READY=1" in m)
        assert "1 GPU(s)" in ready
        # READY came after the first collection: metrics are there already
        assert "gpuperf_power_draw_watts{" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        proc.terminate()
        while True:
            message = sock.recv(4096).decode()
            if "STOPPING=1" in message:
                break
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
