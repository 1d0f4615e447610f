"""`gpuperfd install` / `uninstall` into a throwaway root: files, user, enablement, idempotence, purge."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuperfd.commands.install import register
from gpuperfd.system import install
from gpuperfd.system.install import Installer

PREFIX = Path(sys.executable).parent.parent  # this test run's environment holds bin/gpuperfd
EXECUTABLE = str(PREFIX / "bin" / "gpuperfd")
WANTS = "etc/systemd/system/multi-user.target.wants/gpuperfd.service"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuperfd")
    register(parser.add_subparsers())
    return parser


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = _parser().parse_args(list(argv))
    code = args.func(args)
    return code, capsys.readouterr().out


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root -> its content, or where it links, or 'dir'."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = "-> " + str(path.readlink())
        elif path.is_dir():
            out[key] = "dir"
        else:
            out[key] = path.read_text(errors="replace")
    return out


@pytest.fixture(autouse=True)
def _tools() -> None:
    for tool in ("systemctl", "systemd-analyze"):
        assert shutil.which(tool), f"{tool} is required: apt-get install systemd (scripts/test.sh installs it)"
    assert shutil.which("systemd-sysusers") or shutil.which("useradd"), "systemd-sysusers or useradd is required"


def test_install_lays_down_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), capsys=capsys)
    assert code == 0, out
    unit = (tmp_path / "etc/systemd/system/gpuperfd.service").read_text()
    assert unit == install.render_unit(EXECUTABLE)
    assert f"ExecStart={EXECUTABLE} run --config /etc/gpuperfd/gpuperfd.yaml $GPUPERFD_OPTS" in unit
    assert (tmp_path / "etc/gpuperfd/gpuperfd.yaml").read_text() == install.DEFAULT_CONFIG
    assert (tmp_path / "etc/default/gpuperfd").read_text() == install.ENVIRONMENT_TEMPLATE
    assert (tmp_path / "var/lib/gpuperfd").is_dir()
    assert (tmp_path / "etc/sysusers.d/gpuperfd.conf").read_text() == install.SYSUSERS_TEMPLATE
    passwd = (tmp_path / "etc/passwd").read_text().splitlines()
    user = [line.split(":") for line in passwd if line.startswith("gpuperfd:")]
    assert len(user) == 1 and user[0][5] == "/var/lib/gpuperfd" and user[0][6] == "/usr/sbin/nologin"
    assert int(user[0][2]) < 1000  # a system user
    # enabled for the next boot, nothing started: this is not the running system
    assert (tmp_path / WANTS).is_symlink()
    assert str((tmp_path / WANTS).readlink()) == "/etc/systemd/system/gpuperfd.service"
    assert "not starting (--root" in out
    assert not (tmp_path / "etc/systemd/system/gpuperfd.service.d").exists()
    # the unit as installed passes systemd's own checks (its executable exists on this machine)
    verify = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "etc/systemd/system/gpuperfd.service")],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr


def test_install_is_idempotent_and_keeps_the_operators_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), capsys=capsys)[0] == 0
    config = tmp_path / "etc/gpuperfd/gpuperfd.yaml"
    config.write_text("log_level: debug\n")
    (tmp_path / "etc/default/gpuperfd").write_text('GPUPERFD_OPTS="--log-level=debug"\n')
    before = snapshot(tmp_path)
    code, out = run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), capsys=capsys)
    assert code == 0
    assert snapshot(tmp_path) == before
    assert "keep /etc/gpuperfd/gpuperfd.yaml (exists)" in out and "unchanged /etc/systemd/system/gpuperfd.service" in out
    assert "keep user gpuperfd (exists)" in out
    assert config.read_text() == "log_level: debug\n"


def test_new_prefix_updates_the_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "opt/gpuperfd"
    (other / "bin").mkdir(parents=True)
    (other / "bin/gpuperfd").write_text("#!/bin/sh\n")
    (other / "bin/gpuperfd").chmod(0o755)
    run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), capsys=capsys)
    code, out = run_cli("install", "--root", str(tmp_path), "--prefix", "/opt/gpuperfd", capsys=capsys)
    assert code == 0 and "update /etc/systemd/system/gpuperfd.service" in out
    assert "warning" not in out  # /opt/gpuperfd/bin/gpuperfd exists inside the root
    assert "ExecStart=/opt/gpuperfd/bin/gpuperfd run" in (tmp_path / "etc/systemd/system/gpuperfd.service").read_text()


def test_power_caps_dropin_follows_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dropin = tmp_path / "etc/systemd/system/gpuperfd.service.d/power-caps.conf"
    run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), "--power-caps", capsys=capsys)
    assert dropin.read_text() == install.POWER_CAPS_DROPIN
    run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), capsys=capsys)
    assert not dropin.exists() and not dropin.parent.exists()


def test_dry_run_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), "--dry-run", "--power-caps",
                        capsys=capsys)
    assert code == 0
    assert list(tmp_path.iterdir()) == []
    assert "would create /etc/systemd/system/gpuperfd.service" in out
    assert "would run systemctl --root=" in out


def test_uninstall_keeps_config_and_state_unless_purged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), "--power-caps", capsys=capsys)
    (tmp_path / "var/lib/gpuperfd/history.jsonl").write_text("{}\n")
    code, out = run_cli("uninstall", "--root", str(tmp_path), capsys=capsys)
    assert code == 0, out
    assert not (tmp_path / "etc/systemd/system/gpuperfd.service").exists()
    assert not (tmp_path / "etc/systemd/system/gpuperfd.service.d").exists()
    assert not (tmp_path / WANTS).is_symlink()
    assert (tmp_path / "etc/gpuperfd/gpuperfd.yaml").exists() and (tmp_path / "etc/default/gpuperfd").exists()
    assert (tmp_path / "var/lib/gpuperfd/history.jsonl").exists()
    assert "gpuperfd:" in (tmp_path / "etc/passwd").read_text()
    # a second uninstall has nothing left to do and still succeeds
    assert run_cli("uninstall", "--root", str(tmp_path), capsys=capsys)[0] == 0
    code, out = run_cli("uninstall", "--root", str(tmp_path), "--purge", capsys=capsys)
    assert code == 0, out
    for gone in ("etc/gpuperfd", "etc/default/gpuperfd", "var/lib/gpuperfd", "etc/sysusers.d/gpuperfd.conf"):
        assert not (tmp_path / gone).exists(), gone
    assert "gpuperfd:" not in (tmp_path / "etc/passwd").read_text()


def test_purge_keeps_a_journal_of_unrestored_caps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_cli("install", "--root", str(tmp_path), "--prefix", str(PREFIX), capsys=capsys)
    entry = tmp_path / "var/lib/gpuperfd/GPU-1234.cap.json"
    entry.write_text('{"original_watts": 700}\n')
    code, out = run_cli("uninstall", "--root", str(tmp_path), "--purge", capsys=capsys)
    assert code == 1
    assert entry.exists() and "restore-caps" in out
    assert not (tmp_path / "etc/gpuperfd").exists()


def test_on_a_running_system_it_reloads_enables_and_starts(tmp_path: Path) -> None:
    """With systemd as PID 1 the commands act on the live manager (recorded here, not run)."""
    commands: list[list[str]] = []
    lines: list[str] = []
    installer = Installer(tmp_path, live=True, run=lambda argv: commands.append(list(argv)) or 0, out=lines.append)
    installer._user_exists = lambda: True  # type: ignore[method-assign]
    assert installer.install(EXECUTABLE, power_caps=True) == 0
    assert commands == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "gpuperfd.service"],
                        ["systemctl", "try-restart", "gpuperfd.service"]]
    commands.clear()
    assert installer.uninstall() == 0
    assert commands == [["systemctl", "disable", "--now", "gpuperfd.service"], ["systemctl", "daemon-reload"]]


def test_a_failing_start_is_reported(tmp_path: Path) -> None:
    lines: list[str] = []
    installer = Installer(tmp_path, live=True, run=lambda argv: 1 if "enable" in argv else 0, out=lines.append)
    installer._user_exists = lambda: True  # type: ignore[method-assign]
    assert installer.install(EXECUTABLE) == 1
    assert any(line.startswith("error: `systemctl enable --now gpuperfd.service` exited with 1") for line in lines)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [("/nonexistent/gpuperfd", "no executable /nonexistent/gpuperfd/bin/gpuperfd"),
     ("/root/venv", "ProtectHome=yes"),
     ("/home/alice/.venv", "ProtectHome=yes")],
)
def test_unusable_executable_on_this_machine_is_an_error(prefix: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli("install", "--prefix", prefix, "--dry-run", capsys=capsys)
    assert code == 2 and message in out


def test_prefix_with_spaces_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["install", "--root", str(tmp_path), "--prefix", "/opt/my venv"])
    assert args.func(args) == 2
    assert "must be an absolute path without spaces" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_an_empty_or_missing_root_is_refused_and_nothing_is_created(command: str, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``--root ''`` once installed into the current directory; a mistyped image path grew its tree."""
    monkeypatch.chdir(tmp_path)
    args = _parser().parse_args([command, "--root", ""])
    assert args.func(args) == 2
    assert "--root: empty" in capsys.readouterr().err
    missing = tmp_path / "images" / "node"
    args = _parser().parse_args([command, "--root", str(missing)])
    assert args.func(args) == 2
    assert f"--root {missing}: not an existing directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
