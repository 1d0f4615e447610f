"""What ``gpuperfd install`` and ``uninstall`` do (their flags: gpuperfd/commands/install.py): the systemd
service, its user, config and state.

The files it lays down come from the templates in this module, so an installed
wheel carries them; ``systemd/`` in the repository holds the same files
rendered for ``/usr/local/bin/gpuperfd`` (regenerate with
``python -m gpuperfd.system.install --write-systemd-dir systemd``; a test checks they
match). What ``install`` does, each step printed, nothing done with --dry-run:

1. the system user ``gpuperfd`` (systemd-sysusers, or useradd without it);
2. ``/etc/gpuperfd/gpuperfd.yaml`` and ``/etc/default/gpuperfd``, only if absent
   (they are the operator's files once installed);
3. ``/etc/systemd/system/gpuperfd.service`` with ExecStart pointing at this
   installation's ``gpuperfd`` (``--prefix``), always rewritten (local changes
   belong in a drop-in: ``systemctl edit gpuperfd``); with ``--power-caps`` the
   drop-in that grants CAP_SYS_ADMIN for power-cap sweeps, removed without it;
4. the state directory ``/var/lib/gpuperfd`` (the power-cap journal);
5. ``systemctl daemon-reload`` and ``systemctl enable --now gpuperfd`` where
   systemd runs this machine; under ``--root`` (an image or chroot) or without
   systemd as PID 1 only ``systemctl --root enable`` (nothing is started).

``uninstall`` stops and disables the service (its ExecStopPost restores any
power cap left changed) and removes the unit; ``--purge`` also removes config,
state, cache and the user, but keeps the state directory while it still holds
power-cap journal entries.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

UNIT_NAME = "gpuperfd.service"
USER = "gpuperfd"
DEFAULT_EXECUTABLE = "/usr/local/bin/gpuperfd"
STATE_DIR = "/var/lib/gpuperfd"
CONFIG_FILE = "/etc/gpuperfd/gpuperfd.yaml"
ENVIRONMENT_FILE = "/etc/default/gpuperfd"
UNIT_FILE = f"/etc/systemd/system/{UNIT_NAME}"
DROPIN_FILE = f"/etc/systemd/system/{UNIT_NAME}.d/power-caps.conf"
SYSUSERS_FILE = "/etc/sysusers.d/gpuperfd.conf"
CACHE_DIR = "/var/cache/gpuperfd"
#: Directories the unit hides from the service (ProtectHome=yes): the executable cannot live there.
HIDDEN_BY_UNIT = ("/home", "/root", "/run/user")

_EXE = "@GPUPERFD@"
UNIT_TEMPLATE = f"""\
# gpuperfd: GPU performance daemon (NVML telemetry for Prometheus, probes, power-cap sweeps).
# Installed by `gpuperfd install`, which rewrites this file: put local changes in a
# drop-in (`systemctl edit gpuperfd`). Why each setting: docs/operations.md.

[Unit]
Description=gpuperfd GPU performance daemon
Wants=network-online.target
After=network-online.target nvidia-persistenced.service
# A persistent failure (no driver, port taken) gives up after 5 tries in 5 minutes.
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
# READY=1 after the first collection, WATCHDOG=1 while the sampler is healthy.
Type=notify
NotifyAccess=main
WatchdogSec=60s
TimeoutStartSec=120s
TimeoutStopSec=60s
Restart=on-failure
RestartSec=5s
# Exit code 2 is an invalid configuration: restarting cannot fix it.
RestartPreventExitStatus=2

User={USER}
Group={USER}
EnvironmentFile=-{ENVIRONMENT_FILE}
Environment=XDG_CACHE_HOME=%C/gpuperfd
# Two malloc arenas instead of one per thread: several MB less RSS (docs/benchmarks.md).
Environment=MALLOC_ARENA_MAX=2
# Power caps a crashed run left changed are put back before the start and after any stop,
# with full privileges ("+") so this works even though the daemon itself has no
# capabilities; "-": a failure here is logged and does not block the start.
ExecStartPre=-+{_EXE} restore-caps --state-dir {STATE_DIR}
ExecStart={_EXE} run --config {CONFIG_FILE} $GPUPERFD_OPTS
ExecReload=/bin/kill -HUP $MAINPID
ExecStopPost=-+{_EXE} restore-caps --state-dir {STATE_DIR}

# /var/lib/gpuperfd (power-cap journal, probe history) and /var/cache/gpuperfd, owned by {USER}.
StateDirectory=gpuperfd
StateDirectoryMode=0750
CacheDirectory=gpuperfd
CacheDirectoryMode=0750
UMask=0077

# Sandbox. No capabilities: reading NVML needs none. Power-cap sweeps need
# CAP_SYS_ADMIN: `gpuperfd install --power-caps` adds it in a drop-in.
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallErrorNumber=EPERM
# The GPUs: /dev/nvidiactl, /dev/nvidia0..N, /dev/nvidia-uvm*, /dev/nvidia-caps/*
# (device groups nvidia, nvidia-frontend, nvidia-uvm, nvidia-caps, ... in /proc/devices).
DevicePolicy=closed
DeviceAllow=char-nvidia* rw
# Not set, on purpose (see docs/operations.md): PrivateDevices (hides /dev/nvidia*),
# ProcSubset=pid (hides /proc/driver/nvidia), ProtectProc=invisible (hides the names
# of other users' GPU processes), MemoryDenyWriteExecute (CUDA and PyTorch probes),
# PrivateUsers (CAP_SYS_ADMIN would not reach the driver), PrivateNetwork.

[Install]
WantedBy=multi-user.target
"""

POWER_CAPS_DROPIN = """\
# Installed by `gpuperfd install --power-caps`: lets gpuperfd change GPU power limits
# (power-cap sweeps). The NVIDIA driver allows that to CAP_SYS_ADMIN only, a broad
# capability: grant it only on nodes where sweeps run (docs/operations.md).
[Service]
CapabilityBoundingSet=CAP_SYS_ADMIN
AmbientCapabilities=CAP_SYS_ADMIN
"""

ENVIRONMENT_TEMPLATE = """\
# Environment of gpuperfd.service (EnvironmentFile=-/etc/default/gpuperfd).
# Settings belong in /etc/gpuperfd/gpuperfd.yaml; command-line flags given here
# override it, e.g.:
#   GPUPERFD_OPTS="--web.listen-address=0.0.0.0:10187 --web.config.file=/etc/gpuperfd/web.yml"
#   GPUPERFD_OPTS="--log-level=debug"
GPUPERFD_OPTS=""
"""

DEFAULT_CONFIG = """\
# gpuperfd configuration (installed by `gpuperfd install`; kept on reinstall).
# Every key is optional; the commented values are the defaults. Check a change with
#   gpuperfd check-config /etc/gpuperfd/gpuperfd.yaml
# and apply it with `systemctl reload gpuperfd` (SIGHUP) or a restart.
# Reference: docs/configuration.md.

log_level: info                 # debug, info, warning, error

web:
  # Loopback only by default. For Prometheus on another host listen on 0.0.0.0:10187
  # (or the node's IP), ideally with TLS and basic auth from a web config file.
  listen_address: 127.0.0.1:10187
  # telemetry_path: /metrics
  # Exporter-toolkit web config (TLS, client certificates, basic auth); see docs/operations.md.
  # config_file: /etc/gpuperfd/web.yml

device:
  backend: nvml                 # nvml (real GPUs) or simulated
  # gpus: [0, 1]                # only these GPU indices (default: all)
  # call_timeout_seconds: 5.0

# sampler:
#   interval_seconds: 1.0       # seconds between reads of the cheap fields
#   collectors:                 # per collector (`gpuperfd collectors` lists them)
#     pcie: {interval_seconds: 10}
#     processes: {enabled: false}

probes:
  # Never change power caps. The service runs without the capability the driver
  # requires for that; to run power-cap sweeps install with `gpuperfd install
  # --power-caps` and set this to false.
  read_only: true
  # state_dir: /var/lib/gpuperfd  # power-cap journal (the unit's StateDirectory)
  # idle_seconds: 300             # a GPU must be idle this long before a probe runs
  # schedules:
  #   - probe: llm                # llm, vit, attention, train
  #     cron: "30 3 * * *"        # or interval_seconds: 86400
  #     caps: [current]           # e.g. [max, 0.9, 0.8, 0.7] for a sweep (needs read_only: false)
"""

SYSUSERS_LINE = f'u {USER} - "gpuperfd GPU performance daemon" {STATE_DIR} /usr/sbin/nologin'
SYSUSERS_TEMPLATE = f"""\
# The system user of gpuperfd.service (installed by `gpuperfd install`).
{SYSUSERS_LINE}
"""


def render_unit(executable: str = DEFAULT_EXECUTABLE) -> str:
    """The unit file text with ExecStart (and the restore-caps hooks) running ``executable``."""
    if not executable.startswith("/") or any(c.isspace() for c in executable) or "%" in executable:
        raise ValueError(f"executable {executable!r} must be an absolute path without spaces or '%'")
    return UNIT_TEMPLATE.replace(_EXE, executable)


def systemd_files(executable: str = DEFAULT_EXECUTABLE) -> dict[str, str]:
    """The files of ``systemd/`` in the repository, by name."""
    return {
        "gpuperfd.service": render_unit(executable),
        "power-caps.conf": POWER_CAPS_DROPIN,
        "gpuperfd.default": ENVIRONMENT_TEMPLATE,
        "gpuperfd.yaml": DEFAULT_CONFIG,
        "gpuperfd.sysusers": SYSUSERS_TEMPLATE,
    }


def default_executable() -> str:
    """The ``gpuperfd`` script of the Python environment running this code."""
    return str(Path(sysconfig.get_path("scripts")) / "gpuperfd")


def systemd_running() -> bool:
    """Whether systemd is this machine's init (sd_booted(3): /run/systemd/system exists)."""
    return os.path.isdir("/run/systemd/system")


Runner = Callable[[Sequence[str]], int]


def _run_command(command: Sequence[str]) -> int:
    return subprocess.run(list(command), check=False).returncode


class Installer:
    """Carries out (or, dry, only prints) the steps of install and uninstall under ``root``."""

    def __init__(
        self,
        root: Path | str = "/",
        *,
        dry_run: bool = False,
        out: Callable[[str], None] = print,
        run: Runner = _run_command,
        live: bool | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.dry_run = dry_run
        self.out = out
        self.run_command = run
        #: act on the running system (daemon-reload, start, stop) rather than on files only
        self.live = (self.root == Path("/") and systemd_running()) if live is None else live

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def _say(self, verb: str, what: str) -> None:
        self.out(f"{'would ' if self.dry_run else ''}{verb} {what}")

    def write(self, absolute: str, text: str, *, keep_existing: bool, mode: int = 0o644) -> None:
        target = self.path(absolute)
        if target.exists():
            if keep_existing:
                self.out(f"keep {absolute} (exists)")
                return
            if target.read_text() == text:
                self.out(f"unchanged {absolute}")
                return
            self._say("update", absolute)
        else:
            self._say("create", absolute)
        if self.dry_run:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".gpuperfd-new")
        partial.write_text(text)
        partial.chmod(mode)
        partial.replace(target)

    def mkdir(self, absolute: str, mode: int = 0o750) -> None:
        target = self.path(absolute)
        if target.is_dir():
            self.out(f"keep {absolute}/ (exists)")
            return
        self._say("create", absolute + "/")
        if not self.dry_run:
            target.mkdir(parents=True, mode=mode)

    def remove(self, absolute: str) -> None:
        target = self.path(absolute)
        if not target.exists() and not target.is_symlink():
            return
        self._say("remove", absolute + ("/" if target.is_dir() else ""))
        if self.dry_run:
            return
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()

    def command(self, *argv: str, check: bool = True) -> bool:
        self._say("run", " ".join(argv))
        if self.dry_run:
            return True
        try:
            code = self.run_command(argv)
        except FileNotFoundError:
            code = 127
        if code != 0:
            self.out(f"{'error' if check else 'warning'}: `{' '.join(argv)}` exited with {code}")
        return code == 0

    def _root_flag(self) -> list[str]:
        return [] if self.root == Path("/") else [f"--root={self.root}"]

    # --- steps ---------------------------------------------------------------------------------

    def ensure_user(self) -> bool:
        self.write(SYSUSERS_FILE, SYSUSERS_TEMPLATE, keep_existing=False)
        if self._user_exists():
            self.out(f"keep user {USER} (exists)")
            return True
        if shutil.which("systemd-sysusers"):
            return self.command("systemd-sysusers", *self._root_flag(), "--inline", SYSUSERS_LINE)
        if shutil.which("useradd"):
            return self.command(
                "useradd", "--system", *([f"--root={self.root}"] if self.root != Path("/") else []),
                "--user-group", "--home-dir", STATE_DIR, "--no-create-home", "--shell", "/usr/sbin/nologin",
                "--comment", "gpuperfd GPU performance daemon", USER,
            )
        self.out(f"error: neither systemd-sysusers nor useradd found: create the system user {USER} yourself")
        return False

    def _user_exists(self) -> bool:
        passwd = self.path("/etc/passwd")
        try:
            return any(line.split(":", 1)[0] == USER for line in passwd.read_text().splitlines())
        except OSError:
            return False

    def install(self, executable: str, *, power_caps: bool = False, enable: bool = True) -> int:
        problem = _check_executable(executable, self.root)
        if problem:
            if self.root == Path("/"):
                self.out(f"error: {problem}")
                return EXIT_USAGE
            self.out(f"warning: {problem} (inside {self.root})")
        ok = self.ensure_user()
        self.write(CONFIG_FILE, DEFAULT_CONFIG, keep_existing=True)  # readable by the service user
        self.write(ENVIRONMENT_FILE, ENVIRONMENT_TEMPLATE, keep_existing=True)
        self.write(UNIT_FILE, render_unit(executable), keep_existing=False)
        if power_caps:
            self.write(DROPIN_FILE, POWER_CAPS_DROPIN, keep_existing=False)
        else:
            self.remove(DROPIN_FILE)
            self._remove_empty(str(Path(DROPIN_FILE).parent))
        self.mkdir(STATE_DIR)
        if not enable:
            self.out("not enabled (--no-enable): run `systemctl enable --now gpuperfd` when ready")
        elif self.live:
            ok = self.command("systemctl", "daemon-reload") and ok
            ok = self.command("systemctl", "enable", "--now", UNIT_NAME) and ok
            if ok and power_caps:  # a running service picks up a new drop-in only on restart
                ok = self.command("systemctl", "try-restart", UNIT_NAME) and ok
            if ok:
                self.out("gpuperfd is running: `systemctl status gpuperfd`, `journalctl -u gpuperfd`")
        else:
            why = f"--root {self.root}" if self.root != Path("/") else "systemd is not running this machine"
            self.out(f"not starting ({why}): enabling for the next boot only")
            if shutil.which("systemctl"):
                ok = self.command("systemctl", *self._root_flag(), "enable", UNIT_NAME) and ok
            else:
                self.out(f"warning: systemctl not found: link {UNIT_FILE} into multi-user.target.wants yourself")
        return EXIT_OK if ok else EXIT_FAILURE

    def uninstall(self, *, purge: bool = False) -> int:
        ok = True
        if self.path(UNIT_FILE).exists():
            if self.live:  # stopping runs ExecStopPost: power caps are restored before anything is removed
                ok = self.command("systemctl", "disable", "--now", UNIT_NAME)
            elif shutil.which("systemctl"):
                ok = self.command("systemctl", *self._root_flag(), "disable", UNIT_NAME)
        else:
            self.out(f"no {UNIT_FILE}: nothing to stop")
        self.remove(DROPIN_FILE)
        self._remove_empty(str(Path(DROPIN_FILE).parent))
        self.remove(UNIT_FILE)
        if self.live:
            self.command("systemctl", "daemon-reload", check=False)
        if not purge:
            self.out(f"kept {CONFIG_FILE}, {ENVIRONMENT_FILE} and {STATE_DIR} (remove them with --purge)")
            return EXIT_OK if ok else EXIT_FAILURE
        self.remove(str(Path(CONFIG_FILE).parent))
        self.remove(ENVIRONMENT_FILE)
        self.remove(CACHE_DIR)
        pending = sorted(self.path(STATE_DIR).glob("*.cap.json")) if self.path(STATE_DIR).is_dir() else []
        if pending:
            self.out(
                f"warning: kept {STATE_DIR}: it holds {len(pending)} power-cap journal entr(y/ies) of caps not yet "
                f"restored; run `gpuperfd restore-caps --state-dir {STATE_DIR}` and purge again"
            )
            ok = False
        else:
            self.remove(STATE_DIR)
        self.remove(SYSUSERS_FILE)
        if self._user_exists():
            if shutil.which("userdel"):
                ok = self.command("userdel", *self._root_flag(), USER) and ok
            else:
                self.out(f"warning: userdel not found: remove the user {USER} yourself")
        return EXIT_OK if ok else EXIT_FAILURE

    def _remove_empty(self, absolute: str) -> None:
        target = self.path(absolute)
        if target.is_dir() and not any(target.iterdir()) and not self.dry_run:
            target.rmdir()


def _check_executable(executable: str, root: Path) -> str | None:
    if not executable.startswith("/"):
        return f"{executable!r} is not an absolute path"
    for hidden in HIDDEN_BY_UNIT:
        if executable == hidden or executable.startswith(hidden + "/"):
            return (
                f"{executable} is under {hidden}, which the unit hides from the service (ProtectHome=yes): "
                "install gpuperfd elsewhere (e.g. a venv in /opt/gpuperfd) and pass --prefix"
            )
    target = root / executable.lstrip("/")
    if not (target.is_file() and os.access(target, os.X_OK)):
        return f"no executable {executable}: pass --prefix (the directory holding bin/gpuperfd)"
    return None


def write_systemd_dir(directory: Path | str) -> list[Path]:
    """Render :func:`systemd_files` into ``directory`` (the repository's systemd/)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in systemd_files().items():
        (directory / name).write_text(text)
        written.append(directory / name)
    return written


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(description="Render the repository's systemd/ files from the templates.")
    parser.add_argument("--write-systemd-dir", metavar="DIR", required=True)
    for path in write_systemd_dir(parser.parse_args().write_systemd_dir):
        print(path)
