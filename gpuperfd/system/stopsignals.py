"""Every way a command-line run can be asked to stop, turned into one abort event.

``gpuperfd sweep`` and ``gpuperfd probe`` must put a power cap back and end their probe
child however they are stopped: Ctrl-C (once or twice), ``kill`` (SIGTERM), a dropped SSH
session or closed terminal (SIGHUP), Ctrl-\\ (SIGQUIT). Inside :class:`StopSignals` these
signals only set an event; the run notices it between steps, kills its child and restores
the cap, and no second signal can interrupt that restore (no KeyboardInterrupt is raised).
Only SIGKILL is left to the next start or ``gpuperfd restore-caps``.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class StopSignals:
    """While active, SIGINT/SIGTERM/SIGHUP/SIGQUIT set ``abort``; the first one is remembered."""

    def __init__(self, abort: threading.Event) -> None:
        self.abort = abort
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self.abort.set()

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    @property
    def exit_code(self) -> int:
        """The shell's convention for a run ended by a signal: 128 + its number."""
        return 128 + (self.received or 0)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.received is not None:  # we are stopping: a further Ctrl-C must not cut the exit short
            for sig in self._previous:
                signal.signal(sig, signal.SIG_IGN)
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def say(text: str) -> None:
    """Print to stderr; a closed terminal (EIO) or pipe must not turn a clean stop into a traceback."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
