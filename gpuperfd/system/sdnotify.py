"""systemd service notifications (sd_notify) without libsystemd: readiness, watchdog, status.

The unit runs gpuperfd as ``Type=notify`` with ``WatchdogSec=``: the daemon
sends ``READY=1`` once the first collection has filled the store (so
``systemctl start`` returns when /metrics has data), ``WATCHDOG=1`` from a
thread that pings only while the daemon is healthy, ``RELOADING=1`` around a
SIGHUP reload and ``STOPPING=1`` on shutdown. Outside systemd ($NOTIFY_SOCKET
unset) every function is a cheap no-op that returns False, so callers need no
checks of their own.

The protocol (sd_notify(3)): one datagram of newline-separated ``KEY=VALUE``
lines to the AF_UNIX socket named by $NOTIFY_SOCKET; a name starting with ``@``
is in the abstract namespace (leading NUL byte).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


def _address(env: Mapping[str, str]) -> str | bytes | None:
    name = env.get("NOTIFY_SOCKET", "")
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    if name.startswith("/"):
        return name
    if name:  # e.g. vsock: addresses (systemd >= 253 in VMs); not needed on a GPU host
        log.debug("NOTIFY_SOCKET %r is not an AF_UNIX path; notifications disabled", name)
    return None


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``); True if sent, False if not under systemd or it failed."""
    address = _address(os.environ if env is None else env)
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode("utf-8"))
    except OSError as exc:
        log.debug("sd_notify %r failed: %s", state, exc)
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """The service is up (systemd ends ``start`` and starts ordering-dependent units)."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status_text)}" if status_text else ""))


def reloading() -> bool:
    """A reload (SIGHUP) has begun; follow with :func:`ready` when done."""
    return notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def stopping() -> bool:
    """Shutdown has begun."""
    return notify("STOPPING=1")


def watchdog() -> bool:
    """Keep-alive ping; systemd kills and restarts the service if none comes within WatchdogSec."""
    return notify("WATCHDOG=1")


def status(text: str) -> bool:
    """Free-form status shown by ``systemctl status``."""
    return notify(f"STATUS={_one_line(text)}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout in seconds from $WATCHDOG_USEC, or None if no watchdog is asked of this process.

    Ping at half this interval or more often. $WATCHDOG_PID, when set, must be
    this process (a child that inherited the environment must not ping).
    """
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None


class WatchdogPinger:
    """A thread that sends WATCHDOG=1 every half interval while ``healthy()`` says True.

    ``healthy`` should prove the daemon does its work (e.g. the sampler
    completed a pass recently), not just that the process exists; when it
    returns False the pings stop and systemd restarts the service after
    WatchdogSec. :meth:`start` does nothing (returns False) when systemd asked
    for no watchdog.
    """

    def __init__(self, healthy: Callable[[], bool] = lambda: True, env: Mapping[str, str] | None = None) -> None:
        self.healthy = healthy
        self.interval = watchdog_interval(env)
        self._env = env
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        if self.interval is None:
            return False
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        period = self.interval / 2  # type: ignore[operator]
        while True:
            try:
                ok = self.healthy()
            except Exception:  # a broken health check must look unhealthy, not kill the thread silently
                log.exception("watchdog health check failed")
                ok = False
            if ok:
                notify("WATCHDOG=1", self._env)
            else:
                log.warning("unhealthy: not pinging the systemd watchdog")
            if self._stop.wait(period):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
