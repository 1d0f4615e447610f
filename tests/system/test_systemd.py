"""The systemd unit (verified and scored by systemd-analyze) and sd_notify over a real datagram socket."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuperfd.config import DEFAULT_LISTEN_ADDRESS, load_config
from gpuperfd.system import install, sdnotify

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD_DIR = ROOT / "systemd"
OPERATIONS = ROOT / "docs" / "operations.md"


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze is required: apt-get install systemd (scripts/test.sh installs it)"
    return path


def _unit_values(text: str) -> dict[str, list[str]]:
    """KEY -> every value assigned in the unit (systemd allows repeats)."""
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        values.setdefault(key, []).append(value)
    return values


@pytest.fixture
def unit_dir(tmp_path: Path) -> Path:
    """The unit as `gpuperfd install` writes it, pointing at this test run's real gpuperfd script."""
    executable = Path(sys.executable).parent / "gpuperfd"
    assert executable.is_file(), f"{executable} missing: pip install -e . into this environment"
    (tmp_path / "gpuperfd.service").write_text(install.render_unit(str(executable)))
    return tmp_path


# --- the committed files ---------------------------------------------------------------------------


def test_committed_systemd_files_match_the_installer_templates() -> None:
    for name, text in install.systemd_files().items():
        path = SYSTEMD_DIR / name
        assert path.exists(), f"{path} missing: python -m gpuperfd.system.install --write-systemd-dir systemd"
        assert path.read_text() == text, f"{path} is stale: python -m gpuperfd.system.install --write-systemd-dir systemd"


def test_unit_settings() -> None:
    values = _unit_values(install.render_unit())
    assert values["Type"] == ["notify"] and values["WatchdogSec"] == ["60s"]
    assert values["Restart"] == ["on-failure"] and values["RestartPreventExitStatus"] == ["2"]
    assert values["User"] == ["gpuperfd"] and values["StateDirectory"] == ["gpuperfd"]
    assert values["EnvironmentFile"] == ["-/etc/default/gpuperfd"]
    assert values["ExecStart"] == ["/usr/local/bin/gpuperfd run --config /etc/gpuperfd/gpuperfd.yaml $GPUPERFD_OPTS"]
    restore = "-+/usr/local/bin/gpuperfd restore-caps --state-dir /var/lib/gpuperfd"
    assert values["ExecStartPre"] == [restore] and values["ExecStopPost"] == [restore]
    assert values["CapabilityBoundingSet"] == [""] and values["NoNewPrivileges"] == ["yes"]
    assert values["DeviceAllow"] == ["char-nvidia* rw"]
    assert "PrivateDevices" not in values  # it would hide /dev/nvidia*
    dropin = _unit_values(install.POWER_CAPS_DROPIN)
    assert dropin["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"] == dropin["AmbientCapabilities"]


def test_render_unit_rejects_unusable_paths() -> None:
    for bad in ("gpuperfd", "/opt/my venv/bin/gpuperfd", "/opt/%h/gpuperfd"):
        with pytest.raises(ValueError):
            install.render_unit(bad)


def test_default_config_is_valid_and_safe(tmp_path: Path) -> None:
    config = load_config(SYSTEMD_DIR / "gpuperfd.yaml", required=True)
    assert config.web.listen_address == DEFAULT_LISTEN_ADDRESS == "127.0.0.1:10187"
    assert config.device.backend == "nvml"
    assert config.probes.read_only is True  # the unit has no CAP_SYS_ADMIN by default
    assert str(config.probes.state_dir) == "/var/lib/gpuperfd"


def test_environment_file_sets_empty_opts(tmp_path: Path) -> None:
    text = (SYSTEMD_DIR / "gpuperfd.default").read_text()
    assignments = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert assignments == ['GPUPERFD_OPTS=""']
    # and the shell reads it the way systemd does for a simple assignment
    out = subprocess.run(["sh", "-c", f". {SYSTEMD_DIR / 'gpuperfd.default'}; printf %s \"$GPUPERFD_OPTS\""],
                         capture_output=True, text=True, check=True)
    assert out.stdout == ""


# --- systemd-analyze ----------------------------------------------------------------------------


def test_systemd_analyze_verify_passes(unit_dir: Path) -> None:
    result = subprocess.run([_systemd_analyze(), "verify", str(unit_dir / "gpuperfd.service")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stdout + result.stderr


def test_systemd_analyze_verify_passes_with_the_power_caps_dropin(unit_dir: Path) -> None:
    dropins = unit_dir / "gpuperfd.service.d"
    dropins.mkdir()
    (dropins / "power-caps.conf").write_text(install.POWER_CAPS_DROPIN)
    result = subprocess.run([_systemd_analyze(), "verify", str(unit_dir / "gpuperfd.service")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stdout + result.stderr


def test_systemd_analyze_verify_catches_a_missing_executable(tmp_path: Path) -> None:
    """The check above can fail: a unit whose binary does not exist is rejected."""
    (tmp_path / "gpuperfd.service").write_text(install.render_unit("/nonexistent/bin/gpuperfd"))
    result = subprocess.run([_systemd_analyze(), "verify", str(tmp_path / "gpuperfd.service")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "/nonexistent/bin/gpuperfd" in result.stderr


def _exposure(unit: Path) -> float:
    result = subprocess.run([_systemd_analyze(), "security", "--offline=yes", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    match = re.search(r"Overall exposure level for gpuperfd\.service: (\d+\.\d)", result.stdout)
    assert match, result.stdout[-2000:]
    return float(match.group(1))


def _documented_scores() -> dict[str, float]:
    text = OPERATIONS.read_text()
    found = dict(re.findall(r"<!-- exposure:(\w+) -->\s*\**(\d+\.\d)", text))
    assert set(found) == {"default", "power_caps"}, "docs/operations.md must record both exposure scores"
    return {name: float(value) for name, value in found.items()}


def test_security_exposure_is_low_and_documented(unit_dir: Path) -> None:
    documented = _documented_scores()
    default = _exposure(unit_dir / "gpuperfd.service")
    dropins = unit_dir / "gpuperfd.service.d"
    dropins.mkdir()
    (dropins / "power-caps.conf").write_text(install.POWER_CAPS_DROPIN)
    power_caps = _exposure(unit_dir / "gpuperfd.service")
    assert default <= 2.0 and power_caps <= 2.5  # "OK" is below 4.0; keep well inside it
    assert power_caps > default
    assert {"default": default, "power_caps": power_caps} == documented, (
        "update the scores in docs/operations.md"
    )


# --- sd_notify ------------------------------------------------------------------------------------


class NotifySocket:
    """A datagram socket standing in for systemd's notification socket."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(5)

    def receive(self) -> str:
        return self.sock.recv(4096).decode()

    def nothing_waiting(self) -> bool:
        self.sock.settimeout(0.2)
        try:
            self.sock.recv(4096)
        except (BlockingIOError, TimeoutError):
            return True
        finally:
            self.sock.settimeout(5)
        return False


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    path = tmp_path / "notify.sock"
    listener = NotifySocket(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield listener
    listener.sock.close()


def test_notifications_over_a_path_socket(notify_socket: NotifySocket) -> None:
    assert sdnotify.ready()
    assert notify_socket.receive() == "READY=1"
    assert sdnotify.ready("2 GPUs")
    assert notify_socket.receive() == "READY=1\nSTATUS=2 GPUs"
    assert sdnotify.watchdog()
    assert notify_socket.receive() == "WATCHDOG=1"
    assert sdnotify.status("sampling\n3 GPUs")
    assert notify_socket.receive() == "STATUS=sampling 3 GPUs"  # one line: a newline would start a new field
    assert sdnotify.stopping()
    assert notify_socket.receive() == "STOPPING=1"
    assert sdnotify.reloading()
    message = notify_socket.receive()
    assert re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=\d+", message)
    assert abs(int(message.split("=")[-1]) - time.monotonic_ns() // 1000) < 10_000_000


def test_notifications_over_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"gpuperfd-test-{os.getpid()}-{time.monotonic_ns()}"
    listener = NotifySocket(b"\0" + name.encode())
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready()
        assert listener.receive() == "READY=1"
    finally:
        listener.sock.close()


def test_outside_systemd_everything_is_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False and sdnotify.watchdog() is False and sdnotify.stopping() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))  # systemd went away: no exception
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert sdnotify.ready() is False


def test_watchdog_interval() -> None:
    pid = str(os.getpid())
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "60000000"}) == 60.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}) == 30.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None  # for another process
    assert sdnotify.watchdog_interval({}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


def test_watchdog_pinger_pings_only_while_healthy(notify_socket: NotifySocket) -> None:
    healthy = threading.Event()
    healthy.set()
    env = {"NOTIFY_SOCKET": os.environ["NOTIFY_SOCKET"], "WATCHDOG_USEC": "200000"}  # 0.2 s: pings every 0.1 s
    pinger = sdnotify.WatchdogPinger(healthy.is_set, env=env)
    assert pinger.interval == 0.2
    assert pinger.start()
    try:
        assert notify_socket.receive() == "WATCHDOG=1"
        assert notify_socket.receive() == "WATCHDOG=1"
        healthy.clear()
        time.sleep(0.15)
        while not notify_socket.nothing_waiting():  # drain pings sent before the change
            pass
        assert notify_socket.nothing_waiting()
        healthy.set()
        assert notify_socket.receive() == "WATCHDOG=1"
    finally:
        pinger.stop()


def test_watchdog_pinger_without_watchdog_does_nothing() -> None:
    pinger = sdnotify.WatchdogPinger(lambda: True, env={})
    assert pinger.start() is False
    pinger.stop()
