"""``gpuperfd install`` and ``gpuperfd uninstall``: their flags and the root check; the steps are
:class:`gpuperfd.system.install.Installer`'s (what each lays down: that module's docstring)."""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from gpuperfd.system.install import EXIT_USAGE, Installer, default_executable, render_unit


def register(subparsers: Any) -> None:
    install = subparsers.add_parser(
        "install",
        help="install the systemd service (user, config, unit, state directory) and start it",
        description=(
            "Install gpuperfd as a systemd service: the system user gpuperfd, /etc/gpuperfd/gpuperfd.yaml and "
            "/etc/default/gpuperfd (if absent), /etc/systemd/system/gpuperfd.service, /var/lib/gpuperfd; then "
            "enable and start it. Run again to update the unit; config files are never overwritten."
        ),
    )
    install.add_argument(
        "--prefix", metavar="DIR",
        help="installation holding bin/gpuperfd that the unit runs (default: this Python environment, "
             f"{Path(sysconfig.get_path('scripts')).parent})",
    )
    install.add_argument("--root", metavar="DIR", default="/", help="install into an image or chroot at DIR; starts nothing")
    install.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    install.add_argument(
        "--power-caps", action="store_true",
        help="grant CAP_SYS_ADMIN so power-cap sweeps can change limits (drop-in power-caps.conf)",
    )
    install.add_argument("--no-enable", dest="enable", action="store_false", help="do not enable or start the service")
    install.set_defaults(func=cmd_install)

    uninstall = subparsers.add_parser(
        "uninstall",
        help="stop, disable and remove the systemd service",
        description="Stop and disable gpuperfd.service and remove the unit; config and state stay unless --purge.",
    )
    uninstall.add_argument("--root", metavar="DIR", default="/", help="operate on an image or chroot at DIR")
    uninstall.add_argument("--purge", action="store_true", help="also remove config, state, cache and the user")
    uninstall.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    uninstall.set_defaults(func=cmd_uninstall)


def _require_root(args: argparse.Namespace) -> str | None:
    if not str(args.root).strip():  # '' resolved to the current directory: an install into wherever one stood
        return "--root: empty; name the image or chroot's directory (or leave --root out for this machine)"
    if not Path(args.root).is_dir():  # a mistyped image path would grow etc/ and var/ from nothing
        return f"--root {args.root}: not an existing directory (an image or chroot is one)"
    if args.dry_run or Path(args.root).resolve() != Path("/") or os.geteuid() == 0:
        return None
    return "must run as root (or use --root DIR or --dry-run)"


def cmd_install(args: argparse.Namespace) -> int:
    problem = _require_root(args)
    if problem:
        print(f"gpuperfd: {problem}", file=sys.stderr)
        return EXIT_USAGE
    executable = str(Path(args.prefix) / "bin" / "gpuperfd") if args.prefix else default_executable()
    try:
        render_unit(executable)
    except ValueError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return Installer(args.root, dry_run=args.dry_run).install(
        executable, power_caps=args.power_caps, enable=args.enable
    )


def cmd_uninstall(args: argparse.Namespace) -> int:
    problem = _require_root(args)
    if problem:
        print(f"gpuperfd: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return Installer(args.root, dry_run=args.dry_run).uninstall(purge=args.purge)
