"""Shared fixtures: a controllable clock, simulated backends, free ports, daemon processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import gpuperfd.cli  # noqa: F401  (hands the config its vocabulary, as every command does)
from child_processes import end
from manual_clock import FakeClock

# The daemon requires the kubelet's answer before probing inside a Kubernetes pod
# (attribution.kubernetes.required: auto); a CI runner that is itself a pod must not
# turn every test daemon's probes into "allocated" skips. Tests that want it set it.
os.environ.pop("KUBERNETES_SERVICE_HOST", None)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DaemonProcess:
    """A real `gpuperfd run` child process on a free loopback port."""

    def __init__(self, args: list[str], config_text: str | None, tmp_path: Path) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "gpuperfd", "run", "--web.listen-address", f"127.0.0.1:{self.port}", *args]
        if config_text is not None:
            config = tmp_path / "gpuperfd.yaml"
            config.write_text(config_text)
            cmd += ["--config", str(config)]
        self.log_path = tmp_path / "daemon.log"
        self._log = self.log_path.open("wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"daemon not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        returncode = end(self.proc, timeout, sig)
        self._log.close()
        return returncode


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator:
    started: list[DaemonProcess] = []

    def start(args: list[str] | None = None, config_text: str | None = None, ready: bool = True) -> DaemonProcess:
        daemon = DaemonProcess(args or [], config_text, tmp_path)
        started.append(daemon)
        if ready:
            daemon.wait_ready()
        return daemon

    yield start
    for daemon in started:
        daemon.stop(signal.SIGKILL if daemon.proc.poll() is None else signal.SIGTERM)
