"""Logging to stderr in logfmt, with syslog priority prefixes under journald.

Under systemd (JOURNAL_STREAM is set) each line starts with ``<N>`` so journald
stores the right priority, and the timestamp is left to journald. Elsewhere the
line carries its own timestamp.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def _quote(value: str) -> str:
    if value and not any(c in value for c in ' ="\n\t'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def __init__(self, journald: bool) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        fields = [f"level={record.levelname.lower()}", f"logger={record.name}", f"msg={_quote(message)}"]
        if self.journald:
            return f"<{_PRIORITY.get(record.levelno, 6)}>" + " ".join(fields)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        return f"time={stamp} " + " ".join(fields)


#: Libraries whose INFO lines say what they did, not what gpuperfd did: APScheduler logs every job it
#: adds and every run it starts and ends (81 of the demo's 440 lines). Their warnings (a run missed, a
#: job that raised) still come through; ``log_level: debug`` shows everything.
QUIET_LIBRARIES: tuple[str, ...] = ("apscheduler",)


def setup_logging(level: str = "info") -> None:
    """Configure the root logger once; later calls only change the level."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)
    if any(getattr(h, "_gpuperfd", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    handler._gpuperfd = True  # type: ignore[attr-defined]
    root.addHandler(handler)
