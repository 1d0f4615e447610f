"""The daemon's log says what gpuperfd did: APScheduler's INFO lines (every job added, every run started
and ended: 81 of the demo's 440 lines) are not in it at info, its warnings are, and debug shows all."""

from __future__ import annotations

import subprocess
import sys

#: A real APScheduler with one job that runs once, under the daemon's logging setup.
SCRIPT = """
import logging, sys, threading
from apscheduler.schedulers.background import BackgroundScheduler
from gpuperfd.system.logs import setup_logging
setup_logging(sys.argv[1])
ran = threading.Event()
scheduler = BackgroundScheduler()
scheduler.add_job(ran.set, "date")
scheduler.start()
ran.wait(10)
scheduler.shutdown()
logging.getLogger("apscheduler.scheduler").warning("a run was missed")
logging.getLogger("gpuperfd.daemon").info("gpuperfd did this")
"""


def _log(level: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, level], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_apscheduler_info_lines_stay_out_of_the_log_at_info_and_its_warnings_stay_in() -> None:
    log = _log("info")
    assert "logger=gpuperfd.daemon" in log and 'msg="a run was missed"' in log
    assert [line for line in log.splitlines() if "logger=apscheduler" in line and "level=info" in line] == []


def test_debug_shows_apscheduler_too() -> None:
    assert any("logger=apscheduler" in line and "level=info" in line for line in _log("debug").splitlines())
