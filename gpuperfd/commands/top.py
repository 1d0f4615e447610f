"""``gpuperfd top``: the flags, the source choice and the redraw loop.

Exit codes: 0 (a frame printed with ``--once``; Ctrl-C or SIGTERM in the live view), 1 (no frame:
the daemon does not answer, refuses or answers something else), 2 (usage: a bad flag value, a GPU
index that does not exist, a config file that does not parse), 3 (``--local`` and no usable GPU
backend, the message of every other command's no-driver error).

The live view redraws in place with plain ANSI (home, clear to end of line and of screen) on the
terminal's alternate screen, cursor hidden, and puts both back however it ends; when stdout is not
a terminal it writes whole frames one after another without any escape code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from types import FrameType
from typing import Any, TextIO

from gpuperfd.config import DEFAULT_CONFIG_PATH, Config, config_with_flags, env_config_path
from gpuperfd.console import seconds_between
from gpuperfd.commands.check import gpu_list
from gpuperfd.top.client import DaemonAddress, DaemonSource, Source, TopError, daemon_url
from gpuperfd.top.frame import render

EXIT_OK, EXIT_NO_FRAME, EXIT_USAGE, EXIT_DEVICE = 0, 1, 2, 3
#: Alternate screen and hidden cursor on; their undoing.
ENTER, LEAVE = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"


_interval = seconds_between(0.1, 3600.0)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "top", help="live per-GPU view in the terminal (from the daemon, or --local)",
        description="A live per-GPU view: utilization, memory, power against the cap, temperature, SM clock and "
                    "throttle reasons, the verdict, the last probe result against its expected figure, the "
                    "recommended cap, and a sweep in progress. Read from the running daemon's /api/v1/gpus "
                    "(its address from the config, or --url); --local reads the GPUs here instead.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", metavar="URL", help="the daemon's base URL (default: from the config's "
                                                    "web.listen_address and web config file)")
    where.add_argument("--local", action="store_true", help="read the GPUs here (NVML), no daemon")
    where.add_argument("--simulate", type=int, metavar="N", help="read N simulated GPUs here (demos, tests)")
    parser.add_argument("--once", action="store_true", help="print one frame and exit (no escape codes unless a TTY)")
    parser.add_argument("--interval", type=_interval, default=2.0, metavar="S", help="seconds between frames (default 2)")
    parser.add_argument("--gpus", type=gpu_list, metavar="LIST", help="GPU indices, e.g. 0,2,4-7 (default: all)")
    parser.add_argument("--config", metavar="FILE", help=f"YAML config (default: $GPUPERFD_CONFIG or "
                                                         f"{DEFAULT_CONFIG_PATH} if it exists)")
    parser.add_argument("--ca-file", metavar="FILE", help="CA to trust the daemon's TLS certificate with")
    parser.add_argument("--cert", metavar="FILE", help="client certificate, when the daemon asks for one")
    parser.add_argument("--key", metavar="FILE", help="the client certificate's key")
    parser.add_argument("--user", metavar="NAME", help="basic-auth user; the password comes from $GPUPERFD_PASSWORD")
    parser.set_defaults(func=cmd_top)
    return parser


def _config(args: argparse.Namespace) -> Config:
    path = args.config or env_config_path()
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = str(DEFAULT_CONFIG_PATH)
    return config_with_flags(path, {}, simulate=args.simulate)


def open_source(args: argparse.Namespace, config: Config) -> Source:
    """The daemon's API, or (``--local``/``--simulate``) the GPUs here; raises TopError or DeviceError."""
    if args.local or args.simulate is not None:
        from gpuperfd.top.local import LocalSource

        return LocalSource(config, args.gpus)
    address = DaemonAddress(args.url or daemon_url(config), args.ca_file, args.cert, args.key, args.user)
    return DaemonSource(address)


def select(data: dict[str, Any], gpus: list[int] | None) -> dict[str, Any]:
    """``data`` with only the GPUs of ``--gpus``; TopError naming an index the source does not have."""
    if gpus is None:
        return data
    known = {g["gpu"] for g in data["gpus"]}
    missing = [i for i in gpus if i not in known]
    if missing:
        raise TopError(f"--gpus: GPU index {', '.join(map(str, missing))} does not exist there "
                       f"(GPUs: {', '.join(map(str, sorted(known))) or 'none'})")
    return {**data, "gpus": [g for g in data["gpus"] if g["gpu"] in set(gpus)]}


def cmd_top(args: argparse.Namespace) -> int:
    from gpuperfd.device.errors import DeviceError, DriverNotFound

    config = _config(args)
    try:
        source = open_source(args, config)
    except DriverNotFound as exc:
        print(f"gpuperfd top: {exc}", file=sys.stderr)
        return EXIT_DEVICE
    except DeviceError as exc:
        print(f"gpuperfd top: cannot open the GPUs: {exc}", file=sys.stderr)
        return EXIT_DEVICE
    except TopError as exc:
        print(f"gpuperfd top: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        try:
            data = select(source.fetch(), args.gpus)
        except TopError as exc:
            print(f"gpuperfd top: {exc}", file=sys.stderr)
            return EXIT_USAGE if str(exc).startswith("--gpus") else EXIT_NO_FRAME
        if args.once:
            _print_frame(sys.stdout, data, source.description)
            return EXIT_OK
        return live(source, data, args.gpus, args.interval, sys.stdout)
    finally:
        source.close()


def _color(out: TextIO) -> bool:
    return out.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _print_frame(out: TextIO, data: dict[str, Any], description: str, error: str | None = None) -> None:
    width = shutil.get_terminal_size().columns
    out.write("\n".join(render(data, description, width, _color(out), error)) + "\n")
    out.flush()


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def live(source: Source, data: dict[str, Any], gpus: list[int] | None, interval: float, out: TextIO) -> int:
    """Redraw every ``interval`` seconds until Ctrl-C (or SIGTERM); exit 0 with the terminal restored.

    A failed fetch keeps the last frame on screen, marked stale with the reason, and tries again."""
    tty = out.isatty() and os.environ.get("TERM") != "dumb"  # a dumb terminal gets whole frames, no escapes
    previous = signal.signal(signal.SIGTERM, _interrupt)
    error: str | None = None
    try:
        if tty:
            out.write(ENTER)
        while True:
            if tty:
                size = shutil.get_terminal_size()
                lines = render(data, source.description, size.columns, _color(out), error)
                if len(lines) > size.lines - 1:  # a taller frame would scroll and garble the next redraw
                    hidden = len(lines) - (size.lines - 2)
                    lines = lines[:size.lines - 2] + [f"... {hidden} more line(s): a taller terminal or --gpus"[:size.columns]]
                out.write("\x1b[H" + "\x1b[K\n".join(lines) + "\x1b[K\x1b[J")
                out.flush()
            else:
                _print_frame(out, data, source.description, error)
                out.write("\n")
            time.sleep(interval)
            try:
                data, error = select(source.fetch(), gpus), None
            except TopError as exc:
                error = str(exc)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if tty:
            out.write(LEAVE)
            out.flush()
        signal.signal(signal.SIGTERM, previous)
